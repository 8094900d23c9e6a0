"""The options of BudgetFormer's attention (model options: ``--min-heads``,
``--head-selection``, the exploration schedule, ...) and the one place they are checked."""

import argparse
import enum
import math
from dataclasses import dataclass, field, fields
from typing import List, Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.utils import safe_getattr

POOLING_CHOICES = ChoiceEnum(["mean", "first"])
ATTENTION_PATH_CHOICES = ChoiceEnum(["fast", "reference"])
HEAD_SELECTION_CHOICES = ChoiceEnum(["learned", "nested", "static", "random", "kept", "pruned"])
SCHEDULE_CHOICES = ChoiceEnum(["linear", "cosine"])


# Options whose default changed after checkpoints were saved without them: the value
# such a checkpoint was trained and computes with (see BudgetConfig.fill_args)
SAVED_BEFORE = {"router_scale": 1.0}  # issue 25 made 10 the default

class OptionError(SystemExit, ValueError):
    """A bad option. A ValueError to Python callers; a SystemExit, so that fairseq's
    command-line tools, which catch nothing, print its one line (``error: ...``) and
    exit 1 instead of a traceback."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = f"error: {message}"


def require(ok: bool, option: str, allowed: str, value):
    """Refuse a bad setting when the model is built, naming the option and its range."""
    if not ok:
        raise OptionError(f"--{option.replace('_', '-')} must be {allowed}, got {value!r}")


@dataclass
class BudgetConfig(FairseqDataclass):
    """Options of the budgeted attention, shared by every layer of a model."""

    min_heads: int = field(
        default=1, metadata={"help": "fewest heads a layer runs for any input (m)"}
    )
    budget_pooling: POOLING_CHOICES = field(
        default="mean",
        metadata={
            "help": "summary the router reads: masked mean of the layer input over "
            "non-padding tokens, or the first token (<s>)"
        },
    )
    budget_mask_temperature: float = field(
        default=0.5,
        metadata={
            "help": "temperature t of the soft head-count mask "
            "sigmoid((b - rank - 0.5) / t) that carries the task gradient to the budget "
            "('learned' and 'nested')"
        },
    )
    router_scale: float = field(
        default=10.0,
        metadata={
            "help": "multiplier s on the router's logits (budget, relevance, static): "
            "b = m + (H - m) sigmoid(s (w_b . s + c_b)), p = softmax(s W_r x / tau). "
            "Adam moves a parameter by about the learning rate per update, so at a "
            "fine-tuning rate (1e-5 to 1e-4) a plain router (s = 1) barely moves in an "
            "epoch; s = 10 (the default, the study's and recipe's choice) moves its logits "
            "10x faster than the pretrained weights"
        },
    )
    initial_budget: Optional[float] = field(
        default=None,
        metadata={
            "help": "budget b (in heads) the predictor starts at. Default: the budget "
            "term's target, --target-head-ratio x H, which fairseq-train hands the model "
            "with the criterion's options (so training starts at the budget it is asked "
            "for and the budget term holds it there); without a target (another "
            "criterion, or a hydra config's model section), H - 0.25, which rounds to "
            "every head (a warm start then computes what the pretrained model computes)"
        },
    )
    attention_path: ATTENTION_PATH_CHOICES = field(
        default="fast",
        metadata={
            "help": "inference path: 'fast' computes only the selected heads, "
            "'reference' computes every head and zeroes the unselected ones"
        },
    )
    head_selection: HEAD_SELECTION_CHOICES = field(
        default="learned",
        metadata={
            "help": "'learned': BudgetFormer's per-input budget and relevance. 'nested': "
            "the per-input budget alone, each input running the first k heads of every "
            "layer (for a checkpoint whose heads are ordered by importance: "
            "budget_plugin/nested/reorder.py), so one model serves every budget and a "
            "prefix runs on views of the weights. Baselines with a fixed budget "
            "(--fixed-heads): 'static' learns one head subset per layer shared by every "
            "input; 'random' draws each input's heads uniformly; 'kept' runs named heads "
            "(--kept-heads). 'pruned': an exported nested model (budget-export) "
            "whose layers hold only their first --fixed-heads heads, and run them all"
        },
    )
    fixed_heads: Optional[str] = field(
        default=None,
        metadata={
            "help": "heads per layer for --head-selection static/random/pruned: one number, "
            "or one per layer separated by commas; 'random' meets a fractional number on "
            "average (k drawn from its floor and ceiling), 'static' rounds it, 'pruned' "
            "takes whole numbers (the heads each layer holds)"
        },
    )
    kept_heads: Optional[str] = field(
        default=None,
        metadata={
            "help": "for --head-selection kept: each layer's heads, as comma-separated "
            "indices, layers separated by ';' (e.g. '0,3,5;1,2;...')"
        },
    )
    relevance_prior: Optional[str] = field(
        default=None,
        metadata={
            "help": "for --head-selection learned: per-layer head scores the relevance "
            "starts from (e.g. a dense model's head importance: "
            "budget-importance), H comma-separated numbers per layer, layers "
            "separated by ';'. Each layer's relevance bias starts at its scores "
            "standardised (zero mean, unit std), so that the first choices are the "
            "best-scored heads and what depends on the input is learned on top"
        },
    )
    # The exploration schedule: a function of the update number, which fairseq hands
    # the model (set_num_updates) and restores on resume.
    exploration_updates: int = field(
        default=0,
        metadata={
            "help": "updates over which exploration anneals from rate 1 to 0; after "
            "them head choice is pure top-k exploitation. 0 (the default): OFF, no "
            "exploration: in this project's from-scratch study and sweep the schedule "
            "trained worse than none, so the other --exploration-* options and "
            "--temperature-start are refused unless this is > 0 (and all of them, this "
            "one too, with --head-selection nested: a fixed order has nothing to explore)"
        },
    )
    exploration_schedule: SCHEDULE_CHOICES = field(
        default="linear",
        metadata={"help": "shape of the annealing of the exploration rate from 1 to 0"},
    )
    exploration_noise: float = field(
        default=1.0,
        metadata={
            "help": "Gumbel noise scale on the relevance logits at rate 1 "
            "(1.0 = heads sampled without replacement from p)"
        },
    )
    exploration_uniform: float = field(
        default=0.1,
        metadata={
            "help": "probability, at rate 1, that an example ranks its heads "
            "uniformly at random (epsilon-greedy)"
        },
    )
    temperature_start: float = field(
        default=2.0,
        metadata={"help": "softmax temperature of the relevance distribution at rate 1"},
    )
    temperature_end: float = field(
        default=1.0,
        metadata={"help": "softmax temperature at rate 0, and at evaluation"},
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
        if self.head_selection in ("nested", "pruned"):  # a fixed order: no relevance, nothing to explore (no legacy checkpoints)
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
        try:
            values = [float(v) for v in str(self.fixed_heads).split(",")]
        except ValueError:
            values = []
        if len(values) == 1:
            values *= num_layers
        whole = self.head_selection != "pruned" or all(v == int(v) for v in values)
        require(
            whole and len(values) == num_layers and all(self.min_heads <= v <= num_heads for v in values),
            "fixed_heads",
            f"one number or {num_layers} comma-separated numbers (one per layer), each in "
            f"[--min-heads, {num_heads}]" + (" and whole" if self.head_selection == "pruned" else ""),
            self.fixed_heads,
        )
        return values

    def relevance_prior_per_layer(self, num_layers: int, num_heads: int) -> List[List[float]]:
        """--relevance-prior '0.1,0.5,...;...' -> each layer's H scores."""
        try:
            layers = [[float(v) for v in layer.split(",")] for layer in str(self.relevance_prior).split(";")]
        except ValueError:
            layers = []
        require(
            len(layers) == num_layers and all(len(scores) == num_heads for scores in layers)
            and all(math.isfinite(v) for scores in layers for v in scores),
            "relevance_prior",
            f"{num_layers} ';'-separated lists (one per layer) of {num_heads} comma-separated finite numbers",
            self.relevance_prior,
        )
        return layers

    def kept_heads_per_layer(self, num_layers: int, num_heads: int) -> List[List[int]]:
        """--kept-heads '0,3,5;1,2;...' -> each layer's heads (ascending, distinct)."""
        try:
            layers = [sorted({int(h) for h in layer.split(",")}) for layer in str(self.kept_heads).split(";")]
        except ValueError:
            layers = []
        require(
            len(layers) == num_layers
            and all(self.min_heads <= len(heads) and all(0 <= h < num_heads for h in heads) for heads in layers),
            "kept_heads",
            f"{num_layers} ';'-separated lists (one per layer) of comma-separated head indices in "
            f"[0, {num_heads}), at least --min-heads each",
            self.kept_heads,
        )
        return layers

