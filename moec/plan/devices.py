"""Ceilings of the devices the cost model knows: bandwidth, matmul rates, memory.

The H200 row was measured on this project's H200 (copy bandwidth counting bytes read plus
written, bf16 dense matmul on random data, DeepGEMM's grouped fp8 rate); the others are leads
from datasheets, marked so. Every value can be overridden on the command line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Device:
    name: str
    bandwidth_gbs: float
    """Achievable HBM bandwidth, GB/s (1e9 bytes)."""
    bf16_tflops: float
    fp8_tflops: float
    memory_gib: float
    measured: bool
    fp32_tflops: float = 0.0
    link_gbs: float = 0.0
    """One-way GPU-to-GPU bandwidth inside a node (NVLink), GB/s."""
    nic_gbs: float = 0.0
    """One-way network bandwidth per GPU between nodes (RDMA), GB/s."""

    def rate_tflops(self, compute: str) -> float:
        """Matmul rate for the operand type a stage computes in."""
        if compute == "fp8":
            return self.fp8_tflops
        if compute == "fp32":
            return self.fp32_tflops or self.bf16_tflops / 16
        return self.bf16_tflops


# link: the H200's was measured between the two GPUs of one host (one-way copy); the others,
# and every NIC (400 Gb/s per GPU), are datasheet leads.
H200 = Device(
    "H200", 4274.0, 688.0, 1414.0, 139.8, True, fp32_tflops=51.0, link_gbs=389.6, nic_gbs=50.0
)
B200 = Device(
    "B200", 7200.0, 2250.0, 4500.0, 178.0, False, fp32_tflops=75.0, link_gbs=900.0, nic_gbs=50.0
)
A100 = Device(
    "A100-80GB", 1800.0, 280.0, 280.0, 79.0, False, fp32_tflops=19.5, link_gbs=300.0, nic_gbs=25.0
)
L40S = Device(
    "L40S", 800.0, 360.0, 720.0, 44.0, False, fp32_tflops=90.0, link_gbs=32.0, nic_gbs=25.0
)
CPU = Device(
    "CPU (nominal)", 50.0, 1.0, 1.0, 16.0, False, fp32_tflops=1.0, link_gbs=10.0, nic_gbs=10.0
)

BY_ARCH = {"sm80": A100, "sm89": L40S, "sm90": H200, "sm100": B200, "sm120": B200}


def device_for(
    target_device: str,
    arch: str | None,
    overrides: dict[str, Any] | None = None,
    nic_gbs: float | None = None,
) -> Device:
    """The device table row for a spec's target, with command-line overrides applied and the
    spec's NIC bandwidth (parallel.nic_bandwidth_gbs) when it sets one."""
    device = CPU if target_device == "cpu" else BY_ARCH.get(arch or "sm90", H200)
    if overrides:
        device = replace(device, **overrides, measured=False)
    if nic_gbs is not None:
        device = replace(device, nic_gbs=nic_gbs)
    return device
