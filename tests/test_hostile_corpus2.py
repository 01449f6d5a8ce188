"""A second hostile corpus, the spec side: every spec key given a TOML value of a type no key
takes (a date, a time, an inline table), odd spec files (structure, encodings, names that are
keywords or paths), odd `--set` syntax, and parallel.placement and its files. Each is exit 2
with one line naming the key, no traceback (the commands: test_hostile_corpus2_cli.py)."""

from __future__ import annotations

import json

import pytest
from clihelp import refused
from conftest import EXAMPLES

TINY = EXAMPLES / "tiny-cpu.toml"
TEXT = TINY.read_text()


# --- every key, a value of no key's type --------------------------------------------------

INTEGER, ENUM, NUMBER, BOOLEAN, STRING = (
    "should be a valid integer",
    "is not a known value",
    "should be a valid number",
    "should be a valid boolean",
    "should be a valid string",
)
KEYS = {
    **dict.fromkeys(
        [
            "model.hidden_size",
            "model.moe_intermediate_size",
            "model.n_routed_experts",
            "model.num_experts_per_tok",
            "model.n_shared_experts",
            "model.vocab_size",
            "router.n_group",
            "router.topk_group",
            "parallel.ep_size",
            "parallel.tp_size",
            "parallel.max_tokens_per_rank",
            "parallel.nodes",
            "parallel.redundant_experts",
            "target.max_num_tokens",
        ],
        INTEGER,
    ),
    **dict.fromkeys(
        [
            "model.preset",
            "router.scoring_func",
            "router.topk_method",
            "quant.scheme",
            "quant.checkpoint",
            "quant.activation_scheme",
            "quant.scale_dtype",
            "quant.shared_scheme",
            "experts.gemm_backend",
            "experts.layout",
            "experts.shared_experts",
            "parallel.dispatch",
            "parallel.replica_choice",
            "target.device",
            "target.dtype",
            "target.arch",
        ],
        ENUM,
    ),
    **dict.fromkeys(
        [
            "router.routed_scaling_factor",
            "experts.masked_memory_budget_gib",
            "parallel.nic_bandwidth_gbs",
        ],
        NUMBER,
    ),
    **dict.fromkeys(["router.norm_topk_prob", "parallel.record_load"], BOOLEAN),
    **dict.fromkeys(["name", "description", "target.gpu"], STRING),
    "quant.weight_block": "should be a valid list",
    "activation.kind": "is not a known activation",
    "parallel.placement": "is neither a string nor an array",
}
ODD_VALUES = {  # TOML as written -> as a message shows it
    "1979-05-27T07:32:00Z": "1979-05-27 07:32:00+00:00",
    "07:32:00": "07:32:00",
    "{a=1}": "{a = 1}",
}


@pytest.mark.parametrize("value", ODD_VALUES)
@pytest.mark.parametrize("key", KEYS)
def test_a_value_of_no_keys_type_is_named_with_the_key(key, value, capsys):
    refused(
        capsys,
        "validate",
        TINY,
        "--set",
        f"{key}={value}",
        fragments=(f"{key} = {ODD_VALUES[value]}", KEYS[key], "(--set)"),
    )


# --- spec files ---------------------------------------------------------------------------


def _spec(text: str, old: str = "", new: str = "") -> str:
    assert old in text
    return text.replace(old, new, 1) if old else text


