"""`moec init --from-hf` follows what transformers' MoE block computes for a config's
swiglu_limit.

A DeepSeek-V3 config.json that carries swiglu_limit: transformers' DeepseekV3MoE never reads
it (nor does DeepSeek's own V3 code), and patch_model followed the block, while init wrote a
clamped activation, so the spec init wrote computed otherwise than the model it came from
(and patch_model refused it). Now init writes silu and says, in a comment, which key it did not
follow and why; patch_model(router_keys="config") still clamps, as SGLang's runner does.

Tolerances, float32 (u = 2**-24), as in test_hf_more_families.py: one block, 2u (H + I + K +
S) of its largest output.
"""

from __future__ import annotations

import warnings

import hf_oracle
import pytest
import torch
from test_hf_more_families import _checkpoint
from test_integration_families import _block_bound

import moec
from moec.integrations.transformers import patch_model, spec_for_model
from moec.spec import load_spec

TORCH = "experts.gemm_backend=torch"


@pytest.fixture(scope="module")
def clamped_v3(tmp_path_factory):
    """A tiny DeepSeek-V3 saved with swiglu_limit 1.0, inside the pre-activations' range (about
    N(0, 1)): a clamp would act."""
    config = hf_oracle.deepseek_v3()
    config.swiglu_limit = 1.0
    return hf_oracle.saved_folder(tmp_path_factory, "v3_swiglu_limit", config)


