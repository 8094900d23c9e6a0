"""BudgetFormer for fairseq: ``--user-dir budget_plugin`` registers the ``budgetformer``
model (and sized architectures), the budgeted encoder layer, the
``budget_sentence_prediction`` criterion and task."""

from .checkpoint_safety import allow_fairseq_checkpoints, atomic_checkpoint_copies

allow_fairseq_checkpoints()  # fairseq-validate and resuming under torch >= 2.6
atomic_checkpoint_copies()  # a kill never leaves a half-written checkpoint_last.pt

from . import criterions, models, modules, tasks  # noqa: E402  (registers everything)
from .models import BudgetFormerModel  # noqa: E402

__version__ = "0.1.0"
__all__ = ["BudgetFormerModel", "criterions", "models", "modules", "tasks"]
