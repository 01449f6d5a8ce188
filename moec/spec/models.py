"""The spec: pydantic models of one DeepSeek-style MoE layer, one class per TOML table.

Each model checks its own fields (types, ranges, identifiers). Rules that relate fields of
several tables live in `rules.py`, one named function each, so a violation names its rule.
Keys follow HF `config.json` names where one exists.
"""

from __future__ import annotations

import functools
import importlib.metadata
import keyword
import re
import sys
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from moec.vocab import (
    ActivationSchemeName,
    ArchName,
    CheckpointFormatName,
    DeviceKindName,
    DispatchModeName,
    GemmBackendChoice,
    LayoutChoice,
    ReplicaChoiceName,
    RouterRoundingName,
    ScaleDtypeName,
    SchemeName,
    ScoringFuncName,
    SharedExpertsChoice,
    TopkMethodName,
)

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
GPU_NAME = r"[a-z0-9]+(-[a-z0-9]+)*"
"""A GPU as tuned tables name it: the device name in lowercase, each run of other characters
one hyphen ("NVIDIA H100 80GB HBM3" -> nvidia-h100-80gb-hbm3)."""
GPU_NAME_LENGTH = 64

MAX_NAME_LENGTH = 100
"""Characters of a package name: with moec's staging and cache suffixes, the folder name stays
well inside the 255 bytes file systems allow."""

IMPORTED_BY_PACKAGES = frozenset(
    {
        # what generated packages import, besides the standard library
        "torch",
        "triton",
        "numpy",
        "safetensors",
        "deep_gemm",
        "deep_ep",
        # what torch and triton import in turn
        "typing_extensions",
        "sympy",
        "mpmath",
        "networkx",
        "jinja2",
        "markupsafe",
        "filelock",
        "fsspec",
        "setuptools",
        "pkg_resources",
        "_distutils_hack",
        "functorch",
        "torchgen",
        "nvidia",
        "optree",
        "opt_einsum",
        "psutil",
        "packaging",
        "tqdm",
        # what torch imports when present (optional): a package of that name would be imported
        # in their place (`dill` and `pydot` break `import torch`)
        "dill",
        "pydot",
        "pynvml",
        "amdsmi",
        "moec",
    }
)
"""Modules a generated package imports, directly or through torch and triton."""

STANDARD_LIBRARY = frozenset(sys.stdlib_module_names) | {"test"}
"""The standard library's modules; sys.stdlib_module_names leaves out its `test` package."""
STARTUP_MODULES = frozenset({"sitecustomize", "usercustomize"})
"""Modules `site` imports at every interpreter start, wherever they are on the path."""

SHADOWED = STANDARD_LIBRARY | STARTUP_MODULES | IMPORTED_BY_PACKAGES
"""Module names a generated package must not take: it would shadow them where it is imported."""

MAX_INT = 2**31 - 1
"""Largest integer any key takes: dims, counts and token bounds fit int32 (kernels index with
them), and a TOML integer beyond 64 bits is reported with its key instead of reaching code."""
MAX_FLOAT = 1e6
"""Largest value of a float key (scaling factors, clamp limits, GiB, GB/s)."""
MIN_FLOAT = 1e-6
"""Smallest value of a positive float key (its reciprocal is MAX_FLOAT): a smaller one, such
as 1e-300, is 0 or a denormal in the float32 the kernels compute in (a SiTU beta of 1e-300
divides by 0: every output nan)."""
MIN_BANDWIDTH = 1e-3
"""Smallest bandwidth a key takes, GB/s (1 MB/s, as `moec explain --bandwidth`): below it the
cost model prices a message in numbers of hundreds of digits."""

Preset = Literal["deepseek-v3", "deepseek-r1", "deepseek-v2", "deepseek-v2-lite", "kimi-k2"]
QuantScheme = SchemeName
Arch = ArchName
PositiveInt = Annotated[int, Field(gt=0, le=MAX_INT)]
Count = Annotated[int, Field(ge=0, le=MAX_INT)]


def _not_tiny(value: float) -> float:
    if value < MIN_FLOAT:
        raise ValueError(
            f"is below {MIN_FLOAT:g}, the smallest a float key takes: values near 0 underflow "
            f"in the float32 the kernels compute in (1e-300 is 0 there) ({MIN_FLOAT:g} or more)"
        )
    return value


