"""GLUE's own metrics (--report-mcc, --report-acc-and-f1, --report-pearson-and-spearman)
from the budget criterion: the numbers stock ``sentence_prediction`` gives on the same
predictions, with the budget statistics beside them."""

from types import SimpleNamespace

import pytest
import torch
from fairseq.criterions.sentence_prediction import SentencePredictionConfig, SentencePredictionCriterion
from fairseq.data import Dictionary
from fairseq.logging import metrics

from budget_plugin.criterions.budget_sentence_prediction import (
    BudgetSentencePredictionConfig,
    BudgetSentencePredictionCriterion,
)
from helpers import build_model, make_classification_data, random_tokens, run, train_args, validate

REPORTS = {  # GLUE's option: the metrics it logs
    "report_mcc": ("mcc",),
    "report_acc_and_f1": ("f1", "acc_and_f1"),
    "report_pearson_and_spearman": ("pearson", "spearman", "pearson_and_spearman"),
}
BUDGET_STATS = ("heads", "head_ratio", "heads_l0", "heads_l1", "flops_ratio")


def label_dictionary():
    labels = Dictionary()  # as fairseq-preprocess writes it: the specials, then the labels
    for label in ("1", "0"):
        labels.add_symbol(label)
    return labels


def both_criteria(report, regression=False):
    task = SimpleNamespace(label_dictionary=label_dictionary())
    options = {report: True, "regression_target": regression}
    return (SentencePredictionCriterion(SentencePredictionConfig(**options), task),
            BudgetSentencePredictionCriterion(BudgetSentencePredictionConfig(**options), task))


@pytest.mark.parametrize("report", REPORTS)
def test_the_parents_glue_outputs_and_metrics_on_the_same_predictions(report):
    """In evaluation the budget criterion logs what sentence_prediction logs (its
    predictions and targets, its report flag), and its reduce_metrics derives the same
    numbers, beside the budget statistics."""
    regression = report == "report_pearson_and_spearman"
    model = build_model(num_classes=1 if regression else 2).eval()
    tokens = random_tokens()
    target = torch.tensor([0.1, 0.9, 0.4, 0.3, 0.8, 0.5]) if regression else torch.tensor([0, 1, 0, 1, 1, 0])
    sample = {"net_input": {"src_tokens": tokens, "src_lengths": tokens.ne(1).sum(1)}, "target": target,
              "ntokens": int(tokens.ne(1).sum())}
    stock, budget = both_criteria(report, regression)
    with torch.no_grad():
        stock_logs, budget_logs = stock(model, sample)[2], budget(model, sample)[2]
    for key, value in stock_logs.items():
        if key != "loss":  # the budget criterion's loss adds the budget term
            assert torch.equal(torch.as_tensor(budget_logs[key]), torch.as_tensor(value)), key
    assert len(budget_logs["pred"]) == 6 and report in budget_logs
    found = {}
    for criterion, logs in ((stock, stock_logs), (budget, budget_logs)):
        with metrics.aggregate() as agg:
            type(criterion).reduce_metrics([logs, logs])  # two batches, or two workers
        found[criterion] = agg.get_smoothed_values()
    for key in REPORTS[report]:
        assert found[budget][key] == found[stock][key], key
    assert all(key in found[budget] for key in BUDGET_STATS)
    assert found[budget]["task_loss"] == found[stock]["loss"]


def with_stock_criterion(checkpoint, path):
    """A copy of ``checkpoint`` whose saved criterion is stock ``sentence_prediction``
    with the same options (fairseq-validate builds the checkpoint's criterion)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    saved = state["cfg"]["criterion"]
    stock = {k: saved[k] for k in SentencePredictionConfig.__dataclass_fields__ if k in saved}
    state["cfg"]["criterion"] = {**stock, "_name": "sentence_prediction"}
    torch.save(state, path)
    return path


@pytest.fixture(scope="module")
def glue_data(tmp_path_factory):
    """Sentence pairs scored in [0, 1] (STS-B-like), and the same pairs classed 1 when
    the score is over 0.5, else 0 (CoLA- and MRPC-like; GLUE's labels, which
    sentence_prediction reads back as integers for its metrics)."""
    root = tmp_path_factory.mktemp("glue")
    scored = make_classification_data(root, n_train=256, n_valid=40, pair=True, regression=True)
    classed = root / "classed"
    classed.mkdir()
    for inputs in ("input0", "input1"):
        (classed / inputs).symlink_to(scored / inputs)
    for split in ("train", "valid"):
        scores = (scored / "label" / f"{split}.label").read_text().split()
        (root / f"{split}.class").write_text("".join(f"{int(float(score) > 0.5)}\n" for score in scores))
    run(["fairseq-preprocess", "--only-source", "--trainpref", root / "train.class", "--validpref",
         root / "valid.class", "--destdir", classed / "label", "--workers", 1])
    return {"classes": classed, "scores": scored}


# the GLUE tasks each case stands for: its labels; how it trains (fairseq's GLUE recipes
# keep the best checkpoint by the task's metric); what fairseq-validate adds; the metrics
CASES = {
    "CoLA, MRPC": ("classes", ("--report-mcc", "--best-checkpoint-metric", "mcc"), ("--report-acc-and-f1",),
                   ("mcc", "f1", "acc_and_f1")),
    "STS-B": ("scores", ("--regression-target", "--report-pearson-and-spearman",
                         "--best-checkpoint-metric", "pearson_and_spearman"),
              (), ("pearson", "spearman", "pearson_and_spearman")),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_fairseq_validate_reports_glue_metrics_as_sentence_prediction_does(case, glue_data, tmp_path):
    """A tiny checkpoint trained with the budget criterion and a GLUE metric (its
    validations report it, and the best checkpoint is chosen by it); fairseq-validate
    scores it with the budget criterion and with stock sentence_prediction (MRPC's
    metrics asked for on its command line only): the same GLUE metrics, and the budget
    statistics beside them. STS-B is a regression (one output)."""
    labels, training, validation, keys = CASES[case]
    data = glue_data[labels]
    output = run(train_args(data, tmp_path, *training, "--maximize-best-checkpoint-metric", "--batch-size", 8,
                            num_classes=1 if labels == "scores" else 2, epochs=2))
    trained_keys = keys[:1] if validation else keys
    assert all(f"| {key} " in output for key in trained_keys), output[-2000:]
    budget = validate(data, tmp_path / "checkpoint_best.pt", *validation)
    stock = validate(data, with_stock_criterion(tmp_path / "checkpoint_best.pt", tmp_path / "stock.pt"),
                     *validation, "--criterion", "sentence_prediction")
    assert budget["bsz"] == stock["bsz"] == 40
    for key in keys:
        assert budget[key] == stock[key], (key, budget, stock)
    assert budget["task_loss"] == stock["loss"]
    assert all(key in budget for key in BUDGET_STATS) and not any(key in stock for key in BUDGET_STATS)
    # not the numbers of constant predictions (mcc 0, f1 0 or pearson nan), which any
    # mix-up of predictions and targets would also give
    assert all(0 < abs(budget[key]) <= 100 for key in keys), budget
    assert 0 < budget["head_ratio"] <= 1
