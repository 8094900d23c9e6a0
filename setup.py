"""budget-plugin: BudgetFormer (adaptive attention-head budgets) as a fairseq plugin.

Install with ``make setup`` (or the three pip steps in README.md): fairseq-fixed must
be compiled against the torch that is already installed (--no-build-isolation).

Installs the plugin (``--user-dir``: the folder of ``budget_plugin``) and the user's
commands (``budget-*``); the studies under examples/budgetformer/ are not installed."""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "budget_plugin" / "version.py").read_text()).group(1)

COMMANDS = {  # command: module of budget_plugin.cli (each has main(argv) -> exit status)
    "budget-convert": "convert",  # a pretrained BERT (folder, wheel or package) into fairseq
    "budget-convert-roberta": "convert_roberta",  # a fine-tuned fairseq RoBERTa into a BudgetFormer
    "budget-prepare": "prepare",  # GLUE-style TSV folders binarized
    "budget-finetune": "finetune",  # the nested recipe: dense, importance, reorder, nested, calibration
    "budget-importance": "importance",
    "budget-teacher-logits": "teacher_logits",
    "budget-calibrate": "calibrate",
    "budget-export": "export",  # a dial setting cut into a smaller checkpoint
    "budget-predict": "predict",
    "budget-user-dir": "user_dir",  # the folder to give fairseq's --user-dir
}

setup(
    name="budget-plugin",
    version=VERSION,
    description="BudgetFormer: per-input attention-head budgets for fairseq",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["budget_plugin", "budget_plugin.*"]),
    # fairseq-fixed 0.12.3.1 is built and tested on 3.11 only (the Makefile checks it too):
    # on 3.12 its compiled extensions and pinned wheels are missing
    python_requires="==3.11.*",
    install_requires=[
        # Exact pins, both: fairseq-fixed is compiled against the installed torch's C++ ABI
        # (--no-build-isolation), so a different torch under it breaks its extensions at
        # import. fairseq-fixed is the maintained fork of fairseq main; plain `fairseq`
        # (0.12.2) does not import on Python >= 3.11, and naming it would make pip
        # install it over the fork.
        "fairseq-fixed==0.12.3.1",
        "torch==2.13.0",  # the CPU wheel this project is tested with
        "numpy",
        "sentencepiece",
        "hydra-core>=1.0.7,<1.4",  # fairseq's own bound
        "tensorboard",
        "safetensors",  # the safe, standard reader of .safetensors weights: no hand-written parser
        # BERT's WordPiece tokenizer as the pretrained models ship it (tokenizer.json):
        # the reference implementation of their normalisation, not a re-implementation
        "tokenizers",
    ],
    extras_require={
        # xdist: the suite on both cores (3.8: make test's --no-loadscope-reorder, tested);
        # triton: the GPU path's kernels, which the tests run in Triton's interpreter where
        # there is no GPU
        "test": ["pytest", "pytest-xdist>=3.8", "matplotlib", 'triton; platform_system == "Linux" and platform_machine == "x86_64"'],
        "viz": ["matplotlib"],
    },
    entry_points={"console_scripts": [f"{command}=budget_plugin.cli.{module}:main" for command, module in COMMANDS.items()]},
)
