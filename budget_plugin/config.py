"""The options of BudgetFormer's attention (model options: ``--min-heads``,
``--head-selection``, the exploration schedule, ...) and the one place they are checked."""

import argparse
import enum
from dataclasses import dataclass, field, fields
from typing import List, Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.utils import safe_getattr

from .dial.parsing import parse_fixed_heads, parse_kept_heads, parse_relevance_prior
from .option_error import OptionError, require

POOLING_CHOICES = ChoiceEnum(["mean", "first"])
ATTENTION_PATH_CHOICES = ChoiceEnum(["fast", "reference"])
HEAD_SELECTION_CHOICES = ChoiceEnum(["learned", "nested", "static", "random", "kept", "pruned"])
SCHEDULE_CHOICES = ChoiceEnum(["linear", "cosine"])


# Options whose default changed after checkpoints were saved without them: the value
# such a checkpoint was trained and computes with (see BudgetConfig.fill_args)
SAVED_BEFORE = {"router_scale": 1.0}


@dataclass
class BudgetConfig(FairseqDataclass):
    """Options of the budgeted attention, shared by every layer of a model (their
    rationale: docs/options.md)."""

    head_selection: HEAD_SELECTION_CHOICES = field(
        default="learned",
        metadata={"help": "'learned' (the paper's per-input heads), 'nested' (a per-input count of importance-ordered "
                  "heads), the baselines 'static', 'random', 'kept', or 'pruned' (an export)"},
    )
    min_heads: int = field(default=1, metadata={"help": "fewest heads a layer runs for any input, in [1, H]"})
    budget_pooling: POOLING_CHOICES = field(
        default="mean", metadata={"help": "what the router reads: the mean over real tokens, or the first token"}
    )
    budget_mask_temperature: float = field(
        default=0.5, metadata={"help": "temperature (> 0) of the soft head-count mask that trains the budget"}
    )
    router_scale: float = field(
        default=10.0, metadata={"help": "multiplier (> 0) on the router's logits, so that it learns faster than "
                                "the pretrained weights"}
    )
    initial_budget: Optional[float] = field(
        default=None, metadata={"help": "heads the budget starts at, in [--min-heads, H] (default: the "
                                "criterion's --target-head-ratio x H, else H - 0.25)"}
    )
    attention_path: ATTENTION_PATH_CHOICES = field(
        default="fast", metadata={"help": "at inference, compute only the chosen heads ('fast') or every head, "
                                  "masked ('reference')"}
    )
    fixed_heads: Optional[str] = field(
        default=None, metadata={"help": "heads per layer for static, random and pruned: one number, or one per "
                                "layer (comma-separated)"}
    )
    kept_heads: Optional[str] = field(
        default=None, metadata={"help": "for kept: each layer's head indices, comma-separated, layers separated by "
                                "';'"}
    )
    relevance_prior: Optional[str] = field(
        default=None, metadata={"help": "for learned: H head scores per layer (comma-separated, layers by ';') "
                                "that the relevance starts from"}
    )
    # the exploration schedule: a function of the update number, which fairseq hands
    # the model (set_num_updates) and restores on resume
    exploration_updates: int = field(
        default=0, metadata={"help": "updates over which exploration anneals from 1 to 0 (0: off; learned only)"}
    )
    exploration_schedule: SCHEDULE_CHOICES = field(
        default="linear", metadata={"help": "shape of the exploration rate's annealing"}
    )
    exploration_noise: float = field(
        default=1.0, metadata={"help": "Gumbel noise (>= 0) on the relevance logits at rate 1"}
    )
    exploration_uniform: float = field(
        default=0.1, metadata={"help": "probability in [0, 1], at rate 1, that an input's heads are ranked at random"}
    )
    temperature_start: float = field(
        default=2.0, metadata={"help": "relevance softmax temperature (> 0) at rate 1"}
    )
    temperature_end: float = field(
        default=1.0, metadata={"help": "relevance softmax temperature (> 0) at rate 0 and at evaluation"}
    )

    @property
    def runs_prefix(self) -> bool:
        """Whether every input runs a prefix of the heads (heads 0..k-1)."""
        return self.head_selection in ("nested", "pruned")

    @property
    def predicts_budget(self) -> bool:
        """Whether the router predicts a per-input budget (``budget_proj``)."""
        return self.head_selection in ("learned", "nested")

    @classmethod
    def fill_args(cls, args) -> "BudgetConfig":
        """Give ``args`` (a Namespace or an omegaconf config) every option it lacks,
        at its default, and return them as a config. A Namespace is a command line
        (fairseq-train's holds every option), so one that lacks an option whose
        default has changed is a checkpoint's, saved before the option existed: it
        gets the value that checkpoint was trained and computed with."""
        saved = isinstance(args, argparse.Namespace)
        for f in fields(cls):
            default = SAVED_BEFORE.get(f.name, f.default) if saved else f.default
            setattr(args, f.name, safe_getattr(args, f.name, default))
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    def inert_options(self) -> List[str]:
        """Options set away from their defaults that do nothing in this mode.
        (--exploration-updates itself does nothing for 'random' and 'kept' either, but
        is not refused: the legacy random baseline's checkpoint was trained with it.)"""
        defaults = type(self)()
        changed = {f.name for f in fields(self) if getattr(self, f.name) != getattr(defaults, f.name)}
        schedule = {"exploration_schedule", "exploration_noise", "exploration_uniform", "temperature_start"}
        inert = set()
        if self.exploration_updates == 0:  # exploration is off: its shape and noise do nothing
            inert |= schedule
        if not self.predicts_budget:  # no budget predictor
            inert |= {"budget_pooling", "budget_mask_temperature", "initial_budget"}
        if self.head_selection in ("random", "kept", "pruned"):  # no relevance to explore or soften
            inert |= schedule | {"temperature_end"}
        if self.head_selection in ("nested", "pruned"):  # a fixed order: no relevance, nothing to explore
            inert |= schedule | {"temperature_end", "exploration_updates"}
        return sorted(changed & inert)

    def check(self, num_layers: int, num_heads: int):
        """Every check of these options, before any module is built."""
        for f in fields(self):  # choices: hydra and the hub pass them unchecked
            if isinstance(f.type, type) and issubclass(f.type, enum.Enum):
                choices = [str(c) for c in f.type]
                require(str(getattr(self, f.name)) in choices, f.name, f"one of {', '.join(choices)}",
                        getattr(self, f.name))
        require(1 <= self.min_heads <= num_heads, "min_heads",
                f"in [1, {num_heads}] (--encoder-attention-heads)", self.min_heads)
        require(self.budget_mask_temperature > 0, "budget_mask_temperature", "> 0", self.budget_mask_temperature)
        require(self.router_scale > 0, "router_scale", "> 0", self.router_scale)
        if self.initial_budget is not None:
            require(self.min_heads <= self.initial_budget <= num_heads, "initial_budget",
                    f"in [--min-heads, {num_heads}]", self.initial_budget)
        if self.head_selection in ("learned", "nested", "kept"):
            require(self.fixed_heads is None, "fixed_heads",
                    "unset unless --head-selection is static or random", self.fixed_heads)
        if self.head_selection != "kept":
            require(self.kept_heads is None, "kept_heads", "unset unless --head-selection is kept", self.kept_heads)
        if self.relevance_prior is not None:
            require(self.head_selection == "learned", "relevance_prior", "unset unless --head-selection is learned",
                    self.relevance_prior)
            self.relevance_prior_per_layer(num_layers, num_heads)
        self.heads_per_layer(num_layers, num_heads)
        require(self.exploration_updates >= 0, "exploration_updates", ">= 0", self.exploration_updates)
        require(self.exploration_noise >= 0, "exploration_noise", ">= 0", self.exploration_noise)
        require(0 <= self.exploration_uniform <= 1, "exploration_uniform", "in [0, 1]", self.exploration_uniform)
        require(self.temperature_start > 0, "temperature_start", "> 0", self.temperature_start)
        require(self.temperature_end > 0, "temperature_end", "> 0", self.temperature_end)
        for name in self.inert_options():
            raise OptionError(
                f"--{name.replace('_', '-')} does nothing with --head-selection {self.head_selection} "
                f"and --exploration-updates {self.exploration_updates}; leave it unset "
                "(exploration is off unless --exploration-updates > 0, and 'nested' has no relevance to explore; "
                "only 'learned' and 'nested' have a budget predictor)")

    def heads_per_layer(self, num_layers: int, num_heads: int) -> List[float]:
        """The fixed budget of each layer: '--fixed-heads 3.9' or '4,3.5,4,4' -> one
        float per layer (every layer at ``num_heads`` for a predicted budget)."""
        if self.predicts_budget:
            return [float(num_heads)] * num_layers
        if self.head_selection == "kept":
            return [float(len(heads)) for heads in self.kept_heads_per_layer(num_layers, num_heads)]
        return parse_fixed_heads(self.fixed_heads, num_layers, num_heads, self.min_heads,
                                 whole_only=self.head_selection == "pruned")

    def relevance_prior_per_layer(self, num_layers: int, num_heads: int) -> List[List[float]]:
        """--relevance-prior '0.1,0.5,...;...' -> each layer's H scores."""
        return parse_relevance_prior(self.relevance_prior, num_layers, num_heads)

    def kept_heads_per_layer(self, num_layers: int, num_heads: int) -> List[List[int]]:
        """--kept-heads '0,3,5;1,2;...' -> each layer's heads (ascending, distinct)."""
        return parse_kept_heads(self.kept_heads, num_layers, num_heads, self.min_heads)

