"""Logical expert ids to physical replicas, and the per-expert token counter.

The selection chooses logical experts; a layer with redundant experts (or a placement of its
own) holds physical ones: physical id p is rank p // L's expert p % L (L experts per rank).
Each (token, k) goes to one replica of its logical expert, chosen by a table (static: this
rank's fixed replica) or by a hash of its position (random); both are gathers, with no host
sync, so the forward stays capturable in a CUDA graph. Shapes: T tokens, K top-k, E logical
experts, R replicas at most.
"""

import torch

HASH = 0x9E3779B1
"""Knuth's multiplicative hash constant (2^32 / golden ratio): spreads consecutive positions."""


def static_replicas(topk_ids: torch.Tensor, replica_of: torch.Tensor) -> torch.Tensor:
    """[T, K] logical ids -> [T, K] int32 physical ids: this rank's replica of each expert."""
    return replica_of[topk_ids.long()]


def random_replicas(
    topk_ids: torch.Tensor, replica_table: torch.Tensor, replica_count: torch.Tensor
) -> torch.Tensor:
    """[T, K] logical ids -> [T, K] int32 physical ids: replica h(t * K + k) mod its count, h a
    multiplicative hash of the position (deterministic: the same tokens, the same replicas)."""
    ids = topk_ids.long()
    position = torch.arange(ids.numel(), device=ids.device, dtype=torch.int64).view(ids.shape)
    hashed = ((position * HASH) & 0xFFFFFFFF) >> 16
    choice = hashed % replica_count[ids].long()
    return replica_table[ids, choice]


def record_load(expert_counts: torch.Tensor, topk_ids: torch.Tensor, top_k: int) -> None:
    """Add each routed expert's tokens ([T, K] ids, the first top_k columns: fused shared
    experts are not counted) to `expert_counts` [E] int64, on the device."""
    ids = topk_ids[:, :top_k].reshape(-1).long()
    expert_counts.index_add_(0, ids, torch.ones_like(ids))