PositiveFloat = Annotated[
    float,
    Field(gt=0, le=MAX_FLOAT, json_schema_extra={"minimum": MIN_FLOAT}),
    AfterValidator(_not_tiny),
]
Bandwidth = Annotated[float, Field(ge=MIN_BANDWIDTH, le=MAX_FLOAT)]


class Table(BaseModel):
    """Base of every spec table: frozen, unknown keys rejected, docstrings kept for the schema.

    Strict: TOML values are typed, so "256" or true is not taken for an integer; numbers are
    finite (no inf or nan)."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        strict=True,
        allow_inf_nan=False,
    )


class Model(Table):
    """Dimensions of the MoE layer (HF config.json names)."""

    preset: Preset | None = None
    """Known model whose values fill every key this spec leaves out (model, router, quant)."""
    hidden_size: PositiveInt
    """H: width of the tokens entering and leaving the layer."""
    moe_intermediate_size: PositiveInt
    """I: intermediate width of one routed expert (before tensor parallelism)."""
    n_routed_experts: PositiveInt
    """E: number of routed experts."""
    num_experts_per_tok: PositiveInt
    """K: experts each token is routed to (top-k)."""
    n_shared_experts: Count = 0
    """Shared experts every token goes through; together one MLP of n_shared * I width."""
    vocab_size: PositiveInt | None = None
    """V: token ids the hash table maps (router.topk_method = "hash" only: tid2eid [V, K])."""


class Router(Table):
    """The gate: logits, scoring and top-k selection."""

    scoring_func: ScoringFuncName = "softmax"
    """How logits become scores: softmax over experts, sigmoid, or sqrt(softplus(x))."""
    topk_method: TopkMethodName = "greedy"
    """greedy: top-k of all experts; group_limited_greedy: top-k within the topk_group groups
    with the highest max score; noaux_tc: as grouped, ranking groups by the sum of their top-2
    scores plus `e_score_correction_bias`, which also biases the expert choice; hash: a frozen
    table from the checkpoint chooses each token's experts, `tid2eid[token_id]` (DeepSeek-V4's
    hash_moe layers: the forward takes the token ids beside x), the weights are the scores of
    the chosen experts."""
    n_group: PositiveInt = 1
    """Number of expert groups for the grouped methods (1 = no grouping)."""
    topk_group: PositiveInt = 1
    """Groups kept per token by the grouped methods."""
    norm_topk_prob: bool = False
    """Renormalize the k selected weights to sum to 1."""
    routed_scaling_factor: PositiveFloat = 1.0
    """Multiplies the routed experts' output (not the shared experts')."""
    rounding: RouterRoundingName = "none"
    """What the router rounds to target.dtype, as a router computing in that dtype does. none:
    logits, scores and weights in fp32 (DeepSeek-V3's reference); logits: the gate GEMM's output
    rounded, scores and weights in fp32 from it (transformers' Mixtral, Qwen3-MoE, MiniMax-M2
    routers); all: the logits, each step of the scoring (sqrt(softplus(x)) rounds twice) and the
    weights' sum, division and scaling, the bias-corrected choice in fp32 (transformers'
    DeepSeek-V4 and Mistral-4 routers). With target.dtype = float32 every value is fp32
    already. docs/numerics.md, "Router rounding"."""


class Quant(Table):
    """Quantization of the expert weights and of the activations entering the expert GEMMs."""

    scheme: QuantScheme = "bf16"
    """bf16: no quantization; fp8_per_tensor: e4m3 with one scale per tensor; fp8_block: e4m3
    with 128x128 weight blocks and 1x128 activation groups (DeepSeek-V3); mxfp8: e4m3 with 1x32
    UE8M0 scales; mxfp4: e2m1 weights with 1x32 UE8M0 scales and mxfp8 activations."""
    weight_block: list[PositiveInt] | None = None
    """[block_n, block_k] of the weight scales; default [128, 128] for fp8_block and [1, 32]
    for mxfp8 / mxfp4; must be absent for bf16 and fp8_per_tensor."""
    activation_scheme: ActivationSchemeName = "dynamic"
    """dynamic: activation scales computed per forward; static: fixed scales from the
    checkpoint (`input_scale`), fp8_per_tensor only."""
    scale_dtype: ScaleDtypeName | None = None
    """Scale format: fp32, or UE8M0 (powers of two). Default: ue8m0 for mxfp8 / mxfp4 and for
    fp8_block on deep_gemm sm100, fp32 otherwise."""
    checkpoint: CheckpointFormatName = "quantized"
    """Format of the checkpoint `load_weights` reads: bf16 (quantized on load) or already
    quantized in this scheme (with `weight_scale_inv`). Ignored for scheme = bf16."""
    shared_scheme: QuantScheme | None = None
    """Scheme of the shared experts; default: the routed scheme, except fp8_block for mxfp4
    (as DeepSeek-V4 checkpoints store them)."""


class Silu(Table):
    """SwiGLU: silu(gate) * up."""

    kind: Literal["silu"] = "silu"
    """Which gated activation; the other keys of [activation] depend on it."""


class SiluClamped(Table):
    """SwiGLU with gate clamped to at most swiglu_limit and up to [-limit, limit]."""

    kind: Literal["silu_clamped"]
    """Which gated activation; the other keys of [activation] depend on it."""
    swiglu_limit: PositiveFloat
    """Clamp bound (DeepSeek-V4 uses 10.0)."""


class OaiSwiglu(Table):
    """GPT-OSS SwiGLU: (clamp(up) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)."""

    kind: Literal["oai_swiglu"]
    """Which gated activation; the other keys of [activation] depend on it."""
    alpha: PositiveFloat = 1.702
    """Slope inside the sigmoid (`gemm1_alpha`)."""
    limit: PositiveFloat = 7.0
    """Clamp bound (`gemm1_clamp_limit`)."""


class Situ(Table):
    """SiTU: beta*tanh(gate/beta)*sigmoid(gate) * linear_beta*tanh(up/linear_beta)."""

    kind: Literal["situ"]
    """Which gated activation; the other keys of [activation] depend on it."""
    beta: PositiveFloat
    """Soft cap of the gate branch."""
    linear_beta: PositiveFloat
    """Soft cap of the up branch."""


Activation = Annotated[Silu | SiluClamped | OaiSwiglu | Situ, Field(discriminator="kind")]


class Experts(Table):
    """How the routed experts run."""

    gemm_backend: GemmBackendChoice = "auto"
    """Grouped GEMM implementation; auto picks from the target and what is installed."""
    layout: LayoutChoice = "auto"
    """contiguous: rows grouped by expert, padded per expert; masked: [E, max_m, H] per
    expert with valid-row counts. auto: masked when its peak memory at max_num_tokens fits
    masked_memory_budget_gib."""
    masked_memory_budget_gib: PositiveFloat | None = None
    """Memory the masked layout may take; default 20% of the target's device memory."""
    shared_experts: SharedExpertsChoice = "auto"
    """separate: a dense MLP beside the routed experts; fused: appended as extra experts that
    every token selects with weight 1; overlapped: separate, on a second CUDA stream from the
    start of the forward, so that they run while the router, the selection and the dispatch do
    (on a CPU: in order); auto: fused where the GEMM backend is triton or deep_gemm and the
    rules allow it (the shared experts in the routed scheme, no EP or TP), else separate."""


