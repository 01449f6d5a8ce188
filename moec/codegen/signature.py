"""A stage's function signature and its call in the forward, from one description: the plan's
edges into the stage, its weights and its outputs. The `def` line and the call line are both
rendered from a `Signature`, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from moec.plan.graph import Plan
from moec.plan.stages import Dispatch, Stage
from moec.plan.types import TensorType
from moec.vocab import Backend

RECORD_MODULE = {
    "ContiguousRouting": "grouping",
    "MaskedRouting": "grouping",
    "Exchange": "all2all",
    "NormalExchange": "deepep",
    "LowLatencyExchange": "deepep",
}
"""Runtime module defining each record type that travels along an edge."""


def takes_group(stage: Stage) -> bool:
    """Whether the stage's function takes the layer's process group: every torch.distributed
    stage, and DeepEP's dispatch (which allocates the group's buffer; combine finds it in the
    exchange record)."""
    return stage.backend == Backend.torch_distributed or (
        stage.backend == Backend.deep_ep and isinstance(stage, Dispatch)
    )


TENSOR = "torch.Tensor"


@dataclass(frozen=True)
class Signature:
    params: tuple[tuple[str, str], ...]
    """(parameter name, annotation) of the stage function."""
    args: tuple[str, ...]
    """What the forward passes for each parameter."""
    returns: tuple[tuple[str, str], ...]
    """(variable name in the forward, annotation) of each returned value."""
    shapes: str = ""
    """What the call returns, from the plan's edge types (`h: bf16[M, 2I]`), for the comment
    above it in the forward."""

    def def_line(self, name: str) -> str:
        params = ", ".join(f"{p}: {annotation}" for p, annotation in self.params)
        if len(self.returns) == 1:
            result = self.returns[0][1]
        else:
            result = f"tuple[{', '.join(annotation for _, annotation in self.returns)}]"
        return f"def {name}({params}) -> {result}:"

    def call_line(self, name: str) -> str:
        outputs = ", ".join(variable for variable, _ in self.returns)
        return f"{outputs} = stages.{name}({', '.join(self.args)})"

    @property
    def records(self) -> set[str]:
        """Runtime modules whose record types the annotations name."""
        found = set()
        for _, annotation in (*self.params, *self.returns):
            module = annotation.split(".")[0]
            if module in RECORD_MODULE.values():
                found.add(module)
        return found


def _annotation(tensor_type: TensorType) -> str:
    if tensor_type.record:
        return f"{RECORD_MODULE[tensor_type.record]}.{tensor_type.record}"
    return TENSOR


def _with_scale(name: str, tensor_type: TensorType) -> list[tuple[str, str]]:
    named = [(name, _annotation(tensor_type))]
    if tensor_type.scale is not None:
        named.append((f"{name}_scale", TENSOR))
    return named


def signature(plan: Plan, stage: Stage) -> Signature:
    """The signature of `stage`: its inputs (and their scales) in the plan's input order, then
    its weights and its workspace, then the process group where its backend communicates."""
    params: list[tuple[str, str]] = []
    args: list[str] = []
    for _, edge in plan.inputs(stage.name):
        params += _with_scale(edge.input, edge.type)
        args += [name for name, _ in _with_scale(edge.tensor, edge.type)]
    for weight, held in (*stage.weights.items(), *stage.workspace.items()):
        params.append((weight, TENSOR))
        # a weight read in part: its leading entries in use, as the layer counted them
        args.append(f"self.{weight}[: self.{held.in_use}]" if held.in_use else f"self.{weight}")
    if takes_group(stage):
        params.append(("group", "torch.distributed.ProcessGroup | None"))
        args.append("self.group")
    returns: list[tuple[str, str]] = []
    for tensor, tensor_type in stage.outputs.items():
        returns += _with_scale(tensor, tensor_type)
    shapes = "; ".join(f"{tensor}: {t.brief()}" for tensor, t in stage.outputs.items())
    return Signature(tuple(params), tuple(args), tuple(returns), shapes)
