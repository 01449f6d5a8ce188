"""The plan: a networkx DiGraph of typed stages (moec/plan/stages.py) with typed edges, and the
decisions that shaped it.

Nodes are stage names; each holds its stage record. An edge `producer -> consumer` carries the
tensors passed along it (`Edge`: variable name, type, the consumer's input name). Every choice
is a `Decision` with its reason, made once by a pass and only rendered by codegen and explain.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar, overload

import networkx as nx

from moec.plan.layer import Layer
from moec.plan.stages import Stage
from moec.plan.types import TensorType
from moec.vocab import Backend, GemmLayout

if TYPE_CHECKING:
    from moec.plan.tuning import Tiles

S = TypeVar("S", bound=Stage)

# Pipeline order: the tie-break of the deterministic topological sort.
STAGE_ORDER = (
    "input",
    "router",
    "select",
    "place",
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


@dataclass(frozen=True)
class GemmSplit:
    """The expert GEMMs on another backend above a token count (gemm_backend = "auto")."""

    up_to: int
    """The last token count the plan's own backend runs."""
    above: Backend
    """The backend of every larger token count."""


@dataclass(frozen=True)
class Backends:
    """What the resolve pass chose for the whole layer."""

    gemm: Backend
    """Backend of the expert GEMMs: torch, triton or deep_gemm (up to split.up_to, if split)."""
    layout: GemmLayout
    dispatch: Backend
    """Backend of the exchange between ranks: torch (local), torch.distributed or deep_ep."""
    split: GemmSplit | None = None
    """Set when the GEMM backend changes with the token count."""
    min_tokens: int = 1
    """The fewest tokens this plan runs (past a split: the split's up_to + 1)."""


