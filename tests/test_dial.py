"""The budget dial (--head-ratio), at serving time and in training: a calibrated shift
of the budget logits, or fixed counts; its calibration over the whole accepted range
(and a ratio outside an older table refused, calibration misses reported); the
physically pruned export, the export of a ratio as the counts the dial runs, and an
export refusing the dial; checkpoints of another table size or format; concurrent calls
at different settings; and the criterion's sandwich of widths."""

import argparse
import threading
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from budget_plugin.option_error import OptionError
from budget_plugin.dial.calibration import SHIFT_RESOLUTION, calibration_ratios
from budget_plugin.dial.parsing import parse_head_ratio
from budget_plugin.dial.settings import Dial, HeadRatio
from budget_plugin.dial.state_format import STATE_FORMAT
from budget_plugin.models.hub_interface import BudgetFormerHubInterface
from budget_plugin.dial.calibration import calibrate, calibrate_checkpoint, mean_ratio
from budget_plugin.nested.export import dialled_counts, export_counts, export_pruned, pruned_checkpoint, whole_counts
from budget_plugin.criterions.update_passes import UpdatePasses
from budget_plugin.tasks.budget_sentence_prediction import BudgetSentencePredictionTask
from budget_plugin.tools import building
from budget_plugin.tools.checkpoints import as_budgetformer, load_checkpoint, read
from budget_plugin.tools.errors import DataError
from budget_plugin.tools.evaluation import layer_heads, split_batches
from helpers import (
    HEAD,
    LEGACY,
    assert_close,
    build_model,
    checkpoint_of,
    close,
    dial_batches,
    make_criterion,
    make_sample,
    nested_model,
    random_tokens,
    without_dropout,
)


def one_line(error) -> str:
    text = str(error)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("value, expected", [
    (None, None),
    ("0.3", HeadRatio(0.3, None)),
    (0.5, HeadRatio(0.5, None)),
    ("1", HeadRatio(None, [4, 4])),  # every head, no router
    ("2,3", HeadRatio(None, [2, 3])),
])
def test_head_ratio_takes_a_ratio_or_a_count_per_layer(value, expected):
    assert parse_head_ratio(value, num_layers=2, num_heads=4) == expected


@pytest.mark.parametrize("value, message", [
    ("0", r"--head-ratio must be a ratio in \[--min-heads / H, 1\] = \[0.250, 1\]"),
    ("1.5", "a ratio in"),
    ("2,3,4", "one ratio in \\(0, 1\\], or 2 comma-separated whole head counts"),
    ("2,5", "whole head counts"),
    ("2.5,3", "whole head counts"),
    ("half", "whole head counts"),
])
def test_bad_head_ratios_are_refused_by_name(value, message):
    with pytest.raises(ValueError, match=message):
        parse_head_ratio(value, num_layers=2, num_heads=4)


def test_counts_dial_runs_those_heads_with_no_router():
    model = nested_model()
    tokens = random_tokens()
    with torch.no_grad(), model.dialled("2,3"):
        dialled, extra = model(tokens, classification_head_name=HEAD)
    with torch.no_grad():
        given, _ = model(tokens, classification_head_name=HEAD, dial=Dial(counts=(2, 3)))
    assert [layer["heads"].tolist() for layer in extra["budget"]] == [[2] * 6, [3] * 6]
    assert torch.equal(dialled, given)
    with torch.no_grad():
        _, extra = model(tokens, classification_head_name=HEAD)
    assert len(set(torch.cat([layer["heads"] for layer in extra["budget"]]).tolist())) > 1, "the router's again"


def test_a_ratio_needs_the_calibration():
    with pytest.raises(ValueError, match="needs the budget dial's calibration.*budget-calibrate"):
        with nested_model().dialled("0.5"):
            pass


def test_the_dial_is_for_evaluation_only():
    """Training ignores the dial: the budget predictor is trained as it predicts."""
    model = nested_model()
    tokens = random_tokens()
    model.train()
    torch.manual_seed(0)  # the same dropout
    with model.dialled("2,3"):
        _, dialled = model(tokens)
    torch.manual_seed(0)
    _, plain = model(tokens)
    assert torch.equal(torch.stack([l["budget"] for l in dialled["budget"]]),
                       torch.stack([l["budget"] for l in plain["budget"]]))


