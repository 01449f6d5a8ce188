"""Three things hostile probes found wrong in reading a spec or a HF config.

1. `init --from-hf` read a JSON null as the key left out: `"norm_topk_prob": null` gave
   norm_topk_prob = true, where transformers' DeepseekV3Config keeps None and its router reads
   it as false. A null is refused now, naming the key, unless transformers reads it as the key
   left out (hf_nulls; checked here against transformers' configurations).
2. Lines in messages came from a line-by-line scan that did not know TOML's strings: a key
   written inside a multi-line string earlier in the file took the line, and `"a.b" = 1` under
   [router] was shown as router.a.b (three keys). The locator now reads TOML's tokens, and a
   key path quotes the parts that are no bare keys (router."a.b").
3. A misspelt required key (`hiden_size`) was two problems, "model.hidden_size is required"
   and "model.hiden_size: unknown key"; now it is one, naming both.
"""

from __future__ import annotations

import json

import pytest
import tomli
from clihelp import assert_refused, cli, refused
from test_spec_hf import DEEPSEEK_V2, DEEPSEEK_V3

from moec.errors import MoecError
from moec.spec import hf_families, hf_layers, hf_nulls, hf_refused, hf_values
from moec.spec.hf import spec_data_from_config
from moec.spec.loader import parse_spec
from moec.spec.locate import dotted, key_lines, line_of, split_dotted

# --- 1. a JSON null in a HF config ------------------------------------------------------------

LFM2 = {
    "model_type": "lfm2_moe",
    "hidden_size": 64,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": False,
}
COHERE = {
    "model_type": "cohere2_moe",
    "hidden_size": 64,
    "intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_shared_experts": 1,
    "shared_expert_combination_strategy": "sum",
}
GLM5_NEXT = {**DEEPSEEK_V3, "model_type": "glm5_next_text", "swiglu_limit": 10.0}
V2_GREEDY = {**DEEPSEEK_V2, "topk_method": "greedy"}


def _init(capsys, tmp_path, config, *extra) -> tuple[int, str, str]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return cli(capsys, "init", "--from-hf", path, "-o", tmp_path / "spec.toml", *extra)


