"""The yaml recipes run as they stand through fairseq-hydra-train (tiny data and
sizes swapped in on the command line) and their checkpoints load in fairseq-validate."""

import re

import pytest

from helpers import REPO, make_classification_data, run, validate

CONFIG_DIR = REPO / "examples" / "budgetformer" / "config"


@pytest.mark.slow
@pytest.mark.parametrize("config, pair", [("mr", False), ("rte", True)])
def test_hydra_config_trains_and_validates(config, pair, tmp_path):
    """mr also turns the exploration schedule on, a model option under ``model:``."""
    data = make_classification_data(tmp_path, n_train=96, n_valid=40, pair=pair)
    save = tmp_path / "ckpt"
    output = run([
        "fairseq-hydra-train", "--config-dir", CONFIG_DIR, "--config-name", config,
        f"task.data={data}", f"checkpoint.save_dir={save}", f"hydra.run.dir={tmp_path / 'hydra'}",
        "model._name=budgetformer_tiny", "model.max_positions=64", "task.max_positions=64",
        "optimization.max_epoch=1", "optimization.max_update=6", "lr_scheduler.total_num_update=6",
        "lr_scheduler.warmup_updates=1", "dataset.batch_size=16", "common.log_interval=1",
        "common.cpu=true", "distributed_training.distributed_world_size=1",
        *(["+model.exploration_updates=4"] if config == "mr" else []),
    ], cwd=REPO)
    rates = [float(r) for r in re.findall(r"explore_rate=([\d.]+)", output)]
    assert rates and (rates[0] > 0) == (config == "mr"), rates
    assert rates[-1] == 0
    metrics = validate(data, save / "checkpoint_last.pt")
    assert metrics["bsz"] == 40 and 0 < metrics["head_ratio"] <= 1


def test_sst2_is_rte_but_for_its_task():
    """sst2.yaml differs from rte.yaml (which runs above) only in the task's numbers."""
    from omegaconf import OmegaConf

    sst2, rte = (OmegaConf.load(CONFIG_DIR / f"{name}.yaml") for name in ("sst2", "rte"))
    flat = {name: {f"{section}.{key}" for section in cfg for key in cfg[section]} for name, cfg in
            (("sst2", sst2), ("rte", rte))}
    assert flat["sst2"] == flat["rte"]
    # raw values: ${hydra:...} resolves only inside a hydra run
    raw = {name: OmegaConf.to_container(cfg, resolve=False) for name, cfg in (("sst2", sst2), ("rte", rte))}
    differ = {k for k in flat["rte"]
              if raw["sst2"][k.split(".")[0]][k.split(".")[1]] != raw["rte"][k.split(".")[0]][k.split(".")[1]]}
    assert differ <= {"task.data", "dataset.batch_size", "lr_scheduler.warmup_updates",
                      "lr_scheduler.total_num_update", "optimization.lr", "optimization.max_update",
                      "checkpoint.save_dir"}, differ