NAME = 'name = "tiny_cpu"'
HIDDEN = "hidden_size = 256"
SPEC_FILES = {
    "a table twice": (TEXT + "\n[model]\nhidden_size = 1\n", "Cannot declare model twice"),
    "an array of tables for a table": (
        _spec(TEXT, "[router]", "[[router]]"),
        "must be a table ([router] with its keys)",
    ),
    "a key in the wrong table": (
        _spec(TEXT, "[quant]", "[quant]\nhidden_size = 256"),
        "quant.hidden_size = 256: unknown key in [quant]",
    ),
    "a model key at the top": (
        _spec(TEXT, NAME, NAME + "\n" + HIDDEN),
        "hidden_size = 256: unknown key in the top level",
    ),
    "a table 300 deep": (TEXT + "\n[x" + ".a" * 300 + "]\n", "x = {a = {a = {a = {a = {...}}}}}"),
    "arrays 2000 deep": (TEXT + "\nzz = " + "[" * 2000 + "]" * 2000 + "\n", "nested too deeply"),
    "a look-alike letter in a key": (
        _spec(TEXT, HIDDEN, "h\u0456dden_size = 256"),
        "TOML syntax",
    ),
    "a quoted key with a dot": (
        _spec(TEXT, HIDDEN, '"hidden_size.x" = 256\n' + HIDDEN),
        'model."hidden_size.x" = 256: unknown key in [model] (did you mean hidden_size?)',
    ),
    "an empty quoted key": (_spec(TEXT, HIDDEN, '"" = 256\n' + HIDDEN), "unknown key in [model]"),
    "an escape character in a key": (
        _spec(TEXT, HIDDEN, '"hid\\u001bden" = 256\n' + HIDDEN),
        'model."hid\\x1bden" = 256',
    ),
    "a byte order mark": ("\ufeff" + TEXT, "byte order mark"),
    "a NUL byte": (TEXT + "\x00", "TOML syntax"),
    "old Mac line endings": (TEXT.replace("\n", "\r"), "TOML syntax"),
    "a name of a million characters": (
        _spec(TEXT, NAME, 'name = "' + "a" * 1_000_000 + '"'),
        "is 1000000 characters long",
    ),
    "a key of 100000 characters": (
        _spec(TEXT, HIDDEN, HIDDEN + "\n" + "k" * 100_000 + " = 1"),
        "unknown key in [model]",
    ),
    "name written twice": (_spec(TEXT, NAME, NAME + '\nname = "x"'), "Cannot overwrite a value"),
    "name as a table": (_spec(TEXT, NAME) + "\n[name]\na = 1\n", "name = {a = 1}"),
    "a table below a value": (TEXT + "\n[model.hidden_size]\n", "Cannot overwrite a value"),
    "an array of activation tables": (
        TEXT + '\n[[activation]]\nkind = "silu"\n',
        "must be a table ([activation] with its keys)",
    ),
    "an empty activation table": (TEXT + "\n[activation]\n", "activation.kind: is required"),
    "an activation kind that is a number": (
        TEXT + "\n[activation]\nkind = 1\n",
        "activation.kind = 1: is not a known activation",
    ),
    "an unknown activation": (
        TEXT + '\n[activation]\nkind = "gelu"\n',
        'activation.kind = "gelu": is not a known activation',
    ),
    "a swiglu_limit that underflows to 0": (
        TEXT + '\n[activation]\nkind = "silu_clamped"\nswiglu_limit = 1e-400\n',
        "activation.swiglu_limit = 0.0: should be greater than 0",
    ),
    "a swiglu_limit of -0.0": (
        TEXT + '\n[activation]\nkind = "silu_clamped"\nswiglu_limit = -0.0\n',
        "activation.swiglu_limit = -0.0",
    ),
    "a swiglu_limit that overflows to inf": (
        TEXT + '\n[activation]\nkind = "silu_clamped"\nswiglu_limit = 1e400\n',
        "activation.swiglu_limit = inf: should be a finite number",
    ),
    "a scaling factor of -0.0": (
        _spec(TEXT, "routed_scaling_factor = 2.5", "routed_scaling_factor = -0.0"),
        "router.routed_scaling_factor = -0.0: should be greater than 0",
    ),
    "a scaling factor of 2**1100": (
        _spec(TEXT, "routed_scaling_factor = 2.5", f"routed_scaling_factor = {2**1100}"),
        "router.routed_scaling_factor = 13582985290493858492773514283592667786",
    ),
    "max_num_tokens 1e3": (
        _spec(TEXT, "max_num_tokens = 256", "max_num_tokens = 1e3"),
        "target.max_num_tokens = 1000.0: should be a valid integer",
    ),
    "a weight_block of three": (
        _spec(TEXT, 'checkpoint = "bf16"', 'checkpoint = "bf16"\nweight_block = [128, 128, 128]'),
        "needs two block dims, got 3",
    ),
    "a weight_block of 100000": (
        _spec(
            TEXT,
            'checkpoint = "bf16"',
            'checkpoint = "bf16"\nweight_block = [' + "128," * 100_000 + "]",
        ),
        "... 99984 more]",
    ),
    "a weight_block table": (
        _spec(
            TEXT, 'checkpoint = "bf16"', 'checkpoint = "bf16"\nweight_block = {n = 128, k = 128}'
        ),
        "quant.weight_block = {n = 128, k = 128}: should be a valid list",
    ),
    "a gpu name with a path": (
        _spec(TEXT, 'device = "cpu"', 'device = "cpu"\ngpu = "../../etc"'),
        'target.gpu = "../../etc": must be a GPU name',
    ),
    "an arch of 5000 digits": (
        _spec(TEXT, 'device = "cpu"', 'device = "cuda"\narch = "sm' + "9" * 5000 + '"'),
        "is not a known value",
    ),
    "a preset in capitals": (
        _spec(TEXT, HIDDEN, 'preset = "DeepSeek-V3"\n' + HIDDEN),
        'model.preset = "DeepSeek-V3": is not a known value',
    ),
    "a preset that is a path": (
        _spec(TEXT, HIDDEN, 'preset = "../../etc/passwd"\n' + HIDDEN),
        'model.preset = "../../etc/passwd": is not a known value',
    ),
    "a preset that is a list": (
        _spec(TEXT, HIDDEN, 'preset = ["deepseek-v3"]\n' + HIDDEN),
        'model.preset = ["deepseek-v3"]',
    ),
    "vocab_size without a hash router": (
        _spec(TEXT, "n_shared_experts = 1", "n_shared_experts = 1\nvocab_size = 100"),
        "model.vocab_size = 100: sizes the hash table only",
    ),
    "nodes that do not divide the ranks": (
        _spec(TEXT, "[target]", "[parallel]\nnodes = 2147483647\n[target]"),
        "parallel.nodes = 2147483647: does not divide the 1 ranks",
    ),
    "nic bandwidth on one node": (
        _spec(TEXT, "[target]", "[parallel]\nnic_bandwidth_gbs = 0.001\n[target]"),
        "has no effect with nodes = 1",
    ),
}


