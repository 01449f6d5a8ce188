"""The placement's tables, as the place stage reads them (no torch here).

Physical expert r * L + j is rank r's j-th expert (L experts per rank); `placement[r][j]` is
its logical expert. A token's top-k ids are logical; the place stage maps each to one of its
replicas: `static` through this rank's fixed choice per logical expert, `random` through a hash
of the token's position into the expert's list of replicas.
"""

from __future__ import annotations

from moec.plan.layer import Layer


def physical_to_logical(layer: Layer) -> list[int]:
    """The logical expert of every physical expert, in physical order."""
    return [expert for rank in layer.placement for expert in rank]


def replicas(layer: Layer) -> list[list[int]]:
    """The physical ids of each logical expert's replicas, ascending."""
    found: list[list[int]] = [[] for _ in range(layer.routed_experts)]
    for physical, logical in enumerate(physical_to_logical(layer)):
        found[logical].append(physical)
    return found


def static_choice(layer: Layer) -> list[list[int]]:
    """Per rank, the replica each logical expert's tokens go to: the rank's own replica if it
    holds one, else one on its node, else one of all; among several, spread by rank."""
    per_rank, per_node = layer.local_experts, max(1, layer.ep // layer.nodes)
    table = []
    for rank in range(layer.ep):
        row = []
        for candidates in replicas(layer):
            own = [p for p in candidates if p // per_rank == rank]
            node = [p for p in candidates if p // per_rank // per_node == rank // per_node]
            pool = own or node or candidates
            row.append(pool[rank % len(pool)])
        table.append(row)
    return table


def replica_table(layer: Layer) -> tuple[list[list[int]], list[int]]:
    """[E, R] physical ids of each logical expert's replicas (padded with its first) and [E]
    their counts: the random choice's tables."""
    found = replicas(layer)
    width = max(len(r) for r in found)
    return [r + [r[0]] * (width - len(r)) for r in found], [len(r) for r in found]
