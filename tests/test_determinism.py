"""Same command, same model: two fine-tunings with the same seed and thread count write
bit-identical checkpoints (the README's tables come from one run that anyone can repeat)."""

import os
import subprocess

import pytest
import torch

from helpers import console_script, make_classification_data, train_args


def train(data, save_dir, threads, *extra):
    cmd = train_args(data, save_dir, *extra, epochs=2)
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    proc = subprocess.run([*console_script(cmd[0]), *map(str, cmd[1:])], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(save_dir / "checkpoint_best.pt", map_location="cpu", weights_only=True)["model"]


@pytest.mark.slow
def test_two_runs_of_the_same_command_write_the_same_checkpoint(tmp_path):
    # exploration draws Gumbel noise and uniform rankings; the learned budget mixes head
    # counts; dropout draws masks (random heads draw from the same generators)
    mode = ["--exploration-updates", 30, "--dropout", 0.1, "--attention-dropout", 0.1]
    data = make_classification_data(tmp_path / "data", n_train=160, n_valid=60)
    first = train(data, tmp_path / "first", 2, *mode)
    second = train(data, tmp_path / "second", 2, *mode)
    assert first.keys() == second.keys()
    different = [k for k in first if not torch.equal(first[k], second[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"
