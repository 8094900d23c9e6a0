"""BudgetFormer for fairseq: ``--user-dir budget_plugin`` registers the ``budgetformer``
model (and sized architectures), the budgeted encoder layer, the
``budget_sentence_prediction`` criterion and task, and the ``wordpiece`` BPE.

Importing the plugin also changes two things outside it (``fairseq_patches.py``): it
allow-lists ``argparse.Namespace`` for torch's safe checkpoint loader, so that fairseq
checkpoints load with ``weights_only=True``; and it makes fairseq's copies of a
checkpoint (``checkpoint_last.pt``, ``checkpoint_best.pt``) atomic. And it keeps one
thing as it was: fairseq configures the root logger at INFO when its tasks are imported,
which the plugin's import does not let it do (the caller's logging stays theirs)."""

from .fairseq_logging import logging_left_alone

with logging_left_alone():
    from . import fairseq_patches

    fairseq_patches.apply()

    from . import criterions, encoders, models, modules, tasks  # noqa: E402  (registers everything)
    from .models import BudgetFormerModel  # noqa: E402
from .version import __version__  # noqa: E402

__all__ = ["__version__", "BudgetFormerModel", "criterions", "encoders", "models", "modules", "tasks"]
