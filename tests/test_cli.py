"""End to end through the real command-line tools: fairseq-preprocess ->
fairseq-train --user-dir budget_plugin -> fairseq-validate, on tiny data."""

import json
import re
import sys

import pytest
import torch

from helpers import REPO, assert_close, make_classification_data, parse_metrics, run, train_args, validate

N_VALID = 100  # not a multiple of 8 or of the batch size, on purpose

pytestmark = pytest.mark.slow  # every test here runs the fairseq tools


def train_inner(output):
    """The key=value metrics of every train_inner log line."""
    return [
        {k: float(v) for k, v in re.findall(r"(\w+)=(-?[\d.]+)", line)}
        for line in output.splitlines() if "train_inner" in line
    ]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return make_classification_data(tmp_path_factory.mktemp("single"), n_valid=N_VALID)


@pytest.fixture(scope="module")
def trained(single, tmp_path_factory):
    save = tmp_path_factory.mktemp("ckpt")
    output = run(train_args(single, save, "--tensorboard-logdir", save / "tb", epochs=4))
    return save, output


def test_train_logs_budget_metrics_and_loss_decreases(trained):
    _, output = trained
    steps = train_inner(output)
    assert len(steps) >= 4
    for key in ("heads", "head_ratio", "flops_ratio", "relevance_entropy", "explore_rate", "heads_l0", "heads_l1"):
        assert key in steps[0], key
    assert steps[0]["explore_rate"] > steps[-1]["explore_rate"] == 0  # annealed to exploitation
    assert steps[-1]["task_loss"] < steps[0]["task_loss"]


def test_validate_prints_metrics_and_scores_every_example(single, trained):
    save, _ = trained
    metrics = validate(single, save / "checkpoint_best.pt")
    for key in ("loss", "nll_loss", "accuracy", "heads", "head_ratio", "flops_ratio", "relevance_entropy", "explore_rate"):
        assert key in metrics, key
    assert metrics["bsz"] == N_VALID  # every example scored, despite --required-batch-size-multiple 8
    assert 0 < metrics["head_ratio"] < 1, "default settings should save heads"
    assert 1 <= metrics["heads"] <= 4
    assert metrics["heads"] == pytest.approx(4 * metrics["head_ratio"], abs=0.02)
    assert metrics["flops_ratio"] >= metrics["head_ratio"] - 0.01  # the router costs a little
    assert metrics["explore_rate"] == 0
    assert metrics["accuracy"] > 60


