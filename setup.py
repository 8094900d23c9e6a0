"""budget-plugin: BudgetFormer (adaptive attention-head budgets) as a fairseq plugin.

Install with ``make setup`` (or the three pip steps in README.md): fairseq-fixed must
be compiled against the torch that is already installed (--no-build-isolation)."""

from setuptools import find_packages, setup

setup(
    name="budget-plugin",
    version="0.1.0",
    description="BudgetFormer: per-input attention-head budgets for fairseq",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["budget_plugin", "budget_plugin.*"]),
    python_requires=">=3.10",
    install_requires=[
        # the maintained fork of fairseq main; plain `fairseq` (0.12.2) does not import
        # on Python >= 3.11, and naming it would make pip install it over the fork.
        "fairseq-fixed==0.12.3.1",
        "torch==2.13.0",  # the CPU wheel this project is tested with
        "numpy",
        "sentencepiece",
        "hydra-core>=1.0.7,<1.4",
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
)