def test_a_dial_given_to_the_call_applies_in_training_too():
    """A call's own dial runs its counts in training as at evaluation (the sandwich's
    widths), over the model's own setting, which stays out of training."""
    model = nested_model().train()
    tokens = random_tokens()
    with model.dialled("1,1"):
        torch.manual_seed(0)
        _, given = model(tokens, dial=Dial(counts=(2, 3)))
        torch.manual_seed(0)
        _, own = model(tokens)
    torch.manual_seed(0)
    _, plain = model(tokens)
    assert [layer["heads"].tolist() for layer in given["budget"]] == [[2] * 6, [3] * 6]
    assert torch.equal(torch.stack([l["heads"] for l in own["budget"]]),
                       torch.stack([l["heads"] for l in plain["budget"]]))
    assert not all((l["heads"] == 1).all() for l in own["budget"]), "the router's own counts, not the dialled ones"


def test_calibration_makes_every_dialled_ratio_the_mean_on_its_split():
    model = nested_model()
    data = dial_batches()
    table = calibrate(model, data)
    assert table[0, 0].item() == pytest.approx(0.25) and table[-1, 0].item() == 1  # the range the dial accepts
    assert all(any(r == pytest.approx(aim) for r in table[:, 0].tolist()) for aim in calibration_ratios(1, 4))
    assert torch.all(table[1:, 0] > table[:-1, 0]) and torch.all(table[1:, 1] >= table[:-1, 1]), \
        "a larger ratio takes a larger shift"
    model.store_dial(table)
    achieved = {}
    for ratio in (0.3, 0.5, 0.75):
        with model.dialled(str(ratio)):
            achieved[ratio] = mean_ratio(model, data)
    assert achieved == {r: pytest.approx(r, abs=0.02) for r in achieved}
    # between two calibrated ratios, interpolated: the mean lands between theirs
    with model.dialled("0.45"):
        assert 0.4 - 0.02 <= mean_ratio(model, data) <= 0.5 + 0.02
    assert model.head_ratio is None and model.dial_setting == Dial(), "the model's own setting again"


def test_a_calibrated_checkpoint_dials_when_loaded():
    """--head-ratio reaches the model as its option; the shift is applied once the
    calibration is loaded with the weights."""
    model, data = nested_model(), dial_batches()
    model.store_dial(calibrate(model, data))
    dialled = build_model(num_classes=2, head_selection="nested", head_ratio="0.3").eval()
    dialled.load_state_dict(model.state_dict())
    assert mean_ratio(dialled, data) == pytest.approx(0.3, abs=0.02)


@pytest.mark.parametrize("counts", [[2, 3], [2, 2], [4, 4]])
def test_the_pruned_export_computes_the_dialled_model_with_fewer_weights(counts):
    model = nested_model()
    state = checkpoint_of(model)
    pruned = as_budgetformer(pruned_checkpoint(state, counts))
    tokens = random_tokens()
    with torch.no_grad():
        expected, _ = model(tokens, classification_head_name=HEAD, dial=Dial(counts=tuple(counts)))
    with torch.no_grad():
        found, extra = pruned(tokens, classification_head_name=HEAD)
    assert_close(found, expected)
    assert [layer["heads"].tolist() for layer in extra["budget"]] == [[c] * 6 for c in counts]
    sizes = {name: sum(p.numel() for p in m.parameters()) for name, m in (("nested", model), ("pruned", pruned))}
    d = model.args.encoder_embed_dim // 4
    dropped = sum(4 * (4 - c) * d * model.args.encoder_embed_dim + 3 * (4 - c) * d for c in counts)
    router = sum(p.numel() for a in model.budgeted_attentions() for p in a.router.parameters())
    assert sizes["nested"] - sizes["pruned"] == dropped + router
    assert not any(".router." in k for k in pruned.state_dict())
    for module in pruned.modules():  # its gated (training) path holds only the kept heads too
        if hasattr(module, "p") and isinstance(module.p, float):
            module.p = 0.0
    pruned.train()
    gated, _ = pruned(tokens, classification_head_name=HEAD)
    assert_close(gated, expected)


def test_only_a_nested_checkpoint_exports():
    learned = build_model(num_classes=2)
    with pytest.raises(DataError, match="export needs a --head-selection nested checkpoint"):
        pruned_checkpoint(checkpoint_of(learned), [2, 2])


