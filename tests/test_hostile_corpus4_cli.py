"""A fourth hostile corpus, the commands: `moec tune --tokens` past the spec's
target.max_num_tokens (or zero, twice, not a number, thousands of digits) is refused before the
GPU is looked for and before any measuring; `moec eplb` refuses a load file that is not one by
the key or the entry that is wrong, its counts past the 4096 physical experts it balances, and a
replica choice without replicas in the spec's own words; JSON nested too deep for the parser
is a message, not a traceback. Each is exit 2, one line, nothing written."""

from __future__ import annotations

import json
import os

import pytest
import torch
from clihelp import cli, refused, snapshot
from conftest import EXAMPLES

from moec import eplb
from moec.tune import command

V3 = EXAMPLES / "deepseek-v3-fp8.toml"
TINY = EXAMPLES / "tiny-cpu.toml"
BOUND = ["--set", "target.max_num_tokens=256"]
"""A spec bound small enough to write past in a test."""


# --- moec tune --tokens ---------------------------------------------------------------------


@pytest.fixture
def gpu_that_must_not_measure(monkeypatch, tmp_path):
    """This machine as an H100, whose measuring (or building) fails the test: a refused
    --tokens never gets there, on a machine with a GPU or without."""
    monkeypatch.setenv("MOEC_TUNING_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(command.moec, "load", lambda loaded: pytest.fail("built"))
    monkeypatch.setattr(command, "tune_layer", lambda *args: pytest.fail("measured"))
    return tmp_path


UP_TO = "up to 64 whole numbers from 1 to 256, separated by commas"
EXAMPLE = "e.g. --tokens 1,16,64,256"
LARGER = "token counts up to 256, or a larger target.max_num_tokens in the spec's [target]"

TOKENS = {  # --tokens -> the whole message
    "past the bound": (
        "257",
        '--tokens = "257": 257 is more than the spec\'s target.max_num_tokens = 256 '
        f"({LARGER} or by --set target.max_num_tokens=257)",
    ),
    "one of several past it": (
        "1,64,4096",
        '--tokens = "1,64,4096": 4096 is more than the spec\'s target.max_num_tokens = 256 '
        f"({LARGER} or by --set target.max_num_tokens=4096)",
    ),
    "past any spec's bound": (
        "2147483648",
        '--tokens = "2147483648": 2147483648 is more than the spec\'s target.max_num_tokens = '
        f"256 ({LARGER})",
    ),
    "twenty digits": (
        "9" * 20,
        f'--tokens = "{"9" * 20}": {"9" * 20} is more than the spec\'s target.max_num_tokens = '
        f"256 ({LARGER})",
    ),
    "5000 digits": (
        "9" * 5000,
        None,  # the value is cut short; the line still says what is wrong
    ),
    "zero": (
        "0",
        f'--tokens = "0": 0 is not a bucket limit: a bucket holds at least 1 token ({UP_TO})',
    ),
    "zero among others": (
        "1, 000",
        f'--tokens = "1, 000": 0 is not a bucket limit: a bucket holds at least 1 token ({UP_TO})',
    ),
    "negative": ("-1", f'--tokens = "-1": "-1" is not a whole number ({UP_TO}, {EXAMPLE})'),
    "a word": ("abc", f'--tokens = "abc": "abc" is not a whole number ({UP_TO}, {EXAMPLE})'),
    "an exponent": ("1e3", f'--tokens = "1e3": "1e3" is not a whole number ({UP_TO}, {EXAMPLE})'),
    "a plus sign": ("+4", f'--tokens = "+4": "+4" is not a whole number ({UP_TO}, {EXAMPLE})'),
    "an underscore": ("1_0", f'--tokens = "1_0": "1_0" is not a whole number ({UP_TO}, {EXAMPLE})'),
    "a full-width digit": (
        "\uff11",
        f'--tokens = "\\uff11": "\\uff11" is not a whole number ({UP_TO}, {EXAMPLE})',
    ),
    "a fraction": ("1.5", f'--tokens = "1.5": "1.5" is not a whole number ({UP_TO}, {EXAMPLE})'),
    "empty": ("", f'--tokens = "": names no token count ({UP_TO}, {EXAMPLE})'),
    "blank": (" ", f'--tokens = " ": names no token count ({UP_TO}, {EXAMPLE})'),
    "two commas": ("1,,2", f'--tokens = "1,,2": names no token count ({UP_TO}, {EXAMPLE})'),
    "a trailing comma": ("1,", f'--tokens = "1,": names no token count ({UP_TO}, {EXAMPLE})'),
    "a duplicate": (
        "64,1,16,1",
        f'--tokens = "64,1,16,1": names 1 twice (each bucket limit once: {UP_TO})',
    ),
    "a duplicate written two ways": (
        "16,016",
        f'--tokens = "16,016": names 16 twice (each bucket limit once: {UP_TO})',
    ),
    "65 buckets": (",".join(map(str, range(1, 66))), None),
}


@pytest.mark.parametrize("case", TOKENS)
def test_a_bad_tokens_is_refused_before_any_measuring(case, gpu_that_must_not_measure, capsys):
    text, message = TOKENS[case]
    err = refused(
        capsys, "tune", V3, *BOUND, f"--tokens={text}", fragments=("moec tune: --tokens",)
    )
    if message is not None:
        assert err == f"moec tune: {message}\n"
    assert not list(gpu_that_must_not_measure.iterdir())  # no table written


def test_tokens_of_thousands_of_digits_or_buckets_say_so():
    with pytest.raises(Exception) as digits:
        command._token_list("9" * 5000, 256)
    assert "a number of 5000 digits is more than the spec's target.max_num_tokens = 256" in str(
        digits.value
    )
    with pytest.raises(Exception) as buckets:
        command._token_list(",".join(map(str, range(1, 66))), 4096)
    assert "names 65 buckets (up to 64 whole numbers from 1 to 4096" in str(buckets.value)


def test_tokens_are_checked_before_the_gpu_is_looked_for(monkeypatch, capsys):
    """On a machine without a GPU a wrong --tokens is told as such; a right one reaches the
    GPU check (so the order is what the first shows, not an accident of this machine)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = refused(capsys, "tune", V3, *BOUND, "--tokens", "512")
    assert "--tokens" in err and "512 is more than" in err and "no CUDA GPU" not in err
    err = refused(capsys, "tune", V3, *BOUND, "--tokens", " 256, 1")
    assert err.startswith("moec tune: no CUDA GPU here")


def test_tokens_up_to_the_bound_are_measured_sorted(monkeypatch, tmp_path, capsys):
    """The bound itself is a bucket limit; the buckets are measured in ascending order."""
    monkeypatch.setenv("MOEC_TUNING_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(command.moec, "load", lambda loaded: None)
    measured = []

    def tune_layer(package, layer, search, device, timer, progress):
        measured.append(search.tokens)
        bucket = {"max_tokens": None, "block_m": 16, "ms": 1}
        return command.TunedLayer("fp8_block/H7168/I2048/E256/K8", [bucket], {})

    monkeypatch.setattr(command, "tune_layer", tune_layer)
    code, out, err = cli(capsys, "tune", V3, *BOUND, "--tokens", "256, 1,16")
    assert code == 0, err
    assert measured == [(1, 16, 256)]


def test_tune_refuses_standard_output_as_its_table(gpu_that_must_not_measure, capsys):
    err = refused(capsys, "tune", V3, "-o", "-")
    assert err == (
        'moec tune: -o = "-": is standard output, and moec tune writes its table to a file '
        "(a table file's path, or leave -o out for this GPU's table)\n"
    )
    assert not os.path.exists("-")


# --- moec eplb: load files that are not one --------------------------------------------------

LOAD_HINT = (
    "(token counts from 0 to 2**53, one per logical expert, as write_expert_load writes: "
    '{"format": "moec-load", "load": [...]})'
)
FILE_HINT = '(a JSON file {"format": "moec-load", "load": [...]} (write_expert_load))'


def _load(*values: str) -> bytes:
    return ('{"format": "moec-load", "load": [' + ", ".join(values) + "]}").encode()


LOADS = {  # the file's bytes -> the message after "FILE: "
    "NaN": (
        _load("1", "NaN", "3", "4"),
        f"load[1] = NaN: is not a load file's token count {LOAD_HINT}",
    ),
    "Infinity": (
        _load("Infinity", "2", "3", "4"),
        f"load[0] = Infinity: is not a load file's token count {LOAD_HINT}",
    ),
    "-Infinity": (
        _load("1", "2", "3", "-Infinity"),
        f"load[3] = -Infinity: is not a load file's token count {LOAD_HINT}",
    ),
    "1e400": (
        _load("1e400", "2"),
        f"load[0] = Infinity: is not a load file's token count {LOAD_HINT}",
    ),
    "negative": (_load("1", "-2"), f"load[1] = -2: is not a load file's token count {LOAD_HINT}"),
    "past 2**53": (
        _load(str(2**53 + 1)),
        f"load[0] = {2**53 + 1}: is not a load file's token count {LOAD_HINT}",
    ),
    "a string": (
        _load('"1"', "2"),
        f'load[0] = "1": is not a load file\'s token count {LOAD_HINT}',
    ),
    "a boolean": (
        _load("true", "2"),
        f"load[0] = true: is not a load file's token count {LOAD_HINT}",
    ),
    "a null": (_load("1", "null"), f"load[1] = null: is not a load file's token count {LOAD_HINT}"),
    "a list in it": (
        _load("[1]", "2"),
        f"load[0] = [1]: is not a load file's token count {LOAD_HINT}",
    ),
    "three wrong": (
        _load("1", "-1", '"x"', "true", "2"),
        f"load[1] = -1: is not a load file's token count, nor are 2 more of its 5 {LOAD_HINT}",
    ),
    "no experts": (_load(), f'is not a load file: its "load" is empty {LOAD_HINT}'),
    "no load": (
        b'{"format": "moec-load"}',
        f'is not a load file: its "load" is missing {LOAD_HINT}',
    ),
    "a load object": (
        b'{"format": "moec-load", "load": {"0": 1}}',
        f'is not a load file: its "load" is not a list {LOAD_HINT}',
    ),
    "no format": (b'{"load": [1, 2]}', f'is not a load file: it has no "format" {FILE_HINT}'),
    "a placement's format": (
        b'{"format": "moec-placement", "load": [1, 2]}',
        f'is not a load file: it says "format": "moec-placement" {FILE_HINT}',
    ),
    "a list": (b"[1, 2, 3, 4]", f"is not a load file: a JSON list, not an object {FILE_HINT}"),
    "null": (b"null", f"is not a load file: a JSON null, not an object {FILE_HINT}"),
    "cut short": (
        b'{"format": "moec-load", "load": [1, 2',
        "cannot read the load: not JSON: Expecting ',' delimiter: line 1 column 38 (char 37) "
        + FILE_HINT,
    ),
    "empty": (
        b"",
        f"cannot read the load: not JSON: Expecting value: line 1 column 1 (char 0) {FILE_HINT}",
    ),
    "nested 100000 deep": (
        b"[" * 100_000,
        f"cannot read the load: JSON nested too deeply to read {FILE_HINT}",
    ),
    "an integer of 5000 digits": (
        _load("9" * 5000),
        f"cannot read the load: holds an integer of 5000 digits, too long to read {FILE_HINT}",
    ),
    "not UTF-8": (
        b'{"format": "moec-load", "load": [1]}\xff',
        f"cannot read the load: not UTF-8 text: invalid start byte at byte 36 {FILE_HINT}",
    ),
    "a byte order mark": (
        b"\xef\xbb\xbf" + _load("1", "2"),
        "cannot read the load: starts with a UTF-8 byte order mark (BOM): save it as UTF-8 "
        f"without one {FILE_HINT}",
    ),
    "a key twice": (
        b'{"format": "moec-load", "load": [1], "load": [2]}',
        'cannot read the load: the key "load" is written twice (which one is meant?) ' + FILE_HINT,
    ),
}


@pytest.mark.parametrize("case", LOADS)
def test_a_load_file_that_is_no_load_is_told_by_what_is_wrong(case, tmp_path, capsys):
    data, message = LOADS[case]
    load = tmp_path / "load.json"
    load.write_bytes(data)
    before = snapshot(tmp_path)
    err = refused(capsys, "eplb", load, "-o", tmp_path / "p.json", "--ranks", "1")
    assert err == f"{load}: {message}\n"
    assert snapshot(tmp_path) == before  # nothing written


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda path: path.mkdir(), "cannot read the load: Is a directory"),
        (lambda path: None, "cannot read the load: No such file or directory"),
        (lambda path: os.mkfifo(path), "cannot read the load: a fifo, not a regular file"),
    ],
    ids=["a folder", "missing", "a fifo"],
)
def test_a_load_path_that_is_no_file_is_named(make, says, tmp_path, capsys):
    load = tmp_path / "load.json"
    make(load)
    err = refused(capsys, "eplb", load, "-o", tmp_path / "p.json", "--ranks", "1")
    assert err == f"{load}: {says} {FILE_HINT}\n"
    assert not (tmp_path / "p.json").exists()


# --- moec eplb: counts, the replica choice, -o -------------------------------------------------


@pytest.fixture
def four(tmp_path):
    """A load of 4 experts."""
    load = tmp_path / "load.json"
    load.write_text(json.dumps({"format": "moec-load", "load": [40, 10, 10, 20]}))
    return load


BOUND_SAID = f"at most {eplb.MAX_PHYSICAL} physical experts, the load's experts plus --redundant"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--ranks", "1", "--redundant", "4093"],
            "--redundant = 4093: makes 4097 physical experts with the load's 4 "
            f"({BOUND_SAID}; with this load --redundant at most 4092)",
        ),
        (
            ["--ranks", "1", "--redundant", "2147483647"],
            "--redundant = 2147483647: makes 2147483651 physical experts with the load's 4 "
            f"({BOUND_SAID}; with this load --redundant at most 4092)",
        ),
        (
            ["--ranks", "1", "--redundant", "2147483648"],
            '--redundant = "2147483648": must be a whole number from 0 to 2147483647 '
            "(e.g. --redundant 0)",
        ),
        (
            ["--ranks", "3"],
            "--ranks = 3: does not divide the 4 physical experts (a divisor of the experts plus "
            "--redundant)",
        ),
        (
            ["--ranks", "2", "--nodes", "4"],
            "--nodes = 4: does not divide --ranks 2 (a divisor of --ranks)",
        ),
        (
            ["--ranks", "2", "--groups", "3"],
            "--groups = 3: does not divide the load's 4 experts (a divisor of the load's experts "
            "(router.n_group))",
        ),
        (
            ["--ranks", "1", "--replica-choice", "random"],
            '--replica-choice = "random": chooses among replicas, and --redundant 0 makes none '
            "(leave it out, or set --redundant)",
        ),
        (
            ["--ranks", "2", "--redundant", "2", "--replica-choice", "RANDOM"],
            '--replica-choice = "RANDOM": is not a replica choice (static or random, as '
            "parallel.replica_choice takes)",
        ),
        (
            ["--ranks", "1", "--replica-choice", ""],
            '--replica-choice = "": is not a replica choice (static or random, as '
            "parallel.replica_choice takes)",
        ),
        (
            ["--ranks", "1", "-o", "-"],
            '-o = "-": is standard output, and moec eplb writes its placement to a file '
            "(a placement file's path)",
        ),
    ],
    ids=[
        "redundant past the bound",
        "redundant of int32",
        "redundant past int32",
        "ranks",
        "nodes",
        "groups",
        "random without replicas",
        "RANDOM",
        "empty choice",
        "standard output",
    ],
)
def test_eplb_counts_and_choices_are_one_message(argv, message, four, tmp_path, capsys):
    out = ["-o", tmp_path / "p.json"] if "-o" not in argv else []
    before = snapshot(tmp_path)
    err = refused(capsys, "eplb", four, *out, *argv)
    assert err == f"moec eplb: {message}\n"
    assert snapshot(tmp_path) == before


def test_the_physical_bound_is_the_bound_and_a_larger_load_is_named(four, tmp_path, capsys):
    """4 experts + 4092 redundant fill the 4096 exactly; a load of 4097 experts is refused by
    the same bound, however few --redundant; explain --load has no such bound (it balances
    nothing), only its layer's expert count."""
    code, out, err = cli(capsys, "eplb", four, "-o", tmp_path / "p.json", "--ranks", "1",
                         "--redundant", "4092")  # fmt: skip
    assert code == 0, err
    assert len(json.loads((tmp_path / "p.json").read_text())["physical_to_logical"][0]) == 4096
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"format": "moec-load", "load": [1] * 4097}))
    err = refused(capsys, "eplb", big, "-o", tmp_path / "q.json", "--ranks", "1")
    assert (
        err == f"moec eplb: LOAD: holds 4097 experts, more than a placement holds ({BOUND_SAID})\n"
    )
    err = refused(capsys, "explain", TINY, "--load", big)
    assert "holds 4097 experts, the layer 16" in err


