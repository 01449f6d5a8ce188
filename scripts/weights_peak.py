"""The peak memory of random_ on the CPU, beside the estimate `moec run` checks before it allocates
(moec/spec/memory.py: making_bytes).

    python scripts/weights_peak.py SPEC [KEY=VALUE ...]
    python scripts/weights_peak.py examples/tiny-cpu.toml model.hidden_size=7168 \\
        model.moe_intermediate_size=2048 model.n_routed_experts=16

Run it once per spec (a fresh process: the peak is the process's maximum resident set,
getrusage's ru_maxrss); the peak is counted above the resident set before random_ (the
parameters are allocated then but not yet touched).
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile


def resident() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(argv: list[str]) -> int:
    import torch

    import moec
    from moec.runner import parameter_bytes
    from moec.spec import load_spec
    from moec.spec.memory import making_bytes

    loaded = load_spec(argv[0], argv[1:])
    with tempfile.TemporaryDirectory() as cache:
        package = moec.load(loaded, cache_dir=cache)
        torch.set_num_threads(1)
        layer = package.MoELayer(device="cpu")
        weights = parameter_bytes(package)
        before, earlier = resident(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        layer.random_(0)
        highest = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if highest <= earlier:
            print("random_ stayed under the process's earlier peak: a larger spec", file=sys.stderr)
            return 1
        peak = highest * 1024 - before
    estimate = making_bytes(loaded.spec, weights)
    print(
        f"parameters {weights / 1e6:.1f} MB, random_ peak {peak / 1e6:.1f} MB "
        f"({peak / weights:.2f}x), estimate {estimate / 1e6:.1f} MB ({estimate / weights:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
