"""The codegen layer: render the plan into a package, format it, write it atomically.

Decides nothing: every value comes from the plan, through one renderer per (stage kind, backend)
(codegen/registry.py, codegen/renderers/); templates only place values.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from moec.codegen.package import COPY_MARK, python_sources
from moec.codegen.write import write_package
from moec.errors import MoecError, override_list, path_argument, problem
from moec.plan import device_for, plan_loaded
from moec.plan.environment import Environment
from moec.plan.export import plan_data
from moec.plan.resolve import INSTALL_HINTS
from moec.spec import LoadedSpec, load_spec, toml_text
from moec.spec.toml_text import one_line

PLAN_TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)
"""Token counts whose cost the generated plan.json records."""


@dataclass(frozen=True)
class BuildResult:
    package_dir: Path
    written: bool
    seconds: float
    files: tuple[str, ...]

    @property
    def summary(self) -> str:
        state = "written" if self.written else "unchanged"
        return f"{state}, {len(self.files)} files, {self.seconds:.2f} s"


def render_package(loaded: LoadedSpec, env: Environment | None = None) -> dict[str, bytes]:
    """Every file of the package for `loaded`, as bytes, formatted."""
    spec = loaded.spec
    plan = plan_loaded(loaded, env)
    check_installed(plan, loaded)
    device = device_for(spec.target.device, spec.target.arch, None, spec.parallel.nic_bandwidth_gbs)
    plan_json = json.dumps(plan_data(plan, spec, device, list(PLAN_TOKENS)), indent=2) + "\n"
    files = {name: data.encode() for name, data in format_python(python_sources(plan)).items()}
    files["plan.json"] = plan_json.encode()
    files["spec.json"] = (json.dumps(loaded.normalized, indent=2, sort_keys=True) + "\n").encode()
    files["spec.toml"] = spec_copy(loaded).encode()
    return files


def check_installed(plan, loaded: LoadedSpec) -> None:
    """Raise when the plan's code imports an optional package this machine does not have."""
    if not plan.missing:
        return
    raise MoecError(
        loaded.located(
            [
                problem(
                    key,
                    f"needs the optional package {module}, which is not installed here",
                    INSTALL_HINTS[module],
                    value=value,
                )
                for module in plan.missing
                for key, value in [_asked_by(module, loaded)]
            ]
        ),
        loaded.source,
        kind="backend",
    )


def spec_copy(loaded: LoadedSpec) -> str:
    """The spec file as it was, or, where --set changed it, the spec as built (every default
    explicit): either way it parses to the spec this package was built from."""
    source = one_line(Path(loaded.source).name)
    if loaded.overrides:
        sets = " ".join(f"--set {one_line(override)}" for override in loaded.overrides)
        how = f"with {sets}"
    elif loaded.placement_file:  # a path beside the copy would name no file
        how = "with its placement file read into it"
    else:  # a copy of a package's own copy keeps one header, this one
        text = _RELATIVE_SCHEMA.sub("", _COPY_HEADER.sub("", loaded.text, count=1), count=1)
        return f"# Copy of {source} as built\n{text}"
    return (
        f"# The spec of {source} as built {how}\n"
        "# (every value explicit, defaults included; the file's comments are not kept)\n"
        + toml_text.dumps(loaded.normalized)
    )


_COPY_HEADER = re.compile(r"\A# Copy of [^\n]* as built\n")
"""The first line spec_copy writes above a spec's text."""
_RELATIVE_SCHEMA = re.compile(r"\A#:schema (?![A-Za-z][A-Za-z0-9+.-]*:|/)[^\n]*\n")
"""An editor's schema pointer (`#:schema ../schemas/...`, the first line) relative to the
source's folder: from the package it names no file, so the copy drops it."""


