"""The stage functions of one package: each stage of a plan rendered through its renderer, and
the two plans of a GEMM split made one set of functions and one forward.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from moec.codegen import registry
from moec.codegen.render import render
from moec.codegen.signature import Signature, signature
from moec.plan.graph import Plan
from moec.plan.stages import Stage
from moec.vocab import ENDPOINTS

SIDE_STREAM_NOTE = "on a second CUDA stream, overlapping the stages issued after it"


@dataclass(frozen=True)
class StageFunction:
    """One rendered stage function."""

    name: str
    signature: Signature
    doc: str
    body: str

    @property
    def def_line(self) -> str:
        return self.signature.def_line(self.name)

    @property
    def call_line(self) -> str:
        return self.signature.call_line(self.name)

    @property
    def call_lines(self) -> list[str]:
        """The forward's call, below a comment of what it returns."""
        shapes = self.signature.shapes
        return [f"# {shapes}", self.call_line] if shapes else [self.call_line]


@dataclass
class Rendered:
    """The stage functions of a package and what stages.py needs around them."""

    functions: list[StageFunction]
    calls: list[str]
    """The forward's lines between its checks and `return out`."""
    pipeline: str
    """The functions in the order the forward calls them (a docstring line per branch)."""
    bindings: dict[str, str]
    imports: set[str]
    modules: set[str]


def render_stages(jinja, plan: Plan, modules: set[str]) -> Rendered:
    """Each stage of `plan` through its renderer."""
    rendered = Rendered([], [], "", {}, set(), modules)
    beside = side_stream_stages(plan)
    for stage in stages_of(plan):
        found = registry.renderer_of(stage)
        code = found.fill(plan, stage)
        sig = signature(plan, stage)
        fields = {**code.fields, "returns": ", ".join(name for name, _ in sig.returns)}
        body = render(jinja, found.template(stage), fields).rstrip("\n")
        function = StageFunction(stage.name, sig, code.doc, body)
        rendered.functions.append(function)
        for producer, edge in plan.inputs(stage.name):
            if producer in beside:  # wait for the side stream before reading its output
                rendered.calls.append(f"self.side_stream.join({edge.tensor})")
        if stage.name in beside:
            rendered.calls.append(f"# {stage.name}: {SIDE_STREAM_NOTE}")
            rendered.calls.append("with self.side_stream.beside(x):")
            rendered.calls += [f"    {line}" for line in function.call_lines]
        else:
            rendered.calls += function.call_lines
        _bind(rendered.bindings, code.bindings)
        rendered.imports.update(code.imports)
        rendered.modules.update(found.runtime(stage))
        rendered.modules.update(sig.records)
    rendered.pipeline = " -> ".join(f.name for f in rendered.functions)
    return rendered


def _bind(bindings: dict[str, str], new) -> None:
    for name, expression in new:
        if bindings.setdefault(name, expression) != expression:
            raise ValueError(f"moec bug: two bindings of {name}: {expression}, {bindings[name]}")


def with_split(plan: Plan, below: Rendered, above: Rendered) -> Rendered:
    """One package of the two plans of a GEMM split: the functions the plans render alike once,
    those they render differently under two names (the one above the split suffixed with its
    backend); the forward runs the calls the two share, and branches on T where they differ."""
    split = plan.backends.split
    assert split is not None, "with_split: a plan with a GEMM split"
    mine = {f.name: f for f in below.functions}
    functions, order = list(below.functions), []  # order: the functions the forward calls above
    cursor = 0  # where the next function of the plan above goes: after the last one placed
    for function in above.functions:
        same = mine.get(function.name)
        if same is not None:
            cursor = functions.index(same) + 1
            if same == function:
                order.append(same)
                continue
            function = replace(function, name=f"{function.name}_{split.above}")
        functions.insert(cursor, function)  # a stage of its own (a converter) keeps its name
        cursor += 1
        order.append(function)
    calls = [line for f in order for line in f.call_lines]
    first = 0
    while first < min(len(below.calls), len(calls)) and below.calls[first] == calls[first]:
        first += 1
    last = 0
    while last < min(len(below.calls), len(calls)) - first and (
        below.calls[-1 - last] == calls[-1 - last]
    ):
        last += 1
    end_below, end_above = len(below.calls) - last, len(calls) - last
    lines = [
        *below.calls[:first],
        f"if x.shape[0] <= {split.up_to}:  # {plan.backends.gemm} GEMMs "
        f"(measured faster up to {split.up_to} tokens)",
        *(f"    {c}" for c in below.calls[first:end_below]),
        f"else:  # {split.above} GEMMs",
        *(f"    {c}" for c in calls[first:end_above]),
        *below.calls[end_below:],
    ]
    bindings = dict(below.bindings)
    _bind(bindings, above.bindings.items())
    names = " -> ".join(f.name for f in order)
    pipeline = f"{below.pipeline}  (T <= {split.up_to})\n    {names}  (T > {split.up_to})"
    return Rendered(
        functions,
        lines,
        pipeline,
        bindings,
        below.imports | above.imports,
        below.modules | above.modules,
    )


def side_stream_stages(plan: Plan) -> set[str]:
    """The stages the forward issues on its second CUDA stream (runtime module streams)."""
    return {s.name for s in stages_of(plan) if s.side_stream}


def stages_of(plan: Plan) -> list[Stage]:
    return [s for s in plan.order() if s.kind not in ENDPOINTS]
