"""Resuming loses nothing, and a killed run resumes from its last checkpoint.

fairseq reseeds every update (``Trainer._set_seed``: seed + update number), restores the
optimizer, the update count and the position in the epoch from ``checkpoint_last.pt``,
and the task's exploration schedule is a pure function of the update number: a run
stopped and resumed must therefore be bit-identical to one that never stopped, Gumbel
exploration noise included."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import BIN, REPO, make_classification_data, parse_metrics, run, train_args

N = 25  # the stop: mid-epoch 2 (320 examples / batch 16 = 20 updates an epoch)
EXPLORATION = 80  # > 2N: the schedule is still annealing at the stop and at the end
SPEED_KEYS = {"wps", "ups", "wall", "train_wall"}


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def num_updates(state):
    return state["optimizer_history"][-1]["num_updates"]


def inner_metrics(line):
    """'... | train_inner | epoch 002:  5 / 20 loss=0.5, heads=3, ...' -> {'loss': 0.5, ...}"""
    return {k: float(v) for k, v in re.findall(r"(\w+)=(-?[\d.]+(?:e-?\d+)?)", line)}


def train_inner(output):
    return [inner_metrics(line) for line in output.splitlines() if "| train_inner |" in line]


def last_valid(output):
    lines = [line for line in output.splitlines() if "valid on 'valid' subset" in line]
    assert lines, output[-3000:]
    return {k: v for k, v in parse_metrics(lines[-1]).items() if k not in SPEED_KEYS}


def rate_over(updates):
    """Mean exploration rate the task sets over these update numbers (linear schedule)."""
    return sum(1 - min(1.0, u / EXPLORATION) for u in updates) / len(updates)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_classification_data(tmp_path_factory.mktemp("resume-data"))


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    schedule = ["--exploration-updates", EXPLORATION]
    whole = run(train_args(data, root / "whole", "--max-update", 2 * N, *schedule))
    first = run(train_args(data, root / "split", "--max-update", N, *schedule))
    shutil.copy(root / "split" / "checkpoint_last.pt", root / "stop.pt")
    second = run(train_args(data, root / "split", "--max-update", 2 * N, *schedule))
    return root, whole, first, second


@pytest.mark.slow
def test_resumed_run_is_bit_identical_to_an_uninterrupted_one(runs):
    root, _, _, second = runs
    stop = load(root / "stop.pt")
    assert num_updates(stop) == N
    iterator = stop["extra_state"]["train_iterator"]
    assert (iterator["epoch"], iterator["iterations_in_epoch"]) == (2, 5), "stop must be mid-epoch"
    assert f"(epoch 2 @ {N} updates)" in second  # resumed from checkpoint_last.pt, not from scratch

    whole, resumed = load(root / "whole" / "checkpoint_last.pt"), load(root / "split" / "checkpoint_last.pt")
    assert num_updates(whole) == num_updates(resumed) == 2 * N
    assert whole["model"].keys() == resumed["model"].keys()
    assert all(whole["model"][k].shape == resumed["model"][k].shape for k in whole["model"])
    diff = max((whole["model"][k].double() - resumed["model"][k].double()).abs().max().item()
               for k in whole["model"] if whole["model"][k].numel())  # not the empty buffers
    print(f"\nmax |uninterrupted - resumed| over {len(whole['model'])} tensors: {diff}")
    assert diff == 0.0, f"resumed parameters differ by up to {diff}"
    assert all(torch.equal(whole["model"][k], resumed["model"][k]) for k in whole["model"])
    # Adam's moments too: the next update would also be identical
    for a, b in zip(whole["last_optimizer_state"]["state"].values(),
                    resumed["last_optimizer_state"]["state"].values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    # and the model moved since the stop, so the comparison above is not vacuous
    assert any(not torch.equal(stop["model"][k], resumed["model"][k]) for k in stop["model"])


@pytest.mark.slow
def test_exploration_schedule_continues_where_it_stopped(runs):
    _, whole, _, second = runs
    steps_whole, steps_resumed = train_inner(whole), train_inner(second)
    # the resumed run's first log covers updates N..N+4 (a restarted schedule: 0..4)
    first = steps_resumed[0]
    assert first["num_updates"] == N + 5
    assert first["explore_rate"] == pytest.approx(rate_over(range(N, N + 5)), abs=1e-4)
    assert first["temperature"] == pytest.approx(1 + rate_over(range(N, N + 5)), abs=1e-4)
    end_whole, end_resumed = steps_whole[-1], steps_resumed[-1]
    assert end_whole["num_updates"] == end_resumed["num_updates"] == 2 * N
    for key in ("explore_rate", "temperature", "loss", "task_loss", "heads", "relevance_entropy", "gnorm"):
        assert end_whole[key] == end_resumed[key], key
    assert end_resumed["explore_rate"] == pytest.approx(rate_over(range(2 * N - 5, 2 * N)), abs=1e-4)
    assert 0 < end_resumed["explore_rate"] < 1  # still exploring: a restart would show


@pytest.mark.slow
def test_validation_after_resume_is_identical(runs):
    _, whole, _, second = runs
    assert last_valid(whole) == last_valid(second)
    assert last_valid(second)["num_updates"] == 2 * N


@pytest.mark.slow
def test_checkpoints_load_safely_and_hold_only_an_argparse_namespace(runs):
    root = runs[0]
    path = root / "whole" / "checkpoint_last.pt"
    allowed = torch.serialization.get_safe_globals()  # what `import budget_plugin` allowed
    torch.serialization.clear_safe_globals()
    try:
        assert torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) == ["argparse.Namespace"]
        with pytest.raises(Exception, match="argparse.Namespace"):
            load(path)
    finally:
        torch.serialization.add_safe_globals(allowed)
    assert load(path)["cfg"]["model"].arch == "budgetformer_tiny"


# ------------------------------------------------------------------ killed runs


@pytest.mark.slow
def test_run_killed_mid_training_resumes_from_its_last_checkpoint(data, tmp_path):
    save = tmp_path / "ckpt"
    args = train_args(data, save, "--max-update", 5000, "--save-interval-updates", 10,
                      "--log-interval", 1, epochs=500)
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([str(BIN / "fairseq-train"), *map(str, args[1:])], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, deadline = [], time.monotonic() + 240
    try:
        for line in proc.stdout:  # kill while it trains, after a few checkpoints
            seen.append(line)
            if "| train_inner |" in line and inner_metrics(line)["num_updates"] >= 35:
                break
            assert time.monotonic() < deadline, "".join(seen[-50:])
        else:
            pytest.fail("training ended before it could be killed:\n" + "".join(seen[-50:]))
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    checkpoints = sorted(save.glob("*.pt"))
    assert save / "checkpoint_last.pt" in checkpoints
    for path in checkpoints:  # not one half-written file
        load(path)
    last = num_updates(load(save / "checkpoint_last.pt"))
    assert last >= 30 and last % 10 == 0
    print(f"\nkilled after {inner_metrics(line)['num_updates']:.0f} updates; on disk: "
          f"{[p.name for p in checkpoints]} (+ {[p.name for p in save.glob('*.tmp')]}), last at {last} updates")

    output = run(train_args(data, save, "--max-update", last + 10, "--save-interval-updates", 10,
                            "--log-interval", 1, epochs=500))
    assert f"@ {last} updates)" in output.split("Loaded checkpoint", 1)[1].splitlines()[0]
    assert "done training" in output
    assert num_updates(load(save / "checkpoint_last.pt")) == last + 10


@pytest.mark.slow
def test_kill_while_copying_to_checkpoint_last_leaves_it_whole(runs, tmp_path):
    """fairseq writes a checkpoint once (atomically) and copies it to its other names,
    checkpoint_last.pt included; a kill during that copy must not tear the target."""
    root = runs[0]
    new, last = tmp_path / "checkpoint_1_50.pt", tmp_path / "checkpoint_last.pt"
    shutil.copy(root / "whole" / "checkpoint_last.pt", new)
    shutil.copy(root / "stop.pt", last)
    before = last.read_bytes()
    proc = subprocess.run([sys.executable, "-c", DYING_COPY, str(new), str(last)], cwd=REPO,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert last.read_bytes() == before, (
        "checkpoint_last.pt was torn by a kill during fairseq's copy: budget_plugin/__init__.py "
        "must call fairseq_patches.atomic_checkpoint_copies()")
    assert num_updates(load(last)) == N
    for path in tmp_path.glob("*.pt"):
        load(path)


DYING_COPY = """
import os, shutil, signal, sys
import budget_plugin  # what --user-dir budget_plugin imports
from fairseq.file_io import PathManager

