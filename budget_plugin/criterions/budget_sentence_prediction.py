"""Sentence prediction loss plus BudgetFormer's budget and exploration terms."""

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.criterions import register_criterion
from fairseq.criterions.sentence_prediction import (
    SentencePredictionConfig as SentencePredictionCriterionConfig,
)
from fairseq.criterions.sentence_prediction import (
    SentencePredictionCriterion,
)
from torch import Tensor

from ..dial.settings import Dial
from ..option_error import OptionError
from .budget_metrics import budget_logs, reduce_budget_metrics
from .distillation import hidden_distillation, soft_distillation
from .option_checks import check_options
from .teacher_logits import load_teacher_logits
from .update_passes import UpdatePasses


@dataclass
class BudgetSentencePredictionConfig(SentencePredictionCriterionConfig):
    """The criterion's options (their rationale: docs/options.md)."""

    budget_weight: float = field(
        default=10.0, metadata={"help": "weight (>= 0) of the budget term, which pulls the head ratio towards "
                                "--target-head-ratio"}
    )
    target_head_ratio: Optional[float] = field(
        default=0.5, metadata={"help": "head ratio in (0, 1] each layer's batch-mean budget is pulled to (0 or "
                               "None: a linear cost on the ratio)"}
    )
    exploration_weight: float = field(
        default=0.01, metadata={"help": "weight (>= 0) of the relevance-entropy bonus, annealed with the "
                                "exploration schedule"}
    )
    distill_logits: Optional[str] = field(
        default=None, metadata={"help": "a teacher's class logits per training example (budget-teacher-logits' "
                                "file), distilled in training"}
    )
    distill_weight: float = field(
        default=0.5, metadata={"help": "share w in [0, 1] of the distillation term: (1 - w) x cross-entropy + w x "
                               "T^2 x KL"}
    )
    distill_temperature: float = field(
        default=2.0, metadata={"help": "temperature T (> 0) of the distilled distributions"}
    )
    sandwich_widths: int = field(
        default=0, metadata={"help": "fixed widths every update also trains (nested: full, smallest, then random "
                             "ones), distilled from the full width; 0: off"}
    )
    distill_hidden_weight: float = field(
        default=0.0, metadata={"help": "weight (>= 0) of distilling the full width's layer outputs into the "
                               "narrower widths; 0: off"}
    )
    min_ffn_ratio: float = field(
        default=0.0, metadata={"help": "with --sandwich-widths, the smallest share in [0, 1] of FFN neurons a "
                               "width runs; 0: the FFN is not nested"}
    )
    sandwich_max_ratio: float = field(
        default=1.0, metadata={"help": "with --sandwich-widths, the largest share in (0, 1] of heads and FFN "
                               "neurons the random widths run (below 1: more of each update at narrow widths)"}
    )
    no_router_pass: bool = field(
        default=False, metadata={"help": "with --sandwich-widths, train the fixed widths only, not the router's "
                                 "budgets: one pass fewer, for a model served at --width (--head-ratio untrained)"}
    )
    router_interval: int = field(
        default=1, metadata={"help": "with --sandwich-widths, the router's pass (its budgets) every N updates; the "
                             "updates between train the fixed widths alone (1: every update)"}
    )


class _Recorder:
    """The model as :meth:`SentencePredictionCriterion.forward` calls it, keeping the
    output (logits and ``extra``) that the parent's forward drops; given ``output``, it
    hands that back instead of running the model."""

    def __init__(self, model, output=None):
        self.model, self.output, self.replay = model, output, output is not None

    def __getattr__(self, name):  # classification_heads, get_targets, training, args
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        if not self.replay:
            self.output = self.model(*args, **kwargs)
        return self.output