def test_the_sandwich_adds_every_width_distilled_from_the_full_one():
    """--sandwich-widths 3: the loss is the full width's task loss + the smallest's and
    one random width's losses mixed with the full width's distillation + the router
    pass's (mixed the same way); computed here by hand from forced runs under the same
    seed, in the criterion's order (full, smallest, random, router)."""
    model = without_dropout(nested_model(min_heads=1).train())
    sample = make_sample()
    criterion = make_criterion(sandwich_widths=3, distill_weight=0.5, distill_temperature=2.0,
                               budget_weight=0.0, exploration_weight=0.0)
    torch.manual_seed(5)
    loss, size, logs = criterion(model, sample)
    torch.manual_seed(5)
    full, _ = criterion.width_forward(model, sample, None)
    random_width = torch.randint(1, 5, (2,)).tolist()
    target = sample["target"]

    def mixed(z):
        kl = F.kl_div(F.log_softmax(z / 2, -1), F.log_softmax(full.detach() / 2, -1), reduction="sum",
                      log_target=True)
        return 0.5 * F.cross_entropy(z, target, reduction="sum") + 0.5 * 4 * kl

    smallest = model(**sample["net_input"], features_only=True, classification_head_name=HEAD,
                     dial=Dial(counts=(1, 1)))[0]
    drawn = model(**sample["net_input"], features_only=True, classification_head_name=HEAD,
                  dial=Dial(counts=tuple(random_width)))[0]
    logits, _ = model(**sample["net_input"], features_only=True, classification_head_name=HEAD)
    widths = F.cross_entropy(full, target, reduction="sum") + mixed(smallest) + mixed(drawn)
    assert_close(logs["width_loss"], widths)
    assert_close(loss, mixed(logits) + widths)
    loss.backward()
    budget = model.encoder.sentence_encoder.layers[0].self_attn.router.budget_proj.weight
    assert budget.grad is not None and budget.grad.abs().sum() > 0, "the router's pass trains the budget"


@pytest.mark.parametrize("min_ffn_ratio", [0.0, 0.25])
def test_train_step_backpropagates_each_width_as_it_comes_to_the_same_gradient(min_ffn_ratio):
    """The task's train_step hands the criterion its optimizer's backward: every pass of
    the sandwich is backpropagated as soon as it is computed (one graph alive at a time),
    and the gradient is the one of the summed loss, with dropout on (same seed)."""
    task = SimpleNamespace(label_dictionary=None, cfg=SimpleNamespace(cpu_precision="fp32"))
    criterion = make_criterion(sandwich_widths=4, min_ffn_ratio=min_ffn_ratio, distill_weight=0.5)
    model = nested_model(min_heads=1, encoder_ffn_embed_dim=32).train()
    sample = make_sample()
    calls = []

    class Optimizer:  # what train_step uses of fairseq's optimizer
        def backward(self, loss):
            calls.append(loss.item())
            loss.backward()

    torch.manual_seed(3)
    loss, size, logs = BudgetSentencePredictionTask.train_step(task, sample, model, criterion, Optimizer(), 0)
    by_pass = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    torch.manual_seed(3)
    summed, _, summed_logs = criterion(model, sample)
    summed.backward()
    at_once = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert len(calls) == 5, "the full width, the smallest, two random ones, the router's pass"
    assert not loss.requires_grad
    assert_close(loss, sum(calls))  # the same five losses, summed in float32 in another order
    assert_close(loss, summed)
    assert_close(logs["width_loss"], summed_logs["width_loss"])
    assert len(by_pass) == len(at_once)
    scale = max(g.abs().max().item() for g in at_once)  # the whole gradient's (k_proj.bias's is 0 but for rounding)
    for a, b in zip(by_pass, at_once):
        assert_close(a, b, scale=scale)


