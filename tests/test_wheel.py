"""The wheel carries the top-level templates/ and schemas/ (as moec/_data/), so an installed moec
builds packages without the source tree (an editable install maps neither; FACTS.md)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from conftest import EXAMPLES, ROOT


def test_wheel_builds_packages_without_the_source_tree(tmp_path):
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("moec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "moec/_data/templates/package/layer.py.j2" in names
    assert "moec/_data/schemas/moec-spec.schema.json" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import sys, moec, moec.resources as r\n"
        f"assert moec.__file__.startswith({str(site)!r}), moec.__file__\n"
        "assert '_data' in str(r.templates_dir())\n"
        "from moec.cli import main\n"
        f"sys.exit(main(['build', {str(EXAMPLES / 'tiny-cpu.toml')!r}, '-o', {str(tmp_path / 'out')!r}]))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": ""},
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "out" / "tiny_cpu" / "layer.py").exists()
