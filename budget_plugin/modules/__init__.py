from . import head_subset, prefix_heads  # noqa: F401  (the fast paths' functions: modules.head_subset, ...)
from .baseline_routers import KeptRouter, RandomRouter, StaticRouter
from .budgeted_attention import ROUTERS, BudgetedAttention
from .budgeted_encoder_layer import BudgetedEncoderLayer
from .exploration import Exploration, exploration_at
from .learned_router import LearnedRouter
from .nested_router import NestedRouter
from .router import HeadRoute, HeadRouter

__all__ = ["BudgetedAttention", "BudgetedEncoderLayer", "Exploration", "HeadRoute", "HeadRouter", "KeptRouter",
           "LearnedRouter", "NestedRouter", "RandomRouter", "ROUTERS", "StaticRouter", "exploration_at"]
