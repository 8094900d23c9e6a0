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

from ..config import OptionError, require
from ..models.budget_dial import Dial
from .budget_metrics import budget_logs, reduce_budget_metrics
from .distillation import hidden_distillation, soft_distillation
from .teacher_logits import load_teacher_logits
from .update_passes import UpdatePasses


@dataclass
class BudgetSentencePredictionConfig(SentencePredictionCriterionConfig):
    budget_weight: float = field(
        default=10.0,
        metadata={
            "help": "weight of the budget term: the mean over layers and examples of "
            "b/H, or, with --target-head-ratio, the squared distance of each layer's "
            "batch-mean b/H to that ratio. 10 (the default, the study's choice): at 1 a "
            "fine-tuned budget stayed 0.09 above its target after 270 updates"
        },
    )
    target_head_ratio: Optional[float] = field(
        default=0.5,
        metadata={
            "help": "head ratio in (0, 1] that the budget term pulls each layer's "
            "batch-mean budget towards; 'None' (or 0) for a plain linear cost on b/H"
        },
    )
    exploration_weight: float = field(
        default=0.01,
        metadata={
            "help": "weight of the exploration term -H(p)/log H (keeps the relevance "
            "distribution from collapsing early), annealed with the model's schedule"
        },
    )
    distill_logits: Optional[str] = field(
        default=None,
        metadata={
            "help": "a teacher's class logits for every training example (a float tensor "
            "N x classes saved with torch.save, row i for the example of id i, as "
            "budget-teacher-logits writes them): training then distils the teacher"
        },
    )
    distill_weight: float = field(
        default=0.5,
        metadata={
            "help": "with --distill-logits, the task loss in training is (1 - w) * "
            "cross-entropy + w * T^2 * KL(teacher || model) at temperature T"
        },
    )
    distill_temperature: float = field(
        default=2.0, metadata={"help": "with --distill-logits, the temperature T of both distributions"}
    )
    sandwich_widths: int = field(
        default=0,
        metadata={
            "help": "train every budget at once (for --head-selection nested; slimmable networks' "
            "sandwich rule): besides the router's own budgets, every update also runs this many "
            "fixed widths: every head, then the smallest (--min-heads in every layer), then "
            "widths drawn uniformly per layer from [--min-heads, H]. Every width but the full one "
            "(and the router's) is trained on (1 - w) * its task loss + w * T^2 * KL(full || width), "
            "distilling the full width's logits in place (w, T: --distill-weight, "
            "--distill-temperature; with --distill-logits, that teacher instead, for every "
            "width). Each width costs about one more forward and backward. 0: off"
        },
    )
    distill_hidden_weight: float = field(
        default=0.0,
        metadata={
            "help": "with --sandwich-widths, also distil the full width's hidden states into every "
            "narrower width (DynaBERT's second term): this weight times the mean squared difference "
            "of each layer's output, averaged over an example's tokens and features, summed over "
            "layers and examples. 0: off"
        },
    )
    min_ffn_ratio: float = field(
        default=0.0,
        metadata={
            "help": "with --sandwich-widths, nest the FFN too (for a model whose FFN neurons are in "
            "importance order: budget-finetune orders them): the smallest width also runs this "
            "fraction of every layer's FFN neurons (its first ones), and the random widths draw "
            "each layer's neurons uniformly from [that, all]. 0: every width runs every neuron"
        },
    )