def _asked_by(module: str, loaded: LoadedSpec) -> tuple[str, object]:
    """The spec key (and its value) that asks for an optional package."""
    if module == "deep_ep":
        return "parallel.dispatch", loaded.spec.parallel.dispatch
    return "experts.gemm_backend", loaded.spec.experts.gemm_backend


def format_python(sources: dict[str, str]) -> dict[str, str]:
    """Sort the imports of and format the rendered files with the pinned ruff and its default
    settings (what a user's ruff checks), in one process each for all files. The verbatim copies
    of moec/runtime/ are left as they are (the project's lint checks them)."""
    from ruff.__main__ import find_ruff_bin

    rendered = {name: text for name, text in sources.items() if COPY_MARK not in text}
    ruff = find_ruff_bin()
    try:
        scratch = tempfile.TemporaryDirectory(prefix="moec-format-", ignore_cleanup_errors=True)
    except OSError as error:
        raise temporary_folder_error(error, None) from None
    with scratch as folder:
        try:
            for name, source in rendered.items():
                (Path(folder) / name).write_text(source, encoding="utf-8")
        except OSError as error:
            raise temporary_folder_error(error, folder) from None
        for command in (  # no cache: ruff writes it in its working folder, the user's
            ["check", "--isolated", "--no-cache", "--select", "I", "--fix", "--quiet", folder],
            ["format", "--isolated", "--no-cache", "--quiet", folder],
        ):
            result = subprocess.run(
                [ruff, *command], capture_output=True, text=True, check=False, cwd=folder
            )
            if result.returncode != 0:
                os_failure = re.search(r"(.*) \(os error (\d+)\)", result.stderr)
                if os_failure:  # ruff could not write its files back: the folder is full
                    number = int(os_failure.group(2))
                    raise temporary_folder_error(OSError(number, os.strerror(number)), folder)
                raise RuntimeError(f"generated code does not parse (a moec bug):\n{result.stderr}")
        try:
            formatted = {
                name: (Path(folder) / name).read_text(encoding="utf-8") for name in rendered
            }
        except OSError as error:
            raise temporary_folder_error(error, folder) from None
    return {**sources, **formatted}


def temporary_folder_error(error: OSError, folder: str | None) -> MoecError:
    """The MoecError of an OS failure in the temporary folder (TMPDIR) where the generated code
    is formatted: it names that folder and the variable that chooses it, not the spec."""
    chosen = os.environ.get("TMPDIR")
    origin = f"TMPDIR={chosen}" if chosen else "TMPDIR is not set"
    where = folder or chosen or tempfile.gettempdir()
    return MoecError(
        [
            problem(
                "",
                f"cannot write moec's temporary files ({origin}): {error.strerror or error}",
                "free some space there, or set TMPDIR to a folder with room that you may write to",
            )
        ],
        str(where),
        kind="io",
    )


def api_spec(spec, overrides, call: str) -> LoadedSpec:
    """The LoadedSpec of the Python API's `spec` (a path, with its overrides, or a LoadedSpec,
    which holds its own); TypeError or ValueError naming the argument."""
    if not isinstance(spec, LoadedSpec):
        path = path_argument(spec, "spec", call)
        return load_spec(path, override_list(overrides, call))
    if override_list(overrides, call):
        raise ValueError(
            f"{call}: overrides apply to a spec path; a LoadedSpec holds its own "
            "(load_spec(path, overrides))"
        )
    return spec


def build(
    spec, out_dir: str | Path | None = None, overrides=(), env: Environment | None = None
) -> BuildResult:
    """Build the package of `spec` (a path or a LoadedSpec) into `out_dir`/<name>/."""
    start = time.perf_counter()
    loaded = api_spec(spec, overrides, "moec.build")
    out_dir = path_argument(out_dir, "out_dir", "moec.build", optional=True)
    files = render_package(loaded, env)
    target = Path(out_dir or "out") / loaded.spec.name
    written = write_package(target, files)
    return BuildResult(target, written, time.perf_counter() - start, tuple(sorted(files)))
