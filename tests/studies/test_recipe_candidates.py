"""examples/budgetformer/budget_research/recipe_candidates.py: a candidate is the recipe's
own nested command with its save dir moved and its options added; each finished candidate
is recorded once and never trained or scored again."""

import json

from budget_research import recipe_candidates
from budget_research.recipe_candidates import CANDIDATES, TEACHER, candidate_command, report, run_candidates

NESTED = ["fairseq-train", "DATA", "--save-dir", "SAVE/nested", "--tensorboard-logdir", "SAVE/nested/tensorboard",
          "--warmup-updates", "14", "--total-num-update", "240", "--max-update", "240", "--sandwich-widths", "3"]


def test_a_candidate_is_the_recipes_command_moved_with_its_options(tmp_path):
    command = candidate_command({"nested": NESTED}, tmp_path, "dense teacher, narrow sandwich", tmp_path / "t.pt")
    out = tmp_path.resolve() / "candidates" / "dense-teacher-narrow-sandwich"
    assert command[:len(NESTED)] == ["fairseq-train", "DATA", "--save-dir", str(out), "--tensorboard-logdir",
                                     str(out / "tensorboard"), *NESTED[6:]]
    assert command[len(NESTED):] == ["--distill-logits", str(tmp_path / "t.pt"), "--sandwich-max-ratio", "0.5"]
    assert TEACHER not in " ".join(command)


def test_twice_the_updates_doubles_the_schedule_in_place(tmp_path):
    command = candidate_command({"nested": NESTED}, tmp_path, "narrow sandwich, twice the updates", None)
    assert command[6:] == ["--warmup-updates", "28", "--total-num-update", "480", "--max-update", "480",
                           "--sandwich-widths", "3", "--sandwich-max-ratio", "0.5"]


def test_finished_candidates_are_neither_trained_nor_scored_again(tmp_path, monkeypatch):
    (tmp_path / "nested").mkdir()
    (tmp_path / "recipe.json").write_text(json.dumps({"nested": NESTED}))
    (tmp_path / "nested" / "done.json").write_text(json.dumps({"train_wall_s": 100.0}))
    trained, scored = [], []

    def train_step(name, command, out, log, threads):
        trained.append(out.name)
        return {"train_wall_s": 7.0}

    def compare_nested(checkpoints, data, save_dir, log):
        (name, checkpoint), = checkpoints.items()
        scored.append(name)
        rows = {w: {"accuracy": 80.0 - float(w)} for w in ("1", "0.5", "0.25")}
        return {name: {"uniform": rows, "importance": rows}}

    monkeypatch.setattr(recipe_candidates, "train_step", train_step)
    monkeypatch.setattr(recipe_candidates, "compare_nested", compare_nested)
    monkeypatch.setattr(recipe_candidates, "dense_teacher", lambda save_dir, data, log: tmp_path / "teacher.pt")
    record = tmp_path / "record.json"
    found = run_candidates(tmp_path, tmp_path / "data", ["recipe", "narrow sandwich"], record, log=lambda _: None)
    assert trained == ["narrow-sandwich"] and scored == ["recipe", "narrow sandwich"]
    assert found["recipe"]["train_wall_s"] == 100.0 and found["narrow sandwich"]["train_wall_s"] == 7.0
    assert json.loads(record.read_text()) == found
    found = run_candidates(tmp_path, tmp_path / "data", [*CANDIDATES], record, log=lambda _: None)
    assert trained == ["narrow-sandwich", *(recipe_candidates.slug(n) for n in CANDIDATES
                                            if n not in ("recipe", "narrow sandwich"))]
    assert scored == ["recipe", "narrow sandwich", *(n for n in CANDIDATES if n not in ("recipe", "narrow sandwich"))]
    text = report(found, "MR")
    assert "| uniform | 0.25 | 79.75 |" in text and "| uniform | mean of 0.4 and below | 79.75 |" in text
    assert "`{twice the updates}`: the recipe's `--max-update`" in text and "`{teacher}`: the dense step's" in text
    assert "Where:" not in report({"recipe": found["recipe"]}, "MR")


def test_a_training_that_shared_the_machine_is_marked_so(tmp_path, monkeypatch):
    (tmp_path / "recipe.json").write_text(json.dumps({"nested": NESTED}))
    rows = {w: {"accuracy": 80.0} for w in ("1", "0.5", "0.25")}
    monkeypatch.setattr(recipe_candidates, "train_step", lambda *args: {"train_wall_s": 9.0})
    monkeypatch.setattr(recipe_candidates, "compare_nested",
                        lambda checkpoints, *args, **kwargs: {n: {"uniform": rows, "importance": rows}
                                                              for n in checkpoints})
    found = run_candidates(tmp_path, tmp_path / "data", ["narrow sandwich"], tmp_path / "r.json",
                           log=lambda _: None, shared=True)
    assert found["narrow sandwich"]["shared"] is True
    text = report(found, "MR")
    assert "| | training (s) | 9.0 (shared) |" in text and "its wall time is not the step's cost" in text
