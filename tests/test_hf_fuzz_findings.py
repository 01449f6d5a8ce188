"""What a differential fuzzer of `moec init --from-hf` / patch_model against transformers 5.25
found, one test per bug (each config its minimal reproducer).

Found wrong before this file: GLM-4.7-Flash, GLM-5-Next, Beam, MiMo-V2-Flash, HY-V3, Laguna,
Mellum and MiniMax-M3 configs without mlp_layer_types were judged by first_k_dense_replace,
which their transformers configurations never read (they make the first 1 or 3 layers dense, or
none): refused where the model has MoE layers, accepted where it has none; a null under one of
a key's two names (Param2's num_shared_experts, Jamba's num_local_experts) was passed over for
the other name or the default, though transformers reads the alias's null; Cohere2-MoE and
Qwen3-Omni's thinker took num_local_experts for the experts' count, a key their configurations
never read; Cohere2-MoE's expert_selection_fn "sqrtsoftplus" (its block refuses it) got a spec;
a DeepSeek-V4 config of fewer layers than the default 3 hash layers was refused, counting "-1
moe layers"; HY-V3's num_shared_experts 0 got a spec without shared experts, where HYV3MLP
reads the width 0 as unset and holds one intermediate_size wide.
"""

from __future__ import annotations

import json

import hf_oracle
import pytest
from test_hf_families5 import _config, check_patched_model, save
from test_hf_more_families import _GLM5_NEXT_TEXT, CONFIGS
from test_spec_hf import init, write_config

from moec.spec import load_spec

_NO_TYPES = {key: value for key, value in CONFIGS["glm4_moe_lite"].items()}
_NO_TYPES.pop("mlp_layer_types")
_NO_TYPES["model_type"] = "glm4_moe_lite"


def _spec(tmp_path, capsys, config):
    spec_path = tmp_path / "spec.toml"
    code, _, err = init(
        capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path)
    )
    assert (code, err) == (0, "")
    return load_spec(spec_path).spec


def _refused(tmp_path, capsys, config) -> str:
    code, out, err = init(capsys, "--from-hf", str(write_config(tmp_path, config)))
    assert (code, out) == (2, "") and "Traceback" not in err
    return err


def test_a_first_k_dense_replace_transformers_never_reads_is_not_followed(tmp_path, cache_dir):
    """GLM-4.7-Flash without mlp_layer_types: transformers makes layer 0 dense, layer 1 MoE,
    whatever first_k_dense_replace says; it was refused ("leaves the model no MoE layer")."""
    config = {**_NO_TYPES, "first_k_dense_replace": 2}
    assert _config(config).mlp_layer_types == ["dense", "sparse"]
    save(config, tmp_path, left_out=("mlp_layer_types",))
    path = tmp_path / "config.json"
    written = json.loads(path.read_text())
    path.write_text(json.dumps({**written, "first_k_dense_replace": 2}))
    check_patched_model(tmp_path, cache_dir)


@pytest.mark.parametrize(
    ("model_type", "keys", "dense"),
    [
        ("glm5_next_text", {k: v for k, v in _GLM5_NEXT_TEXT.items() if k != "mlp_layer_types"}, 2),
        ("glm4_moe_lite", {**_NO_TYPES, "num_hidden_layers": 1}, 1),
    ],
)
def test_a_default_layer_list_without_moe_layers_is_refused(
    model_type, keys, dense, tmp_path, capsys
):
    """GLM-5-Next's mlp_layer_types, left out, makes the first 3 layers dense: a 2-layer model
    has no MoE layer, and got a spec."""
    config = {**keys, "model_type": model_type}
    assert "sparse" not in _config(config).mlp_layer_types
    err = _refused(tmp_path, capsys, config)
    assert (
        "mlp_layer_types: absent, so transformers' default, which leaves the model no MoE layer: "
        f"the first {dense} layers are dense (it reads no first_k_dense_replace)"
    ) in err


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        (  # alone: transformers reads n_shared_experts None (and fails); moec took 2
            {
                **{k: v for k, v in CONFIGS["sarvam_moe"].items() if k != "n_shared_experts"},
                "model_type": "param2moe",
                "num_shared_experts": None,
            },
            "num_shared_experts = null: null is not this key left out",
        ),
        (  # beside the other name: transformers reads the alias's null
            {
                "model_type": "jamba",
                "hidden_size": 64,
                "intermediate_size": 32,
                "num_experts": 8,
                "num_local_experts": None,
                "num_experts_per_tok": 2,
            },
            "num_local_experts = null: says otherwise than num_experts = 8: two names of one key",
        ),
    ],
    ids=["param2moe alias null", "jamba alias null beside a value"],
)
def test_a_null_under_a_keys_other_name_is_read(config, fragment, tmp_path, capsys):
    assert fragment in _refused(tmp_path, capsys, config)


@pytest.mark.parametrize("model_type", ["cohere2_moe", "qwen3_omni_moe_text"])
def test_num_local_experts_is_not_read_where_transformers_reads_none(model_type, tmp_path, capsys):
    """Their configurations keep num_experts (its default) beside a num_local_experts nobody
    reads: moec's spec had num_local_experts' count of experts."""
    keys = {"hidden_size": 64, "intermediate_size": 32, "moe_intermediate_size": 32}
    config = {**keys, "model_type": model_type, "num_local_experts": 4, "num_experts_per_tok": 2}
    assert _config(config).num_experts != 4
    assert "num_experts: is missing from config.json" in _refused(tmp_path, capsys, config)
    spec = _spec(tmp_path, capsys, {**config, "num_experts": 8})
    assert spec.model.n_routed_experts == 8


def test_cohere2_router_it_refuses_is_refused_by_key(tmp_path, capsys):
    config = {
        "model_type": "cohere2_moe",
        "hidden_size": 64,
        "intermediate_size": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "expert_selection_fn": "sqrtsoftplus",
    }
    err = _refused(tmp_path, capsys, config)
    assert 'expert_selection_fn = "sqrtsoftplus": is a router transformers\' Cohere2-MoE' in err


def test_v4_of_fewer_layers_than_its_default_hash_layers_is_all_hash_moe(tmp_path, capsys):
    """transformers' default schedule: min(3, num_hidden_layers) hash_moe layers, so a 2-layer
    V4 is two hash_moe layers; init said "holds 3 hash_moe and -1 moe layers"."""
    config = hf_oracle.deepseek_v4(layers=2).to_dict()
    config.pop("mlp_layer_types")
    assert _config(config).mlp_layer_types == ["hash_moe", "hash_moe"]
    assert _spec(tmp_path, capsys, config).router.topk_method == "hash"


def test_hy_v3_without_shared_experts_is_refused_by_key(tmp_path, capsys):
    """HYV3MLP reads the width 0 (moe_intermediate_size x 0) as unset: its shared expert is
    then intermediate_size wide; init wrote n_shared_experts = 0."""
    config = {**CONFIGS["hy_v3"], "model_type": "hy_v3", "num_shared_experts": 0}
    err = _refused(tmp_path, capsys, config)
    assert (
        "num_shared_experts = 0: makes transformers' HY-V3 shared expert intermediate_size" in err
    )
