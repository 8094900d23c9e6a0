"""The studies' shared tooling (examples/budgetformer/budget_research): records reused
only with the same settings, means and spreads, the --updates option, each layer's heads
read from fairseq's validation; and the studies' commands finding the repository they
write their results and caches in."""

import importlib.util

import pytest

from budget_plugin.tools import fairseq_cli
from budget_plugin.tools.files import write_json
from budget_research.study.plan import UPDATES, cached_record, parse_updates
from budget_research.study.report import mean_std
from budget_research.study.train import heads_per_layer
from helpers import REPO

# ----------------------------------------------------------------------- records


def test_cached_record_is_reused_only_with_the_same_settings(tmp_path):
    path = tmp_path / "result.json"
    assert cached_record(path, updates=20) is None
    write_json(path, {"updates": 20, "lr": 5e-4, "fixed_heads": None, "test_accuracy": 61.0})
    assert cached_record(path, updates=20, lr=5e-4, fixed_heads=None)["test_accuracy"] == 61.0
    assert cached_record(path, updates=21, lr=5e-4) is None
    assert cached_record(path, updates=20, fixed_heads=[2.0, 2.0]) is None
    write_json(path, {"updates": 20, "lr": 5e-4})  # a record without the key: it counts as None
    assert cached_record(path, updates=20, fixed_heads=None) is not None
    # settings nested in a dict (a recipe's) are compared key by key, with the same rule
    write_json(path, {"recipe": {"lr": 5e-4, "batch_size": 32}})
    assert cached_record(path, recipe={"lr": 5e-4, "batch_size": 32, "max_tokens": None}) is not None
    assert cached_record(path, recipe={"lr": 5e-4, "batch_size": 32, "max_tokens": 8192}) is None
    assert cached_record(path, recipe={"lr": 1e-4, "batch_size": 32}) is None


def test_mean_std():
    assert mean_std([70.0]) == (70.0, 0.0)
    mean, std = mean_std([1.0, 2.0, 4.0])
    assert mean == pytest.approx(7 / 3) and std == pytest.approx(1.5275252)
    assert mean_std([1.0, 2.0, 4.0], 2) == (2.33, 1.53)


def test_parse_updates_names_the_option():
    assert parse_updates(["TOY=7", "MR=9"], UPDATES) == dict(UPDATES, TOY=7, MR=9)
    with pytest.raises(SystemExit, match="--updates expects NAME=N"):
        parse_updates(["MR=0"], UPDATES)


# ----------------------------------------------------------------------- fairseq's logs

VALID_LINE = ("2024-05-01 12:00:00 | INFO | valid | epoch 003 | valid on 'valid' subset | loss 0.693 | "
              "nll_loss 0.01 | accuracy 87.5 | heads_l0 3.25 | heads_l1 2 | wps 1.2e+05 | lr 1e-05 | bsz 60 | "
              "num_updates 39")


def test_heads_per_layer_of_the_best_validation():
    log = "\n".join([VALID_LINE.replace("accuracy 87.5", "accuracy 80").replace("heads_l0 3.25", "heads_l0 1"),
                     VALID_LINE])
    assert heads_per_layer(fairseq_cli.best_validation(log)) == [3.25, 2.0]


def test_heads_per_layer_follows_the_layer_numbers_not_the_text_order():
    metrics = {f"heads_l{i}": float(i) for i in reversed(range(12))} | {"heads": 5.5}
    assert heads_per_layer(metrics) == [float(i) for i in range(12)]


# ----------------------------------------------------------------------- the commands


@pytest.mark.parametrize("script", ["demo", "reproduce", "latency_study", "benchmark", "width_study", "nested_memory",
                                    "serving_study", "importance_study"])
def test_the_studies_commands_find_the_repository(script):
    spec = importlib.util.spec_from_file_location(f"layout_{script}", REPO / "examples" / "budgetformer" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.REPO == REPO and (module.REPO / "setup.py").is_file()