def test_validate_in_half_precision_agrees_with_fp32(single, trained):
    """fairseq-validate --fp16 casts the model to float16 (on the CPU here): the fast
    path, the router and the criterion's statistics work in half precision."""
    save, _ = trained
    full = validate(single, save / "checkpoint_best.pt")
    half = validate(single, save / "checkpoint_best.pt", "--fp16")
    assert half["bsz"] == N_VALID
    assert abs(half["accuracy"] - full["accuracy"]) <= 3  # a few of 100 examples may flip
    assert half["heads"] == pytest.approx(full["heads"], abs=0.1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fairseq-train --fp16/--bf16 need CUDA")
@pytest.mark.parametrize("precision", ["--fp16", "--bf16"])
def test_train_and_validate_in_mixed_precision_on_a_gpu(single, tmp_path, precision):
    args = [a for a in train_args(single, tmp_path, precision, epochs=4) if a != "--cpu"]
    output = run(args)
    assert train_inner(output)[-1]["task_loss"] < train_inner(output)[0]["task_loss"]
    # on the GPU: the Triton path (fairseq-validate casts the model for --fp16 only)
    metrics = validate(single, tmp_path / "checkpoint_best.pt", *(["--fp16"] if precision == "--fp16" else []),
                       cpu=False)
    assert metrics["bsz"] == N_VALID and metrics["accuracy"] > 60


def test_distillation_from_cached_teacher_logits(single, trained, tmp_path):
    """scripts/teacher_logits.py scores every training example with a checkpoint (the
    teacher); fairseq-train --distill-logits then trains on them and logs distill_loss."""
    save, _ = trained
    logits = tmp_path / "teacher.pt"
    output = run([sys.executable, REPO / "scripts" / "teacher_logits.py", "--checkpoint", save / "checkpoint_best.pt",
                  "--data", single, "--out", logits])
    assert "320 examples x 2 classes" in output
    teacher = torch.load(logits, weights_only=True)
    assert teacher.shape == (320, 2) and torch.isfinite(teacher).all()
    output = run(train_args(single, tmp_path / "student", "--distill-logits", logits, "--distill-weight", 0.5,
                            epochs=1))
    steps = train_inner(output)
    assert steps and all("distill_loss" in step for step in steps)
    assert "distill_loss" not in validate(single, tmp_path / "student" / "checkpoint_best.pt")


def test_importance_pruning_keeps_the_most_important_heads(single, trained, tmp_path):
    """scripts/head_importance.py (Michel et al.'s |dL/dgate| on the training set) picks
    each layer's heads; --head-selection kept fine-tunes with exactly those."""
    save, _ = trained
    out = tmp_path / "importance.json"
    output = run([sys.executable, REPO / "scripts" / "head_importance.py", "--checkpoint", save / "checkpoint_best.pt",
                  "--data", single, "--heads-per-layer", "2,3", "--out", out])
    report = json.loads(out.read_text())
    importance = torch.tensor(report["importance"])
    assert importance.shape == (2, 4)
    assert_close(importance.norm(dim=1), torch.ones(2))
    kept = [sorted(row.argsort(descending=True)[:k].tolist()) for row, k in zip(importance, (2, 3))]
    assert report["kept_heads"] == ";".join(",".join(map(str, heads)) for heads in kept)
    assert f"--kept-heads '{report['kept_heads']}'" in output
    run(train_args(single, tmp_path / "pruned", "--head-selection", "kept", "--kept-heads", report["kept_heads"],
                   epochs=1))
    metrics = validate(single, tmp_path / "pruned" / "checkpoint_best.pt")
    assert metrics["heads_l0"] == 2 and metrics["heads_l1"] == 3


def test_raising_budget_weight_lowers_heads(single, tmp_path):
    heads = {}
    for weight in (0.0, 5.0):
        output = run(train_args(single, tmp_path / str(weight), "--budget-weight", weight, "--target-head-ratio", 0))
        valid = [parse_metrics(l) for l in output.splitlines() if "valid on 'valid' subset" in l]
        heads[weight] = valid[-1]["heads"]
    assert heads[5.0] < heads[0.0] - 0.5, heads


def test_regression(tmp_path):
    data = make_classification_data(tmp_path, n_train=160, n_valid=40, regression=True)
    # the recipe selects regression checkpoints on task_loss (loss includes the budget term)
    # the budget starts at every head (not at the target), so that the budget term is not 0
    run(train_args(data, tmp_path / "ckpt", "--regression-target", "--best-checkpoint-metric", "task_loss",
                   "--initial-budget", 3.75, num_classes=1, epochs=2))
    metrics = validate(data, tmp_path / "ckpt" / "checkpoint_best.pt")
    assert "accuracy" not in metrics and metrics["loss"] > metrics["task_loss"] > 0 and 0 < metrics["head_ratio"] <= 1


def test_tensorboard_has_the_budget_tags(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    save, _ = trained
    tags = {}
    for split in ("train", "train_inner", "valid"):
        events = EventAccumulator(str(save / "tb" / split))
        events.Reload()
        tags[split] = {t: [e.value for e in events.Scalars(t)] for t in events.Tags()["scalars"]}
    wanted = ("heads", "head_ratio", "heads_l0", "heads_l1", "budget_term", "exploration_term",
              "explore_rate", "temperature", "relevance_entropy", "flops_ratio", "accuracy")
    for split in ("train_inner", "valid"):
        missing = [t for t in wanted if t not in tags[split]]
        assert not missing, (split, missing)
    inner = tags["train_inner"]
    assert inner["explore_rate"][0] > 0.5 and inner["explore_rate"][-1] == 0
    assert inner["temperature"][0] > 1.5 and inner["temperature"][-1] == 1.0
    assert all(1 <= h <= 4 for h in inner["heads"]) and all(0 < r <= 1 for r in inner["head_ratio"])
    assert all(0 <= e <= 1 for e in inner["relevance_entropy"])
