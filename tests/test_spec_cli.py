"""`moec validate` and `--set` from the command line: the bad-spec corpus and the error contract.

Every file in `tests/bad_specs/` is a small spec that moec must reject. Its first lines say how:

    # expect: KEY.PATH [(rule NAME)] [line N] [-- TEXT]
    # set: KEY=VALUE

`KEY.PATH` is the key path the message must name (`-` for a TOML syntax error, which has none),
`rule` the combination rule that must report it, `line` the line the message must point at and
`TEXT` a fragment the message must contain. A spec can expect several problems (one line each,
all reported at once). `# set:` lines are passed as `--set` overrides.

Each spec must make `moec validate` exit 2 with one `FILE:LINE: key.path = value: message (hint)`
line per problem on stderr and no traceback. Most checks call `moec.cli.main` in-process; a few
end-to-end checks run the real command.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from moec.cli import main
from moec.errors import MoecError, Problem
from moec.spec import load_spec
from moec.spec.rules import RULES

ROOT = Path(__file__).resolve().parent.parent
BAD_SPECS = ROOT / "tests" / "bad_specs"
EXAMPLES = ROOT / "examples"
GOOD = EXAMPLES / "tiny-cpu.toml"

EXPECT = re.compile(
    r"^# expect: (?P<path>\S+)(?: \(rule (?P<rule>\w+)\))?(?: line (?P<line>\d+))?"
    r"(?: -- (?P<text>.+))?$"
)
SET = re.compile(r"^# set: (?P<item>.+)$")
MESSAGE = re.compile(
    r"^(?P<file>.+?\.toml)(?::(?P<line>\d+))?(?: \((?P<origin>[^)]*)\))?: (?P<rest>.+)$"
)
"""One stderr line: `FILE[:LINE][ (origin)]: rest`."""


@dataclass(frozen=True)
class Expect:
    path: str
    rule: str | None
    line: int | None
    text: str | None


@dataclass(frozen=True)
class BadSpec:
    file: Path
    expects: tuple[Expect, ...]
    sets: tuple[str, ...]

    @property
    def argv(self) -> list[str]:
        args = ["validate", str(self.file)]
        for item in self.sets:
            args += ["--set", item]
        return args


def read_bad_spec(file: Path) -> BadSpec:
    expects, sets = [], []
    for line in file.read_text(encoding="utf-8").splitlines():
        if found := EXPECT.match(line):
            path = "" if found["path"] == "-" else found["path"]
            number = int(found["line"]) if found["line"] else None
            expects.append(Expect(path, found["rule"], number, found["text"]))
        elif found := SET.match(line):
            sets.append(found["item"])
        else:
            break
    return BadSpec(file, tuple(expects), tuple(sets))


CORPUS = [read_bad_spec(file) for file in sorted(BAD_SPECS.glob("*.toml"))]


def _validate(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _names_path(rest: str, path: str) -> bool:
    return rest.startswith(f"{path} = ") or rest.startswith(f"{path}: ")


# --- the corpus ---------------------------------------------------------------------------


def test_corpus_has_at_least_40_bad_specs():
    assert len(CORPUS) >= 40


def test_every_bad_spec_says_what_it_expects():
    for bad in CORPUS:
        first = bad.file.read_text(encoding="utf-8").splitlines()[0]
        assert EXPECT.match(first), f"{bad.file.name}: first line is not `# expect: ...`"
        assert bad.expects


def test_corpus_breaks_every_rule():
    broken = {expect.rule for bad in CORPUS for expect in bad.expects if expect.rule}
    missing = {rule.name for rule in RULES} - broken
    assert not missing, f"no bad spec breaks rule(s) {sorted(missing)}"
    unknown = broken - {rule.name for rule in RULES}
    assert not unknown, f"bad specs name rules that do not exist: {sorted(unknown)}"


@pytest.mark.parametrize("bad", CORPUS, ids=[bad.file.stem for bad in CORPUS])
def test_bad_spec_is_rejected(bad: BadSpec, capsys):
    code, out, err = _validate(capsys, bad.argv)
    assert code == 2, f"exit {code}; stdout: {out!r}"
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert lines, "nothing on stderr"
    parsed = []
    for line in lines:
        found = MESSAGE.match(line)
        assert found, f"not FILE:LINE: key = value: message (hint): {line!r}"
        assert found["file"] == str(bad.file)
        parsed.append(found)
    for expect in bad.expects:
        matching = [
            found
            for found in parsed
            if (not expect.path or _names_path(found["rest"], expect.path))
            and (expect.line is None or found["line"] == str(expect.line))
            and (expect.text is None or expect.text in found.group(0))
        ]
        assert matching, f"no message names {expect}; stderr:\n{err}"


@pytest.mark.parametrize(
    "bad",
    [bad for bad in CORPUS if any(e.rule for e in bad.expects)],
    ids=[bad.file.stem for bad in CORPUS if any(e.rule for e in bad.expects)],
)
def test_bad_spec_problem_names_its_rule(bad: BadSpec):
    """Through the Python API: one MoecError whose Problems carry the rule and the key path."""
    with pytest.raises(MoecError) as caught:
        load_spec(bad.file, bad.sets)
    problems = caught.value.problems
    assert all(isinstance(p, Problem) for p in problems)
    for expect in bad.expects:
        if expect.rule:
            assert any(p.rule == expect.rule and p.path == expect.path for p in problems), (
                f"{expect}: got {[(p.rule, p.path) for p in problems]}"
            )


def test_all_problems_are_reported_at_once(capsys):
    code, _, err = _validate(capsys, ["validate", str(BAD_SPECS / "multi_rules_reported.toml")])
    assert code == 2
    assert len(err.splitlines()) == 3
    with pytest.raises(MoecError) as caught:
        load_spec(BAD_SPECS / "multi_every_problem_reported.toml")
    assert {p.path for p in caught.value.problems} >= {
        "model.hidden_size",
        "router.scoring_func",
        "quant.scheme",
        "target.max_num_tokens",
    }


def test_corpus_end_to_end():
    """The real command over every bad spec without overrides at once: exit 2, no traceback,
    every file named, nothing reported ok."""
    files = [str(bad.file) for bad in CORPUS if not bad.sets]
    result = subprocess.run(
        [sys.executable, "-m", "moec.cli", "validate", *files],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    for file in files:
        assert f"{file}:" in result.stderr or f"{file} (" in result.stderr


def test_console_script_end_to_end():
    """The installed `moec` entry point: a bad --set on a good spec."""
    moec = Path(sys.executable).with_name("moec")
    assert moec.exists(), "the README's set-up installs the `moec` console script beside python"
    result = subprocess.run(
        [str(moec), "validate", str(GOOD), "--set", "parallel.ep_size=3"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{GOOD} (--set): parallel.ep_size = 3: does not divide" in result.stderr


# --- validate -----------------------------------------------------------------------------


def test_validate_prints_ok(capsys):
    assert _validate(capsys, ["validate", str(GOOD)]) == (0, "ok\n", "")


def test_validate_several_files(capsys):
    bad = BAD_SPECS / "rule_arch_needs_cuda.toml"
    code, out, err = _validate(capsys, ["validate", str(GOOD), str(bad)])
    assert code == 2
    assert out == f"{GOOD}: ok\n"
    assert err.startswith(f"{bad}:")


def test_validate_missing_file(capsys, tmp_path):
    missing = tmp_path / "nope.toml"
    code, _, err = _validate(capsys, ["validate", str(missing)])
    assert code == 2
    assert err.startswith(f"{missing}: cannot read the spec")
    assert "Traceback" not in err


def test_validate_a_folder(capsys, tmp_path):
    code, _, err = _validate(capsys, ["validate", str(tmp_path)])
    assert code == 2
    assert "cannot read the spec" in err


def test_validate_not_utf8(capsys, tmp_path):
    spec = tmp_path / "latin1.toml"
    spec.write_bytes(GOOD.read_bytes() + b'description = "caf\xe9"\n')
    code, _, err = _validate(capsys, ["validate", str(spec)])
    assert code == 2
    line = GOOD.read_text(encoding="utf-8").count("\n") + 1
    assert err.startswith(f"{spec}:{line}: not UTF-8 text")


def test_validate_a_byte_order_mark(capsys, tmp_path):
    spec = tmp_path / "bom.toml"
    spec.write_bytes(b"\xef\xbb\xbf" + GOOD.read_bytes())
    code, _, err = _validate(capsys, ["validate", str(spec)])
    assert code == 2
    assert err.startswith(f"{spec}:1: starts with a UTF-8 byte order mark (BOM)")


def test_validate_needs_a_spec(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["validate"])
    assert caught.value.code == 2


# --- --set --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "item",
    [
        "quant.scheme=bf16",
        'quant.scheme="bf16"',
        "router.norm_topk_prob=false",
        "router.routed_scaling_factor=2",
        "target.max_num_tokens=128",
        "experts.gemm_backend=triton",
        "quant.weight_block=[128, 128]",
        "activation={kind = 'silu_clamped', swiglu_limit = 10.0}",
    ],
)
def test_set_takes_toml_values(item, capsys):
    assert _validate(capsys, ["validate", str(GOOD), "--set", item]) == (0, "ok\n", "")


def test_set_values_reach_the_spec():
    loaded = load_spec(
        GOOD, ["quant.scheme=mxfp8", "target.max_num_tokens=32", "description=from --set"]
    )
    assert loaded.spec.quant.scheme == "mxfp8"
    assert loaded.spec.quant.weight_block == [1, 32]  # normalized for the new scheme
    assert loaded.spec.target.max_num_tokens == 32
    assert loaded.spec.description == "from --set"
    assert loaded.overrides == (
        "quant.scheme=mxfp8",
        "target.max_num_tokens=32",
        "description=from --set",
    )


def test_set_problem_is_marked(capsys):
    code, _, err = _validate(capsys, ["validate", str(GOOD), "--set", "quant.scheme=fp4"])
    assert code == 2
    assert err.startswith(f'{GOOD} (--set): quant.scheme = "fp4": is not a known value')


def test_later_set_wins(capsys):
    argv = ["validate", str(GOOD), "--set", "quant.scheme=fp4", "--set", "quant.scheme=bf16"]
    assert _validate(capsys, argv) == (0, "ok\n", "")


@pytest.mark.parametrize("command", ["explain", "build"])
def test_other_commands_reject_bad_set(command, capsys, tmp_path):
    argv = [command, str(GOOD), "--set", "model.hidden_size=abc"]
    if command == "build":
        argv += ["-o", str(tmp_path / "out")]
    code, out, err = _validate(capsys, argv)
    assert code == 2
    assert out == ""
    assert "Traceback" not in err
    assert err.startswith(f'{GOOD} (--set): model.hidden_size = "abc": should be a valid integer')
    assert not (tmp_path / "out").exists()


def test_run_rejects_bad_set(capsys):
    pytest.importorskip("moec.runner")
    code, _, err = _validate(capsys, ["run", str(GOOD), "--set", "parallel.ep_size=0"])
    assert code == 2
    assert err.startswith(f"{GOOD} (--set): parallel.ep_size = 0: ")


def test_explain_reads_bad_spec_like_validate(capsys):
    bad = BAD_SPECS / "rule_arch_needs_cuda.toml"
    _, _, expected = _validate(capsys, ["validate", str(bad)])
    code, _, err = _validate(capsys, ["explain", str(bad)])
    assert code == 2
    assert err == expected


@pytest.mark.parametrize("command", ["explain", "build", "run"])
@pytest.mark.parametrize("bad", CORPUS, ids=[bad.file.stem for bad in CORPUS])
def test_every_command_rejects_bad_specs_as_validate_does(bad: BadSpec, command, capsys, tmp_path):
    """No command prints a traceback or writes anything for a bad spec: each exits 2 with the
    problems validate reports."""
    _, _, expected = _validate(capsys, bad.argv)
    argv = [command, *bad.argv[1:]]
    if command == "build":
        argv += ["-o", str(tmp_path / "out")]
    code, out, err = _validate(capsys, argv)
    assert (code, out, err) == (2, "", expected)
    assert not (tmp_path / "out").exists()
