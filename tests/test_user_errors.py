"""Issue 9, points 3, 4 and 6 (the CLI side): package names, numbers (spec integers and floats,
the layer against the device's memory, command-line numbers), TOML nested too deeply, and
`moec run --weights` with checkpoints that do not load: exit 2, one message naming the key,
argument, path or tensor, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from clihelp import assert_refused, cli, snapshot
from conftest import EXAMPLES
from safetensors.torch import save_file

import moec
from moec import runner
from moec.errors import MoecError
from moec.spec import memory

TINY = EXAMPLES / "tiny-cpu.toml"
V3 = EXAMPLES / "deepseek-v3-fp8.toml"
BEYOND_64_BITS = 2**70


@pytest.fixture(autouse=True)
def _session_cache(cache_dir, monkeypatch):
    """`moec run` builds into the session's cache, not the user's."""
    monkeypatch.setenv("MOEC_CACHE_DIR", str(cache_dir))


# --- package names ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("__main__", "a dunder name"),
        ("__init__", "a dunder name"),
        ("typing_extensions", "would shadow the Python module typing_extensions"),
        ("sympy", "through torch"),
        ("networkx", "would shadow"),
        ("jinja2", "would shadow"),
        ("filelock", "would shadow"),
        ("fsspec", "would shadow"),
        ("mpmath", "would shadow"),
        ("safetensors", "would shadow"),
        ("numpy", "would shadow"),
        ("deep_gemm", "would shadow"),
        ("deep_ep", "would shadow"),
        ("dill", "would shadow"),  # torch imports these when present: `import torch` broke
        ("pydot", "would shadow"),
        ("pynvml", "would shadow"),
        ("tempfile", "standard library"),
        ("test", "standard library"),  # not in sys.stdlib_module_names
        ("sitecustomize", "at every start"),  # imported by `site` when on the path
        ("usercustomize", "at every start"),
        ("dataclasses", "standard library"),
        ("moec", "would shadow"),
        ("pytest", "installed here"),
        ("a" * 101, "at most 100"),
    ],
    ids=lambda value: value[:20],
)
def test_a_name_that_cannot_be_the_package(name, fragment, capsys):
    code, out, err = cli(capsys, "validate", TINY, "--set", f"name={name}")
    assert_refused(code, out, err, f'name = "{name}"', fragment)
    assert "_moe" in err or "100" in err  # a suggestion


# --- integers and floats of the spec ------------------------------------------------------

INT_KEYS = [
    "model.hidden_size",
    "model.moe_intermediate_size",
    "model.n_routed_experts",
    "model.num_experts_per_tok",
    "model.n_shared_experts",
    "router.n_group",
    "router.topk_group",
    "parallel.tp_size",
    "parallel.ep_size",
    "parallel.nodes",
    "parallel.max_tokens_per_rank",
    "target.max_num_tokens",
]


@pytest.mark.parametrize("key", INT_KEYS)
def test_an_integer_beyond_64_bits_names_its_key(key, capsys):
    code, out, err = cli(capsys, "validate", TINY, "--set", f"{key}={BEYOND_64_BITS}")
    assert_refused(code, out, err, f"{key} = {BEYOND_64_BITS}", "less than or equal to", lines=None)


def test_an_integer_beyond_64_bits_in_a_list(capsys):
    code, out, err = cli(
        capsys, "validate", TINY, "--set", f"quant.weight_block=[{BEYOND_64_BITS}, 128]"
    )
    assert_refused(code, out, err, "quant.weight_block", lines=None)


@pytest.mark.parametrize(
    "key",
    [
        "router.routed_scaling_factor",
        "parallel.nic_bandwidth_gbs",
        "experts.masked_memory_budget_gib",
    ],
)
@pytest.mark.parametrize("value", ["1e300", str(BEYOND_64_BITS)])
def test_a_huge_float_names_its_key(key, value, capsys):
    code, out, err = cli(capsys, "validate", TINY, "--set", f"{key}={value}")
    assert_refused(code, out, err, key, lines=None)


@pytest.mark.parametrize(
    ("sets", "fragments"),
    [
        (["model.hidden_size=114688"], ["model: the layer needs at least", "H200's 139.8 GiB"]),
        (
            ["target.arch=sm89", "quant.scheme=bf16", "model.n_routed_experts=1024"],
            ["L40S's 44.0 GiB"],
        ),
        (["model.n_routed_experts=65536", "model.hidden_size=65536"], ["TiB", "H200"]),
        (["target.max_num_tokens=2147483647"], ["target.max_num_tokens = 2147483647"]),
    ],
    ids=["16x wider", "bf16 on an L40S", "huge", "tokens"],
)
def test_a_layer_larger_than_the_device_is_reported_with_its_size(sets, fragments, capsys):
    argv = ["validate", "--portable", V3]
    for item in sets:
        argv += ["--set", item]
    code, out, err = cli(capsys, *argv)
    assert_refused(code, out, err, "GiB", *fragments, lines=None)


def test_a_layer_larger_than_any_host(capsys):
    code, out, err = cli(capsys, "validate", TINY, "--set", "model.hidden_size=2000000000")
    assert_refused(code, out, err, "the 4.0 TiB a CPU target may take")


def test_a_layer_that_fits_per_rank_with_expert_parallelism(capsys):
    """1024 DeepSeek-V3 experts in bf16: 84 GiB of weights, over an A100's 79 GiB; a quarter of
    it per rank with ep_size = 4."""
    sets = ["--set", "target.arch=sm80", "--set", "quant.scheme=bf16"]
    sets += ["--set", "model.n_routed_experts=1024"]
    code, _, err = cli(capsys, "validate", "--portable", V3, *sets)
    assert code == 2 and "the A100-80GB's 79.0 GiB" in err
    sets += ["--set", "parallel.ep_size=4", "--set", "parallel.dispatch=all2all"]
    code, _, err = cli(capsys, "validate", "--portable", V3, *sets)
    assert "needs at least" not in err, err


# --- numbers on the command line ----------------------------------------------------------

BAD_COUNTS = ["nan", "inf", "0", "-1", "1e3", "2.5", "99999999999999999999", "abc", ""]


@pytest.mark.parametrize("value", BAD_COUNTS)
def test_run_tokens(value, capsys):
    assert_refused(
        *cli(capsys, "run", TINY, "--tokens", value), "moec run: --tokens", "whole number"
    )


@pytest.mark.parametrize("value", ["-1", "nan", str(2**64), "1.5"])
def test_run_seed(value, capsys):
    assert_refused(*cli(capsys, "run", TINY, "--seed", value), "--seed", "whole number")


@pytest.mark.parametrize("value", ["0", "-5", "nan", "1,,x", str(2**40), "1," * 100])
def test_explain_tokens(value, capsys):
    assert_refused(*cli(capsys, "explain", TINY, "--tokens", value), "--tokens", "token counts")


@pytest.mark.parametrize("option", ["--bandwidth", "--bf16-tflops", "--fp8-tflops"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "1e-300", "1e308", "fast"])
def test_explain_ceilings(option, value, capsys):
    code, out, err = cli(capsys, "explain", TINY, f"{option}={value}")  # = lets "-inf" through
    assert_refused(code, out, err, f"{option} = ", "finite number")


def test_run_tokens_over_the_layer_bound(capsys):
    code, out, err = cli(capsys, "run", TINY, "--tokens", "100000")
    assert_refused(code, out, err, "--tokens = 100000", "target.max_num_tokens = 256")


def test_run_tokens_that_do_not_fit_say_so_before_allocating(capsys, monkeypatch):
    monkeypatch.setattr(runner, "_free_memory", lambda device: 2**20)
    monkeypatch.setattr(torch, "randn", _never)
    code, out, err = cli(capsys, "run", TINY, "--tokens", "256")
    assert_refused(code, out, err, "--tokens = 256", "more than the 1.0 MiB free on this cpu")


def test_run_counts_what_it_keeps_beside_the_forward(capsys, monkeypatch):
    """The check counts the run's own copies (the input on the host, the fp64 copies of the
    checksum, combine's fp32 sums...): with room for the layer's least forward but not for
    them, the run is refused, not killed for want of memory halfway."""
    from moec.spec import load_spec

    spec = load_spec(str(TINY), []).spec
    least = memory.layer_bytes(spec, 256)
    extra = memory.run_bytes(spec, 256, compared=False)
    free = int(least.weights + least.activations + extra / 2)
    monkeypatch.setattr(runner, "_free_memory", lambda device: free)
    monkeypatch.setattr(torch, "randn", _never)
    code, out, err = cli(capsys, "run", TINY, "--tokens", "256")
    assert_refused(code, out, err, "--tokens = 256", "a forward of 256 tokens and its report")


def _never(*args, **kwargs):
    raise AssertionError("allocated before the memory check")


# --- TOML nested too deeply ---------------------------------------------------------------

DEEP = 5000


@pytest.mark.parametrize(
    "text",
    [
        f"a = {'[' * DEEP}{']' * DEEP}\n",
        "a = " + "{b = " * DEEP + "1" + "}" * DEEP + "\n",
        'name = "x"\n' + "[model]\nhidden_size = " + "[" * DEEP + "]" * DEEP + "\n",
    ],
    ids=["arrays", "inline tables", "inside a table"],
)
def test_toml_nested_too_deeply(text, tmp_path, capsys):
    spec = tmp_path / "deep.toml"
    spec.write_text(text)
    assert_refused(*cli(capsys, "validate", spec), f"{spec}", "nested too deeply")


def test_a_set_value_nested_too_deeply(capsys):
    value = "[" * DEEP + "]" * DEEP
    assert_refused(*cli(capsys, "validate", TINY, "--set", f"quant.weight_block={value}"), "--set")


@pytest.mark.parametrize("depth", [5, 200, 400])
def test_nesting_tomli_reads_is_a_type_error_shown_short(depth, tmp_path, capsys):
    spec = tmp_path / "nested.toml"
    value = "[" * depth + "]" * depth
    spec.write_text(TINY.read_text().replace('name = "tiny_cpu"', f"name = {value}"))
    code, out, err = cli(capsys, "validate", spec)
    assert_refused(code, out, err, "name = [[[[")
    assert len(err) < 300


def test_a_set_key_nested_deeply(capsys):
    key = ".".join(["a"] * 3000)
    code, out, err = cli(capsys, "validate", TINY, "--set", f"{key}=1")
    assert_refused(code, out, err, "a = {a = {", "unknown key in the top level")


def test_a_long_value_is_shown_cut_short(capsys):
    code, out, err = cli(capsys, "validate", TINY, "--set", f"name={'x' * 5000}")
    assert_refused(code, out, err, "5000 characters", '..."')
    assert len(err) < 600


def test_toml_nested_too_deeply_from_a_real_process(tmp_path):
    spec = tmp_path / "deep.toml"
    spec.write_text(f"a = {'[' * 100_000}{']' * 100_000}\n")
    result = subprocess.run(
        [sys.executable, "-m", "moec", "validate", str(spec)], capture_output=True, text=True
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "nested too deeply" in result.stderr


# --- moec run --weights -------------------------------------------------------------------


def _garbage(folder):
    (folder / "w.safetensors").write_bytes(b"\x00" * 64)
    return folder / "w.safetensors"


def _tensors(folder, tensor):
    save_file({"gate.weight": tensor}, folder / "w.safetensors")
    return folder / "w.safetensors"


def _named(folder, name):
    save_file({name: torch.zeros(16, 256)}, folder / "w.safetensors")
    return folder / "w.safetensors"


def _pickle(folder):
    torch.save({"gate.weight": torch.zeros(16, 256)}, folder / "w.pt")
    return folder / "w.pt"


def _under_another_prefix(folder):
    save_file({"model.layers.3.mlp.gate.weight": torch.zeros(16, 256)}, folder / "w.safetensors")
    return folder / "w.safetensors"


WEIGHTS = {
    "missing": (lambda folder: folder / "nope.safetensors", "no such file or folder"),
    "garbage": (_garbage, "not a readable safetensors file"),
    "int32": (lambda f: _tensors(f, torch.ones(16, 256, dtype=torch.int32)), "torch.int32"),
    "uint8": (
        lambda f: _tensors(f, torch.ones(16, 256, dtype=torch.uint8)),
        "gate.weight: torch.uint8: expected floating-point values",
    ),
    "a name that drives the terminal": (
        lambda f: _named(f, "gate.weight\n\x1b[2J"),
        "gate.weight\\x0a\\x1b[2J: unexpected",
    ),
    "nan": (lambda f: _tensors(f, torch.full((16, 256), float("nan"))), "gate.weight: 4096 of"),
    "inf": (lambda f: _tensors(f, torch.full((16, 256), float("inf"))), "not finite"),
    "pickle": (_pickle, "pickle file"),
    "fp8 without scale": (
        lambda f: _tensors(f, torch.zeros(16, 256).to(torch.float8_e4m3fn)),
        "gate.weight: fp8 values without gate.weight_scale_inv",
    ),
    "another prefix": (_under_another_prefix, 'under "model.layers.3.mlp.": pass that prefix'),
    "empty folder": (lambda folder: folder, "without *.safetensors"),
}


@pytest.mark.parametrize("case", WEIGHTS)
def test_run_weights_that_do_not_load(case, tmp_path, capsys):
    make, fragment = WEIGHTS[case]
    weights = make(tmp_path)
    before = snapshot(tmp_path)
    code, out, err = cli(capsys, "run", TINY, "--tokens", "2", "--weights", weights)
    assert_refused(code, out, err, f"{weights}: --weights: ", fragment, lines=None)
    assert snapshot(tmp_path) == before


# --- input files moec will not read whole, numbers Python will not convert -----------------

HUGE = "9" * 5000  # more digits than Python converts to an int (4300)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["validate", "SPEC"], "big.toml:3: model.hidden_size: is a number of 5,000 digits"),
        (
            ["validate", TINY, "--set", f"model.hidden_size={HUGE}"],
            "(--set): model.hidden_size: is a number of 5,000 digits",
        ),
        (
            ["init", "--from-hf", "CONFIG"],
            "not JSON moec can read: a number of 5,000 digits at line 1",
        ),
    ],
    ids=["spec", "set", "config"],
)
def test_an_integer_of_too_many_digits_is_a_user_error(argv, fragment, capsys, tmp_path):
    spec = tmp_path / "big.toml"
    spec.write_text(f'name = "big"\n[model]\nhidden_size = {HUGE}\n')
    config = tmp_path / "config.json"
    config.write_text(f'{{"hidden_size": {HUGE}}}')
    argv = [str(spec) if a == "SPEC" else str(config) if a == "CONFIG" else a for a in argv]
    code, _, err = cli(capsys, *argv)
    assert code == 2 and fragment in err and "Traceback" not in err


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_spec_that_is_not_a_small_regular_file_is_refused_unread(kind, capsys, tmp_path):
    """A fifo would block a read, a device or a huge file fill memory: refused before."""
    if kind == "fifo":
        path = tmp_path / "spec.toml"
        os.mkfifo(path)
        says = "not a regular file"
    elif kind == "device":
        path, says = "/dev/zero", "not a regular file"
    else:
        path = tmp_path / "spec.toml"
        path.write_bytes(b"#" * ((4 << 20) + 1))
        says = "larger than 4 MiB"
    for argv in (["validate", str(path)], ["init", "--from-hf", str(path)]):
        code, _, err = cli(capsys, *argv)
        assert code == 2 and says in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("command", "value"),
    [("explain", v) for v in ["", "1,,2", "1_000", "+4", "\uff11", "1e3"]]
    + [("run", v) for v in ["", "1_000", "+4", "\uff11", "1e3"]],
)
def test_token_counts_are_plain_digits(command, value, capsys):
    """int() takes "1_000", "+4" and other scripts' digits; a token count is ASCII digits."""
    code, _, err = cli(capsys, command, TINY, "--tokens", value)
    assert code == 2 and "--tokens" in err and "Traceback" not in err


