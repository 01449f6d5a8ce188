"""`moec explain --format svg|png`: the plan's stage graph drawn, each stage with its floor and
its share of the stage floors' sum at the first token count asked for (the layer's own floor,
which lets memory and compute overlap across stages, is at most that sum).

Graphviz's `dot` renders it where it is installed (SVG and PNG); without it, SVG is laid out
here: stages in rows by their depth in the graph (the longest path from the input), one box
each with a bar for its share of the stage floors; edges between neighbouring rows are straight,
longer ones run down lanes to the right of the boxes, so no edge crosses a box. PNG needs dot.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from moec.errors import MoecError, problem

CHAR_W, LINE_H, PAD = 7.2, 16, 10  # 12px monospace: 0.6 em a character
BOX_H, GAP_X, GAP_Y, LANE_W, MARGIN, TITLE_H = 68, 24, 40, 14, 16, 40
BAR_COLOR, TRACK_COLOR, BOX_FILL, INK = "#3b6ea8", "#dde3ea", "#f7f9fb", "#333333"


@dataclass(frozen=True)
class Box:
    """One stage placed on the page (x, y: top left corner)."""

    name: str
    lines: tuple[str, ...]
    share: float | None
    """Of the floor, 0..1; None for the input and output, which cost nothing."""
    x: float
    y: float
    height: float
    row: int

    @property
    def bottom(self) -> float:
        return self.y + self.height


def stage_shares(data: dict[str, Any]) -> dict[str, float]:
    """Each stage's share of the sum of the stage floors in explain's first cost row."""
    stages = data["cost"][0]["stages"]
    total = sum(s["floor_ms"] for s in stages)
    return {s["stage"]: (s["floor_ms"] / total if total else 0.0) for s in stages}


def _runs_above(data: dict[str, Any]) -> bool:
    """Whether explain's first cost row (the picture's T) is past a GEMM split: its stages
    are then those of the plan above it."""
    above = data["above"]
    return bool(above) and data["cost"][0]["tokens"] > above["up_to"]


def stages_at(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The stages the layer runs at the picture's T, in plan order: past a GEMM split, the
    plan above it's own version of each stage it runs differently."""
    if not _runs_above(data):
        return data["stages"]
    above = {stage["name"]: stage for stage in data["above"]["stages"]}
    costed = {stage["stage"] for stage in data["cost"][0]["stages"]}
    ends = {stage["name"] for stage in data["stages"] if stage["kind"] in ("input", "output")}
    running = [above.pop(s["name"], s) for s in data["stages"]]
    running += above.values()  # a stage only the plan above has: before the output
    running.sort(key=lambda stage: stage["kind"] == "output")
    return [stage for stage in running if stage["name"] in costed | ends]


def heading(data: dict[str, Any]) -> tuple[str, str]:
    """Two title lines: what the shares are of, and the floors they come from."""
    row = data["cost"][0]
    total = sum(s["floor_ms"] for s in row["stages"])
    return (
        f"{data['spec']['name']} at T = {row['tokens']} on {data['device']['name']}: each "
        "stage's share of the stage floors",
        f"stage floors {total:.4f} ms in sum; layer floor {row['floor_ms']:.4f} ms "
        "(memory and compute overlap across stages)",
    )


WRITTEN_BY = "written by moec explain"
"""Marks the dot, mermaid and svg outputs (a comment) and the png (a tEXt chunk) as moec's, so
that `moec explain -o` replaces only its own earlier output."""


def is_marked_picture(head: bytes) -> bool:
    """Whether a file starting with `head` is a picture explain wrote: its WRITTEN_BY mark
    where explain puts it (dot and mermaid: the second line; svg, ours or Graphviz's: a comment
    line of its own in the first 4 KiB; png: the tEXt chunk after the header), not the phrase
    anywhere, which a user's page may quote."""
    mark = WRITTEN_BY.encode()
    if head.startswith(b"\x89PNG"):
        return head[_PNG_HEADER_END + 4 :].startswith(b"tEXtSoftware\0" + mark)
    lines = head[:4096].split(b"\n")
    second = lines[1] if len(lines) > 1 else b""
    if lines[0].startswith(b"digraph "):
        return second == b'  comment="' + mark + b'";'
    if lines[0].startswith(b"flowchart "):
        return second == b"  %% " + mark
    if lines[0].startswith((b"<svg ", b"<?xml ")):  # Graphviz writes the comment lower down
        return b"<!-- " + mark + b" -->" in (line.strip() for line in lines)
    return False


_PNG_HEADER_END = 8 + 25  # signature, then IHDR: length, type, 13 bytes, crc


