"""The plan: a networkx DiGraph of stages with typed edges, and the decisions that shaped it.

    [router] -> [select] -> [quantize] -> [dispatch] -> [gemm_gate_up] -> [activation]
                   |                                                          |
                   +--------------------------> [combine] <- [gemm_down] <---+
                                                    |
                            [shared_expert] --> [finalize] -> output

Nodes are stage names; each holds a `Stage`. An edge `producer -> consumer` carries the tensors
passed along it (`Edge`: variable name, type, the consumer's input name). Every choice is a
`Decision` with its reason, made once by a pass and only rendered by codegen and explain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from moec.plan.types import TensorType

# Pipeline order: the tie-break of the deterministic topological sort.
STAGE_ORDER = (
    "input",
    "router",
    "select",
    "quantize",
    "dispatch",
    "gemm_gate_up",
    "activation",
    "gemm_down",
    "combine",
    "shared_expert",
    "finalize",
    "output",
)


# Order of a stage's inputs in its signature: data first, then routing, then extras.
INPUT_ORDER = (
    "x",
    "a",
    "h",
    "g",
    "y",
    "logits",
    "topk_ids",
    "topk_weights",
    "routing",
    "exchange",
    "shared",
)


@dataclass
class Stage:
    """One step of the layer."""

    name: str
    kind: str
    backend: str
    params: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, TensorType] = field(default_factory=dict)
    """Tensors this stage produces, by variable name."""
    accepts: dict[str, TensorType] = field(default_factory=dict)
    """Type this stage needs on each input (by input name); absent = takes what it gets."""
    weights: dict[str, TensorType] = field(default_factory=dict)
    """Parameters of the layer this stage reads, by attribute name."""
    fused: list[str] = field(default_factory=list)
    """Stage kinds folded into this one by the fuse pass."""
    syncs_host: bool = False
    graph_safe: bool = True
    note: str = ""


@dataclass(frozen=True)
class Edge:
    """One tensor passed from a producer to a consumer."""

    tensor: str
    """Variable name in the generated forward."""
    type: TensorType
    input: str
    """The consumer's name for it."""


@dataclass(frozen=True)
class Decision:
    what: str
    choice: str
    reason: str


@dataclass
class Plan:
    """Stages, typed edges, decisions; built by `moec.plan.make_plan`."""

    graph: nx.DiGraph
    decisions: list[Decision] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    """Resolved values every later pass and template reads (dims, dtypes, layout, backend)."""

    def stage(self, name: str) -> Stage:
        return self.graph.nodes[name]["stage"]

    def has(self, name: str) -> bool:
        return name in self.graph

    def order(self) -> list[Stage]:
        """Stages in execution order: same spec, same order."""
        rank = {kind: index for index, kind in enumerate(STAGE_ORDER)}

        def key(name: str) -> str:
            stage = self.stage(name)
            position = rank.get(name, rank.get(stage.kind, len(rank)))
            return f"{position:02d}:{name}"

        return [self.stage(n) for n in nx.lexicographical_topological_sort(self.graph, key=key)]

    def inputs(self, name: str) -> list[tuple[str, Edge]]:
        """(producer, edge) for every tensor stage `name` reads, sorted by input name."""
        found = []
        for producer in self.graph.predecessors(name):
            for edge in self.graph.edges[producer, name]["tensors"]:
                found.append((producer, edge))
        rank = {name: index for index, name in enumerate(INPUT_ORDER)}
        return sorted(found, key=lambda item: (rank.get(item[1].input, len(rank)), item[1].input))

    def consumers(self, name: str) -> list[tuple[str, Edge]]:
        found = []
        for consumer in self.graph.successors(name):
            for edge in self.graph.edges[name, consumer]["tensors"]:
                found.append((consumer, edge))
        return sorted(found, key=lambda item: (item[0], item[1].input))

    def add_stage(self, stage: Stage) -> Stage:
        self.graph.add_node(stage.name, stage=stage)
        return stage

    def connect(
        self, producer: str, consumer: str, tensor: str, input_name: str | None = None
    ) -> None:
        """Pass `producer`'s output `tensor` to `consumer` (as `input_name`, default the same)."""
        tensor_type = self.stage(producer).outputs[tensor]
        edge = Edge(tensor, tensor_type, input_name or tensor)
        if self.graph.has_edge(producer, consumer):
            self.graph.edges[producer, consumer]["tensors"].append(edge)
        else:
            self.graph.add_edge(producer, consumer, tensors=[edge])

    def decide(self, what: str, choice: str, reason: str) -> None:
        self.decisions.append(Decision(what, choice, reason))

    def decision(self, what: str) -> Decision | None:
        return next((d for d in self.decisions if d.what == what), None)

    def absorb(self, keep: str, gone: str) -> None:
        """Fold stage `gone` into its neighbour `keep`: `keep` takes over `gone`'s other inputs
        and its outputs; the tensors that passed between them disappear."""
        kept, dropped = self.stage(keep), self.stage(gone)
        internal = set()
        for producer, edge in self.inputs(gone):
            if producer == keep:
                internal.add(edge.tensor)
            else:
                self._add_edge(producer, keep, edge)
        for consumer, edge in self.consumers(gone):
            if consumer == keep:
                internal.add(edge.tensor)
            else:
                self._add_edge(keep, consumer, edge)
        for tensor in internal:
            kept.outputs.pop(tensor, None)
        for tensor, tensor_type in dropped.outputs.items():
            if tensor not in internal:
                kept.outputs[tensor] = tensor_type
        kept.weights.update(dropped.weights)
        kept.fused.append(dropped.kind)
        self.graph.remove_node(gone)

    def _add_edge(self, producer: str, consumer: str, edge: Edge) -> None:
        if self.graph.has_edge(producer, consumer):
            tensors = self.graph.edges[producer, consumer]["tensors"]
            if edge not in tensors:
                tensors.append(edge)
        else:
            self.graph.add_edge(producer, consumer, tensors=[edge])
