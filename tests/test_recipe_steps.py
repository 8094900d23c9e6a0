"""The nested recipe's record of its finished steps (SAVE_DIR/recipe.json): the same
options resume, other options are refused naming what differs, and --redo runs the
changed step and every step after it again."""

import json

import pytest

from budget_plugin.nested.step_record import StepRecord, difference, recorded
from budget_plugin.tools.errors import DataError

PLANNED = {
    "dense": ["fairseq-train", "data", "--lr", "0.0001", "--max-update", "40", "--cpu"],
    "importance": {"examples": 2048, "batch_size": 32, "split": "train"},
    "nested": ["fairseq-train", "data", "--lr", "0.0001", "--sandwich-widths", "3"],
}


def finished(tmp_path, names):
    steps = StepRecord(tmp_path)
    for name in names:
        steps.finish(name, PLANNED[name])
    return StepRecord(tmp_path)  # read back from the file


def test_the_same_options_resume_every_finished_step(tmp_path):
    steps = finished(tmp_path, ["dense", "importance"])
    steps.check(PLANNED, tmp_path, redo=False, log=print)
    assert [n for n in PLANNED if steps.done(n)] == ["dense", "importance"]
    assert json.loads((tmp_path / "recipe.json").read_text()) == {k: PLANNED[k] for k in ("dense", "importance")}


def test_other_options_are_refused_naming_what_differs(tmp_path):
    steps = finished(tmp_path, list(PLANNED))
    changed = dict(PLANNED, dense=["fairseq-train", "data2", "--lr", "0.0002", "--max-update", "40"])
    with pytest.raises(DataError) as refused:
        steps.check(changed, tmp_path, redo=False, log=print)
    message = str(refused.value)
    assert f"{tmp_path}: its dense step was run with other options" in message and "--redo" in message
    assert "--cpu (set) (now (unset))" in message and "--lr 0.0001 (now 0.0002)" in message
    assert "arguments fairseq-train data (now fairseq-train data2)" in message and "--max-update" not in message
    assert all(steps.done(n) for n in PLANNED)  # nothing forgotten by a refusal
    assert set(json.loads((tmp_path / "recipe.json").read_text())) == set(PLANNED)


def test_redo_forgets_the_changed_step_and_every_step_after_it(tmp_path):
    steps = finished(tmp_path, list(PLANNED))
    changed = dict(PLANNED, importance={"examples": 512, "batch_size": 32, "split": "train"})
    lines = []
    steps.check(changed, tmp_path, redo=True, log=lines.append)
    assert [n for n in PLANNED if steps.done(n)] == ["dense"]  # the nested step took the importance as input
    assert lines == ["--redo: the importance step's options changed; it and the steps after it run again"]
    assert list(json.loads((tmp_path / "recipe.json").read_text())) == ["dense"]


def test_a_step_that_runs_again_takes_the_steps_after_it_along(tmp_path):
    # the dense step cut short (no record) while a later step's record survived
    steps = finished(tmp_path, ["importance", "nested"])
    steps.check(PLANNED, tmp_path, redo=False, log=print)
    assert not any(steps.done(n) for n in PLANNED)


def test_settings_differ_by_name_and_the_log_interval_is_not_recorded():
    assert difference({"examples": 2048, "split": "train"}, {"examples": 512, "split": "train"}) == \
        "examples 2048 (now 512)"
    assert recorded(["fairseq-train", "d", "--log-interval", 10, "--lr", 1e-4]) == ["fairseq-train", "d", "--lr", "0.0001"]