@pytest.mark.parametrize("update, passes", [(0, 4), (1, 3), (2, 3), (3, 3), (4, 4)])
def test_router_interval_runs_the_routers_pass_every_nth_update(update, passes):
    """--router-interval 4: the router's pass on updates 0, 4, 8, ... (its budgets then
    get a gradient); the updates between are --no-router-pass's, pass for pass."""
    model = without_dropout(nested_model(min_heads=1).train())
    model.set_num_updates(update)
    calls = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))
    torch.manual_seed(5)
    loss, _, logs = make_criterion(sandwich_widths=3, distill_weight=0.5, router_interval=4)(model, make_sample())
    hook.remove()
    loss.backward()
    budget = model.encoder.sentence_encoder.layers[0].self_attn.router.budget_proj.weight
    assert len(calls) == passes and (budget.grad is not None) == (passes == 4)
    if passes == 3:
        torch.manual_seed(5)
        alone, _, _ = make_criterion(sandwich_widths=3, distill_weight=0.5, no_router_pass=True)(model, make_sample())
        assert_close(loss, alone)


def test_router_interval_needs_the_sandwich():
    with pytest.raises(OptionError, match=r"--router-interval must be 1 unless --sandwich-widths is 1 or more"):
        make_criterion(router_interval=2)
    with pytest.raises(OptionError, match=r"--router-interval must be >= 1, got 0"):
        make_criterion(sandwich_widths=3, router_interval=0)


def test_no_router_pass_trains_the_sandwich_alone_and_logs_its_full_width():
    """--no-router-pass: the update's loss is the sandwich's widths' alone (the same
    passes under the same seed, nothing after them), the routers get no gradient, and
    the loss and accuracy fairseq logs are the full width's, with no pass of their own."""
    model = without_dropout(nested_model(min_heads=1).train())
    sample = make_sample()
    criterion = make_criterion(sandwich_widths=3, distill_weight=0.5, no_router_pass=True)
    torch.manual_seed(5)
    calls = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))
    loss, size, logs = criterion(model, sample)
    hook.remove()
    assert len(calls) == 3, "the full width, the smallest, a random one: no router's pass"
    torch.manual_seed(5)
    full, widths = criterion.sandwich(model, sample, UpdatePasses(model, None))
    assert_close(loss, widths)
    assert_close(logs["width_loss"], widths)
    assert int(logs["ncorrect"]) == int(full.argmax(-1).eq(sample["target"]).sum())
    assert "distill_loss" not in logs and logs["layer_sentences"] == 0  # no router's budgets ran
    loss.backward()
    for name, p in model.named_parameters():
        if ".router." in name:
            assert p.grad is None, name
    encoder = model.encoder.sentence_encoder.layers[0]
    assert encoder.self_attn.q_proj.weight.grad.abs().sum() > 0


def test_no_router_pass_needs_a_sandwich():
    with pytest.raises(OptionError, match="--no-router-pass"):
        make_criterion(no_router_pass=True)


def test_the_sandwich_max_ratio_keeps_the_random_widths_narrow():
    """--sandwich-max-ratio 0.5: every random width runs at most half the heads and FFN
    neurons of each layer (and at least the smallest width); without it, wider ones are drawn."""
    model = nested_model(min_heads=1, encoder_ffn_embed_dim=32)

    def drawn(**options):
        torch.manual_seed(0)
        criterion = make_criterion(sandwich_widths=6, min_ffn_ratio=0.25, **options)
        return [width for _ in range(50) for width in criterion.widths(model)[1:]]  # [0]: the smallest

    narrow = drawn(sandwich_max_ratio=0.5)
    assert all(1 <= h <= 2 for heads, _ in narrow for h in heads)
    assert all(8 <= n <= 16 for _, neurons in narrow for n in neurons)
    assert {h for heads, _ in narrow for h in heads} == {1, 2}
    wide = drawn()
    assert max(h for heads, _ in wide for h in heads) == 4 and max(n for _, ns in wide for n in ns) > 16


def test_no_sandwich_in_evaluation():
    model = nested_model()
    sample = make_sample()
    _, _, logs = make_criterion(sandwich_widths=3)(model, sample)
    assert "width_loss" not in logs


@pytest.mark.parametrize("means, counts", [
    ([3.6] * 6, None),  # 21.6 heads: 22 (any four layers at 4), not the 24 that rounding each layer gives
    ([3.76, 3.61, 3.18, 4.0, 3.01, 4.0], [4, 4, 3, 4, 3, 4]),  # 21.56: the largest remainders get the heads
    ([2.0, 3.0], [2, 3]),
    ([2.5, 2.5], None),  # 5: one layer at 3
])
def test_fixed_counts_keep_the_total_of_the_means(means, counts):
    found = whole_counts(means)
    assert sum(found) == round(sum(means))
    assert all(abs(c - m) < 1 for c, m in zip(found, means))
    assert counts is None or found == counts


