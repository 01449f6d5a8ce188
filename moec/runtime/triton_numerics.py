"""Triton numerics every kernel shares (docs/numerics.md), written once.

group_scale    max(amax, 1e-10) / 448 (true division), rounded up to a power of two under POW2_SCALES
               (add the mantissa mask to the fp32 bits, keep the exponent: round up unless the
               mantissa is already zero).
to_e4m3        clamp to +-448 and cast to e4m3; under the interpreter (SOFT_ROUND) round to
               nearest even in software first, since its cast does not.
round_output   round an fp32 tile for a store in the output dtype; under the interpreter a
               bf16 output is rounded to nearest even in software (its cast truncates).
round_through  an fp32 tile rounded to DTYPE ("bfloat16" | "float16" | "float32") and back
               to fp32 (the router's rounding), NaN kept.
"""

import triton
import triton.language as tl


@triton.jit
def group_scale(amax, POW2_SCALES: tl.constexpr):
    scale = tl.math.div_rn(tl.maximum(amax, 1e-10), 448.0)
    if POW2_SCALES:
        scale_bits = scale.to(tl.int32, bitcast=True) + 0x7FFFFF
        scale = (scale_bits & 0x7F800000).to(tl.float32, bitcast=True)
    return scale


@triton.jit
def to_e4m3(q, SOFT_ROUND: tl.constexpr):
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    if SOFT_ROUND:  # round |q| to nearest even on the e4m3 grid, ulp 2**(e - 3) with e >= -6
        bits = q.to(tl.int32, bitcast=True)
        ulp = ((tl.maximum((bits >> 23) & 0xFF, 121) - 3) << 23).to(tl.float32, bitcast=True)
        q = (tl.abs(q) + ulp * 12582912.0) - ulp * 12582912.0  # fp32 add at 1.5 * 2**23 ulp
        q = (q.to(tl.int32, bitcast=True) | ((bits >> 31) << 31)).to(tl.float32, bitcast=True)
    return q.to(tl.float8e4nv)


@triton.jit
def round_output(x, out_dtype: tl.constexpr, SOFT_ROUND: tl.constexpr):
    if SOFT_ROUND and out_dtype == tl.bfloat16:  # round to nearest even
        bits = x.to(tl.uint32, bitcast=True)
        x = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).to(tl.float32, bitcast=True)
    return x.to(out_dtype)


@triton.jit
def round_through(x, DTYPE: tl.constexpr, SOFT_ROUND: tl.constexpr):
    if DTYPE == "float16":
        rounded = x.to(tl.float16).to(tl.float32)
    elif DTYPE == "bfloat16":
        rounded = round_output(x, tl.bfloat16, SOFT_ROUND).to(tl.float32)
    else:  # float32: nothing to round
        rounded = x
    return tl.where(x == x, rounded, x)  # noqa: PLR0124  (a NaN's bits could carry: keep it)


@triton.jit
def tensor_scale_kernel(
    scale_ptr,  # [1] fp32: amax in, scale out (the middle pass of dynamic per-tensor quant)
    POW2_SCALES: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    tl.store(scale_ptr, group_scale(tl.load(scale_ptr), POW2_SCALES))


# Programmatic dependent launch (Hopper and newer). A kernel launched with it waits for its
# predecessor to finish, and for the predecessor's writes to be visible, before it reads
# anything (`wait_inputs`); right after that wait it lets its own successor launch. The
# successor's programs are then scheduled once every program of this kernel has started, and
# sit in their own wait until this kernel has finished: their launch is hidden behind this
# kernel's work, and nothing is read early. (Letting the successor launch only at the end, after
# the stores, hid almost nothing: 0.193 against 0.196 ms at T=1, benchmarks/RESULTS.md run 6.)


def launch_options(pdl: bool) -> dict:
    """The PDL meta-parameter and launch option of a kernel: programmatic dependent launch when
    asked for and compiled (the interpreter runs launches one after the other anyway)."""
    if pdl and not triton.knobs.runtime.interpret:
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


@triton.jit
def wait_inputs(PDL: tl.constexpr):
    """The first statement of every kernel: wait for the predecessor, then release the successor."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