@pytest.mark.parametrize("case", SPEC_FILES)
def test_an_odd_spec_file_is_one_line_naming_it(case, tmp_path, capsys):
    text, fragment = SPEC_FILES[case]
    path = tmp_path / "spec.toml"
    path.write_text(text, encoding="utf-8")
    refused(capsys, "validate", path, fragments=(str(path), fragment))


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (TEXT.encode() + b"\n# caf\xe9\n", "not UTF-8 text"),
        (TEXT.encode("utf-16"), "not UTF-8 text"),
    ],
    ids=["latin-1", "utf-16"],
)
def test_a_spec_in_another_encoding_is_named(data, fragment, tmp_path, capsys):
    path = tmp_path / "spec.toml"
    path.write_bytes(data)
    refused(capsys, "validate", path, fragments=(fragment,))


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("class", "not a keyword"),
        ("None", "not a keyword"),
        ("True", "not a keyword"),
        ("__builtins__", "a dunder name"),
        ("../evil", "ASCII Python identifier"),
        ("/tmp/evil", "ASCII Python identifier"),
        ("a.b", "ASCII Python identifier"),
        ("caf\u00e9", 'name = "caf\\u00e9"'),
        ("builtins", "standard library"),
        ("os", "standard library"),
        ("this", "standard library"),
        ("antigravity", "standard library"),
        ("torch", "would shadow the Python module torch"),
        ("triton", "would shadow the Python module triton"),
    ],
)
def test_a_name_that_is_no_safe_package_is_refused(name, fragment, capsys):
    refused(capsys, "validate", TINY, "--set", f"name={json.dumps(name)}", fragments=(fragment,))


# --- --set syntax -------------------------------------------------------------------------

SET_SYNTAX = {
    "": "expects KEY=VALUE",
    "=": "expects KEY=VALUE",
    "=1": "expects KEY=VALUE",
    "model.hidden_size": "expects KEY=VALUE",
    "model..hidden_size=1": "expects KEY=VALUE",
    ".model=1": "expects KEY=VALUE",
    "model.=1": "expects KEY=VALUE",
    '"model".hidden_size=256': "expects KEY=VALUE",
    "a b=1": "expects KEY=VALUE",
    "[model]": "expects KEY=VALUE",
    "[[model]]": "expects KEY=VALUE",
    "model.hidden_size==1": 'model.hidden_size = "=1"',
    'model.hidden_size=256\nname="x"': "more than one value",
    "model.hidden_size=256\x00": 'model.hidden_size = "256\\u0000"',
    "model.hidden_size=256;name=x": 'model.hidden_size = "256;name=x"',
    "model.hidden_size=[": "is not one TOML value",
    "quant.weight_block=[128,128": "Unclosed array",
    'name="tiny_cpu': "Unterminated string",
    "model.hidden_size=" + "9" * 5000: "a number of 5,000 digits",
    "model.hidden_size=1e400": "model.hidden_size = inf",
    'model="x"': 'model = "x": must be a table',
    "model.hidden_size.x=1": "hidden_size is not a table",
    "name.x=1": "name is not a table",
    "activation=silu": 'activation = "silu": must be a table',
    "activation.swiglu_limit=7": "activation.kind: is required",
    "target.device=CPU": 'target.device = "CPU": is not a known value',
    "target.dtype=torch.bfloat16": 'target.dtype = "torch.bfloat16"',
    "name=tiny cpu": 'name = "tiny cpu"',
    "name=\u0131": 'name = "\\u0131"',
    "model.hidden_size=0256": 'model.hidden_size = "0256"',
    "router.routed_scaling_factor=.5": 'router.routed_scaling_factor = ".5"',
    "router.norm_topk_prob=True": 'router.norm_topk_prob = "True"',
    "router.norm_topk_prob=1": "router.norm_topk_prob = 1: should be a valid boolean",
    "x" * 100_000 + "=1": "unknown key in the top level",
    "a.b.c.d.e.f.g.h.i.j.k=1": "a = {b = {c = {d = {e = {...}}}}}",
    "model.hidden_size={a={b={c={d={e=1}}}}}": "model.hidden_size = {a = {b = {c = {d = {...}}}}}",
}