def _load(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_init_on_a_v3_config_with_swiglu_limit_computes_the_v3_block(clamped_v3, cache_dir):
    """init wrote silu_clamped (the layer 'clamped where transformers does not', its output
    off); now silu, as DeepseekV3MoE computes, with a comment naming the key; patch_model takes
    that spec without a word and leaves the model computing what it did."""
    spec = hf_oracle.init_spec(clamped_v3, "--set", TORCH)
    text = open(spec).read()
    assert "# swiglu_limit = 1.0 is not followed: transformers' deepseek_v3 MoE block" in text
    loaded = load_spec(spec).spec
    assert loaded.activation.kind == "silu"
    reference = _load(clamped_v3)
    name = hf_oracle.moe_names(reference)[0]
    source, prefix = _checkpoint(clamped_v3, name)
    layer = moec.load(spec, cache_dir=cache_dir).MoELayer(device="cpu").load_weights(source, prefix)
    x = 3 * torch.randn(11, loaded.model.hidden_size, generator=torch.Generator().manual_seed(1))
    expected = hf_oracle.oracle(reference.get_submodule(name), x)
    error = (layer(x) - expected).abs().max().item()
    assert error <= _block_bound(loaded.model) * expected.abs().max().item()

    model = _load(clamped_v3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RouterKeysIgnored: the spec agrees with the block
        patch_model(model, spec, cache_dir=cache_dir)
    assert type(model.get_submodule(name)).__name__ == "MoecMoE"


def test_router_keys_config_still_clamps_as_sglang_does(clamped_v3):
    """patch_model(router_keys="config") reads the config as SGLang's runner does: clamped."""
    config = _load(clamped_v3).config
    loaded = spec_for_model(config, torch.float32, torch.device("cpu"))
    assert (loaded.spec.activation.kind, loaded.spec.activation.swiglu_limit) == (
        "silu_clamped",
        1.0,
    )


def test_a_swiglu_limit_nobody_reads_is_not_checked(tmp_path, capsys):
    """A Kimi-K2.5 (DeepSeek-V3 text model) whose text_config writes swiglu_limit as a string:
    init refused it ('is a string'), though no block reads it; now the spec is silu and the
    comment names the key where it is (without a value that is no number)."""
    from test_spec_hf import init, write_config
    from test_spec_hf_families import KIMI_K25

    config = {**KIMI_K25, "text_config": {**KIMI_K25["text_config"], "swiglu_limit": "10"}}
    spec_path = tmp_path / "spec.toml"
    code, _, err = init(
        capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path)
    )
    assert (code, err) == (0, "")
    assert "# text_config.swiglu_limit is not followed: " in spec_path.read_text()
    assert load_spec(spec_path).spec.activation.kind == "silu"


# --- the MoE model types of transformers that were refused as "not checked" ---------------
#
# Each tiny random model is saved with `save_pretrained` (every tensor of its MoE blocks random:
# hf_oracle.save_model randomizes those under .mlp. only, and these models name their blocks
# block_sparse_moe or feed_forward); `moec init --from-hf` reads its config.json, the layer's
# `load_weights` its safetensors (Granite's under input_linear / output_linear / router.layer,
# as transformers writes them), and `patch_model` replaces every MoE block of the model loaded
# back. Tolerances as above; logits, 2u N of the largest logit (`summed_terms`). Where the model
# mixes MoE layers with others (Jamba's expert_layer_period, LFM2-MoE's num_dense_layers), the
# others are transformers' own.

U32 = 2.0**-24
_DIMS = dict(
    vocab_size=64,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=64,
    num_experts_per_tok=2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
_GRANITE = dict(_DIMS, intermediate_size=32, num_local_experts=8)


def _config(model_type: str, **keys):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **keys)


MODELS = {
    # the softmax of the top-k logits (the renormalized top-k of the softmax); the shared MLP
    # of granitemoeshared / _swa / hybrid is the decoder layer's, beside the block
    "granitemoe": lambda: _config("granitemoe", **_GRANITE),
    "granitemoe_swa": lambda: _config(
        "granitemoe_swa", **_GRANITE, shared_intermediate_size=48, sliding_window=4
    ),
    "granitemoeshared": lambda: _config(
        "granitemoeshared", **_GRANITE, shared_intermediate_size=48
    ),
    "granitemoehybrid": lambda: _config(  # a Mamba-2 layer, then an attention one, both MoE
        "granitemoehybrid",
        **_GRANITE,
        shared_intermediate_size=48,
        layer_types=["mamba", "attention"],
        mamba_n_heads=4,
        mamba_d_head=32,
        mamba_d_state=16,
        mamba_chunk_size=8,
    ),
    # the top-k of the softmax, never renormalized; MoE on layer 1 only (a Mamba layer),
    # layer 0 attention with a dense MLP
    "jamba": lambda: _config(
        "jamba",
        **_DIMS,
        intermediate_size=32,
        num_experts=8,
        attn_layer_period=2,
        attn_layer_offset=0,
        expert_layer_period=2,
        expert_layer_offset=1,
        mamba_d_state=8,
        mamba_dt_rank=8,
    ),
    # sigmoid scores plus the correction bias (noaux_tc, one group), weights left as scores
    # (norm_topk_prob false), scaled; layer 0 a dense short-conv layer
    "lfm2_moe": lambda: _config(
        "lfm2_moe",
        **_DIMS,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_experts=8,
        num_dense_layers=1,
        layer_types=["conv", "full_attention"],
        norm_topk_prob=False,
        routed_scaling_factor=1.5,
    ),
    "flex_olmo": lambda: _config(
        "flex_olmo", **_DIMS, intermediate_size=32, num_experts=8, norm_topk_prob=True
    ),
    "mellum": lambda: _config(
        "mellum",
        **_DIMS,
        head_dim=32,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_local_experts=8,
    ),
    # Mixtral's block, after a lightning (linear) attention layer and a full one
    "minimax": lambda: _config(
        "minimax",
        **_DIMS,
        head_dim=32,
        intermediate_size=32,
        num_local_experts=8,
        layer_types=["linear_attention", "full_attention"],
    ),
}
ROUTERS = {
    "granitemoe": ("softmax", "greedy", True),
    "jamba": ("softmax", "greedy", False),
    "lfm2_moe": ("sigmoid", "noaux_tc", False),
    "flex_olmo": ("softmax", "greedy", True),
    "mellum": ("softmax", "greedy", True),
    "minimax": ("softmax", "greedy", True),
}
"""(scoring_func, topk_method, norm_topk_prob) init writes (Granite's copies as granitemoe)."""


def _blocks(model) -> list[str]:
    """The names of the model's MoE blocks (those patch_model replaces), in layer order."""
    from moec.integrations.transformers import moe_block_classes

    classes = moe_block_classes()
    return [name for name, module in model.named_modules() if isinstance(module, classes)]


def _save(config, folder) -> None:
    """Build the model, set every tensor of its MoE blocks random (as hf_oracle.save_model
    does), save it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name in _blocks(model):
            block = model.get_submodule(name)
            for tensor in list(block.parameters()) + list(block.buffers()):
                fan_in = tensor.shape[-1] if tensor.dim() > 1 else 1
                scale = 1.0 / fan_in**0.5 if tensor.dim() > 1 else 0.05
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * scale)
    model.eval().save_pretrained(folder)


@pytest.fixture(scope="module", params=sorted(MODELS))
def saved(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"hf_{request.param}")
    _save(MODELS[request.param](), folder)
    return request.param, folder


def _checkpoint_prefix(folder, name: str) -> str:
    """The prefix of block `name`'s tensors in the saved file: transformers writes some under
    the checkpoints' own names (Mixtral's and MiniMax's block_sparse_moe)."""
    import re

    from safetensors import safe_open

    layer = name.split(".")[-2]
    pattern = rf"^(model\.layers\.{layer}\.[a-z_]+\.)(gate|router|router\.layer)\.weight$"
    with safe_open(folder / "model.safetensors", "pt") as handle:
        found = [match.group(1) for key in handle.keys() if (match := re.match(pattern, key))]
    assert len(found) == 1, found
    return found[0]


def test_init_load_weights_and_patch_model_give_transformers(saved, cache_dir):
    """init on config.json, load_weights from model.safetensors: one block as transformers';
    patch_model on the whole model: logits within the float32 bound, the same greedy tokens.
    Each of these model types was refused as "not checked"."""
    from test_hf_more_families import summed_terms

    model_type, folder = saved
    reference = _load(folder)
    spec = hf_oracle.init_spec(folder, "--set", TORCH)
    loaded = load_spec(spec).spec
    router = loaded.router
    expected_router = ROUTERS.get(model_type, ROUTERS["granitemoe"])
    assert (router.scoring_func, router.topk_method, router.norm_topk_prob) == expected_router
    assert (loaded.model.n_shared_experts, router.n_group) == (0, 1)
    names = _blocks(reference)
    first = names[0]
    prefix = _checkpoint_prefix(folder, first)
    layer = moec.load(spec, cache_dir=cache_dir).MoELayer(device="cpu")
    layer.load_weights(folder / "model.safetensors", prefix)
    x = torch.randn(11, loaded.model.hidden_size, generator=torch.Generator().manual_seed(1))
    expected = hf_oracle.oracle(reference.get_submodule(first), x)
    error = (layer(x) - expected).abs().max().item()
    assert error <= _block_bound(loaded.model) * expected.abs().max().item()

    model = _load(folder)
    patch_model(model, overrides=[TORCH], cache_dir=cache_dir)
    assert {type(model.get_submodule(name)).__name__ for name in names} == {"MoecMoE"}
    tokens = hf_oracle.tokens(3)
    with torch.no_grad():
        expected, logits = reference(input_ids=tokens).logits, model(input_ids=tokens).logits
    bound = 2 * U32 * summed_terms(model, loaded.model, first, tokens.shape[1])
    assert (logits - expected).abs().max().item() <= bound * expected.abs().max().item()
    kwargs = dict(attention_mask=torch.ones_like(tokens), max_new_tokens=3, do_sample=False)
    assert torch.equal(model.generate(tokens, **kwargs), reference.generate(tokens, **kwargs))


def test_shared_mlp_beside_the_block_is_noted(tmp_path, capsys):
    """GraniteMoeShared's shared_mlp is the decoder layer's, added after the MoE block: the
    spec describes the block (no shared experts) and says so above its keys."""
    from test_spec_hf import init, write_config

    config = {"model_type": "granitemoeshared", **_GRANITE, "shared_intermediate_size": 48}
    spec_path = tmp_path / "spec.toml"
    code, _, err = init(
        capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path)
    )
    assert (code, err) == (0, "")
    assert "# shared_intermediate_size = 48 is the width of the decoder layer's shared_mlp" in (
        spec_path.read_text()
    )
    assert load_spec(spec_path).spec.model.n_shared_experts == 0