def _marked_png(png: bytes) -> bytes:
    """`png` with a tEXt chunk "Software: written by moec explain" after its header chunk
    (anything that does not start as a PNG does is returned as it is)."""
    if not png.startswith(b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR"):
        return png
    body = b"tEXt" + b"Software\0" + WRITTEN_BY.encode()
    chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))
    return png[:_PNG_HEADER_END] + chunk + png[_PNG_HEADER_END:]


def render(data: dict[str, Any], fmt: str, dot_text: str) -> str | bytes:
    """SVG text or PNG bytes of the plan: through `dot` when installed, else (SVG) laid out
    here; MoecError for PNG without dot."""
    dot = shutil.which("dot")
    if dot:
        return _run_dot(dot, dot_text, fmt)
    if fmt == "png":
        raise MoecError(
            [
                problem(
                    "--format",
                    "png needs Graphviz's dot program, which is not on PATH",
                    "install Graphviz (e.g. apt install graphviz), or use --format svg",
                    value="png",
                )
            ],
            "moec explain",
            kind="backend",
        )
    return svg(data)


def _run_dot(dot: str, dot_text: str, fmt: str) -> str | bytes:
    result = subprocess.run(
        [dot, f"-T{fmt}"], input=dot_text.encode(), capture_output=True, check=False, timeout=60
    )
    if result.returncode != 0:
        message = result.stderr.decode(errors="replace").strip() or f"exit {result.returncode}"
        raise MoecError(
            [problem("--format", f"dot failed: {message}", "--format svg without dot on PATH")],
            "moec explain",
            kind="backend",
        )
    return result.stdout.decode() if fmt == "svg" else _marked_png(result.stdout)


# --- layout -------------------------------------------------------------------------------


def layout(data: dict[str, Any]) -> tuple[list[Box], float, float]:
    """Boxes (in plan order) in rows by depth, each row centred; the width of a box and of the
    widest row."""
    shares = stage_shares(data)
    running = stages_at(data)
    depth: dict[str, int] = {}
    for stage in running:  # plan order is topological
        depth[stage["name"]] = max((depth[i["from"]] + 1 for i in stage["inputs"]), default=0)
    rows: dict[int, list[dict]] = {}
    for stage in running:
        rows.setdefault(depth[stage["name"]], []).append(stage)
    ms = {s["stage"]: s["floor_ms"] for s in data["cost"][0]["stages"]}
    labels = {s["name"]: _lines(s, shares.get(s["name"]), ms.get(s["name"])) for s in running}
    width = _box_width(labels.values())
    content = max(len(r) for r in rows.values()) * (width + GAP_X) - GAP_X
    placed = {}
    for index, stages in rows.items():
        used = len(stages) * (width + GAP_X) - GAP_X
        for slot, stage in enumerate(stages):
            placed[stage["name"]] = Box(
                stage["name"],
                labels[stage["name"]],
                shares.get(stage["name"]),
                MARGIN + (content - used) / 2 + slot * (width + GAP_X),
                MARGIN + TITLE_H + index * (BOX_H + GAP_Y),
                BOX_H if stage["name"] in shares else LINE_H + 2 * PAD,
                index,
            )
    return [placed[stage["name"]] for stage in running], width, content


def _lines(stage: dict, share: float | None, ms: float | None) -> tuple[str, ...]:
    if share is None:
        return (stage["name"],)
    return stage["name"], f"{stage['kind']} / {stage['backend']}", f"{share:.1%}  {ms:.4f} ms"


def _box_width(labels) -> float:
    return max(len(line) for lines in labels for line in lines) * CHAR_W + 2 * PAD


