"""The other DeepSeek-style MoE model types of transformers, end to end against transformers'
own block: copies of DeepseekV3MoE / Glm4MoeMoE under other names and key names (dots1,
GLM-4.7-Flash, GLM-5, Solar-Open, Kimi-Linear, Ling, MiMo-V2-Flash, EXAONE-MoE, Sarvam, A.X-K2),
the same router written otherwise (AFMoE, MiniMax-M2, HY-V3), softmax top-k with a shared expert
(Hunyuan, Mistral-4), SwiGLU clamped (GLM-5-Next) and the vision models whose text_config holds
one (GLM-4.5V, GLM-4.6V, GLM-5-Next, Mistral-Large-4, DeepSeek-OCR-2's and Unlimited-OCR's
DeepSeek-V2). Then the refusals: model
types moec cannot compute, and keys that change the math, each named.

Each tiny random model is saved with `save_pretrained` (every MoE tensor random, as in
tests/hf_oracle.py); `moec init --from-hf` reads its config.json and the layer's `load_weights`
its safetensors (the names transformers writes: Kimi-Linear's block_sparse_moe.experts.<e>.w1,
Ling's gate.expert_bias, AFMoE's router.gate.weight, Hunyuan's gate.wg ...), checked against transformers' block;
then `patch_model` replaces every MoE block of the model loaded back.

Tolerances, float32 (u = 2**-24), as in test_integration_families.py: one block, 2u (H + I + K
+ S) of its largest output. Logits: 2u N of the largest logit, N bounding the terms of every sum
from the first MoE block to a logit: per later layer the input widths of all its linear maps
(every projection of every attention kind, each expert's counted once), the sums over the
sequence, the norms; then the final norm and the head.
"""

from __future__ import annotations

import re

import hf_oracle
import pytest
import torch
from test_integration_families import _block_bound

import moec
from moec.integrations.transformers import patch_model
from moec.spec import load_spec

