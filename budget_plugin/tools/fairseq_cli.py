"""fairseq's console scripts (fairseq-train, fairseq-validate, fairseq-preprocess) run
from this interpreter's environment, and the metric lines they log."""

import contextlib
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

BIN = Path(sys.executable).parent  # not resolved: a venv's bin/ links to the base python
PLUGIN_DIR = Path(__file__).resolve().parent.parent  # what --user-dir names


class CommandFailed(RuntimeError):
    """A command exited with an error; the message ends with its output's tail."""

    def __init__(self, message: str, returncode: int = 1, output: str = ""):
        super().__init__(message)
        self.returncode, self.output = returncode, output


def console_script(name: str) -> List[str]:
    """The command line that runs fairseq's ``name`` (e.g. ``fairseq-train``) in this
    environment: its console script, or the module behind it."""
    exe = BIN / name
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "fairseq_cli." + name.split("-", 1)[1]]


LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| \w+ \| [\w.]+ \| ")


def progress_line(line: str) -> str:
    """A log line without fairseq's ``date time | level | logger |`` prefix, shortened."""
    return LOG_PREFIX.sub("", line.rstrip())[:160]


def run(
    cmd: Sequence,
    *,
    log_path: Optional[Path] = None,
    progress: Optional[Callable[[str], bool]] = None,
    threads: Optional[int] = None,
    env: Optional[Dict[str, str]] = None,
    cwd: Optional[Path] = None,
    timeout: Optional[float] = None,
) -> str:
    """Run ``cmd`` and return its output (stdout and stderr, interleaved).

    A first item named ``fairseq-*`` is found with :func:`console_script`; every item
    may be a Path or a number. Lines that ``progress`` selects are echoed as they come
    (a long training shows it is alive); with ``log_path`` the whole output is written
    there as it comes. ``threads`` caps the child's OpenMP/MKL threads. A failure (or
    the ``timeout``) raises :class:`CommandFailed` with the output's tail."""
    program = console_script(cmd[0]) if str(cmd[0]).startswith("fairseq-") else [str(cmd[0])]
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    if threads:
        full_env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    lines, timed_out = [], threading.Event()
    with open(log_path, "w", buffering=1) if log_path else contextlib.nullcontext() as log:  # line by line
        proc = subprocess.Popen([*program, *map(str, cmd[1:])], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=full_env, cwd=cwd)
        timer = threading.Timer(timeout, lambda: (timed_out.set(), proc.kill())) if timeout else None
        try:
            if timer:
                timer.start()
            for line in proc.stdout:
                lines.append(line)
                if log:
                    log.write(line)
                if progress and progress(line):
                    print("    " + progress_line(line), flush=True)
            code = proc.wait()
        finally:
            if timer:
                timer.cancel()
            if proc.poll() is None:  # interrupted: take the child down too
                proc.kill()
    output = "".join(lines)
    if code != 0:
        what = " ".join(Path(str(item)).name for item in cmd[:2])  # e.g. "fairseq-train MR-bin"
        why = f"timed out ({timeout}s" if timed_out.is_set() else f"failed ({code}"
        where = f", log {log_path}" if log_path else ""
        raise CommandFailed(f"{what} {why}{where}):\n{output[-4000:]}", code, output)
    return output


NUMBER = r"[-+]?(?:inf|nan|\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
METRIC = re.compile(rf"(?:\|\s*(\w+)\s+|(\w+)=)({NUMBER})(?=[\s|,]|$)")


def parse_metrics(line: str) -> Dict[str, float]:
    """The numbers of one fairseq log line, in either of its forms:
    ``| loss 0.52 | lr 1e-05`` (simple format) or ``loss=0.52, lr=1e-05`` (progress
    bars): ``{"loss": 0.52, "lr": 1e-05}``."""
    return {a or b: float(value) for a, b, value in METRIC.findall(line)}


def validation_metrics(output: str, subset: str = "valid") -> List[Dict[str, float]]:
    """Every validation of ``subset`` in a fairseq-train or fairseq-validate log, in order."""
    marker = f"valid on '{subset}' subset"
    return [parse_metrics(line) for line in output.splitlines() if marker in line]


def best_validation(output: str, metric: str = "accuracy") -> Dict[str, float]:
    """The validation that checkpoint_best.pt holds: the last one at the best
    ``metric`` (fairseq keeps a tie as the new best)."""
    found = validation_metrics(output)
    if not found:
        raise CommandFailed("the training log has no validation line")
    best = max(m[metric] for m in found)
    return [m for m in found if m[metric] == best][-1]


def train_options(data: Path, save_dir: Path, *, lr: float, updates: int, warmup: int, seed: int,
                  num_classes: int, batch_size: int = 32, max_tokens: Optional[int] = None,
                  log_interval: int = 100, cpu: bool = True) -> list:
    """fairseq-train's command line that every recipe here shares (fine-tuning a
    converted encoder, in the demo and the study; the benchmark's updates/s):
    sentence classification with RoBERTa's input layout, Adam with polynomial decay,
    the best checkpoint by dev accuracy, TensorBoard logs in ``save_dir``, on the CPU
    unless ``cpu`` is false. ``max_tokens``: a batch's padded pieces at most (fewer
    examples in a batch with a long one). Model and criterion options follow."""
    return [
        "fairseq-train", data, "--user-dir", PLUGIN_DIR, "--save-dir", save_dir,
        "--num-classes", num_classes, "--init-token", 0, "--separator-token", 2,
        "--shorten-method", "truncate", "--batch-size", batch_size,
        *(["--max-tokens", max_tokens] if max_tokens else []),
        "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-6",
        "--weight-decay", 0.01, "--clip-norm", 1.0,
        "--lr", lr, "--lr-scheduler", "polynomial_decay",
        "--warmup-updates", warmup, "--total-num-update", updates, "--max-update", updates,
        "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric",
        "--no-epoch-checkpoints", "--no-last-checkpoints", "--seed", seed, *(["--cpu"] if cpu else []),
        "--num-workers", 0, "--log-format", "simple", "--log-interval", log_interval,
        "--tensorboard-logdir", save_dir / "tensorboard",
    ]


def validate(
    checkpoint: Path,
    data: Path,
    subsets: Sequence[str],
    *,
    task: str,
    criterion: Optional[str] = None,
    batch_size: int = 64,
    log_path: Optional[Path] = None,
    threads: Optional[int] = None,
    head_ratio: Optional[str] = None,
    user_dir: Path = PLUGIN_DIR,
) -> Dict[str, Dict[str, float]]:
    """Score a checkpoint on every example of each subset with one fairseq-validate
    run (the criterion: the task's name unless given): ``{subset: metrics}``, ``bsz`` the number
    of examples scored. One process pays fairseq's start-up once; a subset's draws of
    ``--head-selection random`` then depend on the subsets before it. ``head_ratio``: the
    budget dial (--head-ratio); ``user_dir``: a plugin that registers ``task``."""
    output = run([
        "fairseq-validate", data, "--user-dir", user_dir, "--path", checkpoint, "--task", task,
        "--criterion", criterion or task, "--valid-subset", ",".join(subsets), "--batch-size", batch_size,
        "--required-batch-size-multiple", 1, "--cpu", "--num-workers", 0,
        *([] if head_ratio is None else ["--head-ratio", head_ratio]),
    ], log_path=log_path, threads=threads)
    scores = {}
    for subset in subsets:
        found = validation_metrics(output, subset)
        if not found:
            raise CommandFailed(f"fairseq-validate printed no metrics for {subset}:\n{output[-2000:]}")
        scores[subset] = found[-1]
    return scores