@register_criterion("budget_sentence_prediction", dataclass=BudgetSentencePredictionConfig)
class BudgetSentencePredictionCriterion(SentencePredictionCriterion):
    """fairseq's ``sentence_prediction`` loss (cross-entropy, or MSE with
    ``--regression-target``) + budget_weight * budget term - exploration_weight *
    rate * relevance entropy. The statistics come from the model's output
    (``extra["budget"]``, one dict per layer), the rate from the model's schedule.
    With ``--distill-logits`` the cross-entropy of training is mixed with a dense
    teacher's distillation term (distillation.py). With ``--sandwich-widths N``
    every update also trains N fixed widths (every head, the smallest, random ones:
    :meth:`widths`), each its own forward pass, so that one nested model serves every
    budget. ``--report-mcc``, ``--report-acc-and-f1`` and
    ``--report-pearson-and-spearman`` report GLUE's metrics as ``sentence_prediction``
    does, beside the budget statistics."""

    # the task's train_step hands forward its optimizer's backward (UpdatePasses)
    runs_own_backward = True

    def __init__(self, cfg: BudgetSentencePredictionConfig, task):
        super().__init__(cfg, task)
        check_options(cfg, self.regression_target)
        self.budget_weight = cfg.budget_weight
        self.target_head_ratio = cfg.target_head_ratio or None  # 0 and None both mean: a linear cost
        self.exploration_weight = cfg.exploration_weight
        self.sandwich_widths = cfg.sandwich_widths
        self.min_ffn_ratio, self.max_ratio = cfg.min_ffn_ratio, cfg.sandwich_max_ratio
        self.distill_hidden_weight = cfg.distill_hidden_weight
        self.no_router_pass, self.router_interval = cfg.no_router_pass, cfg.router_interval
        self.teacher = load_teacher_logits(cfg.distill_logits) if cfg.distill_logits else None
        self.distill_weight = self.distill_temperature = None  # no logits to distil
        if cfg.distill_logits or (cfg.sandwich_widths and not self.regression_target):
            self.distill_weight, self.distill_temperature = cfg.distill_weight, cfg.distill_temperature

    def forward(self, model, sample, reduce=True, backward: Optional[Callable[[Tensor], None]] = None):
        """The update's loss, sample size and logging output. With the sandwich, each
        width is a forward pass of its own: given ``backward`` (the task's train_step
        gives its optimizer's), each pass's loss is backpropagated as soon as it is
        computed, so that one pass's graph is alive at a time, not every width's (the
        gradient is the same sum), and the returned loss is detached."""
        if not hasattr(model, "exploration"):
            raise OptionError("criterion budget_sentence_prediction needs a model that returns budget statistics "
                              "(--arch budgetformer*); use sentence_prediction for others")
        passes = UpdatePasses(model, backward)
        sandwich = bool(self.sandwich_widths) and model.training
        without_router = sandwich and (self.no_router_pass or model.num_updates % self.router_interval != 0)
        if without_router and getattr(model, "no_sync", None) and not getattr(model, "find_unused_parameters", True):
            raise OptionError("--no-router-pass and --router-interval leave the routers' parameters without "
                              "gradients: data parallelism needs --find-unused-parameters with them")
        full, width_loss = self.sandwich(model, sample, passes, last=without_router) if sandwich else (None, None)
        # the router's pass last: it uses every parameter, so that data parallelism can
        # reduce the update's gradients once, after it. The parent's forward gives the
        # task loss, accuracy and GLUE's predictions (--report-mcc ...) exactly as
        # sentence_prediction does; it drops the model's extra, which the recorder keeps.
        # Without the router's pass, the full width's logits stand in for its output
        recorder = _Recorder(model, (full, {"budget": []}) if without_router else None)
        task_loss, sample_size, logging_output = super().forward(recorder, sample, reduce)
        logits, extra = recorder.output
        layers: List[Dict[str, Tensor]] = extra["budget"]  # only the layers that ran
        exploration = model.exploration()
        zero = logits.new_zeros((), dtype=torch.float)  # on the logits' device: fairseq reduces by device
        budget_term = self.budget_term(layers) if layers else zero  # --encoder-layerdrop can skip all
        entropy = self.relevance_entropy(layers) if layers else zero
        distill_loss = None  # without the router's pass, no loss of its own to fit
        if not without_router:
            teacher = self.teacher_logits(sample, full, logits.size(1)) if model.training else None
            fit, distill_loss = self.fitted(task_loss, logits, teacher)
            passes.add(fit + sample_size * self.budget_weight * budget_term
                       - sample_size * self.exploration_weight * exploration.rate * entropy)
        num_layers = len(model.encoder.sentence_encoder.layers)  # run or skipped
        logging_output.update(budget_logs(layers, num_layers, sample_size, zero))
        logged = {"loss": passes.total, "task_loss": task_loss, "budget_term": budget_term * sample_size,
                  "exploration_term": -entropy * sample_size, "relevance_entropy": entropy * sample_size,
                  "width_loss": width_loss, "distill_loss": distill_loss}
        logging_output.update({name: value.data for name, value in logged.items() if value is not None})
        logging_output.update(explore_rate=exploration.rate * sample_size,
                              temperature=exploration.temperature * sample_size)
        return passes.total, sample_size, logging_output

    def sandwich(self, model, sample, passes: UpdatePasses, last: bool = False) -> Tuple[Tensor, Tensor]:
        """The sandwich's fixed widths, each a pass of its own: every head first (the
        narrower widths distil its logits in place; it learns from the cached teacher
        only, being the teacher), then :meth:`widths`; ``last``: its last pass is the
        update's (no router's pass after it). Returns the full width's logits
        (detached) and the widths' summed loss."""
        if self.distill_hidden_weight and getattr(model.args, "encoder_layerdrop", 0):
            raise OptionError("--distill-hidden-weight needs every layer in every pass: --encoder-layerdrop 0 "
                              "(each pass would drop other layers, and no layer's output would have its teacher's)")
        with passes.unsynced(last=last and self.sandwich_widths == 1):
            full, full_states = self.width_forward(model, sample, None)
            cached = self.teacher_logits(sample, None, full.size(1))
            width_loss = passes.add(self.fitted(self.task_loss(full, sample), full, cached)[0])
        full, full_states = full.detach(), [state.detach() for state in full_states]
        teacher = self.teacher_logits(sample, full, full.size(1))
        padding = sample["net_input"]["src_tokens"].eq(model.encoder.sentence_encoder.padding_idx)
        widths = self.widths(model)  # drawn after the full width's dropout, as they always were
        for i, (heads, neurons) in enumerate(widths):
            with passes.unsynced(last=last and i == len(widths) - 1):
                logits, states = self.width_forward(model, sample, heads, neurons)
                loss = self.fitted(self.task_loss(logits, sample), logits, teacher)[0]
                if self.distill_hidden_weight:
                    loss = loss + self.distill_hidden_weight * hidden_distillation(states, full_states, padding)
                width_loss = width_loss + passes.add(loss)
        return full, width_loss

    def width_forward(self, model, sample, heads: Optional[List[int]],
                      neurons: Optional[List[int]] = None) -> Tuple[Tensor, List[Tensor]]:
        """The classifier's logits with ``heads`` heads in each layer (None: every head)
        and its first ``neurons`` FFN neurons (None: every neuron), and, with
        --distill-hidden-weight, every layer's output (T x B x C; else none)."""
        dial = Dial.heads_per_layer(heads or model.args.encoder_attention_heads, model.args.encoder_layers, neurons)
        hiddens = bool(self.distill_hidden_weight)
        logits, extra = model(**sample["net_input"], features_only=True, return_all_hiddens=hiddens,
                              classification_head_name=self.classification_head_name, dial=dial)
        return logits, extra["inner_states"][1:] if hiddens else []  # [0]: the embeddings, not nested

    def task_loss(self, logits: Tensor, sample) -> Tensor:
        """The summed task loss, as the parent's forward computes it."""
        targets = sample["target"].view(-1)
        if self.regression_target:
            return F.mse_loss(logits.view(-1).float(), targets.float(), reduction="sum")
        return F.nll_loss(F.log_softmax(logits, dim=-1, dtype=torch.float32), targets, reduction="sum")

    def widths(self, model) -> List[Tuple[List[int], Optional[List[int]]]]:
        """The sandwich's narrower widths for this update, (heads, FFN neurons) per layer
        (neurons None: the FFN is not nested): the smallest, then random ones of at most
        --sandwich-max-ratio of each, drawn from torch's generator, which fairseq seeds
        per update."""
        H, L, m = model.args.encoder_attention_heads, model.args.encoder_layers, model.budget.min_heads
        every = model.args.encoder_ffn_embed_dim
        fewest = max(1, round(self.min_ffn_ratio * every))
        most_heads, most_neurons = max(m, round(self.max_ratio * H)), max(fewest, round(self.max_ratio * every))

        def neurons(draw: bool) -> Optional[List[int]]:
            if not self.min_ffn_ratio:  # and no neuron is drawn: the generator's stream stays as it was
                return None
            return torch.randint(fewest, most_neurons + 1, (L,)).tolist() if draw else [fewest] * L

        smallest = [([m] * L, neurons(draw=False))] if self.sandwich_widths > 1 else []
        return smallest + [(torch.randint(m, most_heads + 1, (L,)).tolist(), neurons(draw=True))
                           for _ in range(self.sandwich_widths - 2)]

    def fitted(self, task_loss: Tensor, logits: Tensor, teacher: Optional[Tensor]
               ) -> Tuple[Tensor, Optional[Tensor]]:
        """The loss a pass fits, (1 - w) * task loss + w * distillation from ``teacher``
        (None: the task loss), and the distillation term (None without a teacher)."""
        if teacher is None:
            return task_loss, None
        distilled = soft_distillation(logits, teacher, self.distill_temperature)
        return (1 - self.distill_weight) * task_loss + self.distill_weight * distilled, distilled

    def teacher_logits(self, sample, full: Optional[Tensor], classes: int) -> Optional[Tensor]:
        """The logits to distil for this (training) batch: the cached teacher's rows
        (--distill-logits), else the full width's (the sandwich's), else none."""
        if self.teacher is not None:
            ids, teacher = sample["id"], self.teacher
            if classes != teacher.size(1) or int(ids.max()) >= teacher.size(0):
                raise OptionError(f"--distill-logits holds {teacher.size(0)} examples x {teacher.size(1)} classes; "
                                  f"this batch has example ids up to {int(ids.max())} and {classes} classes")
            return teacher.to(ids.device)[ids]
        if full is None or self.regression_target:
            return None
        return full.detach()

    def budget_term(self, layers: List[Dict[str, Tensor]]) -> Tensor:
        num_heads = layers[0]["selected"].size(1)
        ratios = torch.stack([layer["budget"] for layer in layers]) / num_heads  # L x B
        if self.target_head_ratio is None:
            return ratios.mean()
        return ((ratios.mean(dim=1) - self.target_head_ratio) ** 2).mean()

    @staticmethod
    def relevance_entropy(layers: List[Dict[str, Tensor]]) -> Tensor:
        """Mean entropy of p over layers and examples, normalised to [0, 1] by log H."""
        p = torch.stack([layer["relevance"] for layer in layers])  # L x B x H
        entropy = -(p * p.clamp_min(1e-12).log()).sum(dim=-1) / math.log(p.size(-1))
        return entropy.mean()

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        SentencePredictionCriterion.reduce_metrics(logging_outputs)
        reduce_budget_metrics(logging_outputs)