U32 = 2.0**-24
_MOE = dict(
    moe_intermediate_size=32, num_experts_per_tok=4, norm_topk_prob=True, routed_scaling_factor=2.5
)
_DIMS = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=64,
    num_hidden_layers=2,
)
_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
_MLA = dict(q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
_GROUPED = dict(n_routed_experts=16, n_shared_experts=1, n_group=4, topk_group=2)
_LINEAR = dict(  # Kimi-Linear's and Ling's own key names (their config.json's)
    num_experts=16,
    num_shared_experts=1,
    num_expert_group=4,
    topk_group=2,
    linear_num_heads=2,
    linear_head_dim=16,
    head_dim=16,
    layer_types=["linear_attention", "full_attention"],
    **_IDS,
)
_GLM4V_TEXT = dict(
    **_DIMS,
    **_MOE,
    **_GROUPED,
    first_k_dense_replace=1,
    head_dim=32,
    model_type="glm4v_moe_text",
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": [2, 3, 3],
        "partial_rotary_factor": 0.5,
    },
)
_GLM4V_VISION = dict(
    depth=1,
    hidden_size=32,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=64,
    patch_size=14,
    spatial_merge_size=2,
)
_GLM5_NEXT_TEXT = dict(
    **_DIMS,
    **_MOE,
    **_GROUPED,
    **{**_MLA, "qk_rope_head_dim": 0, "qk_nope_head_dim": 16},  # its indexed attention: NoPE
    **_IDS,
    swiglu_limit=1.0,  # inside the pre-activations' range (about N(0, 1)): the clamp acts
    index_topk=4,
    index_kpool=2,
    index_head_dim=16,
    index_n_heads=2,
    hc_mult=2,
    linear_num_heads=2,
    linear_head_dim=16,
    mlp_layer_types=["dense", "sparse"],
    layer_types=["linear_attention", "indexed_attention"],
)
_OCR_VISION = dict(  # DeepSeek-OCR-2's and Unlimited-OCR's: SAM and a Qwen2 encoder
    sam_config=dict(
        hidden_size=32,
        output_channels=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=64,
        window_size=2,
        global_attn_indexes=[0],
        downsample_channels=[16, 32],
    ),
    encoder_config=dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    ),
)
CONFIGS = {
    "dots1": dict(**_DIMS, **_MOE, **_GROUPED, first_k_dense_replace=1),
    "glm4_moe_lite": dict(**_DIMS, **_MOE, **_MLA, **_GROUPED, mlp_layer_types=["dense", "sparse"]),
    "glm_moe_dsa": dict(
        **_DIMS,
        **_MOE,
        **_MLA,
        **_GROUPED,
        first_k_dense_replace=1,
        index_topk=4,
        index_head_dim=16,
        index_n_heads=2,
        head_dim=16,
    ),
    "solar_open": dict(**_DIMS, **_MOE, **_GROUPED, head_dim=32),
    "kimi_linear": dict(**_DIMS, **_MOE, **_MLA, **_LINEAR),
    "bailing_hybrid": dict(**_DIMS, **_MOE, **_MLA, **_LINEAR, first_k_dense_replace=1),
    "mimo_v2_flash": dict(  # sliding-window layers hold twice the KV heads
        **{**_DIMS, "num_attention_heads": 4, "num_key_value_heads": 1},
        **_MOE,
        n_routed_experts=16,
        n_group=4,
        topk_group=2,
        head_dim=32,
        v_head_dim=32,
        layer_types=["full_attention", "sliding_attention"],
        sliding_window=4,
    ),
    "exaone_moe": dict(
        **_DIMS, **_MOE, num_experts=16, num_shared_experts=1, n_group=4, topk_group=2
    ),
    "sarvam_mla": dict(**_DIMS, **_MOE, **_MLA, **_GROUPED),
    "sarvam_moe": dict(**_DIMS, **_MOE, **_GROUPED, head_dim=32),
    "afmoe": dict(
        **_DIMS,
        moe_intermediate_size=32,
        num_experts_per_tok=4,
        num_experts=16,
        num_shared_experts=2,
        route_scale=2.5,
        num_dense_layers=1,
        head_dim=32,
    ),
    "minimax_m2": dict(  # intermediate_size: the experts' width; every layer MoE
        **{**_DIMS, "intermediate_size": 32},
        num_local_experts=16,
        num_experts_per_tok=4,
        head_dim=32,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "axk2": dict(**_DIMS, **_MOE, **_MLA, n_routed_experts=16, n_shared_experts=1),  # ungrouped
    "hy_v3": dict(
        **_DIMS,
        moe_intermediate_size=32,
        num_experts_per_tok=4,
        num_experts=16,
        num_shared_experts=1,
        router_scaling_factor=2.5,
        head_dim=32,
        mlp_layer_types=["dense", "sparse"],
    ),
    "mistral4": dict(**_DIMS, **_MOE, **_MLA, n_routed_experts=16, n_shared_experts=1),
    "mistral_large4": dict(
        text_config=dict(**_DIMS, **_MOE, **_MLA, n_routed_experts=16, n_shared_experts=1),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=16,
            head_dim=16,
        ),
    ),
    "unlimited_ocr": dict(  # DeepSeek-OCR-2's text model again
        vision_config=_OCR_VISION,
        text_config=dict(
            **_DIMS,
            **{**_MOE, "norm_topk_prob": False},
            n_routed_experts=16,
            n_shared_experts=2,
            topk_method="greedy",
            mlp_layer_types=["dense", "sparse"],
        ),
    ),
    "hunyuan_v1_moe": dict(  # intermediate_size: the experts' and the shared expert's width
        **{**_DIMS, "intermediate_size": 32}, num_experts=16, moe_topk=4, head_dim=32
    ),
    "glm4v_moe": dict(text_config=_GLM4V_TEXT, vision_config=_GLM4V_VISION),
    "glm46v": dict(
        text_config=_GLM4V_TEXT, vision_config={**_GLM4V_VISION, "model_type": "glm4v_vision"}
    ),
    "glm5_next": dict(
        text_config=_GLM5_NEXT_TEXT,
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2),
    ),
    "deepseek_ocr2": dict(  # a DeepSeek-V2 MoE (softmax, greedy) behind a SAM + Qwen2 encoder
        text_config=dict(
            **_DIMS,
            **{**_MOE, "norm_topk_prob": False},
            n_routed_experts=16,
            n_shared_experts=2,
            topk_method="greedy",
            mlp_layer_types=["dense", "sparse"],
        ),
        vision_config=_OCR_VISION,
    ),
}
IMAGE_TEXT = ("glm4v_moe", "glm46v", "glm5_next", "deepseek_ocr2", "unlimited_ocr")
IMAGE_TEXT += ("mistral_large4", "mistral4")
"""Image-text-to-text models (the MoE in text_config; Mistral-4's causal LM is one too)."""
NAME = "name=tiny_moe"
"""One spec name for init's and patch_model's specs: models of the same MoE math share builds."""


