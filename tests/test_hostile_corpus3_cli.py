"""A third hostile corpus, the commands: a file name with a newline or a terminal escape quoted
in a message keeps the problem on one line, and a problem of a table only --set wrote, or of a
--set that cannot be applied, is told as the --set's, not the file's. Each is exit 2 with one
line per problem naming the key, no traceback; and a NIC bandwidth too small for the cost model
to price is refused by name."""

from __future__ import annotations

import json
import re

import pytest
from clihelp import cli, refused, snapshot
from conftest import EXAMPLES

TINY = EXAMPLES / "tiny-cpu.toml"
HOSTILE_NAME = "evil\nname\x1b[2J.json"
"""A file name that would split a message line and clear the terminal, were it printed raw."""


# --- a file name quoted in a message --------------------------------------------------------

PLACEMENT_FILES = {  # contents of the placement file -> what the message says of it
    "missing": (None, "cannot read"),
    "not JSON": ("{", "is not JSON"),
    "no placement": (json.dumps({"format": "other"}), "not a placement file"),
    "a key twice": ('{"format": "moec-placement", "format": "moec-placement"}', "twice"),
}


@pytest.mark.parametrize("case", PLACEMENT_FILES)
def test_a_placement_file_name_with_a_newline_stays_one_line(case, tmp_path, capsys):
    text, says = PLACEMENT_FILES[case]
    path = tmp_path / HOSTILE_NAME
    if text is not None:
        path.write_text(text)
    err = refused(capsys, "validate", TINY, "--set", f"parallel.placement={json.dumps(str(path))}")
    assert says in err
    assert "evil\\x0aname\\x1b[2J.json" in err  # the name, escaped where it is quoted
    assert "\x1b" not in err


def test_an_output_inside_a_package_in_a_folder_with_a_newline_is_one_line(tmp_path, capsys):
    folder = tmp_path / "two\nlines"
    code, out, err = cli(capsys, "build", TINY, "-o", folder)
    assert code == 0, err
    before = snapshot(folder)
    err = refused(capsys, "explain", TINY, "-o", folder / "tiny_cpu" / "plan.txt")
    assert "two\\x0alines" in err and "a package moec built" in err
    assert snapshot(folder) == before


# --- whose problem it is: the file's or the --set's ------------------------------------------


@pytest.mark.parametrize(
    ("spec_text", "overrides", "expected"),
    [
        # [activation] is not in the file: --set activation.kind wrote it, and its missing keys
        (
            None,
            ["activation.kind=situ"],
            [
                "tiny-cpu.toml (--set): activation.beta: is required",
                "tiny-cpu.toml (--set): activation.linear_beta: is required",
            ],
        ),
        (
            None,
            ["activation.swiglu_limit=3.0"],
            ["tiny-cpu.toml (--set): activation.kind: is required to choose the activation"],
        ),
        # a file with no [model]: the table --set wrote lacks keys; the file lacks its name
        (
            "",
            ["model.hidden_size=256"],
            [
                "spec.toml (--set): model.moe_intermediate_size: is required",
                "spec.toml (--set): model.n_routed_experts: is required",
                "spec.toml (--set): model.num_experts_per_tok: is required",
                "spec.toml: name: is required",
            ],
        ),
        # a --set into a value an earlier --set made: the --set cannot be applied
        (
            None,
            ["model=1", "model.hidden_size=256"],
            ["tiny-cpu.toml (--set): model.hidden_size = 256: model is not a table"],
        ),
        (
            None,
            ["quant.scheme.n=128"],
            ["tiny-cpu.toml (--set): quant.scheme.n = 128: scheme is not a table"],
        ),
    ],
    ids=["situ kind", "clamp limit", "model of no file", "set into a set", "set into a file's"],
)
def test_a_problem_of_what_only_set_wrote_is_the_sets(
    spec_text, overrides, expected, tmp_path, capsys
):
    spec = TINY
    if spec_text is not None:
        spec = tmp_path / "spec.toml"
        spec.write_text(spec_text)
    argv = ["validate", spec]
    for item in overrides:
        argv += ["--set", item]
    err = refused(capsys, *argv, lines=len(expected))
    told = [line.removeprefix(f"{spec.parent}/") for line in err.strip().splitlines()]
    assert len(told) == len(expected)
    for line, start in zip(told, expected, strict=True):
        assert line.startswith(start), (line, start)


# --- a bandwidth too small to price ---------------------------------------------------------

EP2 = EXAMPLES / "deepseek-v3-ep2-all2all.toml"


@pytest.mark.parametrize("value", ["1e-300", "5e-324", "0.0009"])
def test_a_nic_bandwidth_below_a_megabyte_per_second_is_refused(value, capsys):
    err = refused(
        capsys,
        "explain",
        EP2,
        "--cpu",
        "--set",
        "parallel.nodes=2",
        "--set",
        f"parallel.nic_bandwidth_gbs={value}",
        lines=None,
    )
    assert "parallel.nic_bandwidth_gbs" in err and "greater than or equal to 0.001" in err


# --- the cost table at the largest token count ----------------------------------------------

STAGE_ROW = re.compile(r" {4}\w+ +[0-9.]+ k?[MGTP]?B +[0-9.]+ k?[MGTPE]?F +[0-9]+\.[0-9]{4}")
"""A row of the cost table: stage, bytes, FLOPs, floor ms, each column apart from the next."""


def test_the_cost_table_at_the_largest_token_count_keeps_its_columns(capsys):
    code, out, err = cli(
        capsys, "explain", EXAMPLES / "deepseek-v3-fp8.toml", "--cpu", "--tokens", "2147483647"
    )
    assert code == 0, err
    table = out[out.index("    stage ") :].splitlines()[1:]
    rows = [line for line in table if line.strip()]
    assert rows and all(STAGE_ROW.fullmatch(row) for row in rows), rows
    assert "1.32 PB, 1.71 EF," in out  # in the largest units, not 1322105.34 GB, 1710241.96 TF


# --- moec init: the package named twice ---------------------------------------------------

CONFIG = {
    "model_type": "deepseek_v3",
    "hidden_size": 256,
    "moe_intermediate_size": 128,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
}


@pytest.mark.parametrize("named", ['name="from_set"', "name=from_set", " name = from_set"])
def test_init_refuses_a_name_given_by_name_and_by_set(named, tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    out = tmp_path / "spec.toml"
    argv = ["init", "--from-hf", config, "--name", "from_name", "--set", named, "-o", out]
    refused(capsys, *argv, fragments=('--name = "from_name": names the package', "--set"))
    assert not out.exists()


# --- a preset that is no preset --------------------------------------------------------------


@pytest.mark.parametrize(
    "preset", ['"DeepSeek-V3"', '"deepseek-v4"', '["deepseek-v3"]', "3", '""', "{}"]
)
def test_a_preset_that_is_no_preset_is_one_problem(preset, tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(f'name = "a"\n\n[model]\npreset = {preset}\n')
    err = refused(capsys, "validate", spec)  # not also "hidden_size: is required", and 3 more
    assert f"{spec}:4: model.preset = " in err
