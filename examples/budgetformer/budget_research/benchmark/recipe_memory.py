"""The whole recipe's resident memory, summed over its processes (issue 42): budget-finetune
as a user runs it, on the memory benchmark's data (memory.py: short MR sentences and a few
texts over 1,000 words, cut at 512 pieces), its process and every descendant sampled
together every ``interval`` seconds from /proc. Reported: the peak of the sum and what
each process held at that moment, and each process's own peak, against the dense step's
(its fairseq-train child's) peak: the recipe may hold at most 1.3x what the dense step
alone holds."""

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

from budget_plugin.data.prepare import prepare_task
from budget_research.benchmark.memory import GIB, long_and_short

PAGE = os.sysconf("SC_PAGE_SIZE")


def processes() -> Dict[int, Tuple[int, int]]:
    """{pid: (parent pid, resident bytes)} of every process readable now."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                resident = int(Path(f"/proc/{entry}/statm").read_text().split()[1]) * PAGE
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            parent = int(stat[stat.rindex(")") + 2:].split()[1])  # after "(comm) state"
            found[int(entry)] = (parent, resident)
    return found


def descendants(root: int, table: Dict[int, Tuple[int, int]]) -> List[int]:
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, (parent, _) in table.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sorted(pid for pid in tree if pid in table)


def role(pid: int) -> str:
    """A process's part in the recipe, from its command line."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        words = []
    if not words or not words[0]:
        return "other (exited)"  # read as it exited: no command line left
    if any("fairseq-train" in w or "fairseq_cli.train" in w for w in words):
        save = words[words.index("--save-dir") + 1] if "--save-dir" in words else ""
        return f"{Path(save).name} step (fairseq-train)"
    return "budget-finetune" if any("budget-finetune" in w for w in words) else Path(words[0]).name


def sampled(command: List[str], log_path: Path, env: Dict[str, str], interval: float = 0.1) -> dict:
    """Run ``command`` to its end, sampling its process tree; the peaks in GiB."""
    peak_sum, at_peak, own = 0, {}, {}
    start = time.time()
    with open(log_path, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, **env))
        while proc.poll() is None:
            table = processes()
            tree = {pid: table[pid][1] for pid in descendants(proc.pid, table)}
            roles = {pid: role(pid) for pid in tree}
            for pid, resident in tree.items():
                name = roles[pid]
                own[name] = max(own.get(name, 0), resident)
            if sum(tree.values()) > peak_sum:
                peak_sum = sum(tree.values())
                at_peak = {}
                for pid, resident in tree.items():
                    at_peak[roles[pid]] = at_peak.get(roles[pid], 0) + resident
            time.sleep(interval)
    if proc.returncode != 0:
        raise RuntimeError(f"{command[0]} failed; see {log_path}:\n{log_path.read_text()[-2000:]}")
    return {"wall_s": round(time.time() - start), "peak_sum_gib": peak_sum / GIB,
            "at_peak_gib": {k: v / GIB for k, v in at_peak.items()}, "own_peak_gib": {k: v / GIB for k, v in own.items()}}


def measure(model_dir: Path, mr_train: Path, work: Path, short: int = 256, long: int = 6, words: int = 1200,
            seed: int = 1, threads: int = 2) -> dict:
    """budget-finetune (one epoch a step) on the long-and-short data, sampled."""
    task = long_and_short(mr_train, work / "raw" / "LONG", short, long, words, seed)
    data = Path(prepare_task(task, work, layout="SST-2", name="LONG", labelled_test=True, wordpiece=model_dir,
                             log=lambda _: None).out_dir)
    command = [str(Path(sys.executable).with_name("budget-finetune")), str(model_dir), str(data), str(work / "run"),
               "--epochs", "1", "--seed", str(seed), "--threads", str(threads), "--cpu", "--no-latency"]
    found = sampled(command, work / "recipe.log", {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"})
    dense = found["own_peak_gib"]["dense step (fairseq-train)"]
    return {**found, "dense_step_peak_gib": dense, "ratio": found["peak_sum_gib"] / dense}


def report(found: dict) -> str:
    """The markdown table of :func:`measure`'s record."""
    lines = ["| process | at the summed peak (GiB) | its own peak (GiB) |", "|---|---|---|"]
    for name, own in found["own_peak_gib"].items():
        if own < 0.01:
            continue  # a process seen as it exited
        lines.append(f"| {name} | {found['at_peak_gib'].get(name, 0.0):.2f} | {own:.2f} |")
    lines += [f"| **all, summed** | **{found['peak_sum_gib']:.2f}** | |", "",
              f"The recipe's summed peak is {found['ratio']:.2f}x the dense step's own peak "
              f"({found['dense_step_peak_gib']:.2f} GiB); budget-finetune ran {found['wall_s']} s"
              + (" while other work shared the machine (its memory is the recipe's own; its time is not)"
                 if found.get("shared") else "") + "."]
    return "\n".join(lines) + "\n"