def _model_class(model_type: str):
    import transformers

    if model_type in IMAGE_TEXT:
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


def _save(model_type: str, folder) -> None:
    """The tiny model, every MoE tensor random (as hf_oracle.save_model), saved."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, **CONFIGS[model_type])
    torch.manual_seed(0)
    model = _model_class(model_type).from_config(config, torch_dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if ".mlp." in name and tensor.is_floating_point() and tensor.numel():
                fan_in = tensor.shape[-1] if tensor.dim() > 1 else 1
                scale = 1.0 / fan_in**0.5 if tensor.dim() > 1 else 0.05
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * scale)
    model.eval().save_pretrained(folder)


def _load(model_type: str, folder):
    return _model_class(model_type).from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def saved(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"hf_{request.param}")
    _save(request.param, folder)
    return request.param, folder


def _checkpoint(folder, name: str):
    """(the block's tensors in the saved file, their prefix): the file, except for Mistral's
    own layout, which transformers writes for Mistral-Large-4, the MoE's tensors beside the
    attention's under layers.<i>.: those are picked out by name, as its users must."""
    from safetensors.torch import load_file

    prefix = _checkpoint_prefix(folder, name)
    path = folder / "model.safetensors"
    if not re.fullmatch(r"layers\.\d+\.", prefix):
        return path, prefix
    moe = re.compile(rf"{re.escape(prefix)}(gate|experts|shared_experts)\.")
    return {key: value for key, value in load_file(path).items() if moe.match(key)}, prefix


def _checkpoint_prefix(folder, name: str) -> str:
    """The prefix of the block's tensors in the saved file (transformers writes some under the
    checkpoints' own names: block_sparse_moe, router.gate)."""
    from safetensors import safe_open

    layer = name.split(".")[-2]
    pattern = rf"(^|\.)layers\.{layer}\.([a-z_]+\.)?(router\.)?gate\.(wg\.)?weight$"
    with safe_open(folder / "model.safetensors", "pt") as handle:
        found = [key for key in handle.keys() if re.search(pattern, key)]
    assert len(found) == 1, found
    return re.sub(r"(router\.)?gate\.(wg\.)?weight$", "", found[0])


def summed_terms(model, moe, first: str, seq_len: int) -> int:
    """Bounds the terms of the sums from MoE block `first`'s input to a logit (module doc);
    `moe`: the spec's model table (H, I, K)."""
    config = model.config.get_text_config()
    block = moe.hidden_size + moe.moe_intermediate_size + moe.num_experts_per_tok + 1
    layers = first.rsplit(".", 2)[0]  # "....layers"
    start = int(first.split(".")[-2])
    terms = block
    for index in range(start + 1, config.num_hidden_layers):
        layer = model.get_submodule(f"{layers}.{index}")
        linear = sum(
            module.in_features
            for name, module in layer.named_modules()
            if isinstance(module, torch.nn.Linear) and ".experts." not in f".{name}."
        )
        terms += linear + block + 4 * seq_len + 4 * config.hidden_size
    return terms + 2 * config.hidden_size  # final norm, lm_head


def test_init_load_weights_and_patch_model_give_transformers(saved, cache_dir):
    """init on config.json, load_weights from model.safetensors: one block as transformers';
    patch_model on the whole model: logits within the float32 bound, the same greedy tokens,
    no transformers block left."""
    model_type, folder = saved
    reference = _load(model_type, folder)
    text = reference.config.get_text_config()
    spec = hf_oracle.init_spec(folder, "--set", NAME)
    package = moec.load(spec, cache_dir=cache_dir)
    dims = load_spec(spec).spec.model  # H, I, K, S under moec's names, for the bounds
    names = hf_oracle.moe_names(reference)
    block = reference.get_submodule(names[0])
    source, prefix = _checkpoint(folder, names[0])
    layer = package.MoELayer(device="cpu").load_weights(source, prefix)
    x = torch.randn(11, text.hidden_size, generator=torch.Generator().manual_seed(1))
    expected = hf_oracle.oracle(block, x)
    error = (layer(x) - expected).abs().max().item()
    assert error <= _block_bound(dims) * expected.abs().max().item()

    model = _load(model_type, folder)
    patch_model(model, overrides=[NAME], cache_dir=cache_dir)
    assert not [name for name in model.state_dict() if "gate_up_proj" in name]
    kinds = {type(model.get_submodule(name)).__name__ for name in names}
    assert kinds == {"MoecMoE"}
    tokens = hf_oracle.tokens(3)
    with torch.no_grad():
        expected, logits = reference(input_ids=tokens).logits, model(input_ids=tokens).logits
    bound = 2 * U32 * summed_terms(model, dims, names[0], tokens.shape[1])
    assert (logits - expected).abs().max().item() <= bound * expected.abs().max().item()
    kwargs = dict(attention_mask=torch.ones_like(tokens), max_new_tokens=2, do_sample=False)
    assert torch.equal(model.generate(tokens, **kwargs), reference.generate(tokens, **kwargs))


# --- config.json as the released checkpoints write them, and the refusals ---------------------

KIMI_LINEAR = {  # moonshotai/Kimi-Linear-48B-A3B-Instruct's MoE keys
    "model_type": "kimi_linear",
    "hidden_size": 2304,
    "moe_intermediate_size": 1024,
    "num_experts": 256,
    "num_experts_per_token": 8,
    "num_shared_experts": 1,
    "moe_renormalize": True,
    "num_expert_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.446,
    "moe_router_activation_func": "sigmoid",
    "torch_dtype": "bfloat16",
}
MINIMAX_M2 = {  # MiniMaxAI/MiniMax-M2's: intermediate_size is the experts' width
    "model_type": "minimax_m2",
    "hidden_size": 3072,
    "intermediate_size": 1536,
    "num_local_experts": 256,
    "num_experts_per_tok": 8,
    "scoring_func": "sigmoid",
    "use_routing_bias": True,
    "shared_intermediate_size": 0,
    "torch_dtype": "bfloat16",
}
GLM5_NEXT_TEXT = {  # swiglu_limit left out: transformers' 10
    "model_type": "glm5_next_text",
    "hidden_size": 4096,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 288,
    "num_experts_per_tok": 8,
    "routed_scaling_factor": 2.5,
}


def _spec(tmp_path, capsys, config):
    from test_spec_hf import init, write_config

    from moec.spec import load_spec

    spec_path = tmp_path / "spec.toml"
    code, _, err = init(
        capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path)
    )
    assert (code, err) == (0, "")
    return load_spec(spec_path).spec


