"""Timings that are fair to every contender (interleaved, rotating rounds) and the
machine they were taken on."""

import contextlib
import os
import platform
import statistics
import time
from typing import Callable, List, Sequence, Tuple

import torch

from budget_plugin.tools.evaluation import classify, tokens
from budget_plugin.tools.rotation import rotation


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so a clock read after it is honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> Tuple[float, float]:
    """Milliseconds that ``fn()`` took, and the CPU milliseconds this process spent
    meanwhile (all its threads). On CUDA the first is measured by CUDA events around
    the queued work (after a synchronisation, so that earlier work is not counted),
    on CPU by the wall clock."""
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        elapsed = start.elapsed_time(end)
    else:
        fn()
        elapsed = (time.perf_counter() - wall) * 1e3
    return elapsed, (time.process_time() - cpu) * 1e3


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


@torch.no_grad()
def latencies(models, batches: Sequence[dict], repeats: int) -> List[float]:
    """Seconds per pass over the batches, per fairseq model (latencies_of)."""
    return latencies_of([lambda x, model=model: classify(model, x) for model in models], batches, repeats)


@torch.no_grad()
def latencies_of(runs: Sequence[Callable[[torch.Tensor], object]], batches: Sequence[dict],
                 repeats: int) -> List[float]:
    """Seconds per pass over the batches, per ``run`` (tokens in): median of ``repeats``
    rounds after one warm-up round, the runs interleaved (and rotated) within each
    round, so that the machine's drift hits them alike."""
    times = [[] for _ in runs]
    for round_ in range(repeats + 1):
        for i in rotation(len(runs), round_):
            start = time.perf_counter()
            for sample in batches:
                runs[i](tokens(sample))
            if round_ > 0:
                times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]