CONFIG = {
    "model_type": "deepseek_v3",
    "hidden_size": 256,
    "moe_intermediate_size": 128,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 1,  # left out, deepseek_v3's default of 8 groups would not divide 8 experts
    "topk_group": 1,
}


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["explain", "--matrix", TINY], "takes no SPEC"),
        (["explain", "--matrix", "--cpu"], "takes no --set or --cpu"),
        (
            ["explain", "--matrix", "--tokens", "1", "--format", "json"],
            "takes no --tokens, --format",
        ),
        (["run", TINY, "--prefix", "mlp."], "--prefix: names the weights of --weights"),
        (["run", TINY, "--prefix", ""], "--prefix: names the weights of --weights"),
        (["init", "--from-hf", "CONFIG", "--name", ""], '--name = "": is empty'),
        (["init", "--from-hf", "CONFIG", "-o", " "], '-o = " ": is empty'),
        (["build", TINY, "-o", ""], '-o = "": is empty (leave it out for the default'),
        (["explain", TINY, "-o", ""], '-o = "": is empty'),
        (["explain", "--matrix", "-o", " "], '-o = " ": is empty'),
        (["schema", "-o", ""], '-o = "": is empty'),
    ],
    ids=[
        "matrix-spec",
        "matrix-cpu",
        "matrix-options",
        "prefix",
        "empty-prefix",
        "init-name",
        "init-out",
        "build-out",
        "explain-out",
        "matrix-out",
        "schema-out",
    ],
)
def test_an_option_that_would_be_ignored_is_refused(argv, fragment, capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    argv = [str(config) if a == "CONFIG" else a for a in argv]
    code, _, err = cli(capsys, *argv)
    assert code == 2 and fragment in err and "Traceback" not in err


def test_matrix_out_and_init_out_dash(capsys, tmp_path):
    out = tmp_path / "matrix.txt"
    for _ in range(2):  # written, then replaced: it is explain's own output
        assert cli(capsys, "explain", "--matrix", "-o", str(out))[0] == 0
    assert out.read_text().startswith("Support matrix")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    code, printed, _ = cli(capsys, "init", "--from-hf", str(config), "-o", "-")
    assert code == 0 and 'name = "deepseek_v3"' in printed and not Path("-").exists()


def test_bytes_that_are_not_utf8_on_the_command_line(tmp_path):
    """A --set value holding bytes that are not UTF-8 is a usage error (it validated, then the
    build crashed writing spec.toml); a spec file whose name is not UTF-8 builds, its name
    escaped in spec.toml's comment."""
    spec = os.fsencode(EXAMPLES / "tiny-cpu.toml")
    moec = [sys.executable, "-m", "moec"]
    bad = ["--set", b"description=caf\xe9"]
    for command in ([*moec, "validate", spec, *bad], [*moec, "build", spec, *bad, "-o", tmp_path]):
        done = subprocess.run(command, capture_output=True)
        assert done.returncode == 2 and b"is not UTF-8 text" in done.stderr, done.stderr
        assert b"Traceback" not in done.stderr
    odd = os.path.join(os.fsencode(tmp_path), b"spec-\xe9.toml")
    with open(odd, "wb") as handle:
        handle.write((EXAMPLES / "tiny-cpu.toml").read_bytes())
    out = tmp_path / "out"
    done = subprocess.run(
        [*moec, "build", odd, "-o", out, "--set", "description=x"], capture_output=True
    )
    assert done.returncode == 0, done.stderr
    assert "spec-\\udce9.toml" in (out / "tiny_cpu" / "spec.toml").read_text()


def test_run_of_a_triton_cpu_layer_without_the_interpreter():
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "moec", "run", str(EXAMPLES / "tiny-cpu-triton.toml")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "set TRITON_INTERPRET=1" in done.stderr


def test_fifos_are_refused_not_waited_on(tmp_path, monkeypatch, capsys):
    """A fifo as --weights, as a shard of a folder, or as a tuned table: refused at once
    (opening one waits for a writer)."""
    fifo = tmp_path / "f.safetensors"
    os.mkfifo(fifo)
    spec = EXAMPLES / "tiny-cpu-bf16.toml"
    for weights in (fifo, tmp_path):
        code, _, err = cli(capsys, "run", spec, "--tokens", "1", "--weights", weights)
        assert code == 2 and "not a regular file" in err, err
    tables = tmp_path / "tables"
    tables.mkdir()
    os.mkfifo(tables / "nvidia-h200.json")
    monkeypatch.setenv("MOEC_TUNING_DIR", str(tables))
    code, _, err = cli(capsys, "explain", EXAMPLES / "deepseek-v3-fp8.toml")
    assert code == 2 and "not a regular file" in err, err


def test_one_fp8_element_routed_runs(tmp_path, capsys):
    """A valid spec runs its first forward at its smallest: one token of one element, routed
    to one expert, fp8 (copying one fp8 element through a boolean mask has no torch kernel)."""
    spec = tmp_path / "h1.toml"
    spec.write_text(
        'name = "h1"\n[model]\nhidden_size = 1\nmoe_intermediate_size = 128\n'
        "n_routed_experts = 8\nnum_experts_per_tok = 1\n"
        '[quant]\nscheme = "fp8_per_tensor"\ncheckpoint = "bf16"\n'
        '[experts]\ngemm_backend = "torch"\n[target]\ndevice = "cpu"\nmax_num_tokens = 64\n'
    )
    code, out, err = cli(capsys, "run", spec, "--tokens", "1")
    assert code == 0 and "checksum" in out, err


def test_odd_option_values_are_refused_or_mean_what_they_say(capsys, tmp_path, monkeypatch):
    spec = EXAMPLES / "tiny-cpu.toml"
    for rate in ("1_000", "\uff13\uff10\uff10\uff10", "0x10"):  # float() takes the first two
        code, _, err = cli(capsys, "explain", spec, "--bandwidth", rate)
        assert code == 2 and "--bandwidth" in err, (rate, err)
    code, _, err = cli(capsys, "run", spec, "--weights", "")
    assert code == 2 and '--weights = "": is empty' in err
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli(capsys, "explain", spec, "--format", "json", "-o", "-")
    assert code == 0 and out.startswith('{\n  "moec_version"') and not (tmp_path / "-").exists()


def test_keys_reach_the_terminal_escaped(tmp_path, capsys):
    """A key with control characters (a terminal escape) or look-alike letters is shown
    escaped: the terminal does not obey it, and the user sees which letter differs."""
    spec = tmp_path / "escape.toml"
    spec.write_text(
        (EXAMPLES / "tiny-cpu.toml").read_text() + '\n["\\u001b]0;title\\u0007"]\nx = 1\n'
    )
    code, out, err = cli(capsys, "validate", str(spec))
    assert code == 2 and "\x1b" not in err and "\x07" not in err
    assert "\\x1b]0;title\\x07" in err
    code, out, err = cli(capsys, "validate", TINY, "--set", "model.hidden_s\u0456ze=1")
    assert code == 2 and 'model."hidden_s\\u0456ze"' in err and "did you mean hidden_size" in err


@pytest.mark.parametrize("command", ["validate", "build", "explain"])
def test_an_empty_spec_path_is_named_as_such(command, capsys):
    """'' is not the current folder ("."): the message says the path is empty."""
    code, out, err = cli(capsys, command, "")
    assert code == 2 and err.startswith("SPEC: is an empty path") and "Traceback" not in err


# --- a backend that cannot take the layer: one problem per cause, in a user's words -------


@pytest.mark.parametrize(
    ("spec", "sets", "why"),
    [
        ("deepseek-v3-fp8.toml", ["target.arch=sm100"], "fp8 grouped GEMMs on sm90"),
        ("mxfp8-sm100.toml", [], "not mxfp8"),
    ],
)
def test_a_refused_gemm_backend_is_one_problem(spec, sets, why, capsys):
    """Both GEMMs refused for one reason are named in one message, by what they are; the
    scale converters that would feed them (DeepGEMM's layout) are not problems of their own."""
    args = [a for s in ["experts.gemm_backend=deep_gemm", *sets] for a in ("--set", s)]
    code, out, err = cli(capsys, "validate", str(EXAMPLES / spec), *args)
    assert_refused(
        code, out, err, 'experts.gemm_backend = "deep_gemm": the gate/up GEMM and the down GEMM '
        "would run on deep_gemm: ", why,
    )  # fmt: skip
    assert "convert" not in err and "gemm_gate_up" not in err


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_folder_argument_of_the_api_is_refused(empty, tmp_path, monkeypatch):
    """moec.build(spec, "") and moec.load(spec, cache_dir="") do not mean the default folder."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MoecError, match="out_dir: is an empty path"):
        moec.build(TINY, empty)
    with pytest.raises(MoecError, match="cache_dir: is an empty path"):
        moec.load(TINY, cache_dir=empty)
    assert list(tmp_path.iterdir()) == []