class Parallel(Table):
    """How the layer is spread over ranks."""

    dispatch: DispatchModeName = "local"
    """local: one rank, or tensor parallel with an all-reduce; all2all: expert parallel over
    torch.distributed all_to_all; deepep_*: expert parallel through DeepEP."""
    tp_size: PositiveInt = 1
    """Tensor-parallel ranks: each holds a 1/tp_size slice of every expert's intermediate."""
    ep_size: PositiveInt = 1
    """Expert-parallel ranks: each holds n_routed_experts / ep_size whole experts."""
    max_tokens_per_rank: PositiveInt | None = None
    """Per-rank token bound of the dispatch buffers (DeepEP low-latency needs it)."""
    nodes: PositiveInt = 1
    """Nodes the tp_size * ep_size ranks span, evenly: ranks of one node talk over NVLink,
    ranks of different nodes over the NIC (the cost model uses both)."""
    nic_bandwidth_gbs: Bandwidth | None = None
    """One-way network bandwidth per GPU between nodes, GB/s; default the device table's."""
    redundant_experts: Count = 0
    """Physical experts beyond the n_routed_experts logical ones: replicas of hot experts (as
    SGLang's ep_num_redundant_experts), spread over the expert-parallel ranks, each rank holding
    (n_routed_experts + redundant_experts) / ep_size."""
    placement: Literal["even"] | list[list[Count]] | str = "even"
    """Which logical expert each rank's physical experts hold. "even": rank r holds experts
    r * E/ep_size .. in order, the replicas after them round-robin; a list of ep_size lists
    (each rank's experts, equal lengths); or the path of a JSON file written by `moec eplb`
    (relative to the spec's folder), read into the spec."""
    replica_choice: ReplicaChoiceName = "static"
    """Which replica of an expert a token goes to. static: one fixed replica per rank (its own
    rank's, else one of its node's, else one spread by rank); random: a deterministic hash of
    the token's position and top-k slot picks one (SGLang's dynamic dispatch)."""
    record_load: bool = False
    """Count the tokens routed to each logical expert in a device tensor the layer adds to on
    every forward (no host sync; `expert_load()`, `reset_expert_load()`,
    `write_expert_load(path)`), for `moec eplb`."""


