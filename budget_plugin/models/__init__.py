from .budgetformer import BudgetFormerModel

__all__ = ["BudgetFormerModel"]
