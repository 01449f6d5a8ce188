"""A sixth hostile corpus: a path holding a NUL byte (which no OS path can) given to `-o`,
`--from-hf` or a path argument of the Python API is one message naming it, not Python's
ValueError "embedded null byte"; a HOME that names no folder plans with the shipped tables (it
was a traceback); a config.json with a byte order mark says so in moec's words; a TOML syntax
error quotes its key as TOML writes it, not as a Python tuple. Each refusal is exit 2, one line,
nothing written."""

from __future__ import annotations

import pytest
from clihelp import cli, refused, snapshot
from conftest import EXAMPLES

import moec
from moec.errors import MoecError

TINY = EXAMPLES / "tiny-cpu.toml"

# --- a NUL byte in a path -----------------------------------------------------------------

NUL = "x\x00y"
NUL_SAYS = '-o = "x\\u0000y": holds a NUL byte, which no path can (a path)\n'


@pytest.mark.parametrize(
    "argv",
    [
        ("build", TINY, "-o", NUL),
        ("explain", TINY, "-o", NUL),
        ("explain", TINY, "--format", "svg", "-o", NUL),
        ("schema", "-o", NUL),
        ("init", "--from-hf", TINY, "-o", NUL),
    ],
    ids=["build", "explain", "explain-svg", "schema", "init"],
)
def test_an_out_path_with_a_nul_byte_is_one_message(argv, tmp_path, monkeypatch, capsys):
    """build, explain and schema raised ValueError('embedded null byte') from os.stat."""
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, *argv)
    assert err == f"moec {argv[0]}: {NUL_SAYS}"
    assert snapshot(tmp_path) == {}


def test_a_from_hf_path_with_a_nul_byte_is_one_message(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, "init", "--from-hf", NUL)
    assert err == f"moec init: --from-hf{NUL_SAYS[2:]}"


@pytest.mark.parametrize(
    "call, says",
    [
        (lambda: moec.build(TINY, out_dir=NUL), 'moec.build: out_dir = "x\\u0000y"'),
        (lambda: moec.load(TINY, cache_dir=NUL), 'moec.load: cache_dir = "x\\u0000y"'),
        (lambda: moec.load(NUL), 'moec.load: spec = "x\\u0000y"'),
        (lambda: moec.load_spec(NUL), 'load_spec: path = "x\\u0000y"'),
    ],
    ids=["build", "load-cache", "load-spec", "load_spec"],
)
def test_a_python_path_argument_with_a_nul_byte_is_a_usage_error(call, says, tmp_path, monkeypatch):
    """moec.build(out_dir=...) and moec.load(cache_dir=...) raised the ValueError."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MoecError) as caught:
        call()
    assert caught.value.kind == "usage"
    assert str(caught.value) == f"{says}: holds a NUL byte, which no path can (a path)"
    assert snapshot(tmp_path) == {}


# --- a HOME that names no folder --------------------------------------------------------------


@pytest.fixture
def no_home(monkeypatch):
    """HOME set to "~" (not absolute: Path.home() raises RuntimeError), MOEC_TUNING_DIR unset."""
    monkeypatch.setenv("HOME", "~")
    monkeypatch.delenv("MOEC_TUNING_DIR", raising=False)


@pytest.mark.parametrize("command", ["validate", "explain"])
def test_a_home_that_is_no_folder_plans_with_the_shipped_tables(command, no_home, capsys):
    """validate and explain exited 1 with RuntimeError('Could not determine home directory.')
    from looking up the user's tuned tables in ~/.cache/moec/tuned."""
    code, out, err = cli(capsys, command, TINY)
    assert (code, err) == (0, "")
    assert out.startswith("ok") if command == "validate" else "tiny_cpu" in out


def test_the_tuning_folder_without_a_home_names_moec_tuning_dir(no_home):
    from moec.plan.environment import Environment, user_tuning_dir

    with pytest.raises(MoecError) as caught:
        user_tuning_dir()
    assert caught.value.kind == "io"
    assert str(caught.value) == (
        "moec tune: MOEC_TUNING_DIR: is not set and this user has no home folder "
        "(set MOEC_TUNING_DIR to a folder for the tuned tables)"
    )
    assert Environment.detect().tuning_dir is None


def test_the_cache_without_a_home_says_where_it_is_looked_for(no_home, monkeypatch, capsys):
    """It began "<spec>: MOEC_CACHE_DIR", naming no spec. (A spec of its own: one this process
    has loaded before is imported again from sys.modules, with no cache folder to look up.)"""
    monkeypatch.delenv("MOEC_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    fresh = "name=tiny_cpu_no_home"
    err = refused(capsys, "run", TINY, "--set", fresh, "--tokens", "2")
    assert err == (
        "moec.load: MOEC_CACHE_DIR: is not set and this user has no home folder (set "
        "MOEC_CACHE_DIR (or pass cache_dir=) to a folder you may write to)\n"
    )


# --- a config.json that starts with a byte order mark -----------------------------------------


def test_a_config_with_a_byte_order_mark_says_so_in_moecs_words(tmp_path, capsys):
    """It said json's "Unexpected UTF-8 BOM (decode using utf-8-sig)", advice to a programmer;
    transformers reads config.json as UTF-8 and refuses it too."""
    config = tmp_path / "config.json"
    config.write_bytes(b'\xef\xbb\xbf{"model_type": "deepseek_v3"}')
    err = refused(capsys, "init", "--from-hf", config)
    assert err == (
        f"{config}: --from-hf: starts with a UTF-8 byte order mark (BOM), which transformers "
        "does not read: save it without one (a HF config.json)\n"
    )


# --- tomli's keys, written as TOML writes them ------------------------------------------------


@pytest.mark.parametrize(
    "text, says",
    [
        ("[model]\nhidden_size = 1\n[model]\n", ":4: TOML syntax: column 7: Cannot declare model twice"),
        ("model = {hidden_size = 1}\n[model.sub]\n", ":3: TOML syntax: column 11: Cannot declare model.sub twice"),
        ('[router."a.b"]\n[router."a.b"]\n', ':3: TOML syntax: column 14: Cannot declare router."a.b" twice'),
        ("model.x = {a = 1}\nmodel.x.b = 2\n", ":3: TOML syntax: column 14: Cannot mutate immutable namespace model.x"),
    ],
    ids=["table twice", "inline then header", "quoted key", "inline table extended"],
)  # fmt: skip
def test_a_key_in_a_toml_syntax_error_is_a_toml_key(text, says, tmp_path, capsys):
    """tomli quotes a key as a Python tuple: "Cannot declare ('model', 'sub') twice"."""
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "x"\n' + text)
    err = refused(capsys, "validate", spec)
    assert err == f"{spec}{says} (see https://toml.io)\n"


def test_a_key_in_a_set_tables_syntax_error_is_a_toml_key(capsys):
    err = refused(capsys, "validate", TINY, "--set", 'router={"it\'s"={b=1}, "it\'s".b=2}')
    assert 'is not one TOML value: Cannot mutate immutable namespace "it\'s".b (e.g.' in err