@dataclass
class Plan:
    """Stages, typed edges, decisions; built by `moec.plan.make_plan`. The resolve pass decides
    `layer` and `backends` before the plan exists: every other pass sees them final."""

    name: str
    spec_hash: str
    layer: Layer
    backends: Backends
    description: str = ""
    """The spec's free text (a literal in generated code)."""
    graph: nx.DiGraph = field(default_factory=nx.DiGraph)
    decisions: list[Decision] = field(default_factory=list)
    tiles: Tiles | None = None
    """Triton tiles per token bucket, set by the tiles pass (Triton and DeepGEMM layers)."""
    requires: tuple[str, ...] = ()
    """Optional packages the generated package imports (deep_gemm, deep_ep, triton)."""
    missing: tuple[str, ...] = ()
    """Those of `requires` not importable where the plan was made."""
    above: Plan | None = None
    """With backends.split: the plan of the same layer on split.above, which the package runs
    above split.up_to tokens (its weights are this plan's)."""

    @overload
    def stage(self, name: str) -> Stage: ...
    @overload
    def stage(self, name: str, kind: type[S]) -> S: ...
    def stage(self, name: str, kind: type[Stage] = Stage) -> Stage:
        """The record of stage `name`; with `kind`, checked to be that kind's."""
        found = self.graph.nodes[name]["stage"]
        if not isinstance(found, kind):
            raise TypeError(f"stage {name} is a {type(found).__name__}, not a {kind.__name__}")
        return found

    def at(self, tokens: int) -> Plan:
        """The plan the package runs at `tokens` tokens: this one, or `above` past the split."""
        split = self.backends.split
        return self.above if split and self.above and tokens > split.up_to else self

    def has(self, name: str) -> bool:
        return name in self.graph

    def order(self) -> list[Stage]:
        """Stages in execution order: same spec, same order."""
        rank = {kind: index for index, kind in enumerate(STAGE_ORDER)}

        def key(name: str) -> str:
            stage = self.stage(name)
            position = rank.get(name, rank.get(stage.kind, len(rank)))
            if stage.side_stream:  # issued first, to overlap the rest
                position = 0
            return f"{position:02d}:{name}"

        return [self.stage(n) for n in nx.lexicographical_topological_sort(self.graph, key=key)]

    def inputs(self, name: str) -> list[tuple[str, Edge]]:
        """(producer, edge) for every tensor stage `name` reads, in signature order."""
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

    def put(self, stage: Stage) -> Stage:
        """Replace the record of an existing stage (passes build new records)."""
        self.graph.nodes[stage.name]["stage"] = stage
        return stage

    def update(self, name: str, **changes: Any) -> Stage:
        """A new record for stage `name` with `changes`, put in the plan."""
        return self.put(replace(self.stage(name), **changes))

    def connect(
        self, producer: str, consumer: str, tensor: str, input_name: str | None = None
    ) -> None:
        """Pass `producer`'s output `tensor` to `consumer` (as `input_name`, default the same)."""
        tensor_type = self.stage(producer).outputs[tensor]
        self._add_edge(producer, consumer, Edge(tensor, tensor_type, input_name or tensor))

    def retype(self, producer: str, tensor: str, tensor_type: TensorType) -> None:
        """`producer`'s output `tensor` becomes `tensor_type`, on every edge that carries it."""
        outputs = {**self.stage(producer).outputs, tensor: tensor_type}
        self.update(producer, outputs=outputs)
        for consumer in self.graph.successors(producer):
            tensors = self.graph.edges[producer, consumer]["tensors"]
            tensors[:] = [
                replace(e, type=tensor_type) if e.tensor == tensor else e for e in tensors
            ]

    def decide(self, what: str, choice: str, reason: str) -> None:
        self.decisions.append(Decision(what, choice, reason))

    def decision(self, what: str) -> Decision | None:
        return next((d for d in self.decisions if d.what == what), None)

    def absorb(self, keep: str, gone: str, **changes: Any) -> Stage:
        """Fold stage `gone` into its neighbour `keep`: the new record of `keep` takes over
        `gone`'s other inputs, its outputs and weights (the upstream stage's weights first, in
        pipeline order), plus `changes`; the tensors that passed between the two disappear."""
        kept, dropped = self.stage(keep), self.stage(gone)
        upstream = self.graph.has_edge(gone, keep)
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
        outputs = {k: v for k, v in kept.outputs.items() if k not in internal}
        outputs.update({k: v for k, v in dropped.outputs.items() if k not in internal})
        self.graph.remove_node(gone)
        return self.update(
            keep,
            outputs=outputs,
            weights={**dropped.weights, **kept.weights}
            if upstream
            else {**kept.weights, **dropped.weights},
            fused=(*kept.fused, dropped.kind),
            origin=tuple(dict.fromkeys(kept.origin + dropped.origin)),
            **changes,
        )

    def verify(self, after: str, converted: bool = False) -> None:
        """Check what every pass must leave true, naming the pass that broke it: an acyclic
        graph from `input` to `output`, each node's record under its own name, every stage
        but `output` read by another, each edge a tensor its producer writes, of the type it
        writes, one edge per input name; with `converted` (from the converter pass on), each
        edge of the type its consumer accepts."""

        def broken(what: str) -> AssertionError:
            return AssertionError(f"moec bug: after {after}, {what}")

        graph = self.graph
        if not nx.is_directed_acyclic_graph(graph):
            raise broken("the stage graph has a cycle")
        for end in ("input", "output"):
            if end not in graph:
                raise broken(f"the graph has no {end}")
        reached = nx.descendants(graph, "input") | {"input"}
        for name in graph:
            stage = self.stage(name)
            if stage.name != name:
                raise broken(f"node {name} holds the record of {stage.name}")
            if name != "output" and graph.out_degree(name) == 0:
                raise broken(f"nothing reads the outputs of {name}")
            if name not in reached:
                raise broken(f"{name} is not reached from the input")
            seen: set[str] = set()
            for producer, edge in self.inputs(name):
                if edge.input in seen:
                    raise broken(f"{name} is given two tensors as {edge.input}")
                seen.add(edge.input)
                written = self.stage(producer).outputs.get(edge.tensor)
                if written != edge.type:
                    raise broken(
                        f"{producer} -> {name} carries {edge.tensor} as {edge.type.label()}, "
                        f"which {producer} writes as "
                        f"{written.label() if written else 'nothing'}"
                    )
                wanted = stage.accepts.get(edge.input)
                if converted and wanted is not None and wanted != edge.type:
                    raise broken(
                        f"{name} takes {edge.input} as {wanted.label()}, given {edge.type.label()}"
                    )

    def _add_edge(self, producer: str, consumer: str, edge: Edge) -> None:
        if self.graph.has_edge(producer, consumer):
            tensors = self.graph.edges[producer, consumer]["tensors"]
            if edge not in tensors:
                tensors.append(edge)
        else:
            self.graph.add_edge(producer, consumer, tensors=[edge])