def test_the_replica_choice_rule_is_the_specs_in_its_words(four, tmp_path, capsys):
    """One rule, stated in one place (moec.spec.placement.replica_choice_problem): the spec's
    parallel.replica_choice and eplb's --replica-choice say it alike, each in its own names."""
    spec = refused(capsys, "validate", TINY, "--set", 'parallel.replica_choice="random"')
    assert spec.endswith(
        'parallel.replica_choice = "random": chooses among replicas, and redundant_experts = 0 '
        "makes none (leave it out, or set parallel.redundant_experts)\n"
    )
    cli_err = refused(capsys, "eplb", four, "-o", tmp_path / "p.json", "--ranks", "1",
                      "--replica-choice", "random")  # fmt: skip
    spec_words = spec.split(": ", 2)[-1].replace("redundant_experts = 0", "{zero}")
    eplb_words = cli_err.split(": ", 2)[-1].replace("--redundant 0", "{zero}")
    assert spec_words.replace("parallel.redundant_experts", "{key}") == eplb_words.replace(
        "--redundant", "{key}"
    )


def test_the_replica_choice_is_checked_before_the_load_is_read(tmp_path, capsys):
    err = refused(capsys, "eplb", tmp_path / "missing.json", "-o", tmp_path / "p.json",
                  "--ranks", "1", "--replica-choice", "hash")  # fmt: skip
    assert err.startswith('moec eplb: --replica-choice = "hash": is not a replica choice')