# --------------------------------------------------------------------------------------
# The dial at its edges
# --------------------------------------------------------------------------------------


def calibrated(data):
    """A tiny nested model with its dial calibrated on ``data`` (dial_batches() draws new
    tokens every call: evaluate on the same ones)."""
    model = nested_model()
    model.store_dial(calibrate(model, data))
    return model


# 1. the whole accepted range is calibrated; calibration misses are reported

def test_the_table_covers_the_whole_accepted_range_and_its_ends_are_exact():
    data = dial_batches()
    model = calibrated(data)
    table = model.head_dial
    assert table[0, 0].item() == pytest.approx(0.25) and table[-1, 0].item() == 1.0  # --min-heads / H .. 1
    rows = table[:, 0].tolist()
    assert all(any(r == pytest.approx(aim) for r in rows) for aim in calibration_ratios(1, 4))
    # near the ends (an old table held 0.9's shift for 0.95, and a placeholder row at 0.25 pulled 0.28 to 0.25)
    for ratio in (0.28, 0.5, 0.95, 0.97):
        with model.dialled(str(ratio)):
            assert mean_ratio(model, data) == pytest.approx(ratio, abs=0.02), ratio
    # the ends themselves run exact counts, with no router and no calibration
    assert parse_head_ratio("0.25", 2, 4, 1).counts == [1, 1]
    assert parse_head_ratio("1", 2, 4, 1).counts == [4, 4]
    with nested_model().dialled("0.25"):
        pass


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_calibration_finds_the_ends_exactly_and_most_ratios_in_one_run(seed):
    """The ends come from one run each at the bounds: the bottom row is the last shift at
    --min-heads and the top the first at every head, to SHIFT_RESOLUTION (checked here by
    runs on either side). Each other ratio is proposed from the nearest run's logits:
    at most two runs a ratio in all, where bisection took about seven (54-65 runs here)."""
    torch.manual_seed(seed)
    model, data = nested_model(), dial_batches(seed=seed)
    lines = []
    table = calibrate(model, data, log=lines.append)

    def ratio(shift):
        with model.dialled(Dial(shift=shift)):
            return mean_ratio(model, data)

    bottom, top = table[0, 1].item(), table[-1, 1].item()
    assert ratio(bottom) == 0.25 < ratio(bottom + SHIFT_RESOLUTION)
    assert ratio(top) == 1.0 > ratio(top - SHIFT_RESOLUTION)
    runs = int(lines[-1].split()[0])
    assert lines[-1] == f"{runs} runs over the split" and runs <= 2 * len(calibration_ratios(1, 4))


def test_a_ratio_outside_a_table_is_refused_naming_its_range():
    model, data = nested_model(), dial_batches()
    table = calibrate(model, data)
    inner = table[(table[:, 0] >= 0.3) & (table[:, 0] <= 0.9)]  # as a table from before the ends were calibrated
    model.store_dial(inner)
    for ratio in ("0.28", "0.95"):
        with pytest.raises(OptionError, match=r"calibrated for \[0\.3, 0\.9\] only") as refused:
            with model.dialled(ratio):
                pass
        one_line(refused.value)
    with model.dialled("0.5"):
        assert mean_ratio(model, data) == pytest.approx(0.5, abs=0.02)


def test_calibration_says_which_ratio_it_missed_and_by_how_much():
    """Budgets that do not vary with the input: the mean moves in steps of a quarter."""
    model = nested_model()
    with torch.no_grad():
        for attention in model.budgeted_attentions():
            attention.router.budget_proj.weight.zero_()
    lines = []
    calibrate(model, dial_batches(), ratios=(0.3, 0.5), log=lines.append)
    warnings = [line for line in lines if line.startswith("warning:")]
    assert warnings == ["warning: head ratio 0.300 not reached: the closest shift gives 0.2500, further than the "
                        "tolerance 0.02 (too few examples or heads in the split for that ratio, or budgets that do not "
                        "vary); the dial runs that shift for it"]


# 2. a ratio exports the counts the calibrated dial runs on its calibration split