def _edges(data: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    """(from, to) -> the tensors it carries, each pair once."""
    edges: dict[tuple[str, str], list[str]] = {}
    for stage in stages_at(data):
        for item in stage["inputs"]:
            edges.setdefault((item["from"], stage["name"]), []).append(item["tensor"])
    return edges


def _lanes(spans: list[tuple[int, int]]) -> list[int]:
    """A lane per long edge (its rows from, to), reusing a lane once its last edge has ended."""
    ends: list[int] = []
    lanes = []
    for start, end in spans:
        free = next((lane for lane, last in enumerate(ends) if last <= start), None)
        if free is None:
            ends.append(end)
            lanes.append(len(ends) - 1)
        else:
            ends[free] = end
            lanes.append(free)
    return lanes


# --- drawing ------------------------------------------------------------------------------


def svg(data: dict[str, Any]) -> str:
    """The stage graph as SVG text, laid out here (no Graphviz)."""
    boxes, width, content = layout(data)
    by_name = {box.name: box for box in boxes}
    edges = _edges(data)
    right = MARGIN + content + GAP_X
    routes, lanes = _routes(edges, by_name, right)
    graph_w = right + lanes * LANE_W - MARGIN
    title_w = max(map(len, heading(data))) * CHAR_W
    page_w = MARGIN + max(graph_w, title_w) + MARGIN
    page_h = max(box.bottom for box in boxes) + MARGIN
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{page_w:.0f}" height="{page_h:.0f}" '
        f'viewBox="0 0 {page_w:.0f} {page_h:.0f}" font-family="monospace" font-size="12">',
        f"<!-- {WRITTEN_BY} -->",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        f'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="{INK}"/></marker>'
        "</defs>",
        '<rect width="100%" height="100%" fill="white"/>',
        _title(data),
        f'<g transform="translate({max(0.0, (title_w - graph_w) / 2):.1f},0)">',  # centred
    ]
    for (source, target), tensors in edges.items():
        route = routes.get((source, target))
        parts.append(_edge(by_name[source], by_name[target], width, route, ", ".join(tensors)))
    parts += [_box(box, width) for box in boxes]
    parts.append("</g></svg>")
    return "\n".join(parts) + "\n"


def _routes(edges, by_name: dict[str, Box], right: float):
    """{(from, to): (x of its lane, depth in the half gaps)} of every edge that skips a row,
    and the number of lanes."""
    long = sorted(
        (pair for pair in edges if by_name[pair[1]].row - by_name[pair[0]].row > 1),
        key=lambda pair: (by_name[pair[0]].row, by_name[pair[1]].row),
    )
    lanes = _lanes([(by_name[a].row, by_name[b].row) for a, b in long])
    count = max(lanes, default=-1) + 1
    routes = {
        pair: (right + lane * LANE_W, (count - lane) / (count + 1))
        for pair, lane in zip(long, lanes, strict=True)
    }
    return routes, count


def _title(data: dict[str, Any]) -> str:
    lines = [
        f'<text x="{MARGIN}" y="{MARGIN + 12 + index * LINE_H}" fill="{INK}">{escape(line)}</text>'
        for index, line in enumerate(heading(data))
    ]
    return "".join(lines)


def _edge(a: Box, b: Box, width: float, route: tuple[float, float] | None, tensors: str) -> str:
    """A straight arrow between neighbouring rows; else route = (x of its lane, depth in the
    half gap): out through the gap below a, down the lane, in through the gap above b. Outer
    lanes leave higher and enter lower, so lanes of one gap do not cross."""
    if route is None:
        points = [(a.x + width / 2, a.bottom), (b.x + width / 2, b.y)]
    else:
        lane_x, depth = route
        out_x, in_x = a.x + 3 * width / 4, b.x + 3 * width / 4
        below, above = a.bottom + depth * GAP_Y / 2, b.y - depth * GAP_Y / 2
        points = [
            (out_x, a.bottom),
            (out_x, below),
            (lane_x, below),
            (lane_x, above),
            (in_x, above),
            (in_x, b.y),
        ]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return (
        f'<g class="edge"><title>{escape(f"{a.name} -> {b.name}: {tensors}")}</title>'
        f'<polyline points="{path}" fill="none" stroke="{INK}" stroke-width="1.2" '
        'stroke-linejoin="round" marker-end="url(#arrow)"/></g>'
    )


def _box(box: Box, width: float) -> str:
    share = "" if box.share is None else f' data-share="{box.share:.6f}"'
    parts = [
        f'<g class="node" id={quoteattr("stage-" + box.name)}{share}>',
        f"<title>{escape(box.name)}</title>",
        f'<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{width:.1f}" height="{box.height}" rx="6" '
        f'fill="{BOX_FILL}" stroke="{INK}"/>',
    ]
    for index, line in enumerate(box.lines):
        weight = ' font-weight="bold"' if index == 0 else ""
        parts.append(
            f'<text x="{box.x + PAD:.1f}" y="{box.y + PAD + 10 + index * LINE_H:.1f}"'
            f'{weight} fill="{INK}">{escape(line)}</text>'
        )
    if box.share is not None:
        bar_y, bar_w = box.y + BOX_H - 9, width - 2 * PAD
        parts.append(
            f'<rect x="{box.x + PAD:.1f}" y="{bar_y:.1f}" width="{bar_w:.1f}" height="4" '
            f'fill="{TRACK_COLOR}"/>'
        )
        parts.append(
            f'<rect x="{box.x + PAD:.1f}" y="{bar_y:.1f}" width="{bar_w * box.share:.1f}" '
            f'height="4" fill="{BAR_COLOR}"/>'
        )
    parts.append("</g>")
    return "".join(parts)
