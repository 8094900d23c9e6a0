"""The pair the benchmark compares, with identical weights: fairseq's own RoBERTa encoder
(standard MultiheadAttention) and a BudgetFormer; and the static twin of a trained one."""

import torch

from budget_plugin.tools.building import build_model, twin
from budget_plugin.tools.checkpoints import as_budgetformer, read
from budget_research.benchmark.config import MAX_POSITIONS, VOCAB


def pair(budget):
    """(stock, budget): fairseq's ``roberta`` with every option and weight of ``budget``."""
    return twin(budget, "roberta"), budget


def build_pair(arch: str, vocab: int = VOCAB):
    """A fresh BudgetFormer of a registered size and its stock twin."""
    return pair(build_model(arch, vocab, max_positions=MAX_POSITIONS))


def checkpoint_pair(path: str):
    """A trained BudgetFormer (its own size, options and router) and its stock twin."""
    return pair(as_budgetformer(read(path)))


def randomise_relevance(model, seed: int = 0):
    """Relevance weights redrawn from N(0, 1): an untrained router is near-uniform (std
    0.02), so examples would all pick the same heads; trained ones do not."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for attention in model.budgeted_attentions():
            if not hasattr(attention.router, "relevance_proj"):  # nested: its heads run in order
                continue
            w = attention.router.relevance_proj.weight
            w.copy_(torch.randn(w.shape, generator=generator).to(w))



def static_twin(budget, tokens):
    """The static-budget twin of a trained model, the yardstick of its learned budget:
    every layer runs, for every input, the learned budget's mean heads on ``tokens``
    (rounded), namely the heads of highest mean relevance (a nested model's first heads):
    one head set for the batch."""
    with torch.no_grad():
        _, extra = budget(tokens, features_only=True)
    stats = sorted(extra["budget"], key=lambda s: s["layer"])
    fixed = ",".join(str(round(s["heads"].float().mean().item())) for s in stats)
    if budget.budget.runs_prefix:  # nested: the same model at those counts, its first heads (no router)
        return twin(budget, head_ratio=fixed)
    static = twin(budget, head_selection="static", fixed_heads=fixed)
    with torch.no_grad():
        for attention, s in zip(static.budgeted_attentions(), stats):
            attention.router.static_logits.copy_(s["relevance"].float().mean(0).log())
    return static
