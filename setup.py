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

COMMANDS = {  # command: its module (each has main(argv) -> exit status)
    "budget-convert": "budget_plugin.cli.convert",  # a pretrained BERT (folder, wheel or package) into fairseq
    "budget-convert-roberta": "budget_plugin.cli.convert_roberta",  # a fine-tuned RoBERTa into a BudgetFormer
    "budget-prepare": "budget_plugin.cli.prepare",  # GLUE-style TSV folders binarized
    "budget-finetune": "budget_plugin.cli.finetune",  # the nested recipe: dense ... calibration
    "budget-importance": "budget_plugin.cli.importance",
    "budget-teacher-logits": "budget_plugin.cli.teacher_logits",
    "budget-calibrate": "budget_plugin.cli.calibrate",
    "budget-export": "budget_plugin.cli.export",  # a dial setting cut into a smaller checkpoint
    "budget-export-onnx": "budget_plugin.cli.export_onnx",  # a dial setting cut and exported to ONNX (int8)
    "budget-predict": "budget_plugin.cli.predict",  # a checkpoint, or with --onnx an ONNX export
    "budget-serve-predict": "budget_serve.predict",  # an ONNX export, without torch or fairseq
    "budget-user-dir": "budget_plugin.cli.user_dir",  # the folder to give fairseq's --user-dir
}

setup(
    name="budget-plugin",
    version=VERSION,
    description="BudgetFormer: per-input attention-head budgets for fairseq",
    license="MIT",
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
        # the torch-free predictor of ONNX exports and the helpers both sides share (errors,
        # atomic files, the predictor's input and output): a distribution of its own, in
        # serve/ (make setup installs it first; pip install ./serve elsewhere)
        "budget-serve==0.2.0",
    ],
    extras_require={
        # xdist: the suite on both cores (3.8: make test's --no-loadscope-reorder, tested);
        # triton: the GPU path's kernels, which the tests run in Triton's interpreter where
        # there is no GPU
        # uv: the serving distribution installed alone on another Python in seconds (pip: half a minute)
        "test": ["pytest", "pytest-xdist>=3.8", "matplotlib", "uv",
                 'triton; platform_system == "Linux" and platform_machine == "x86_64"'],
        "viz": ["matplotlib"],
        # exporting to ONNX Runtime (budget-export-onnx), pinned as tested: onnxruntime checks
        # and quantizes the graphs; onnx holds them; onnxscript is what torch's own exporter
        # (torch.export-based, its default since 2.9) writes them with
        "export": ["onnxruntime==1.32.0", "onnx==1.23.2", "onnxscript==0.7.2"],
    },
    entry_points={"console_scripts": [f"{command}={module}:main" for command, module in COMMANDS.items()]},
)
