"""examples/budgetformer/budget_research/update_cost.py: each contender is a recorded
fairseq-train command built into fairseq's own trainer, and every one trains the same
batches, one update a round; the table's ratios are to the first contender."""

import pytest

from budget_research.update_cost import first_batches, report, trainer_from, update_costs
from helpers import make_classification_data, train_args, without_option

NESTED = ("--head-selection", "nested", "--min-heads", 1, "--sandwich-widths", 3)


def nested_args(data, save_dir, *extra):  # nothing to explore in a nested model
    return without_option(train_args(data, save_dir, *NESTED, *extra), "--exploration-updates")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_classification_data(tmp_path_factory.mktemp("cost") / "data", n_train=64, n_valid=16)


def test_every_contender_trains_the_same_batches_an_update_a_round(data, tmp_path):
    commands = {"router": nested_args(data, tmp_path / "a"),
                "no router": nested_args(data, tmp_path / "b", "--no-router-pass")}
    rows = update_costs(commands, rounds=2, threads=1)
    assert [row["name"] for row in rows] == ["router", "no router"]
    assert all(row["updates"] == 3 and row["rounds"] == 2 and row["update_s"] > 0 for row in rows)
    assert rows[0]["vs_first"] == 1.0
    text = report(rows, "tiny", {"router": "as recorded", "no router": "`--no-router-pass`"})
    assert "| router | " in text and "| no router | " in text and "- no router: `--no-router-pass`" in text


def test_the_batches_are_fairseqs_first_of_the_epoch(data, tmp_path):
    trainer = trainer_from(nested_args(data, tmp_path / "a"))
    again = trainer_from(nested_args(data, tmp_path / "b"))
    ids = [batch["id"].tolist() for batch in first_batches(trainer, 2)]
    assert ids == [batch["id"].tolist() for batch in first_batches(again, 2)]  # seeded: the same order
    assert len(ids) == 2 and ids[0] != ids[1]