LFM2 = {
    "model_type": "lfm2_moe",
    "hidden_size": 64,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": False,
}


@pytest.mark.parametrize(
    ("bias", "method"), [(True, "noaux_tc"), (False, "greedy"), (None, "noaux_tc")]
)
def test_lfm2_moe_router_follows_use_expert_bias(bias, method, tmp_path, capsys):
    """use_expert_bias (transformers' default true) chooses on sigmoid + expert_bias; false,
    on the sigmoid scores alone: the plain top-k."""
    from test_spec_hf import init, write_config

    config = {**LFM2, **({} if bias is None else {"use_expert_bias": bias})}
    spec_path = tmp_path / "spec.toml"
    code, _, err = init(
        capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path)
    )
    assert (code, err) == (0, "")
    router = load_spec(spec_path).spec.router
    assert (router.scoring_func, router.topk_method, router.n_group) == ("sigmoid", method, 1)


@pytest.mark.parametrize(
    ("norm", "fragment"),
    [
        (True, "norm_topk_prob = true: renormalizes the top-k weights by their sum + 1e-6"),
        (None, "norm_topk_prob: absent, so transformers' default true, which renormalizes"),
    ],
)
def test_lfm2_moe_renormalized_is_refused_by_key(norm, fragment, tmp_path, capsys):
    """LFM2-MoE divides the top-k weights by sum + 1e-6 and moec by sum + 1e-20: refused by the
    key (as transformers' default is true, also when it is left out), never approximated."""
    from test_spec_hf import init, write_config

    config = {key: value for key, value in LFM2.items() if key != "norm_topk_prob"}
    if norm is not None:
        config["norm_topk_prob"] = norm
    code, out, err = init(capsys, "--from-hf", str(write_config(tmp_path, config)))
    assert (code, out) == (2, "") and "Traceback" not in err
    assert fragment in err and "moec has no such epsilon" in err


