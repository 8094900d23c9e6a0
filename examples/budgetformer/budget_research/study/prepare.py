"""What the studies need before they train: the converted encoder and the binarized data
sets, made when missing (as budget-convert and examples/budgetformer/get_data.py make them)."""

from dataclasses import replace

from budget_plugin.nested import finetune
from budget_plugin.tools.progress import log
from budget_research import pretrained
from budget_research.study.plan import TRUNCATE, StudyConfig

DATASETS = ("MR", "TREC", "BBC")  # those examples/budgetformer/get_data.py fetches


def prepare(cfg: StudyConfig) -> StudyConfig:
    """The converted encoder and the data sets, made when missing; the config with the
    encoder's heads and layers."""
    cache = cfg.data_dir.parent / "cache"
    if not (cfg.model_dir / "model.pt").is_file():
        pretrained.pretrained_minilm(cfg.model_dir, cache, log)
    for dataset in cfg.datasets:
        if not (cfg.data_dir / f"{dataset}-bin" / "label" / "test.idx").is_file():
            if dataset not in DATASETS:
                raise SystemExit(f"error: {cfg.data_dir / f'{dataset}-bin'}: no binarized data set "
                                 "(input0/ and label/ with train, valid and test)")
            truncate = ["--truncate-tokens", TRUNCATE[dataset]] if dataset in TRUNCATE else []
            log(f"preparing {dataset} (budget_research.datasets, as examples/budgetformer/get_data.py)")
            pretrained.get_data([dataset], cfg.data_dir, cache, cfg.model_dir, *truncate)
    args = finetune.encoder_args(cfg.model_dir / "model.pt")
    return replace(cfg, heads=args.encoder_attention_heads, layers=args.encoder_layers)
