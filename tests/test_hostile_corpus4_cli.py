"""A fourth hostile corpus, the commands: `moec tune --tokens` past the spec's
target.max_num_tokens (or zero, twice, not a number, thousands of digits) is refused before the
GPU is looked for and before any measuring; JSON nested too deep for the parser is a message,
not a traceback. Each is exit 2, one line, nothing written."""

from __future__ import annotations

import pytest
import torch
from clihelp import cli, refused
from conftest import EXAMPLES

from moec.tune import command

V3 = EXAMPLES / "deepseek-v3-fp8.toml"
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


# --- JSON nested too deep for the parser: a tuned table -----------------------------------


def test_a_tuned_table_nested_too_deep_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MOEC_TUNING_DIR", str(tmp_path))
    table = tmp_path / "nvidia-h200.json"
    table.write_text("[" * 100_000)
    err = refused(capsys, "explain", V3)
    assert f"the tuned table {table} cannot be read: JSON nested too deeply to read" in err