class _Recorder:
    """The model as :meth:`SentencePredictionCriterion.forward` calls it, keeping the
    output (logits and ``extra``) that the parent's forward drops."""

    def __init__(self, model):
        self.model, self.output = model, None

    def __getattr__(self, name):  # classification_heads, get_targets, training, args
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
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

    def __init__(self, cfg: BudgetSentencePredictionConfig, task):
        super().__init__(cfg, task)
        target = cfg.target_head_ratio or None  # 0 and None both mean: a linear cost
        require(cfg.budget_weight >= 0, "budget-weight", ">= 0", cfg.budget_weight)
        require(cfg.exploration_weight >= 0, "exploration-weight", ">= 0", cfg.exploration_weight)
        require(target is None or 0 < target <= 1, "target-head-ratio", "in (0, 1] (or 0 for none)", target)
        self.budget_weight = cfg.budget_weight
        self.target_head_ratio = target
        self.exploration_weight = cfg.exploration_weight
        require(cfg.sandwich_widths >= 0, "sandwich-widths", ">= 0", cfg.sandwich_widths)
        self.sandwich_widths = cfg.sandwich_widths
        require(0 <= cfg.min_ffn_ratio <= 1, "min-ffn-ratio", "in [0, 1]", cfg.min_ffn_ratio)
        require(not cfg.min_ffn_ratio or cfg.sandwich_widths > 1, "min-ffn-ratio",
                "0 unless --sandwich-widths is 2 or more (the FFN's widths are the sandwich's)", cfg.min_ffn_ratio)
        self.min_ffn_ratio = cfg.min_ffn_ratio
        require(cfg.distill_hidden_weight >= 0, "distill-hidden-weight", ">= 0", cfg.distill_hidden_weight)
        require(not cfg.distill_hidden_weight or cfg.sandwich_widths > 1, "distill-hidden-weight",
                "0 unless --sandwich-widths is 2 or more (it distils the full width into narrower ones)",
                cfg.distill_hidden_weight)
        self.distill_hidden_weight = cfg.distill_hidden_weight
        self.teacher = self.distill_weight = self.distill_temperature = None
        if cfg.distill_logits:
            require(not self.regression_target, "distill-logits", "unset with --regression-target", cfg.distill_logits)
            self.teacher = load_teacher_logits(cfg.distill_logits)
        if cfg.distill_logits or (cfg.sandwich_widths and not self.regression_target):
            require(0 <= cfg.distill_weight <= 1, "distill-weight", "in [0, 1]", cfg.distill_weight)
            require(cfg.distill_temperature > 0, "distill-temperature", "> 0", cfg.distill_temperature)
            self.distill_weight, self.distill_temperature = cfg.distill_weight, cfg.distill_temperature

    def forward(self, model, sample, reduce=True, backward: Optional[Callable[[Tensor], None]] = None):
        """The update's loss, sample size and logging output. With the sandwich, each
        width is a forward pass of its own: given ``backward`` (the task's train_step
        gives its optimizer's), each pass's loss is backpropagated as soon as it is
        computed, so that one pass's graph is alive at a time, not every width's (the
        gradient is the same sum), and the returned loss is detached."""
        if not hasattr(model, "exploration"):
            raise OptionError(
                "criterion budget_sentence_prediction needs a model that returns budget "
                "statistics (--arch budgetformer*); use sentence_prediction for others"
            )
        sandwich = bool(self.sandwich_widths) and model.training
        if sandwich and self.distill_hidden_weight and getattr(model.args, "encoder_layerdrop", 0):
            raise OptionError("--distill-hidden-weight needs every layer in every pass: --encoder-layerdrop 0 "
                              "(each pass would drop other layers, and no layer's output would have its teacher's)")
        passes = UpdatePasses(model, backward)
        width_loss = full = None
        if sandwich:
            # every head first: the other widths distil its logits (in place, detached);
            # it learns from the cached teacher only: in place, it is the teacher
            with passes.unsynced():
                full, full_states = self.width_forward(model, sample, None)
                cached = self.teacher_logits(sample, None, full.size(1))
                width_loss = passes.add(self.fitted(self.task_loss(full, sample), full, cached))
            full = full.detach()
            full_states = [state.detach() for state in full_states]
            teacher = self.teacher_logits(sample, full, full.size(1))
            padding = sample["net_input"]["src_tokens"].eq(model.encoder.sentence_encoder.padding_idx)
            for heads, neurons in self.widths(model):
                with passes.unsynced():
                    logits, states = self.width_forward(model, sample, heads, neurons)
                    loss = self.fitted(self.task_loss(logits, sample), logits, teacher)
                    if self.distill_hidden_weight:
                        loss = loss + self.distill_hidden_weight * hidden_distillation(states, full_states, padding)
                    width_loss = width_loss + passes.add(loss)
        # the router's pass last: it uses every parameter, so that data parallelism can
        # reduce the update's gradients once, after it. The parent's forward gives the
        # task loss, accuracy and GLUE's predictions (--report-mcc ...) exactly as
        # sentence_prediction does; it drops the model's extra, which the recorder keeps
        recorder = _Recorder(model)
        task_loss, sample_size, logging_output = super().forward(recorder, sample, reduce)
        logits, extra = recorder.output
        layers: List[Dict[str, Tensor]] = extra["budget"]  # only the layers that ran
        teacher = self.teacher_logits(sample, full, logits.size(1)) if model.training else None
        fit, distill_loss = task_loss, None
        if teacher is not None:
            distill_loss = soft_distillation(logits, teacher, self.distill_temperature)
            fit = (1 - self.distill_weight) * task_loss + self.distill_weight * distill_loss

        exploration = model.exploration()
        # on the logits' device: fairseq's all-reduce groups values by device
        zero = logits.new_zeros((), dtype=torch.float)
        budget_term = self.budget_term(layers) if layers else zero  # --encoder-layerdrop can skip all
        entropy = self.relevance_entropy(layers) if layers else zero
        passes.add(
            fit
            + sample_size * self.budget_weight * budget_term
            - sample_size * self.exploration_weight * exploration.rate * entropy
        )
        num_layers = len(model.encoder.sentence_encoder.layers)  # run or skipped
        logging_output.update(budget_logs(layers, num_layers, sample_size, zero))
        logging_output.update(
            loss=passes.total.data,
            task_loss=task_loss.data,
            budget_term=budget_term.data * sample_size,
            exploration_term=-entropy.data * sample_size,
            relevance_entropy=entropy.data * sample_size,
            explore_rate=exploration.rate * sample_size,
            temperature=exploration.temperature * sample_size,
        )
        if width_loss is not None:
            logging_output["width_loss"] = width_loss.data
        if distill_loss is not None:
            logging_output["distill_loss"] = distill_loss.data
        return passes.total, sample_size, logging_output

    def width_forward(self, model, sample, heads: Optional[List[int]],
                      neurons: Optional[List[int]] = None) -> Tuple[Tensor, List[Tensor]]:
        """The classifier's logits with ``heads`` heads in each layer (None: every head)
        and its first ``neurons`` FFN neurons (None: every neuron), and, with
        --distill-hidden-weight, every layer's output (T x B x C; else none)."""
        counts = heads or [model.args.encoder_attention_heads] * model.args.encoder_layers
        dial = Dial(neurons=None if neurons is None else tuple(neurons))
        hiddens = bool(self.distill_hidden_weight)
        with model.forced_heads(counts):
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
        (neurons None: the FFN is not nested): the smallest, then random ones, drawn from
        torch's generator, which fairseq seeds per update."""
        H, L, m = model.args.encoder_attention_heads, model.args.encoder_layers, model.budget.min_heads
        every = model.args.encoder_ffn_embed_dim
        fewest = max(1, round(self.min_ffn_ratio * every))

        def neurons(draw: bool) -> Optional[List[int]]:
            if not self.min_ffn_ratio:  # and no neuron is drawn: the generator's stream stays as it was
                return None
            return torch.randint(fewest, every + 1, (L,)).tolist() if draw else [fewest] * L

        smallest = [([m] * L, neurons(draw=False))] if self.sandwich_widths > 1 else []
        return smallest + [(torch.randint(m, H + 1, (L,)).tolist(), neurons(draw=True))
                           for _ in range(self.sandwich_widths - 2)]

    def fitted(self, task_loss: Tensor, logits: Tensor, teacher: Optional[Tensor]) -> Tensor:
        if teacher is None:
            return task_loss
        distilled = soft_distillation(logits, teacher, self.distill_temperature)
        return (1 - self.distill_weight) * task_loss + self.distill_weight * distilled

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
