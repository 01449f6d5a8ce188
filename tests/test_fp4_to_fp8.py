"""quant.e2m1_to_e4m3_blocks (mxfp4 experts stored for DeepGEMM's sm90 fp8 GEMMs) against the
plain definition: the values, dequantized, are the mxfp4 values bit for bit, and each block's
scale is its largest group scale / 2**6."""

from __future__ import annotations

import pytest
import torch

from moec.runtime import quant

E2M1_CODES = torch.arange(16, dtype=torch.uint8)


def mxfp4_values(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp64 of packed e2m1 [N, K/2] with 1 x 32 scales, decoded nibble by nibble."""
    magnitudes = torch.tensor(quant.E2M1_VALUES, dtype=torch.float64)
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).long()
    values = magnitudes[codes & 7] * torch.where(codes >= 8, -1.0, 1.0).double()
    return values * scale.double().repeat_interleave(32, dim=1)


def test_random_weights_convert_exactly():
    w = torch.randn(256, 384, generator=torch.Generator().manual_seed(0)) * 0.02
    packed, scale = quant.quantize_e2m1(w)
    q, block_scale = quant.e2m1_to_e4m3_blocks(packed, scale)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (256, 384)
    assert block_scale.shape == (2, 3)
    expected_scale = scale.view(2, 128, 3, 4).amax(dim=(1, 3)) / 64
    assert torch.equal(block_scale, expected_scale)
    dequantized = q.double() * block_scale.double().repeat_interleave(128, 0).repeat_interleave(
        128, 1
    )
    assert torch.equal(dequantized, mxfp4_values(packed, scale))


def test_every_code_at_the_edges_of_the_exponent_range():
    """Every e2m1 code in a group 2**14 below the block's largest (the smallest exact offset)
    and in the largest group itself (6 * 64 = 384 <= 448)."""
    codes = E2M1_CODES.repeat(128, 16)  # [128, 256] codes, each row all 16 codes x 16
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    scale = torch.full((128, 8), 2.0**-20)
    scale[:, 0] = 2.0**-6  # the largest group: offset 2**6; the others 2**-8
    scale[:, 4] = 2.0**-6
    q, block_scale = quant.e2m1_to_e4m3_blocks(packed, scale)
    assert block_scale.tolist() == [[2.0**-12, 2.0**-12]]
    dequantized = q.double() * 2.0**-12
    assert torch.equal(dequantized, mxfp4_values(packed, scale))
    assert q.float().abs().max().item() == 384.0


def test_a_group_too_far_below_is_refused():
    codes = torch.full((128, 128), 1, dtype=torch.uint8)  # 0.5 everywhere
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    scale = torch.ones(128, 4)
    scale[5, 2] = 2.0**-15  # 0.5 * 2**-15 / 2**-6 = 2**-10: under e4m3's smallest, 2**-9
    with pytest.raises(ValueError, match="1 of 1 128 x 128 blocks"):
        quant.e2m1_to_e4m3_blocks(packed, scale)
    scale[5, 2] = 2.0**-14  # 2**-9: e4m3's smallest subnormal, exact
    quant.e2m1_to_e4m3_blocks(packed, scale)


def test_zero_groups_take_any_scale():
    """A group of zeros is exact whatever its scale (quantize_e2m1 gives it a tiny one)."""
    w = torch.randn(128, 128, generator=torch.Generator().manual_seed(1))
    w[7, 32:64] = 0.0
    packed, scale = quant.quantize_e2m1(w)
    assert scale[7, 1] < 2.0**-30
    q, block_scale = quant.e2m1_to_e4m3_blocks(packed, scale)
    assert torch.equal(q.double() * block_scale.double().item(), mxfp4_values(packed, scale))
