from . import head_subset, prefix_heads  # noqa: F401  (the fast paths' functions: modules.head_subset, ...)
from .budgeted_attention import BudgetedAttention
from .budgeted_encoder_layer import BudgetedEncoderLayer
from .exploration import Exploration, exploration_at
from .router import HeadRoute, HeadRouter

__all__ = ["BudgetedAttention", "BudgetedEncoderLayer", "Exploration", "HeadRoute", "HeadRouter", "exploration_at"]
