"""`moec run`: build, import, load or randomize weights, run one forward, report.

Prints the output checksum, the forward time, and, when the spec's backend is not torch, the
max relative error against the torch backend on the same weights and input.
"""

from __future__ import annotations

import time

from moec.errors import MoecError, problem
from moec.spec import load_spec


def run_spec(path: str, overrides, tokens: int, seed: int, weights: str | None, prefix: str) -> str:
    import torch

    import moec

    if tokens < 0:
        raise MoecError(
            [problem("--tokens", "must be >= 0", "a token count", value=tokens)], kind="usage"
        )
    loaded = load_spec(path, overrides)
    spec = loaded.spec
    device = spec.target.device
    if device == "cuda" and not torch.cuda.is_available():
        raise MoecError(
            [
                problem(
                    "target.device", "no CUDA device here", "--set target.device=cpu", value="cuda"
                )
            ],
            loaded.source,
            kind="usage",
        )
    if spec.parallel.tp_size * spec.parallel.ep_size > 1:
        raise MoecError(
            [problem("parallel", "moec run runs one rank", "tp_size = ep_size = 1")],
            loaded.source,
            kind="usage",
        )
    package = moec.load(loaded)
    layer = _layer(package, device, weights, prefix, seed)
    dtype = getattr(torch, spec.target.dtype)
    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(tokens, spec.model.hidden_size, generator=generator).to(
        device=device, dtype=dtype
    )
    out = layer(x)  # warm-up (and Triton compilation)
    elapsed = _time(layer, x, device)
    lines = [
        f"spec      {spec.name} (sha256 {loaded.content_hash[:16]})",
        f"backend   {package.PLAN['choices']['gemm_backend']}, layout {package.PLAN['choices']['layout']}",
        f"input     [{tokens}, {spec.model.hidden_size}] {spec.target.dtype} on {device}",
        f"checksum  sum {out.double().sum().item():.6e}, sum|x| {out.double().abs().sum().item():.6e}",
        f"time      {elapsed * 1e3:.3f} ms per forward (median)",
    ]
    if package.PLAN["choices"]["gemm_backend"] != "torch":
        reference = moec.load(load_spec(path, [*overrides, "experts.gemm_backend=torch"]))
        expected = _layer(reference, device, weights, prefix, seed)(x)
        scale = expected.double().abs().max().item() or 1.0
        error = (out.double() - expected.double()).abs().max().item() / scale
        lines.append(f"vs torch  max relative error {error:.3e}")
    return "\n".join(lines) + "\n"


def _layer(package, device: str, weights: str | None, prefix: str, seed: int):
    layer = package.MoELayer(device=device)
    if weights:
        try:
            return layer.load_weights(weights, prefix)
        except ValueError as error:
            raise MoecError(
                [problem("--weights", str(error), "a checkpoint of this layer", value=weights)],
                kind="usage",
            ) from None
    return layer.random_(seed)


def _time(layer, x, device: str, repeats: int = 5) -> float:
    import torch

    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        layer(x)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]