def dying_copyfile(src, dst, *args, **kwargs):  # killed half-way through the bytes
    data = open(src, "rb").read()
    with open(dst, "wb") as f:
        f.write(data[: len(data) // 2])
        f.flush()
    os.kill(os.getpid(), signal.SIGKILL)

shutil.copyfile = dying_copyfile
PathManager.copy(sys.argv[1], sys.argv[2], overwrite=True)  # as checkpoint_utils.save_checkpoint does
"""



def test_atomic_checkpoint_copies_never_expose_a_partial_file(tmp_path, monkeypatch):
    """fairseq_patches.atomic_checkpoint_copies itself, in this process (undone afterwards)."""
    from fairseq.file_io import PathManager

    from budget_plugin.fairseq_patches import atomic_checkpoint_copies

    monkeypatch.setattr(PathManager, "copy", PathManager.__dict__["copy"])  # restored at teardown
    atomic_checkpoint_copies()
    atomic_checkpoint_copies()  # idempotent
    src, dst = tmp_path / "checkpoint_best.pt", tmp_path / "checkpoint_last.pt"
    src.write_bytes(b"new" * 1000)
    dst.write_bytes(b"old")
    assert PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_best.pt", "checkpoint_last.pt"]

    def dying_copyfile(a, b, *args, **kwargs):
        open(b, "wb").write(open(a, "rb").read()[:10])
        raise SystemExit("killed")

    dst.write_bytes(b"old")
    monkeypatch.setattr(shutil, "copyfile", dying_copyfile)
    with pytest.raises(SystemExit):
        PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == b"old"