def _refused(tmp_path, capsys, config) -> str:
    from test_spec_hf import init, write_config

    config_path = write_config(tmp_path, config)
    code, out, err = init(capsys, "--from-hf", str(config_path))
    assert (code, out) == (2, "")
    assert err.startswith(str(config_path)) and "Traceback" not in err
    return err


def test_family_key_names_and_defaults(tmp_path, capsys):
    """Each family's own names of the MoE keys are read, and a key left out takes its model
    type's default (GLM-5-Next's clamp at 10, its scaling, one shared expert)."""
    spec = _spec(tmp_path, capsys, KIMI_LINEAR)
    assert (spec.model.n_routed_experts, spec.model.num_experts_per_tok) == (256, 8)
    assert (spec.model.n_shared_experts, spec.router.routed_scaling_factor) == (1, 2.446)
    assert (spec.router.scoring_func, spec.router.topk_method) == ("sigmoid", "noaux_tc")
    spec = _spec(tmp_path, capsys, MINIMAX_M2)
    assert (spec.model.moe_intermediate_size, spec.model.n_routed_experts) == (1536, 256)
    assert (spec.model.n_shared_experts, spec.router.norm_topk_prob) == (0, True)
    spec = _spec(tmp_path, capsys, {"model_type": "glm5_next", "text_config": GLM5_NEXT_TEXT})
    assert (spec.activation.kind, spec.activation.swiglu_limit) == ("silu_clamped", 10.0)
    assert (spec.model.n_shared_experts, spec.router.routed_scaling_factor) == (1, 2.5)
    afmoe = {
        "model_type": "afmoe",
        "hidden_size": 2048,
        "moe_intermediate_size": 256,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "route_scale": 2.826,
    }
    spec = _spec(tmp_path, capsys, afmoe)
    assert (spec.model.n_shared_experts, spec.router.routed_scaling_factor) == (2, 2.826)