@pytest.fixture
def nested_checkpoint(tmp_path):
    """The legacy 'learned' fixture as a nested checkpoint (its data folder is real),
    its budgets made to vary with the input."""
    state = torch.load(LEGACY / "learned.pt", weights_only=True)
    state["cfg"]["model"] = argparse.Namespace(**{**vars(state["cfg"]["model"]), "head_selection": "nested",
                                                  "exploration_updates": 0})
    generator = torch.Generator().manual_seed(0)
    for key in [k for k in state["model"] if k.endswith("budget_proj.weight")]:
        state["model"][key] = torch.randn(state["model"][key].shape, generator=generator) * 0.5
    path = tmp_path / "nested.pt"
    torch.save(state, path)
    return path


def test_a_ratio_exports_what_the_dial_runs_on_its_calibration_split(nested_checkpoint, tmp_path, capsys):
    from budget_plugin.cli.export import main as export_main

    data = LEGACY / "data"
    calibrate_checkpoint(nested_checkpoint, data, "valid", log=lambda _: None)
    assert read(nested_checkpoint)["dial_calibration"]["split"] == "valid"
    model, task = load_checkpoint(nested_checkpoint, data)
    dev = split_batches(task, 64, "valid")
    with model.dialled("0.6"):
        means = layer_heads(model, dev)
    expected = whole_counts(means)
    assert sum(expected) == round(sum(means))
    assert dialled_counts(model, dev, "0.6") == export_counts(nested_checkpoint, "0.6", data) == expected
    assert export_main([str(nested_checkpoint), str(tmp_path / "out"), "--head-ratio", "0.6", "--data", str(data)]) == 0
    assert f"heads per layer {','.join(map(str, expected))}" in capsys.readouterr().out
    pruned = as_budgetformer(read(tmp_path / "out" / "checkpoint_pruned.pt"))
    assert pruned.args.fixed_heads == ",".join(map(str, expected))
    # the explicit per-layer form needs no data
    assert export_counts(nested_checkpoint, "2,3") == [2, 3]


def test_a_bare_ratio_without_its_data_is_refused(nested_checkpoint, tmp_path):
    with pytest.raises(DataError, match=r"--head-ratio 0.5: .*give that data folder \(--data DATA_DIR\), or the "
                                        r"counts") as refused:
        export_pruned(nested_checkpoint, tmp_path / "out.pt", "0.5")
    one_line(refused.value)
    with pytest.raises(DataError, match="no record of the split its dial was calibrated on"):
        export_counts(nested_checkpoint, "0.5", LEGACY / "data")  # never calibrated


# 3. an export has no dial

def test_an_export_refuses_the_dial_in_one_line(tmp_path):
    model = calibrated(dial_batches())
    state = pruned_checkpoint(checkpoint_of(model), [2, 3])
    pruned = as_budgetformer(state)
    for head_ratio in ("0.5", "2,2", "1"):
        with pytest.raises(OptionError, match=r"fixed-width model .*--head-selection pruned, heads per layer 2,3"
                                              r"\) and has no budget dial") as refused:
            pruned.dial_of(head_ratio)
        one_line(refused.value)
    hub = BudgetFormerHubInterface(argparse.Namespace(bpe=None), None, pruned)
    with pytest.raises(OptionError, match="fixed-width model"):
        hub.predict(HEAD, random_tokens(), head_ratio="0.5")
    assert hub.predict(HEAD, random_tokens()).shape == (6, 2)  # undialled, it runs
    # as fairseq-validate and budget-predict hand --head-ratio to the model: refused when it is built
    options = dict(vars(state["cfg"]["model"]), head_ratio="0.5")
    with pytest.raises(OptionError, match="fixed-width model"):
        building.build_model(options["arch"], 50, args=argparse.Namespace(**options))


# 4. the table's own ratios and the state dict's format travel with the checkpoint

def test_a_checkpoint_calibrated_at_other_ratios_loads_and_dials():
    model, data = nested_model(), dial_batches()
    model.store_dial(calibrate(model, data, ratios=(0.45, 0.7)))  # another DIAL_RATIOS
    loaded = build_model(num_classes=2, head_selection="nested", head_ratio="0.45").eval()
    loaded.load_state_dict(model.state_dict())
    assert torch.equal(loaded.head_dial, model.head_dial)
    assert mean_ratio(loaded, data) == pytest.approx(0.45, abs=0.02)