@pytest.mark.parametrize(
    ("config", "key", "accepted"),
    [
        # transformers keeps None, which its block reads otherwise than the default
        (DEEPSEEK_V3, "norm_topk_prob", "true or false"),  # falsy: not renormalized
        (DEEPSEEK_V3, "n_group", "a JSON integer"),  # the grouped top-k fails
        (DEEPSEEK_V3, "first_k_dense_replace", "a JSON integer"),  # one problem, not two
        (V2_GREEDY, "topk_method", '"greedy" or "group_limited_greedy"'),
        # transformers' configuration refuses null for a typed key
        (DEEPSEEK_V3, "routed_scaling_factor", "a JSON number"),
        (DEEPSEEK_V3, "n_shared_experts", "a JSON integer"),
        (DEEPSEEK_V3, "hidden_act", "a JSON string"),
        (V2_GREEDY, "mlp_bias", "false"),
        (GLM5_NEXT, "swiglu_limit", "a JSON number"),
        (LFM2, "norm_topk_prob", "false"),  # not also "absent, so transformers' default true"
        (LFM2, "use_expert_bias", "true or false"),
        (COHERE, "shared_expert_combination_strategy", '"sum"'),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_a_null_transformers_does_not_read_as_left_out_is_refused(
    config, key, accepted, tmp_path, capsys
):
    code, out, err = _init(capsys, tmp_path, {**config, key: None})
    assert_refused(code, out, err, f"{key} = null: null is not this key left out", accepted)
    assert "or leave the key out" in err
    assert not (tmp_path / "spec.toml").exists()


def test_a_null_in_quantization_config_is_named_there(tmp_path, capsys):
    quantization = {**DEEPSEEK_V3["quantization_config"], "activation_scheme": None}
    code, out, err = _init(capsys, tmp_path, {**DEEPSEEK_V3, "quantization_config": quantization})
    assert_refused(code, out, err, "quantization_config.activation_scheme = null")


def test_every_refused_null_is_reported_at_once(tmp_path, capsys):
    config = {**DEEPSEEK_V3, "norm_topk_prob": None, "n_group": None, "hidden_size": "7168"}
    code, out, err = _init(capsys, tmp_path, config)
    assert_refused(code, out, err, "norm_topk_prob = null", "n_group = null", lines=3)


def test_a_null_set_by_the_command_line_is_not_refused(tmp_path, capsys):
    config = {**DEEPSEEK_V3, "norm_topk_prob": None}
    code, _, err = _init(capsys, tmp_path, config, "--set", "router.norm_topk_prob=false")
    assert code == 0, err


def _spec(config) -> dict:
    return spec_data_from_config(config, name="x")


@pytest.mark.parametrize(
    ("config", "key"),
    [
        (DEEPSEEK_V3, "quantization_config"),  # transformers: not pre-quantized
        (DEEPSEEK_V3, "torch_dtype"),
        (DEEPSEEK_V3, "topk_method"),  # DeepseekV3Config has none: its block is noaux_tc
        (DEEPSEEK_V3, "swiglu_limit"),  # its block never clamps
        (V2_GREEDY, "n_group"),  # DeepseekV2Config's default is None
        (V2_GREEDY, "topk_group"),
        ({**DEEPSEEK_V3, "model_type": "deepseek_v32"}, "mlp_layer_types"),  # derived
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_a_null_transformers_reads_as_left_out_is_the_key_left_out(config, key):
    left_out = {name: value for name, value in config.items() if name != key}
    assert _spec({**left_out, key: None}) == _spec(left_out)


def test_a_null_expert_dtype_in_quantization_config_is_fp8_experts():
    """transformers moves a DeepSeek-V4 expert_dtype beside quantization_config into it only
    where it has none: a null there is FineGrainedFP8Config's None, fp8 experts, not fp4."""
    quantization = {**DEEPSEEK_V3["quantization_config"], "expert_dtype": None}
    config = {**DEEPSEEK_V3, "quantization_config": quantization, "expert_dtype": "fp4"}
    assert _spec(config)["quant"]["scheme"] == "fp8_block"


def test_a_transformers_config_with_none_is_refused_by_key():
    """patch_model reads a live config's to_dict(), where None is transformers' own value."""
    transformers = pytest.importorskip("transformers")
    config = transformers.DeepseekV3Config(norm_topk_prob=None).to_dict()
    with pytest.raises(MoecError) as caught:
        spec_data_from_config(config, clamp_as="config")
    assert [p.path for p in caught.value.problems] == ["norm_topk_prob"]
    default = transformers.DeepseekV2Config(topk_method="greedy", num_experts_per_tok=6)
    assert default.n_group is None  # its default: read as left out
    assert spec_data_from_config(default.to_dict(), clamp_as="config")["router"]["n_group"] == 1


def _read_keys(model_type: str, family) -> set[str]:
    """The keys moec reads of a config of `model_type` whose null it decides (hf.py, hf_layers,
    hf_refused), the required ones left out (null there is "missing")."""
    keys = {"hidden_act", "swiglu_limit", "num_hash_layers"}
    if family.activation is not None:
        keys = {"num_hash_layers", *(key for _, key, _ in family.activation[1])}
    names = ["scoring_func", "topk_method", "n_group", "topk_group", "norm_topk_prob"]
    for name in ["n_shared_experts", *names, "routed_scaling_factor"]:
        if family.reads(name):
            keys.update(family.keys.get(name, (name,)))
    keys.update(key for key in (family.bias_key,) if key)
    keys.update(width[0] for width in (family.shared_width,) if width)
    rule = hf_layers.FIRST_K_DENSE.get(model_type)
    if rule is not None:
        keys.update((rule.key, "num_hidden_layers"))
        keys.update(("mlp_layer_types",) if rule.layer_types else ())
    if model_type in hf_layers.SPARSE_STEP:
        keys.update(("mlp_only_layers", "decoder_sparse_step", "num_hidden_layers"))
    if model_type == "deepseek_v4":
        keys.update(("mlp_layer_types", "num_hidden_layers"))
    keys.update(check.key for check in hf_refused.KEY_CHECKS.get(model_type, ()))
    keys.update(hf_refused.LAYER_LIMITS.get(model_type, ()))
    keys.update(
        {
            "jamba": ("num_experts", "num_local_experts", "num_hidden_layers"),
            "granitemoehybrid": ("num_local_experts",),
            "cohere2_moe": ("num_shared_experts", "shared_expert_combination_strategy"),
        }.get(model_type, ())
    )
    keys.update(("expert_layer_offset",) if model_type == "jamba" else ())
    return keys


def test_the_nulls_read_as_left_out_are_those_transformers_reads_so():
    """Each model type's configuration built with each key moec reads null: the key is in
    hf_nulls exactly where transformers holds for it what it holds for the key left out (its
    default None, a value derived from None, or no such key in the configuration)."""
    transformers = pytest.importorskip("transformers")
    mapping = transformers.CONFIG_MAPPING
    assert set(hf_nulls.BY_TYPE) == set(hf_families.FAMILIES)
    checked = 0
    for model_type, family in hf_families.FAMILIES.items():
        if model_type not in mapping:  # kimi_k2: DeepSeek-V3's configuration
            continue
        cls = mapping[model_type]
        default = cls()
        fields = set(getattr(cls, "__dataclass_fields__", ()))
        for key in sorted(_read_keys(model_type, family)):
            try:
                value = getattr(cls(**{key: None}), key, None)
            except Exception:  # strict: transformers refuses the null
                same = False
            else:
                was = getattr(default, key, None)
                same = value == was or (key not in fields and not hasattr(default, key))
            assert same == (key in hf_nulls.absent_nulls(model_type)), (model_type, key)
            checked += 1
    assert checked > 300


def test_a_reader_refuses_a_null_once():
    reader = hf_values.ConfigReader({"a": None}, absent_nulls=frozenset())
    assert reader.integer("a", "model.a") is None
    assert reader.get("a", 3, "an integer") == 3
    assert len(reader.problems) == 1
    lenient = hf_values.ConfigReader({"a": None}, absent_nulls=frozenset({"a"}))
    assert lenient.integer("a", "model.a") is None and not lenient.problems


# --- 2. the line of each key --------------------------------------------------------------------


def _paths(value, prefix=()):
    """Every key path of a parsed document, as `dotted` writes it: tables, keys and the items
    of arrays (by index)."""
    items = value.items() if isinstance(value, dict) else None
    if items is None and isinstance(value, list):
        items = ((str(index), item) for index, item in enumerate(value))
    for key, item in items or ():
        path = (*prefix, key)
        yield dotted(path)
        yield from _paths(item, path)


CORPUS = {
    "multi-line basic strings": (
        'description = """\n'  # 1
        "[model]\n"  # 2: inside the string
        'hidden_size = 1 # "not a key"\n'  # 3
        '\\"""still inside"" and \\\\\n'  # 4: an escaped quote, two quotes, a backslash
        '"""\n'  # 5
        'name = """one line"""\n'  # 6
        'tail = """ends with quotes"""""\n'  # 7: two of them are the string's
        "[model]\n"  # 8
        "hidden_size = 2\n",  # 9
        {"description": 1, "name": 6, "tail": 7, "model": 8, "model.hidden_size": 9},
    ),
    "multi-line literal strings": (
        "a = '''x = 1\n"  # 1
        "[b]\n"  # 2
        "y = '2'''''\n"  # 3: the string ends with two quotes
        "[b]  # the table\n"  # 4
        "y = '''\n"  # 5
        "[[c]]'''\n"  # 6
        "z = 'a # b'\n",  # 7
        {"a": 1, "b": 4, "b.y": 5, "b.z": 7},
    ),
    "strings that look like syntax": (
        'x = "a = b # [model] { \' \\" "\n'  # 1
        "y = 'c:\\path\\' # it's a comment\n"  # 2: a literal string ends at its quote
        'z = ["]", \'[\', """\n'  # 3
        "w = 1\n"  # 4: inside the array's string
        '"""]\n'  # 5
        "v = 2\n",  # 6
        {"x": 1, "y": 2, "z": 3, "z.0": 3, "z.1": 3, "z.2": 3, "v": 6},
    ),
    "quoted and escaped keys": (
        "[router]\n"  # 1
        '"a.b" = 1\n'  # 2
        "a.b = 2\n"  # 3: the table a, its key b
        "'c.d' = 3\n"  # 4
        '"e\\"f" = 4\n'  # 5
        '"g\\\\h" = 5\n'  # 6
        '"\\u00e9" = 6\n'  # 7
        '"" = 7\n'  # 8
        'x . "y.z" . w = 8\n'  # 9
        '"a\\u002eb2" = 9\n',  # 10: an escaped dot
        {
            'router."a.b"': 2,
            "router.a": 3,
            "router.a.b": 3,
            'router."c.d"': 4,
            'router."e\\"f"': 5,
            'router."g\\\\h"': 6,
            'router."\u00e9"': 7,
            'router.""': 8,
            "router.x": 9,
            'router.x."y.z"': 9,
            'router.x."y.z".w': 9,
            'router."a.b2"': 10,
        },
    ),
    "inline tables and arrays over lines": (
        't = { a = 1, b = { c = "}", d = [1,\n'  # 1
        "  2] }, # a comment, then a newline\n"  # 2
        "  e = '{' }\n"  # 3
        "arr = [ { k = 1 },\n"  # 4
        '  { k = "]" }, # ]\n'  # 5
        "  [ [ 3 ], 4 ],\n"  # 6
        "]\n"  # 7
        "d = [1979-05-27 07:32:00, 1979-05-27T00:32:00Z,\n"  # 8
        "  1979-05-27]\n",  # 9
        {
            "t": 1,
            "t.a": 1,
            "t.b.c": 1,
            "t.b.d.1": 2,
            "t.e": 3,
            "arr.0.k": 4,
            "arr.1": 5,
            "arr.1.k": 5,
            "arr.2.0.0": 6,
            "arr.2.1": 6,
            "d.1": 8,
            "d.2": 9,
        },
    ),
    "arrays of tables": (
        "[[fruit]]\n"  # 1
        'name = "apple"\n'  # 2
        "[fruit.physical]\n"  # 3
        'color = "red"\n'  # 4
        "[[fruit.variety]]\n"  # 5
        'name = "red delicious"\n'  # 6
        "[[ fruit ]]\n"  # 7
        'name = "banana"\n'  # 8
        "[[fruit . variety]]\n"  # 9
        'name = "plantain"\n'  # 10
        "[[fruit.variety]]\n"  # 11
        "[ 'x y' . \"z\" ]\n"  # 12
        "k = 1\n",  # 13
        {
            "fruit": 1,
            "fruit.0": 1,
            "fruit.0.name": 2,
            "fruit.0.physical.color": 4,
            "fruit.0.variety.0.name": 6,
            "fruit.1": 7,
            "fruit.1.name": 8,
            "fruit.1.variety": 9,
            "fruit.1.variety.0.name": 10,
            "fruit.1.variety.1": 11,
            '"x y"': 12,
            '"x y".z.k': 13,
        },
    ),
    "a table after its sub-table, CRLF, tabs": (
        "[a.b]\r\n"  # 1
        "k\t=\t1\r\n"  # 2
        "# [a] m = 0\r\n"  # 3
        "[a]\r\n"  # 4
        "m = 2 # m = 3\r\n",  # 5
        {"a": 4, "a.b": 1, "a.b.k": 2, "a.m": 5},
    ),
}


@pytest.mark.parametrize("case", CORPUS)
def test_the_locator_places_every_key_tomli_reads(case):
    text, expected = CORPUS[case]
    lines = key_lines(text)
    assert set(lines) == set(_paths(tomli.loads(text)))  # every key, and nothing in a string
    assert {path: lines[path] for path in expected} == expected


@pytest.mark.parametrize(
    "parts", [["a"], ["a.b", "c"], ['e"f', "g\\h"], [""], ["\u00e9", "x y"], ["a", "0"]]
)
def test_a_dotted_path_splits_back_into_its_parts(parts):
    assert split_dotted(dotted(parts)) == parts


def test_line_of_finds_a_quoted_key_and_its_table():
    lines = key_lines('[router]\n"a.b" = 1\n')
    assert line_of(lines, 'router."a.b"') == 2
    assert line_of(lines, 'router."a.b".c') == 2
    assert line_of(lines, "router.a.b") == 1  # another key: only its table is written


TINY = open(__file__.rsplit("/", 1)[0] + "/../examples/tiny-cpu.toml").read()


def _problems(text: str) -> list[str]:
    with pytest.raises(MoecError) as caught:
        parse_spec(text, "s.toml")
    return [p.format("s.toml") for p in caught.value.problems]


def test_a_key_in_a_multi_line_string_does_not_take_the_line():
    text = TINY.replace(
        'name = "tiny_cpu"\n',
        "name = \"tiny_cpu\"\ndescription = '''\n[quant]\nscheme = \"bf16\"\n'''\n",
    ).replace('scheme = "fp8_block"', 'scheme = "nope"')
    line = text.splitlines().index('scheme = "nope"') + 1
    assert line > 10
    (found,) = _problems(text)
    assert found.startswith(f's.toml:{line}: quant.scheme = "nope": is not a known value')


def test_a_quoted_key_is_shown_quoted_at_its_line():
    text = TINY.replace(
        "[router]\n", '[router]\n"a.b" = 1\na.b = 2\n"c\\"d" = 3\n# "e" = 4\n"e" = 4\n'
    )
    start = text.splitlines().index("[router]") + 1
    assert _problems(text) == [
        f's.toml:{start + 1}: router."a.b" = 1: unknown key in [router] (known keys: '
        "scoring_func, topk_method, n_group, topk_group, norm_topk_prob, routed_scaling_factor, "
        "rounding)",
        f"s.toml:{start + 2}: router.a = {{b = 2}}: unknown key in [router] (known keys: "
        "scoring_func, topk_method, n_group, topk_group, norm_topk_prob, routed_scaling_factor, "
        "rounding)",
        f's.toml:{start + 3}: router."c\\"d" = 3: unknown key in [router] (known keys: '
        "scoring_func, topk_method, n_group, topk_group, norm_topk_prob, routed_scaling_factor, "
        "rounding)",
        f"s.toml:{start + 5}: router.e = 4: unknown key in [router] (known keys: "
        "scoring_func, topk_method, n_group, topk_group, norm_topk_prob, routed_scaling_factor, "
        "rounding)",
    ]


def test_a_quoted_key_set_on_the_command_line_is_from_the_command_line(capsys):
    err = refused(capsys, "validate", "examples/tiny-cpu.toml", "--set", 'router={"a.b"=1}')
    assert err.startswith('examples/tiny-cpu.toml (--set): router."a.b" = 1: unknown key')


# --- 3. a misspelt required key -----------------------------------------------------------------


def test_a_misspelt_required_key_is_one_problem(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(TINY.replace("hidden_size = 256", "hiden_size = 7168"))
    line = spec.read_text().splitlines().index("hiden_size = 7168") + 1
    err = refused(capsys, "validate", spec)
    assert err == (
        f"{spec}:{line}: model.hiden_size = 7168: unknown key in [model] (did you mean "
        "hidden_size? model.hidden_size is required, not set)\n"
    )


def test_a_misspelt_required_key_beside_other_problems(tmp_path, capsys):
    """The other problems stay: a second misspelling of the same key (its required key told
    once), another required key left out, a misspelt key that is not required, a bad value."""
    text = (
        TINY.replace("hidden_size = 256", "hiden_size = 256\nhidden_siz = 256")
        .replace("n_routed_experts = 16\n", "")
        .replace("scoring_func", "scoring_fun")
        .replace("topk_group = 2", "topk_group = -2")
    )
    model = text.splitlines().index("[model]") + 1
    found = _problems(text)
    assert found[0].startswith(f"s.toml:{model}: model.n_routed_experts: is required")
    assert found[1] == (
        f"s.toml:{model + 1}: model.hiden_size = 256: unknown key in [model] (did you mean "
        "hidden_size? model.hidden_size is required, not set)"
    )
    assert found[2] == (
        f"s.toml:{model + 2}: model.hidden_siz = 256: unknown key in [model] (did you mean "
        "hidden_size?)"
    )
    assert "router.scoring_fun" in found[3] and "required" not in found[3]
    assert "router.topk_group = -2" in found[4]
    assert len(found) == 5, found


def test_a_misspelt_required_key_of_an_activation_kind(tmp_path, capsys):
    text = TINY + '\n[activation]\nkind = "silu_clamped"\nswigl_limit = 7.0\n'
    line = text.splitlines().index("swigl_limit = 7.0") + 1
    assert _problems(text) == [
        f"s.toml:{line}: activation.swigl_limit = 7.0: unknown key in [activation] (did you "
        "mean swiglu_limit? activation.swiglu_limit is required, not set)"
    ]


def test_a_misspelt_key_whose_nearest_key_is_set_is_not_paired(tmp_path, capsys):
    """hidden_sizes is nearest hidden_size, which is set: it misspells no required key, though
    another one (n_routed_experts) is left out."""
    text = TINY.replace("hidden_size = 256", "hidden_size = 256\nhidden_sizes = 1").replace(
        "n_routed_experts = 16\n", ""
    )
    found = _problems(text)
    assert len(found) == 2
    assert "model.n_routed_experts: is required" in found[0]
    assert "model.hidden_sizes = 1: unknown key in [model] (did you mean hidden_size?)" in found[1]