def test_patch_model_refuses_a_renormalized_lfm2_moe_unchanged():
    from transformers import AutoModelForCausalLM

    from moec.errors import MoecError

    config = MODELS["lfm2_moe"]()
    config.norm_topk_prob = True
    model = AutoModelForCausalLM.from_config(config)
    names = _blocks(model)
    with pytest.raises(MoecError, match=r"norm_topk_prob = true: renormalizes the top-k"):
        patch_model(model)
    assert {type(model.get_submodule(name)).__name__ for name in names} == {"Lfm2MoeSparseMoeBlock"}


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        (
            {"model_type": "granitemoehybrid", **_GRANITE, "num_local_experts": 0},
            "num_local_experts = 0: leaves the model no MoE layer: every layer's MLP is the dense",
        ),
        (
            {"model_type": "jamba", **_DIMS, "intermediate_size": 32, "num_experts": 1},
            "num_experts = 1: leaves the model no MoE layer: with one expert",
        ),
        (
            {
                "model_type": "jamba",
                **_DIMS,
                "intermediate_size": 32,
                "num_experts": 8,
                "num_hidden_layers": 1,  # expert_layer_offset left out: transformers' 1
            },
            "num_hidden_layers = 1: leaves the model no MoE layer: the MoE layers start at "
            "expert_layer_offset = 1",
        ),
    ],
    ids=["granite hybrid without experts", "jamba one expert", "jamba too few layers"],
)
def test_a_config_without_moe_layers_is_refused_by_key(config, fragment, tmp_path, capsys):
    from test_spec_hf import init, write_config

    code, out, err = init(capsys, "--from-hf", str(write_config(tmp_path, config)))
    assert (code, out) == (2, "") and "Traceback" not in err
    assert fragment in err


REFUSED = {
    "aria": ("stores its routed experts transposed", "is_transposed=True"),
    "aria_text": ("stores its routed experts transposed", "is_transposed=True"),
    "ergo": ("post_expert_norm", "self.post_expert_norm("),
    "ernie4_5_vl_moe": ("vision_moe", "self.vision_moe("),
    "gemma4_text": ("per_expert_scale", "self.per_expert_scale[top_k_index]"),
    "diffusion_gemma_text": ("per_expert_scale", "self.per_expert_scale[top_k_index]"),
    "hy_v4_vl_text": ("clamps the routed experts' SwiGLU", "self.swiglu_limit"),
    "inkling_text": ("shared_gammas", "gammas=shared_gammas"),
    "kolibri1_1": ("before the sigmoid", "router_logits + self.e_score_correction_bias"),
    "nemotron_h": ("ungated MLPs", "has_gate=False"),
    "openai_privacy_filter": ("router.bias", "self.weight.float(), self.bias.float()"),
    "qwen3_omni_moe_talker_text": ("shared_expert_gate", "F.sigmoid(self.shared_expert_gate("),
    "zaya": ("skip expert", "skip_expert"),
}
"""model_type -> (the reason's words, what the transformers modeling file does that says it)."""


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_moe_types_read_and_refused_with_their_reason(model_type, tmp_path, capsys):
    """Each of these was refused as "not checked"; its block was read, and the reason is what
    its modeling file does (checked against the installed transformers' source)."""
    from pathlib import Path

    import transformers
    from test_spec_hf import init, write_config
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    words, source = REFUSED[model_type]
    folder = Path(transformers.__file__).parent / "models" / model_type_to_module_name(model_type)
    modeling = "".join(path.read_text() for path in sorted(folder.glob("modeling_*.py")))
    assert source in modeling, (model_type, source)
    config = {"model_type": model_type, "hidden_size": 64, "num_experts_per_tok": 2}
    code, out, err = init(capsys, "--from-hf", str(write_config(tmp_path, config)))
    assert (code, out) == (2, "") and "Traceback" not in err
    assert f"an MoE moec does not compute: {model_type} " in err and words in err
    assert "not been checked" not in err