def test_a_format_1_table_loads_without_its_placeholder_rows():
    """Before format 2: nine rows, those at or under --min-heads / H holding -40."""
    model = nested_model()
    table = calibrate(model, dial_batches(), ratios=(0.3, 0.4, 0.5, 0.6, 0.75, 0.9))
    inside = table[(table[:, 0] >= 0.3) & (table[:, 0] <= 0.9)]  # the ratios of the day
    old = torch.cat([torch.tensor([[0.15, -40.0], [0.2, -40.0], [0.25, -40.0]]), inside])
    state = {k: v for k, v in model.state_dict().items() if k != "budget_format"}
    loaded = nested_model()
    loaded.load_state_dict({**state, "head_dial": old})  # (loading upgrades the dict it is given)
    assert torch.equal(loaded.head_dial, inside) and int(loaded.budget_format) == STATE_FORMAT
    with pytest.raises(OptionError, match=r"calibrated for \[0\.3, 0\.9\] only"):
        loaded.dial_of("0.27")
    # uncalibrated format 1 (zeros): uncalibrated
    loaded.load_state_dict({**state, "head_dial": torch.zeros(9, 2)})
    assert loaded.head_dial.shape == (0, 2)


def test_a_newer_format_is_refused_by_name():
    state = nested_model().state_dict()
    state["budget_format"] = torch.tensor(STATE_FORMAT + 1)
    with pytest.raises(OptionError, match=rf"the checkpoint's budget_format is {STATE_FORMAT + 1}, newer than this "
                                          rf"budget_plugin reads \({STATE_FORMAT}\)") as refused:
        nested_model().load_state_dict(state)
    one_line(refused.value)


# 5. concurrent calls at different settings

def test_threads_predicting_at_different_settings_each_get_their_own():
    model = calibrated(dial_batches())
    hub = BudgetFormerHubInterface(argparse.Namespace(bpe=None), None, model)
    tokens = random_tokens(batch=6, length=12)
    expected = {ratio: hub.predict(HEAD, tokens, return_logits=True, head_ratio=ratio) for ratio in ("1", "0.3")}
    assert not close(expected["1"], expected["0.3"])
    wrong, errors = [], []

    def loop(ratio):
        try:
            for _ in range(60):
                if not torch.equal(hub.predict(HEAD, tokens, return_logits=True, head_ratio=ratio), expected[ratio]):
                    wrong.append(ratio)
        except Exception as e:  # noqa: BLE001  (reported below, with the thread's setting)
            errors.append((ratio, e))

    threads = [threading.Thread(target=loop, args=(ratio,)) for ratio in ("1", "0.3")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and not wrong, (errors, len(wrong))
    assert model.dial_setting == model.dial_of(None), "the model's own setting is untouched"


def test_budget_predict_refuses_to_dial_an_export(nested_checkpoint, tmp_path):
    from budget_plugin.cli.predict import main as predict_main

    folder = tmp_path / "export"
    folder.mkdir()
    torch.save(pruned_checkpoint(read(nested_checkpoint), [2, 3]), folder / "checkpoint_best.pt")
    (folder / "input.txt").write_text("w1 w2\n")
    with pytest.raises(SystemExit) as refused:
        predict_main(["--checkpoint-dir", str(folder), "--data", str(LEGACY / "data"), "--input",
                      str(folder / "input.txt"), "--head-ratio", "0.5"])
    assert refused.value.code.startswith("error: --head-ratio 0.5: this is a fixed-width model"), refused.value.code
    one_line(refused.value.code)


def test_calibration_on_a_sample_takes_evenly_spaced_whole_batches():
    """spread(): about the asked examples, whole batches from the middle of each equal
    stretch of fairseq's order (shortest to longest); all of them when the split is smaller."""
    from budget_plugin.dial.calibration import spread

    found = [{"nsentences": 64, "id": i} for i in range(16)] + [{"nsentences": 42, "id": 16}]  # 1066 examples
    kept = spread(found, 512)
    assert [b["id"] for b in kept] == [1, 3, 5, 7, 9, 11, 13, 15]
    assert sum(b["nsentences"] for b in kept) == 512
    assert spread(found, 5000) == found and [b["id"] for b in spread(found, 1)] == [8]
    some = [b["id"] for b in spread(found, 400)]  # 6 of 17 batches, from both ends' stretches
    assert some == [1, 4, 7, 9, 12, 15]