def test_eplb_never_replaces_its_load_or_a_folder(four, tmp_path, capsys):
    before = snapshot(tmp_path)
    err = refused(capsys, "eplb", four, "-o", four, "--ranks", "1")
    assert "exists and was not written by moec" in err
    (tmp_path / "folder").mkdir()
    before = snapshot(tmp_path)
    err = refused(capsys, "eplb", four, "-o", tmp_path / "folder", "--ranks", "1")
    assert "is a folder" in err
    assert snapshot(tmp_path) == before


def test_the_written_line_quotes_a_hostile_name_escaped(four, tmp_path, capsys):
    out = tmp_path / "p\x1b[2J.json"
    code, printed, err = cli(capsys, "eplb", four, "-o", out, "--ranks", "1")
    assert code == 0, err
    assert "\x1b" not in printed
    assert f"wrote {tmp_path}/p\\x1b[2J.json (" in printed
    assert out.exists()


# --- JSON nested too deep for the parser: a tuned table -----------------------------------


def test_a_tuned_table_nested_too_deep_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MOEC_TUNING_DIR", str(tmp_path))
    table = tmp_path / "nvidia-h200.json"
    table.write_text("[" * 100_000)
    err = refused(capsys, "explain", V3)
    assert f"the tuned table {table} cannot be read: JSON nested too deeply to read" in err
