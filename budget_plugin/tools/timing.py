"""Timings that are fair to every contender (interleaved, rotating rounds) and the
machine they were taken on."""

import contextlib
import os
import platform
from typing import List

import torch


def rotation(n: int, round_: int) -> List[int]:
    """The order of ``n`` contenders in one timed round. Who goes first rotates from
    round to round: the first pays for the memory the previous round's last one
    handed back (page faults anew)."""
    return [(i + round_) % n for i in range(n)]


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so a clock read after it is honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine_info(device: torch.device) -> dict:
    """Platform, processor, cores and device, for a report's header."""
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "device": str(device),
    }
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info
