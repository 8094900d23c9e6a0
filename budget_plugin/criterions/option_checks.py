"""Every check of the budget criterion's options (budget_sentence_prediction.py's
config), each refused in one line naming the option."""

from ..option_error import require


def check_options(cfg, regression_target: bool) -> None:
    """Every check of the criterion's options, each refused naming the option."""
    target = cfg.target_head_ratio or None
    require(cfg.budget_weight >= 0, "budget-weight", ">= 0", cfg.budget_weight)
    require(cfg.exploration_weight >= 0, "exploration-weight", ">= 0", cfg.exploration_weight)
    require(target is None or 0 < target <= 1, "target-head-ratio", "in (0, 1] (or 0 for none)", target)
    require(cfg.sandwich_widths >= 0, "sandwich-widths", ">= 0", cfg.sandwich_widths)
    require(0 <= cfg.min_ffn_ratio <= 1, "min-ffn-ratio", "in [0, 1]", cfg.min_ffn_ratio)
    require(not cfg.min_ffn_ratio or cfg.sandwich_widths > 1, "min-ffn-ratio",
            "0 unless --sandwich-widths is 2 or more (the FFN's widths are the sandwich's)", cfg.min_ffn_ratio)
    require(0 < cfg.sandwich_max_ratio <= 1, "sandwich-max-ratio", "in (0, 1]", cfg.sandwich_max_ratio)
    require(not cfg.no_router_pass or cfg.sandwich_widths > 0, "no-router-pass",
            "unset unless --sandwich-widths is 1 or more (the update would train nothing)", cfg.no_router_pass)
    require(cfg.router_interval >= 1, "router-interval", ">= 1", cfg.router_interval)
    require(cfg.router_interval == 1 or cfg.sandwich_widths > 0, "router-interval",
            "1 unless --sandwich-widths is 1 or more (the updates between would train nothing)", cfg.router_interval)
    require(cfg.distill_hidden_weight >= 0, "distill-hidden-weight", ">= 0", cfg.distill_hidden_weight)
    require(not cfg.distill_hidden_weight or cfg.sandwich_widths > 1, "distill-hidden-weight",
            "0 unless --sandwich-widths is 2 or more (it distils the full width into narrower ones)",
            cfg.distill_hidden_weight)
    if cfg.distill_logits:
        require(not regression_target, "distill-logits", "unset with --regression-target", cfg.distill_logits)
    if cfg.distill_logits or (cfg.sandwich_widths and not regression_target):
        require(0 <= cfg.distill_weight <= 1, "distill-weight", "in [0, 1]", cfg.distill_weight)
        require(cfg.distill_temperature > 0, "distill-temperature", "> 0", cfg.distill_temperature)
