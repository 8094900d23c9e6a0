"""Let torch's safe loader (``weights_only=True``, the default since torch 2.6) read
fairseq checkpoints.

fairseq converts its hydra config to plain containers before saving, but a legacy
(argparse) model such as RoBERTa keeps its ``argparse.Namespace`` in ``cfg.model``:
that is the one non-builtin type in a checkpoint written by ``fairseq-train`` or
``fairseq-hydra-train`` (tests/test_checkpoints.py checks it). We allow exactly that;
the loader's safety stays on, so a pickle that would run code is still refused."""

import argparse

import torch

FAIRSEQ_CHECKPOINT_TYPES = [argparse.Namespace]


def allow_fairseq_checkpoints():
    torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_TYPES)
