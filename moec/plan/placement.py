"""The placement's tables, as the place stage reads them (no torch here).

Physical expert r * L + j is rank r's j-th expert (L experts per rank); `placement[r][j]` is
its logical expert. A token's top-k ids are logical; the place stage maps each to one of its
replicas: `static` through this rank's fixed choice per logical expert, `random` through a hash
of the token's position into the expert's list of replicas.
"""

from __future__ import annotations

from collections.abc import Sequence

Placement = Sequence[Sequence[int]]
"""Per rank, the logical expert of each of its physical experts (Layer.placement)."""


def physical_to_logical(placement: Placement) -> list[int]:
    """The logical expert of every physical expert, in physical order."""
    return [expert for rank in placement for expert in rank]


def replicas(placement: Placement, experts: int) -> list[list[int]]:
    """The physical ids of each of the `experts` logical experts' replicas, ascending."""
    found: list[list[int]] = [[] for _ in range(experts)]
    for physical, logical in enumerate(physical_to_logical(placement)):
        found[logical].append(physical)
    return found


def static_choice(placement: Placement, experts: int, nodes: int) -> list[list[int]]:
    """Per rank (of ranks spread evenly over `nodes` nodes), the replica each logical expert's
    tokens go to: the rank's own replica if it holds one, else one on its node, else one of
    all; among several, spread by rank."""
    ranks, per_rank = len(placement), len(placement[0])
    per_node = max(1, ranks // nodes)
    columns = []  # per logical expert, every rank's choice
    for candidates in replicas(placement, experts):
        if len(candidates) == 1:  # most experts: every rank sends to the one replica
            columns.append([candidates[0]] * ranks)
            continue
        own: dict[int, list[int]] = {}
        node: dict[int, list[int]] = {}
        for p in candidates:
            own.setdefault(p // per_rank, []).append(p)
            node.setdefault(p // per_rank // per_node, []).append(p)
        column = []
        for rank in range(ranks):
            pool = own.get(rank) or node.get(rank // per_node) or candidates
            column.append(pool[rank % len(pool)])
        columns.append(column)
    return [list(row) for row in zip(*columns, strict=True)] if columns else [[] for _ in placement]


def replica_table(placement: Placement, experts: int) -> tuple[list[list[int]], list[int]]:
    """[E, R] physical ids of each logical expert's replicas (padded with its first) and [E]
    their counts: the random choice's tables."""
    found = replicas(placement, experts)
    width = max(len(r) for r in found)
    return [r + [r[0]] * (width - len(r)) for r in found], [len(r) for r in found]
