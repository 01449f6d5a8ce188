"""A second hostile corpus, the commands: `moec init --from-hf` on broken config.json files,
odd arguments of each command, load files that are no load, and an -o inside a package moec
built, refused by every command that writes a file. Each is exit 2 with one line naming the
argument or file, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from clihelp import cli, refused, snapshot
from conftest import EXAMPLES

TINY = EXAMPLES / "tiny-cpu.toml"


# --- moec init --from-hf ------------------------------------------------------------------

CONFIG = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "n_group": 8,
    "topk_group": 4,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "hidden_act": "silu",
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
}
GOOD = json.dumps(CONFIG)
CONFIGS = {  # config.json text -> what the message names
    "a list": (json.dumps([CONFIG]), "is not a JSON object"),
    "null": ("null", "is not a JSON object"),
    "empty": ("", "not JSON"),
    "a byte order mark": ("\ufeff" + GOOD, "BOM"),
    "NaN": (GOOD.replace("2.5", "NaN"), "routed_scaling_factor = nan"),
    "1e400": (GOOD.replace("2.5", "1e400"), "routed_scaling_factor = inf"),
    "a key twice": (
        GOOD.replace('"hidden_size": 7168', '"hidden_size": 7168, "hidden_size": 1'),
        '"hidden_size" appears twice',
    ),
    "10000 digits": (GOOD.replace("7168", "9" * 10_000), "10,000 digits"),
    "-0.0": (GOOD.replace("2.5", "-0.0"), "-0.0"),
    "a bool for an int": (GOOD.replace("7168", "true"), "hidden_size = true"),
    "a float for an int": (GOOD.replace("7168", "7168.0"), "hidden_size = 7168.0"),
    "a string for an int": (GOOD.replace("7168", '"7168"'), 'hidden_size = "7168"'),
    "a list for an int": (GOOD.replace("7168", "[7168]"), "hidden_size = [7168]"),
    "an object for an int": (GOOD.replace("7168", '{"a": 1}'), "hidden_size = {a = 1}"),
    "null for an int": (GOOD.replace("7168", "null"), "hidden_size"),
    "no model_type": (GOOD.replace('"model_type": "deepseek_v3", ', ""), "model_type"),
    "an unknown model_type": (GOOD.replace("deepseek_v3", "llama"), 'model_type = "llama"'),
    "an escape in model_type": (GOOD.replace("deepseek_v3", "deepseek_v3\\u001b[2J"), "model_type"),
    "quantization_config a list": (
        GOOD.replace('{"quant_method": "fp8", "weight_block_size": [128, 128]}', "[1]"),
        "quantization_config = [1]",
    ),
    "an unknown quant_method": (GOOD.replace('"fp8"', '"gptq"'), 'quant_method = "gptq"'),
    "a block size string": (GOOD.replace("[128, 128]", '"128"'), 'weight_block_size = "128"'),
    "a gelu activation": (GOOD.replace('"silu"', '"gelu"'), 'hidden_act = "gelu"'),
    "n_group 0": (GOOD.replace('"n_group": 8', '"n_group": 0'), "n_group = 0"),
    "nested 100000 deep": (
        GOOD[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "nested too deeply",
    ),
    "garbage after": (GOOD + "garbage", "Extra data"),
    "a comment": ("// x\n" + GOOD, "not JSON"),
}


@pytest.mark.parametrize("case", CONFIGS)
def test_a_broken_config_json_is_one_line(case, tmp_path, capsys):
    text, fragment = CONFIGS[case]
    path = tmp_path / "config.json"
    path.write_text(text, encoding="utf-8")
    refused(capsys, "init", "--from-hf", path, "-o", "-", fragments=(fragment,))


def test_a_config_json_that_is_no_utf8_is_named(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_bytes(GOOD.replace("silu", "sil\xff").encode("latin-1"))
    refused(capsys, "init", "--from-hf", path, "-o", "-", fragments=("not UTF-8",))


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda p: p.mkdir(), "is a folder without a config.json"),
        (lambda p: p.symlink_to("/nonexistent"), "No such file or directory"),
        (
            lambda p: p.write_text(GOOD[:-1] + ', "pad": "' + "x" * (5 << 20) + '"}'),
            "larger than 4 MiB",
        ),
        (lambda p: p.symlink_to("/dev/zero"), "a device, not a regular file"),
    ],
    ids=["a folder named config.json", "a dangling link", "5 MiB", "a link to /dev/zero"],
)
def test_a_config_path_that_is_no_config_is_named(make, fragment, tmp_path, capsys):
    path = tmp_path / "config.json"
    make(path)
    refused(capsys, "init", "--from-hf", path, "-o", "-", fragments=(fragment,))


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--from-hf", ""], '--from-hf = "": is empty'),
        (["--from-hf", "CONFIG", "-o", "/dev/full"], "/dev/full: is a device"),
        (["--from-hf", "CONFIG", "-o", "FOLDER"], "is a folder"),
        (["--from-hf", "CONFIG", "-o", "FOLDER/missing/spec.toml"], "no such folder"),
        (["--from-hf", "CONFIG", "-o", "CONFIG"], "exists and was not written by moec"),
        (["--from-hf", "CONFIG", "-o", "-", "--name", "class"], 'name = "class"'),
        (
            ["--from-hf", "CONFIG", "-o", "-", "--set", "model.hidden_size=x"],
            'model.hidden_size = "x"',
        ),
    ],
)
def test_init_arguments_that_cannot_work_are_named(argv, fragment, tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(GOOD)
    argv = [a.replace("CONFIG", str(config)).replace("FOLDER", str(tmp_path)) for a in argv]
    before = config.read_bytes()
    refused(capsys, "init", *argv, fragments=(fragment,))
    assert config.read_bytes() == before


# --- arguments of the other commands ------------------------------------------------------

ARGUMENTS = [
    (["explain", TINY, "--tokens", "1,,2"], "--tokens"),
    (["explain", TINY, "--tokens", "1.5"], "--tokens"),
    (["explain", TINY, "--tokens", "\u0663"], '--tokens = "\\u0663"'),
    (["explain", TINY, "--tokens", "1," * 10_000], "up to 64 whole numbers"),
    (["explain", TINY, "--tokens", "0x10"], "--tokens"),
    (["explain", "--matrix", TINY], "takes no SPEC"),
    (["explain", TINY, "-o", "/dev/full"], "/dev/full: is a device"),
    (["explain", TINY, "--load", ""], '--load = "": is empty'),
    (["explain", TINY, "--load", "/dev/zero"], "a device, not a regular file"),
    (["explain", TINY, "--load", TINY], "cannot read the load"),
    (["explain", TINY, "--bandwidth", "-0.0"], "--bandwidth"),
    (["explain", TINY, "--bandwidth", "1e-320"], "--bandwidth"),
    (["explain", TINY, "--bf16-tflops", "nan"], "--bf16-tflops"),
    (["build", TINY, "-o", "/dev/full"], "is a device, not a folder"),
    (["build", TINY, "-o", TINY], "is a file, not a folder"),
    (["build", "/dev/stdin"], "a device, not a regular file"),
    (["run", TINY, "--tokens", "257"], "more than target.max_num_tokens = 256"),
    (["run", TINY, "--tokens", "1,2"], "--tokens"),
    (["run", TINY, "--seed", "18446744073709551616"], "--seed"),
    (["run", TINY, "--seed", "nan"], "--seed"),
    (["run", TINY, "--weights", "/dev/zero"], "a device, not a regular file"),
    (["run", TINY, "--weights", TINY], "not a readable safetensors file"),
    (["run", TINY, "--weights", "/nonexistent"], "no such file or folder"),
    (["run", TINY, "--prefix", "\x1b[2J"], "which is not given"),
    (["eplb", "", "-o", "OUT", "--ranks", "1"], 'LOAD = "": is empty'),
    (["eplb", "/dev/zero", "-o", "OUT", "--ranks", "1"], "a device, not a regular file"),
    (["eplb", TINY, "-o", "OUT", "--ranks", "1"], "cannot read the load"),
    (["eplb", "LOAD", "-o", "OUT", "--ranks", "99999999999999999999999"], "--ranks"),
    (["schema", "-o", "/dev/full"], "/dev/full: is a device"),
    (["schema", "-o", TINY], "exists and was not written by moec"),
]


@pytest.mark.parametrize(("argv", "fragment"), ARGUMENTS, ids=lambda v: str(v)[:50])
def test_an_argument_that_cannot_work_is_named(
    argv, fragment, tmp_path, capsys, monkeypatch, cache_dir
):
    monkeypatch.setenv("MOEC_CACHE_DIR", str(cache_dir))
    load = tmp_path / "load.json"
    load.write_text(json.dumps({"format": "moec-load", "load": [1] * 16}))
    argv = [
        str(a).replace("OUT", str(tmp_path / "p.json")).replace("LOAD", str(load)) for a in argv
    ]
    refused(capsys, *argv, fragments=(fragment,))
    assert not (tmp_path / "p.json").exists()


LOADS = {
    "a list": [1, 2],
    "no format": {"load": [1] * 16},
    "negative counts": {"format": "moec-load", "load": [-1] * 16},
    "booleans": {"format": "moec-load", "load": [True] * 16},
    "strings": {"format": "moec-load", "load": ["1"] * 16},
    "nested lists": {"format": "moec-load", "load": [[1]] * 16},
}


@pytest.mark.parametrize("case", LOADS)
def test_a_load_file_that_is_no_load_is_named(case, tmp_path, capsys):
    path = tmp_path / "load.json"
    path.write_text(json.dumps(LOADS[case]))
    refused(capsys, "explain", TINY, "--load", path, fragments=("is not a load file",))


def test_a_load_of_other_experts_is_named(tmp_path, capsys):
    path = tmp_path / "load.json"
    path.write_text(json.dumps({"format": "moec-load", "load": [1] * 3}))
    refused(capsys, "explain", TINY, "--load", path, fragments=("holds 3 experts, the layer 16",))


# --- -o inside a package moec built -------------------------------------------------------


@pytest.fixture
def built(tmp_path, capsys, cache_dir):
    code, out, err = cli(capsys, "build", TINY, "-o", tmp_path)
    assert code == 0, err
    return tmp_path / "tiny_cpu"


@pytest.mark.parametrize(
    "argv",
    [
        ["explain", TINY, "--format", "json", "-o", "PKG/plan.json"],  # the package's own file
        ["explain", TINY, "-o", "PKG/notes.txt"],
        ["schema", "-o", "PKG/schema.json"],
        ["init", "--from-hf", "CONFIG", "-o", "PKG/spec.toml"],
        ["eplb", "LOAD", "-o", "PKG/placement.json", "--ranks", "1"],
        ["build", TINY, "-o", "PKG"],
    ],
    ids=lambda argv: argv[0] + " " + argv[-1 if argv[0] != "eplb" else -3],
)
def test_an_output_inside_a_built_package_is_refused(argv, built, tmp_path, capsys):
    config, load = tmp_path / "config.json", tmp_path / "load.json"
    config.write_text(GOOD)
    load.write_text(json.dumps({"format": "moec-load", "load": [1] * 16}))
    before = snapshot(built)
    values = {"PKG": str(built), "CONFIG": str(config), "LOAD": str(load)}
    argv = [str(a) for a in argv]
    for key, value in values.items():
        argv = [a.replace(key, value) for a in argv]
    refused(capsys, *argv, fragments=(f"is inside {built}, a package moec built",))
    assert snapshot(built) == before
    code, out, err = cli(capsys, "build", TINY, "-o", tmp_path)
    assert code == 0 and "unchanged" in out, err  # the package is still moec's to replace


def test_an_output_beside_a_built_package_is_written(built, capsys):
    code, out, err = cli(capsys, "explain", TINY, "-o", built.parent / "plan.txt")
    assert code == 0, err
    assert (built.parent / "plan.txt").read_text().startswith("moec ")


def test_an_output_from_inside_a_built_package_by_a_relative_path_is_refused(
    built, capsys, monkeypatch
):
    monkeypatch.chdir(built)
    refused(capsys, "schema", "-o", "schema.json", fragments=("a package moec built",))
    assert not os.path.exists(built / "schema.json")


# --- a description that reads as code --------------------------------------------------

DESCRIPTION = (
    '"""\nimport os; os.system("touch PWNED")\n"""\'\'\'\\\\ \u2028 \u0085 \x7f \r\n\t \u202e '
    "}} {{ {% raw %} ${x} `x`"
)


def test_a_description_that_reads_as_code_stays_a_string(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    text = TINY.read_text().replace("[model]", f"description = {json.dumps(DESCRIPTION)}\n[model]")
    spec.write_text(text)
    code, out, err = cli(capsys, "build", spec, "-o", tmp_path)
    assert code == 0, err
    shown = subprocess.run(
        [sys.executable, "-c", "import json, tiny_cpu; print(json.dumps(tiny_cpu.DESCRIPTION))"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(shown.stdout) == DESCRIPTION
    assert not (tmp_path / "PWNED").exists()
    code, out, err = cli(capsys, "validate", tmp_path / "tiny_cpu" / "spec.toml")
    assert code == 0, err  # the package's copy of the spec reads back
