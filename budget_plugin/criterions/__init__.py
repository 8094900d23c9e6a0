from .budget_sentence_prediction import BudgetSentencePredictionCriterion

__all__ = ["BudgetSentencePredictionCriterion"]
