"""The two changes importing the plugin makes to fairseq and torch, in one place
(:func:`apply`, called once by ``budget_plugin/__init__.py``). Both are features:
checkpoints are data, not code, and never half-written.

**Safe loading.** torch's safe loader (``weights_only=True``, the default since torch
2.6) reads fairseq checkpoints once one type is allowed. fairseq converts its hydra
config to plain containers before saving, but a legacy (argparse) model such as
RoBERTa keeps its ``argparse.Namespace`` in ``cfg.model``: that is the one non-builtin
type in a checkpoint written by ``fairseq-train`` or ``fairseq-hydra-train``
(tests/test_resume.py checks it). We allow exactly that, and the numpy float that
fairseq stores as the best score when the best-checkpoint metric is one of GLUE's
derived metrics (pearson, spearman, acc_and_f1, ...: numpy scalars); the loader's
safety stays on, so a pickle that would run code is still refused
(tests/test_checkpoints.py).

**Atomic copies.** fairseq writes a checkpoint atomically (``torch_persistent_save``:
``name.pt.tmp``, then a rename), but it writes it once, under the first of its names
(``checkpoint_E_U.pt``, ``checkpoint_best.pt``, ...), and *copies* that file to the
others, ``checkpoint_last.pt`` included, with a plain ``shutil.copyfile``
(``checkpoint_utils.save_checkpoint`` -> ``PathManager.copy``). A job killed during such
a copy leaves a truncated ``checkpoint_last.pt``, the very file a resumed run loads.
:func:`atomic_checkpoint_copies` makes those copies go through ``name.pt.tmp`` and
``os.replace`` too, so after a kill every ``*.pt`` is either the previous complete file
or the new one."""

import argparse
import os
import shutil

import numpy as np
import torch

# a numpy float pickles as scalar(dtype, bytes): the function that rebuilds it, and the dtype
NUMPY_FLOAT = [np.float64(0).__reduce__()[0], np.dtype, type(np.dtype("float64"))]
FAIRSEQ_CHECKPOINT_TYPES = [argparse.Namespace, *NUMPY_FLOAT]


def allow_fairseq_checkpoints():
    torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_TYPES)


def atomic_checkpoint_copies():
    """Make fairseq's local ``PathManager.copy`` atomic (copy to ``dst.tmp``, then
    ``os.replace``). Remote paths (iopath handlers) and symbolic links keep fairseq's own
    copy. Idempotent; the copied bytes are unchanged."""
    from fairseq.file_io import PathManager

    stock = PathManager.copy
    if getattr(stock, "budget_plugin_atomic", False):
        return

    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if PathManager.path_requires_pathmanager(dst_path) or os.path.islink(dst_path):
            return stock(src_path, dst_path, overwrite=overwrite)
        tmp = dst_path + ".tmp"
        shutil.copyfile(src_path, tmp)
        os.replace(tmp, dst_path)
        return True

    copy.budget_plugin_atomic = True
    PathManager.copy = staticmethod(copy)


def apply():
    """Both patches; idempotent."""
    allow_fairseq_checkpoints()  # fairseq-validate and resuming under torch >= 2.6
    atomic_checkpoint_copies()  # a kill never leaves a half-written checkpoint_last.pt
