"""Number formats of this layer: quantize and dequantize, exactly as docs/numerics.md defines.

e4m3 (max 448) with fp32 scales per block of [block_n, block_k] values; a scale may be rounded
up to a power of two (UE8M0). Activations use the same function with block_n = 1.
e2m1 (mxfp4) values are packed two per byte, the even column in the low nibble.
"""

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
# The eight magnitudes of e2m1; bit 3 of a nibble is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def round_up_pow2(scale: torch.Tensor) -> torch.Tensor:
    """Smallest power of two >= each positive fp32 scale (UE8M0 with rounding up)."""
    bits = scale.float().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    exponent = exponent + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (exponent << 23).view(torch.float32)


def quantize_blocks(
    x: torch.Tensor, block_n: int, block_k: int, pow2_scales: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, K] -> (e4m3 [N, K], fp32 scales [ceil(N/block_n), ceil(K/block_k)]).

    scale = max(amax, 1e-10) / 448 per block (rounded up to a power of two when `pow2_scales`),
    value = clamp(x / scale, -448, 448); partial blocks are padded with zeros.
    """
    n, k = x.shape
    blocks = _blocked(x.float(), block_n, block_k)  # [N/bn, bn, K/bk, bk]
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-10)  # [N/bn, K/bk]
    scale = amax / E4M3_MAX
    if pow2_scales:
        scale = round_up_pow2(scale)
    q = (blocks / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX)
    q = q.reshape(blocks.shape[0] * block_n, blocks.shape[2] * block_k)[:n, :k]
    return q.to(torch.float8_e4m3fn).contiguous(), scale


def quantize_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor e4m3: one fp32 scale = max(amax, 1e-10) / 448, shape [1]."""
    scale = (x.float().abs().amax().clamp(min=1e-10) / E4M3_MAX).reshape(1)
    return quantize_with_scale(x, scale), scale


def quantize_with_scale(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3 of x with a given per-tensor scale (static activation scheme)."""
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def dequantize_blocks(
    q: torch.Tensor, scale: torch.Tensor, block_n: int, block_k: int
) -> torch.Tensor:
    """fp32 values of a block-scaled tensor [N, K] with scales [N/block_n, K/block_k]."""
    n, k = q.shape
    full = scale.repeat_interleave(block_n, dim=0)[:n].repeat_interleave(block_k, dim=1)[:, :k]
    return q.float() * full


def _blocked(x: torch.Tensor, block_n: int, block_k: int) -> torch.Tensor:
    n, k = x.shape
    pad_n, pad_k = -n % block_n, -k % block_k
    if pad_n or pad_k:
        x = torch.nn.functional.pad(x, (0, pad_k, 0, pad_n))
    return x.view(x.shape[0] // block_n, block_n, x.shape[1] // block_k, block_k)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] of two e2m1 codes each -> fp32 [N, K]."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2).long()  # [N, K]
    values = table[codes & 0x7]
    return torch.where((codes & 0x8) != 0, -values, values)


def quantize_e2m1(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (uint8 [N, K/2] packed e2m1, fp32 [N, K/32] power-of-two scales).

    scale = 2**ceil(log2(max(amax, 1e-10) / 6)) per 1x32 group; each value rounds to the
    nearest e2m1 magnitude (ties to the smaller one).
    """
    n, k = w.shape
    groups = w.float().view(n, k // 32, 32)
    scale = round_up_pow2(groups.abs().amax(dim=-1).clamp(min=1e-10) / E2M1_MAX)
    scaled = (groups / scale[..., None]).reshape(n, k)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=w.device)
    magnitude = (scaled.abs()[..., None] - table).abs().argmin(dim=-1)
    codes = (magnitude | ((scaled < 0).to(torch.int64) << 3)).to(torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.contiguous(), scale


def e2m1_to_e4m3_blocks(
    packed: torch.Tensor, scale: torch.Tensor, block: int = 128
) -> tuple[torch.Tensor, torch.Tensor]:
    """mxfp4 [N, K/2] packed e2m1 with [N, K/32] power-of-two scales -> the same values as e4m3
    [N, K] with fp32 power-of-two scales [N/block, K/block] (DeepGEMM's fp8 weights on sm90).

    Each block's scale is its largest group scale / 2**6: a group's values become e2m1 x 2**d
    with d <= 6 (at most 6 * 64 = 384 <= 448), exact in e4m3 while d >= -8 (e2m1's one mantissa
    bit stays on the e4m3 grid, subnormals included). ValueError when a block holds a nonzero
    group more than 2**14 below its largest one (not exact); N and K multiples of `block`.
    """
    values = unpack_e2m1(packed)  # [N, K]
    n, k = values.shape
    group = k // scale.shape[1]
    if n % block or k % block or block % group:
        raise ValueError(f"[{n}, {k}] in 1 x {group} groups is not in {block} x {block} blocks")
    groups = scale.float().view(n // block, block, k // block, block // group)
    block_scale = groups.amax(dim=(1, 3)) / 2**6  # [N/block, K/block], powers of two
    offset = scale.float() / block_scale.repeat_interleave(block, 0).repeat_interleave(
        block // group, 1
    )
    exact = values * offset.repeat_interleave(group, 1)  # fp32: a power-of-two product
    q = exact.to(torch.float8_e4m3fn)
    inexact = q.float() != exact
    if inexact.any():
        blocks = inexact.view(n // block, block, k // block, block).any(dim=(1, 3))
        raise ValueError(
            f"{int(blocks.sum())} of {blocks.numel()} {block} x {block} blocks hold a group "
            "scale more than 2**14 below the block's largest: not exact in e4m3"
        )
    return q, block_scale


def split_bf16x3(w: torch.Tensor) -> torch.Tensor:
    """fp32 [..] -> bf16 [3, ..] whose sum in fp32 is w to within one fp32 rounding: bf16(w),
    then bf16 of what is left, twice (8 significant bits each)."""
    w = w.float()
    first = w.to(torch.bfloat16)
    rest = w - first.float()
    second = rest.to(torch.bfloat16)
    third = (rest - second.float()).to(torch.bfloat16)
    return torch.stack((first, second, third))