@pytest.mark.parametrize(
    "model_type",
    ["longcat_flash", "ernie4_5_moe", "step3p7", "youtu", "axk1", "hy_v4", "kolibri1"],
)
def test_refused_model_types_are_named(model_type, tmp_path, capsys):
    err = _refused(tmp_path, capsys, {"model_type": model_type, "hidden_size": 64})
    reason = {
        "longcat_flash": "zero-computation (identity) experts (zero_expert_num)",
        "ernie4_5_moe": "softmax scores plus a correction bias",
        "step3p7": "clamps its SwiGLU after the activation",
        "youtu": "has no MoE layer",
        "axk1": "normalizes the MoE block's output (post_mlp_layernorm)",
        "hy_v4": "clamps the routed experts' SwiGLU (swiglu_limit) and not the shared",
        "kolibri1": "on the router logits plus a correction bias, before the sigmoid",
    }[model_type]
    assert f'model_type = "{model_type}": is an MoE moec does not compute: {model_type} ' in err
    assert reason in err


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**MINIMAX_M2, "use_routing_bias": False}, "use_routing_bias = false: is a router"),
        (
            {**MINIMAX_M2, "shared_intermediate_size": 1536},
            "shared_intermediate_size = 1536: asks for a shared expert",
        ),
        (
            {**KIMI_LINEAR, "model_type": "mimo_v2_flash", "n_shared_experts": 1},
            "n_shared_experts = 1: asks for shared experts, which MiMo-V2-Flash's",
        ),
        (
            {**KIMI_LINEAR, "model_type": "deepseek_v2", "mlp_bias": True},
            "mlp_bias = true: gives the shared experts' projections biases",
        ),
        (
            {
                "model_type": "deepseek_ocr2",
                "text_config": {
                    **KIMI_LINEAR,
                    "model_type": "deepseek_ocr2_text",
                    "mlp_bias": True,
                },
            },
            "text_config.mlp_bias = true: gives",
        ),
        (
            {**KIMI_LINEAR, "model_type": "sarvam_mla", "n_routed_experts": 128},
            "num_experts = 256: says otherwise than n_routed_experts = 128: two names of one key",
        ),
        (
            {**KIMI_LINEAR, "model_type": "mistral4", "n_group": 8, "topk_group": 4},
            "n_group = 8: ranks expert groups by the sum of their top-2 softmax scores",
        ),
        (
            {**KIMI_LINEAR, "model_type": "axk2", "n_group": 8, "topk_group": 4},
            "n_group = 8: masks the groups left out to 0, not -inf",
        ),
        (  # Hunyuan-A13B's per-layer lists: transformers' block takes one top-k
            {"model_type": "hunyuan_v1_moe", "moe_topk": [8, 8], "num_experts": 64},
            "moe_topk = [8, 8]: is a list of integers, not an integer",
        ),
        (
            {"model_type": "glm46v", "text_config": {"hidden_size": 64}},
            "text_config.model_type: absent, so the text model of glm46v is glm4v_text, which "
            "has no MoE layers",
        ),
    ],
)
def test_keys_that_change_the_math_are_refused_by_name(config, message, tmp_path, capsys):
    assert message in _refused(tmp_path, capsys, config)


def test_patch_model_names_a_refused_model_type():
    from transformers import AutoConfig, AutoModelForCausalLM

    from moec.errors import MoecError

    config = AutoConfig.for_model("ernie4_5_moe", **_DIMS, moe_num_experts=4, moe_k=2)
    with pytest.raises(MoecError) as error:
        patch_model(AutoModelForCausalLM.from_config(config))
    report = error.value.report()
    assert (
        "model: is of model type ernie4_5_moe, an MoE moec does not compute: ernie4_5_moe "
        in report
    )
    assert "softmax scores plus a correction bias" in report
