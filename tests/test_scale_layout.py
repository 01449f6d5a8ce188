"""The scale-layout converters (moec/runtime/scale_layout.py) against plain references of the
layout DeepGEMM reads on sm90: element (row, group) of an MN-major TMA-aligned tensor sits at
group * aligned_rows + row (aligned_rows: rows rounded up to 4 fp32 = 16 bytes)."""

from __future__ import annotations

import pytest
import torch

from moec.runtime.scale_layout import mn_major, tma_aligned_rows, to_mn_major


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 130])
def test_tma_aligned_rows(rows):
    assert tma_aligned_rows(rows) == -(-rows // 4) * 4
    assert tma_aligned_rows(rows, 1) == -(-rows // 16) * 16


@pytest.mark.parametrize("shape", [(5, 3), (128, 56), (2, 7, 4), (3, 256, 16)])
def test_mn_major_places_every_scale(shape):
    scale = torch.rand(shape) + 0.5
    out = to_mn_major(scale)
    assert torch.equal(out, scale)  # the same values
    rows, groups = shape[-2:]
    aligned = -(-rows // 4) * 4
    assert out.stride()[-2:] == (1, aligned)
    storage = out.as_strided((out.untyped_storage().nbytes() // 4,), (1,))
    batch_stride = groups * aligned
    for index in torch.cartesian_prod(*[torch.arange(n) for n in shape]).tolist():
        *lead, row, group = index
        offset = sum(i * batch_stride for i in lead) + group * aligned + row
        assert storage[offset] == scale[tuple(index)]


def test_mn_major_empty_has_the_layout():
    out = mn_major(6, 3, (2,))
    assert out.shape == (2, 6, 3) and out.stride() == (3 * 8, 1, 8)
