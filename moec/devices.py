"""The devices moec knows, one row each: bandwidth, matmul rates, memory. A leaf module (it
imports nothing of moec): the spec's memory rule and the plan's cost model read the same rows.

The H200 row was measured on this project's H200 (copy bandwidth counting bytes read plus
written, bf16 dense matmul on random data, DeepGEMM's grouped fp8 rate); the others are leads
from datasheets, marked so. Every value can be overridden on the command line.
"""

from __future__ import annotations

from dataclasses import dataclass


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
"""The device of each CUDA arch (its row for the cost model and the memory rule)."""
