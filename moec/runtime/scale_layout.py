"""The scale layout DeepGEMM reads on sm90, from the K-major fp32 scales moec's quantizers write,
and back (DeepEP's low-latency dispatch writes MN-major scales; Triton GEMMs read K-major): the
same values, in other places.

MN-major, TMA-aligned: the scales of one K group are contiguous along the rows, each group's
column padded to a 16-byte multiple (rows aligned to 4 fp32); [.., rows, groups] with strides
(1, aligned_rows). (sm100 packs UE8M0 exponents four per int32 instead; moec does not drive
DeepGEMM's sm100 fp8 kernels, so it has no converter for it.)
"""

import torch


def tma_aligned_rows(rows: int, element_size: int = 4) -> int:
    """Rows padded so that one column of `element_size`-byte scales is a 16-byte multiple."""
    unit = 16 // element_size
    return -(-rows // unit) * unit


def mn_major(rows: int, groups: int, leading=(), dtype=torch.float32, device=None) -> torch.Tensor:
    """An empty [*leading, rows, groups] tensor laid out MN-major and TMA-aligned."""
    aligned = tma_aligned_rows(rows, torch.empty((), dtype=dtype).element_size())
    storage = torch.empty((*leading, groups, aligned), dtype=dtype, device=device)
    return storage.transpose(-1, -2)[..., :rows, :]


def to_mn_major(scale: torch.Tensor) -> torch.Tensor:
    """K-major fp32 scales [.., rows, groups] copied into the MN-major TMA-aligned layout."""
    out = mn_major(scale.shape[-2], scale.shape[-1], scale.shape[:-2], scale.dtype, scale.device)
    out.copy_(scale)
    return out


def to_k_major(scale: torch.Tensor) -> torch.Tensor:
    """Scales [.., rows, groups] in any layout copied K-major (each row's groups contiguous)."""
    return scale.contiguous()
