from .budget_sentence_prediction import BudgetSentencePredictionTask

__all__ = ["BudgetSentencePredictionTask"]