@pytest.mark.parametrize("override", SET_SYNTAX, ids=lambda text: repr(text[:30]))
def test_odd_set_syntax_is_one_line(override, capsys):
    refused(capsys, "validate", TINY, "--set", override, fragments=(SET_SYNTAX[override],))


# --- parallel.placement -------------------------------------------------------------------

PLACEMENT_VALUES = {
    "true": "parallel.placement = true: is neither a string nor an array",
    "1.5": "parallel.placement = 1.5: is neither a string nor an array",
    "{a=1}": "parallel.placement = {a = 1}: is neither a string nor an array",
    "[1]": "parallel.placement.0 = 1: should be an array of one rank's expert ids",
    "[[-1,0]]": "parallel.placement.0.0 = -1: should be greater than or equal to 0",
    '[[0,"a"]]': 'parallel.placement.0.1 = "a": should be a valid integer',
    "[[true]]": "parallel.placement.0.0 = true: should be a valid integer",
    "[[99999999999999999999]]": "should be less than or equal to 2147483647",
    '""': "is an empty path",
}


@pytest.mark.parametrize("value", PLACEMENT_VALUES)
def test_a_placement_of_the_wrong_type_is_one_problem(value, capsys):
    err = refused(
        capsys,
        "validate",
        TINY,
        "--set",
        f"parallel.placement={value}",
        fragments=(PLACEMENT_VALUES[value],),
    )
    assert "literal[" not in err and "list[list" not in err  # no pydantic member names


ORDER = list(range(16))
PLACEMENT_FILES = {
    "a list": ([[0]], "not a placement file"),
    "no format": ({"physical_to_logical": [ORDER]}, "not a placement file"),
    "booleans": (
        {"format": "moec-placement", "physical_to_logical": [[True] * 16]},
        "not an expert id",
    ),
    "floats": (
        {"format": "moec-placement", "physical_to_logical": [[0.0] * 16]},
        "not an expert id",
    ),
    "a negative id": (
        {"format": "moec-placement", "physical_to_logical": [[-1] + ORDER[1:]]},
        "not an expert id",
    ),
    "one id twice": (
        {"format": "moec-placement", "physical_to_logical": [[0] * 16]},
        "leaves experts 1, 2, 3, 4, 5, 6, 7, 8 (and 7 more) without a replica",
    ),
    "960000 experts": (
        {"format": "moec-placement", "physical_to_logical": [ORDER * 60_000]},
        "places 960000 physical experts, the layer has 16",
    ),
    "nested 100000 deep": (
        '{"format": "moec-placement", "physical_to_logical": '
        + "[" * 100_000
        + "]" * 100_000
        + "}",
        "JSON nested too deeply",
    ),
    "a number of 10000 digits": (
        '{"format": "moec-placement", "physical_to_logical": [[' + "9" * 10_000 + "]]}",
        "holds an integer of 10000 digits, too long to read",
    ),
    "a key twice": (
        '{"format": "moec-placement", "physical_to_logical": [[0]], "physical_to_logical": '
        + json.dumps([ORDER])
        + "}",
        'names the key "physical_to_logical" twice',
    ),
}


@pytest.mark.parametrize("case", PLACEMENT_FILES)
def test_a_bad_placement_file_is_named(case, tmp_path, capsys):
    data, fragment = PLACEMENT_FILES[case]
    path = tmp_path / "placement.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    refused(
        capsys, "validate", TINY, "--set", f'parallel.placement="{path}"', fragments=(fragment,)
    )


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("/nonexistent/p.json", "No such file or directory"),
        ("/dev/zero", "a device, not a regular file"),
        (str(TINY), "is not JSON"),
        ("/tmp", "Is a directory"),
    ],
)
def test_a_placement_path_that_is_no_placement_file_is_named(path, fragment, capsys):
    refused(
        capsys, "validate", TINY, "--set", f'parallel.placement="{path}"', fragments=(fragment,)
    )


def test_a_thousand_problems_are_a_screenful(tmp_path, capsys):
    import moec
    from moec.errors import MoecError

    path = tmp_path / "spec.toml"
    path.write_text(
        _spec(TEXT, HIDDEN, HIDDEN + "\n" + "".join(f"k{i} = 1\n" for i in range(5000)))
    )
    err = refused(capsys, "validate", path, lines=51, fragments=("model.k0 = 1: unknown key",))
    assert err.splitlines()[-1] == f"{path}: and 4950 more problems (fix those above first)"
    with pytest.raises(MoecError) as raised:
        moec.load_spec(path)
    assert len(raised.value.problems) == 5000  # every one kept for a caller
