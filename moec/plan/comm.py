"""What one rank sends to the others, per communication stage, under uniform routing.

Ranks are spread evenly over `nodes`; the bytes a rank sends to ranks of its own node cross
NVLink (`link_bytes`), to other nodes the NIC (`nic_bytes`). Per stage:

- all2all dispatch: each token once to every rank owning one of its experts (its row, scales,
  top-k ids and weights); combine returns one partial sum per (token, rank) in the model dtype.
- DeepEP normal: as all2all inside a node; between nodes a token crosses the network once per
  destination node and is forwarded over NVLink there (so its NIC bytes count nodes).
- DeepEP low-latency: one row per (token, expert), over the network path for every rank.
- tensor-parallel all-reduce: a ring, 2 (W - 1) / W of the [T, H] output per rank.

A token's destinations: with group-limited routing (topk_group of n_group groups) its experts
lie in the kept groups; with uniform routing the expected number of distinct ranks (or nodes)
holding at least one of its k experts follows from counting (hypergeometric).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

from moec.plan.graph import Plan
from moec.plan.layer import Layer
from moec.plan.stages import Combine, Dispatch, Finalize, Select, Stage
from moec.vocab import DispatchMode, TopkMethod

IDS_AND_WEIGHTS = 8
"""Bytes per top-k entry travelling with a token: an int32 id and an fp32 weight."""


@dataclass(frozen=True)
class Traffic:
    link_bytes: float = 0.0
    """Bytes this rank sends to ranks of its node (NVLink)."""
    nic_bytes: float = 0.0
    """Bytes this rank sends to other nodes (network)."""


def distinct_holders(experts: int, top_k: int, holders: int) -> float:
    """Expected holders (of `holders` equal shares of `experts`) that own at least one of k
    experts drawn without replacement."""
    if holders <= 1:
        return float(holders)
    per = experts // holders
    miss = comb(experts - per, top_k) / comb(experts, top_k) if experts - per >= top_k else 0.0
    return holders * (1.0 - miss)


def destinations(select: Select, layer: Layer, holders: int) -> float:
    """Expected distinct holders (ranks or nodes of the EP group) a token's experts live on."""
    experts, k = layer.routed_experts, layer.top_k
    groups, kept = select.n_group, select.topk_group
    if select.topk_method == TopkMethod.greedy or groups <= 1 or kept >= groups:
        return distinct_holders(experts, k, holders)
    if groups >= holders:  # whole groups per holder: count the holders of the kept groups
        return distinct_holders(groups, kept, holders)
    # a group spans holders // groups holders: spread k experts over the kept groups' holders
    return distinct_holders(kept * experts // groups, k, kept * holders // groups)


def row_bytes(stage: Stage, layer: Layer) -> float:
    """Bytes of one token row as dispatch sends it: values, scales, top-k ids and weights."""
    a = stage.outputs["a"]
    values = layer.hidden * a.dtype.bytes
    scales = 0.0
    if a.scale is not None and a.scale.granularity != "per-tensor":
        group = int(a.scale.granularity.split("x")[1])
        scales = -(-layer.hidden // group) * a.scale.dtype.bytes
    return values + scales + layer.top_k * IDS_AND_WEIGHTS


def stage_traffic(plan: Plan, stage: Stage, tokens: int) -> Traffic:
    """What this rank sends during `stage` at `tokens` tokens on it."""
    layer = plan.layer
    world = layer.tp * layer.ep
    if world == 1 or not isinstance(stage, (Dispatch, Combine, Finalize)):
        return Traffic()
    per_node = world // layer.nodes
    if isinstance(stage, Finalize):
        sent = 2.0 * (world - 1) / world * tokens * layer.hidden * layer.dtype.bytes
        return Traffic(nic_bytes=sent) if layer.nodes > 1 else Traffic(link_bytes=sent)
    if stage.mode == DispatchMode.local:
        return Traffic()
    dispatch = plan.stage("dispatch")
    row = (
        row_bytes(dispatch, layer)
        if isinstance(stage, Dispatch)
        else layer.hidden * layer.dtype.bytes
    )
    select = plan.stage("select", Select)
    if stage.mode == DispatchMode.deepep_low_latency:  # one row per (token, expert), no dedup
        remote = tokens * layer.top_k * (world - 1) / world * row
        return _split(remote, per_node, world, layer.nodes)
    ranks = destinations(select, layer, world)
    if stage.mode == DispatchMode.deepep_normal and layer.nodes > 1:
        nodes = destinations(select, layer, layer.nodes)
        nic = tokens * nodes * (layer.nodes - 1) / layer.nodes * row
        local = tokens * ranks * (per_node - 1) / world * row  # forwarded inside the node
        return Traffic(link_bytes=local, nic_bytes=nic)
    remote = tokens * ranks * (world - 1) / world * row
    return _split(remote, per_node, world, layer.nodes)


def _split(remote: float, per_node: int, world: int, nodes: int) -> Traffic:
    """Remote bytes split by where uniformly spread destinations are: own node or not."""
    if nodes == 1:
        return Traffic(link_bytes=remote)
    inside = (per_node - 1) / (world - 1)
    return Traffic(link_bytes=remote * inside, nic_bytes=remote * (1 - inside))