class Target(Table):
    """Where the generated layer runs."""

    device: DeviceKindName = "cpu"
    """Device the layer runs on."""
    arch: Arch | None = None
    """CUDA architecture (sm90 = Hopper, sm100 = Blackwell); default sm90 for cuda."""
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """Dtype of the layer's input, output and unquantized weights."""
    max_num_tokens: PositiveInt = 4096
    """Largest T one forward takes on one rank; sizes buffers and the layout choice."""
    gpu: (
        Annotated[
            str,
            Field(
                json_schema_extra={
                    "pattern": f"^{GPU_NAME}$",
                    "maxLength": GPU_NAME_LENGTH,
                }
            ),
        ]
        | None
    ) = None
    """The GPU whose tuned Triton tiles the build uses, as `moec tune` names it (lowercase,
    hyphens: nvidia-h100-80gb-hbm3); default: the GPU the arch's shipped table was tuned on
    (sm90: nvidia-h200). Tables are looked up in MOEC_TUNING_DIR (default ~/.cache/moec/tuned)
    first, then among those moec ships."""

    @field_validator("gpu")
    @classmethod
    def _gpu_is_a_slug(cls, value: str | None) -> str | None:
        if value is not None and (
            len(value) > GPU_NAME_LENGTH or not re.fullmatch(GPU_NAME, value)
        ):
            raise ValueError(
                f"must be a GPU name as `moec tune` writes it: lowercase letters and digits in "
                f"words joined by single hyphens, at most {GPU_NAME_LENGTH} characters (e.g. "
                "nvidia-h100-80gb-hbm3)"
            )
        return value


class Spec(Table):
    """One DeepSeek-style MoE layer, as moec compiles it."""

    name: str
    """ASCII identifier naming the generated package, importable by that name (at most 100
    characters, no keyword, no dunder such as __main__), and not the name of a module it would
    shadow: the standard library, what generated packages import directly or through torch
    (torch, triton, numpy, safetensors, typing_extensions, sympy, jinja2, ...), or the top-level
    module of a distribution installed where moec runs."""
    description: str = ""
    """Free text, copied into the generated package's docstring as a literal."""
    model: Model
    router: Router = Router()
    quant: Quant = Quant()
    activation: Activation = Silu()
    experts: Experts = Experts()
    parallel: Parallel = Parallel()
    target: Target = Target()

    @field_validator("name")
    @classmethod
    def _name_is_a_package_name(cls, value: str) -> str:
        reason = package_name_problem(value)
        if reason:
            raise ValueError(reason)
        return value


def package_name_problem(name: str) -> str:
    """Why `name` cannot name a generated package ("" when it can)."""
    if not IDENTIFIER.match(name) or keyword.iskeyword(name):
        return (
            "must be an ASCII Python identifier that is not a keyword "
            "(letters, digits and _, not starting with a digit)"
        )
    if len(name) > MAX_NAME_LENGTH:
        return f"is {len(name)} characters long (a package name, at most {MAX_NAME_LENGTH})"
    if name.startswith("__") and name.endswith("__"):
        return (
            f"a dunder name is Python's, not importable as a package (e.g. {name.strip('_')}_moe)"
        )
    if name in SHADOWED or name in installed_modules():
        if name in STANDARD_LIBRARY:
            whose = "standard library"
        elif name in STARTUP_MODULES:
            whose = "imported by Python's site module at every start"
        elif name in IMPORTED_BY_PACKAGES:
            whose = "imported by generated packages, directly or through torch"
        else:
            whose = "installed here"
        return (
            f"would shadow the Python module {name} ({whose}) wherever the generated package "
            f"is imported (another name, e.g. {name}_moe)"
        )
    return ""


@functools.cache
def installed_modules() -> frozenset[str]:
    """Top-level modules of the distributions installed in this environment."""
    try:
        return frozenset(importlib.metadata.packages_distributions())
    except Exception:  # a broken distribution's metadata must not break validation
        return frozenset()
