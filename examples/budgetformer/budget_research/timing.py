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
    rounds after one warm-up round (steady_latencies at a fixed count)."""
    return steady_latencies(runs, batches, repeats, repeats)[0]


# a median is known to this share of itself when the rounds stop: its standard error, about
# 1.25 sd / sqrt(rounds) for timings near normal, over the median
SPREAD = 0.01


@torch.no_grad()
def steady_latencies(runs: Sequence[Callable[[torch.Tensor], object]], batches: Sequence[dict], min_rounds: int,
                     max_rounds: int, spread: float = SPREAD) -> Tuple[List[float], int]:
    """Seconds per pass over the batches, per ``run`` (tokens in), and the rounds it took:
    the median of the rounds after one warm-up round, the runs interleaved (and rotated)
    within each round so that the machine's drift hits them alike. Rounds go on from
    ``min_rounds`` until every median's standard error is within ``spread`` of it (a
    steady machine stops early, a noisy one gets more rounds), at most ``max_rounds``."""
    times = [[] for _ in runs]
    for round_ in range(max_rounds + 1):
        for i in rotation(len(runs), round_):
            start = time.perf_counter()
            for sample in batches:
                runs[i](tokens(sample))
            if round_ > 0:
                times[i].append(time.perf_counter() - start)
        if round_ >= max(min_rounds, 2) and all(median_error(t) <= spread for t in times):
            break
    return [statistics.median(t) for t in times], len(times[0])


def median_error(times: Sequence[float]) -> float:
    """The standard error of the median of ``times``, a share of it."""
    return 1.2533 * statistics.stdev(times) / len(times) ** 0.5 / statistics.median(times)
