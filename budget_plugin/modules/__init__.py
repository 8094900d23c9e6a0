from .budgeted_attention import BudgetConfig, BudgetedAttention, Exploration
from .budgeted_encoder_layer import BudgetedEncoderLayer

__all__ = ["BudgetConfig", "BudgetedAttention", "BudgetedEncoderLayer", "Exploration"]
