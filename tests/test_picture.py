"""`moec explain --format svg|png`: the stage graph drawn with each stage's share of the sum of
the stage floors.

The SVG laid out in Python (no Graphviz) parses as XML, has one node per stage, shares that sum
to the floor, and no edge through a box; with a `dot` on PATH (a stand-in here) both formats
come from it; PNG without dot, or without -o, exits 2 with one line.
"""

from __future__ import annotations

import json
import os
import re
import stat
import xml.etree.ElementTree as ET
from itertools import pairwise
from pathlib import Path

import pytest

from moec import picture
from moec.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SVG = "{http://www.w3.org/2000/svg}"
DRAWN = sorted(
    p.name for p in EXAMPLES.glob("*.toml") if p.name != "deepseek-v3-deepep-ll-ep8.toml"
)
"""Every example that plans here (DeepEP's low-latency dispatch has no renderer yet)."""


@pytest.fixture
def no_dot(monkeypatch):
    monkeypatch.setattr(picture.shutil, "which", lambda name: None)


def _explain(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["explain", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _data(capsys, spec: str, tokens: str) -> dict:
    code, out, err = _explain(capsys, spec, "--tokens", tokens, "--format", "json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("name", DRAWN)
def test_svg_has_one_node_per_stage_and_shares_of_the_whole_floor(capsys, no_dot, name):
    spec = str(EXAMPLES / name)
    data = _data(capsys, spec, "64,1")
    code, out, err = _explain(capsys, spec, "--tokens", "64,1", "--format", "svg")
    assert code == 0, err
    root = ET.fromstring(out)
    assert root.tag == f"{SVG}svg"
    nodes = root.findall(f".//{SVG}g[@class='node']")
    assert [node.find(f"{SVG}title").text for node in nodes] == [s["name"] for s in data["stages"]]
    row = data["cost"][0]
    assert row["tokens"] == 64 and f"{data['spec']['name']} at T = 64 on" in out
    shares = {
        n.find(f"{SVG}title").text: float(n.get("data-share")) for n in nodes if n.get("data-share")
    }
    assert set(shares) == {s["stage"] for s in row["stages"]}
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-5)
    printed = [float(p) for p in re.findall(r">(\d+\.\d)% ", out)]
    assert len(printed) == len(shares)
    assert sum(printed) == pytest.approx(100.0, abs=0.05 * len(printed))  # each rounded to 0.1%


@pytest.mark.parametrize("name", DRAWN)
def test_no_edge_runs_through_a_box(capsys, name):
    data = _data(capsys, str(EXAMPLES / name), "1")
    boxes, width, _ = picture.layout(data)
    root = ET.fromstring(picture.svg(data))
    for edge in root.findall(f".//{SVG}g[@class='edge']"):
        points = [
            tuple(map(float, p.split(",")))
            for p in edge.find(f"{SVG}polyline").get("points").split()
        ]
        for (x0, y0), (x1, y1) in pairwise(points):
            for step in range(51):
                x, y = x0 + (x1 - x0) * step / 50, y0 + (y1 - y0) * step / 50
                inside = [
                    b.name
                    for b in boxes
                    if b.x + 1 < x < b.x + width - 1 and b.y + 1 < y < b.bottom - 1
                ]
                assert not inside, (edge.find(f"{SVG}title").text, inside)


def test_png_without_dot_exits_2_with_one_line(capsys, no_dot, tmp_path):
    out_file = tmp_path / "plan.png"
    code, out, err = _explain(
        capsys, str(EXAMPLES / "tiny-cpu.toml"), "--format", "png", "-o", str(out_file)
    )
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.strip() == (
        'moec explain: --format = "png": png needs Graphviz\'s dot program, which is not on '
        "PATH (install Graphviz (e.g. apt install graphviz), or use --format svg)"
    )
    assert not out_file.exists()


@pytest.fixture
def fake_dot(tmp_path, monkeypatch) -> Path:
    """A `dot` on PATH that keeps its input and answers `<fake -Tformat>`."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "dot"
    script.write_text(f'#!/bin/sh\ncat > {tmp_path}/input.dot\nprintf "<fake %s>" "$1"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "input.dot"


def test_with_dot_both_formats_come_from_it(capsys, fake_dot, tmp_path):
    spec = str(EXAMPLES / "tiny-cpu.toml")
    code, out, err = _explain(capsys, spec, "--tokens", "16", "--format", "svg")
    assert (code, out) == (0, "<fake -Tsvg>"), err
    sent = fake_dot.read_text()
    assert sent.startswith('digraph "tiny_cpu" {')
    assert "label=\"tiny_cpu at T = 16 on CPU (nominal): each stage's share" in sent
    assert re.search(r'"gemm_gate_up\\ngemm / torch\\n\d+\.\d% of the stage floors"', sent)
    png = tmp_path / "plan.png"
    code, out, err = _explain(capsys, spec, "--format", "png", "-o", str(png))
    assert (code, out, png.read_bytes()) == (0, "", b"<fake -Tpng>"), err


def test_png_needs_an_output_file(capsys, fake_dot):
    code, out, err = _explain(capsys, str(EXAMPLES / "tiny-cpu.toml"), "--format", "png")
    assert code == 2 and out == ""
    assert err.strip() == (
        "moec explain: --out: is required for --format png (binary output) (-o plan.png)"
    )


def test_a_picture_past_a_gemm_split_draws_the_stages_run_there(capsys, no_dot, monkeypatch):
    """deep_gemm installed, gemm_backend auto, T = 4096 past the split at 1024: moec's own
    SVG draws the deep_gemm GEMMs that run at that T with their shares; Graphviz's input puts
    the shares on the nodes of the plan above the split, none on the ones it replaces."""
    from moec import explain
    from moec.plan import Environment

    full = Environment(frozenset({"triton", "deep_gemm", "deep_ep"}))
    monkeypatch.setattr(Environment, "detect", classmethod(lambda cls: full))
    spec = str(EXAMPLES / "deepseek-v3-fp8.toml")
    data = _data(capsys, spec, "4096")
    code, out, err = _explain(capsys, spec, "--tokens", "4096", "--format", "svg")
    assert code == 0, err
    root = ET.fromstring(out)
    nodes = {n.find(f"{SVG}title").text: n for n in root.findall(f".//{SVG}g[@class='node']")}
    assert "gemm / deep_gemm" in ET.tostring(nodes["gemm_gate_up"], encoding="unicode")
    assert "gemm / triton" not in out
    shares = {name: float(n.get("data-share")) for name, n in nodes.items() if n.get("data-share")}
    assert set(shares) == {s["stage"] for s in data["cost"][0]["stages"]}
    dot = explain._dot(data, picture.heading(data), picture.stage_shares(data))
    assert '"gemm_gate_up" [label="gemm_gate_up\\ngemm / triton"];' in dot
    assert re.search(r'"gemm_gate_up \(T > 1024\)" \[label="[^"]*deep_gemm\\n[\d.]+% of', dot)
    assert re.search(r'"select" \[label="[^"]*\\n[\d.]+% of the stage floors"\]', dot)
    below = _data(capsys, spec, "64")  # up to the split: the triton GEMMs carry the shares
    dot = explain._dot(below, picture.heading(below), picture.stage_shares(below))
    assert re.search(r'"gemm_gate_up" \[label="[^"]*triton\\n[\d.]+% of', dot)
    assert '"gemm_gate_up (T > 1024)" [label="gemm_gate_up\\ngemm / deep_gemm"];' in dot
