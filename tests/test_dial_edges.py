"""The budget dial at its edges: the whole accepted range calibrated (and a ratio outside
an older table refused), calibration misses reported, the export of a ratio as the
counts the dial runs, an export refusing the dial, checkpoints of another table size or
format, and concurrent calls at different settings."""

import argparse
import threading
from pathlib import Path

import pytest
import torch
from test_dial import HEAD, batches, checkpoint_of, nested_model

from budget_plugin.option_error import OptionError
from budget_plugin.dial.calibration import calibration_ratios
from budget_plugin.dial.parsing import parse_head_ratio
from budget_plugin.dial.state_format import STATE_FORMAT
from budget_plugin.models.hub_interface import BudgetFormerHubInterface
from budget_plugin.dial.calibration import calibrate, calibrate_checkpoint, mean_ratio
from budget_plugin.nested.export import dialled_counts, export_counts, export_pruned, pruned_checkpoint, whole_counts
from budget_plugin.tools import building
from budget_plugin.tools.checkpoints import as_budgetformer, load_checkpoint, read
from budget_plugin.tools.errors import DataError
from budget_plugin.tools.evaluation import layer_heads, split_batches
from conftest import build_model, random_tokens

LEGACY = Path(__file__).resolve().parent / "fixtures" / "legacy"


def calibrated(data):
    """A tiny nested model with its dial calibrated on ``data`` (batches() draws new
    tokens every call: evaluate on the same ones)."""
    model = nested_model()
    model.store_dial(calibrate(model, data))
    return model


def one_line(error) -> str:
    text = str(error)
    assert "\n" not in text, text
    return text


# 1. the whole accepted range is calibrated; calibration misses are reported

def test_the_table_covers_the_whole_accepted_range_and_its_ends_are_exact():
    data = batches()
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


def test_a_ratio_outside_a_table_is_refused_naming_its_range():
    model, data = nested_model(), batches()
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
    calibrate(model, batches(), ratios=(0.3, 0.5), log=lines.append)
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
    model = calibrated(batches())
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
    model, data = nested_model(), batches()
    model.store_dial(calibrate(model, data, ratios=(0.45, 0.7)))  # another DIAL_RATIOS
    loaded = build_model(num_classes=2, head_selection="nested", head_ratio="0.45").eval()
    loaded.load_state_dict(model.state_dict())
    assert torch.equal(loaded.head_dial, model.head_dial)
    assert mean_ratio(loaded, data) == pytest.approx(0.45, abs=0.02)


def test_a_format_1_table_loads_without_its_placeholder_rows():
    """Before format 2: nine rows, those at or under --min-heads / H holding -40."""
    model = nested_model()
    table = calibrate(model, batches(), ratios=(0.3, 0.4, 0.5, 0.6, 0.75, 0.9))
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
    model = calibrated(batches())
    hub = BudgetFormerHubInterface(argparse.Namespace(bpe=None), None, model)
    tokens = random_tokens(batch=6, length=12)
    expected = {ratio: hub.predict(HEAD, tokens, return_logits=True, head_ratio=ratio) for ratio in ("1", "0.3")}
    assert not torch.allclose(expected["1"], expected["0.3"])
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
