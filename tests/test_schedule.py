"""The recipe's schedule: two epochs, or more where the data is small, so that each step
runs at least ``min_updates`` updates; a cap (``max_updates``) wins over both."""

import pytest

from budget_plugin.cli import finetune as finetune_cli
from budget_plugin.nested.finetune import Recipe


@pytest.mark.parametrize("examples, updates, epochs", [
    (10_202, 638, 2),  # MR: two epochs of 319 batches are over 480 updates
    (2_000, 480, 8),  # MR cut to 2,000: 63 batches an epoch; two epochs (126) are too few
    (4_303, 480, 4),  # TREC: 135 batches an epoch
    (31, 480, 480),  # one batch an epoch
])
def test_the_updates_are_two_epochs_or_at_least_min_updates(examples, updates, epochs):
    recipe = Recipe()
    assert (recipe.updates(examples), recipe.max_epochs(examples)) == (updates, epochs)
    assert recipe.max_epochs(examples) * recipe.batches(examples) >= recipe.updates(examples)


def test_without_min_updates_the_epochs_alone_and_a_cap_wins():
    assert (Recipe(min_updates=0).updates(2_000), Recipe(min_updates=0).max_epochs(2_000)) == (126, 2)
    capped = Recipe(max_updates=240)
    assert (capped.updates(2_000), capped.updates(10_202), capped.max_epochs(2_000)) == (240, 240, 4)
    assert Recipe(epochs=3, min_updates=100).updates(2_000) == 189


def test_a_negative_min_updates_is_refused_naming_the_option(tmp_path, capsys):
    with pytest.raises(SystemExit):
        finetune_cli.main([str(tmp_path), str(tmp_path), str(tmp_path / "out"), "--min-updates", "-1"])
    assert "--min-updates must be >= 0 (0: the epochs alone), got -1" in capsys.readouterr().err
