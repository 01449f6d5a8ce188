"""The device row the cost model uses for a spec's target (moec/devices.py holds the rows).

Every value can be overridden on the command line.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from moec.devices import BY_ARCH, CPU, H200, Device

__all__ = ["BY_ARCH", "CPU", "H200", "Device", "device_for"]


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
