"""The GPU suite: skipped where there is no CUDA device; run on the GPU machine with
`make gpu-test` (compiled Triton, TRITON_INTERPRET=0). Tests that need several GPUs say how
many with `@pytest.mark.gpus(n)`."""

from __future__ import annotations

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "gpus(n): needs n CUDA devices")


def pytest_collection_modifyitems(config, items):
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "tests/gpu" not in str(item.fspath):
            continue
        marker = item.get_closest_marker("gpus")
        needed = marker.args[0] if marker else 1
        if available < needed:
            item.add_marker(pytest.mark.skip(reason=f"needs {needed} CUDA device(s)"))
