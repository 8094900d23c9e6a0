"""The fine-tuning recipe of a converted pretrained encoder (bert_conversion's output),
one for both systems a user compares: the dense model as they would ship it (fairseq's
own ``roberta``, every head) and BudgetFormer, from the same weights, data order, seed,
learning rate and number of updates."""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

import torch

from budget_plugin.precision import cpu_bf16
from budget_plugin.tools.fairseq_cli import train_options

SYSTEMS = ("dense", "budget")
# fairseq-train's environment in the recipe. glibc's malloc raises its mmap threshold as
# large blocks are freed, and then serves the next pass's activations from a heap that
# it does not give back: passes of other shapes (the sandwich's widths, batches of other
# lengths) leave it fragmented. A fixed threshold maps every block over 8 MiB afresh and
# returns it when freed: 5.77 GiB instead of 6.22 for the dense step on 8192-piece
# batches. 1 MiB saved more (5.53) but made an update 1.4x as long, every activation
# mapped and zeroed anew; 8 MiB is as fast as glibc's default (results/width/malloc/)
TRAIN_ENV = {"MALLOC_MMAP_THRESHOLD_": str(8 << 20)}


@dataclass
class Recipe:
    lr: float = 1e-4  # chosen on MR's dev split (examples/budgetformer/README.md)
    epochs: int = 2
    # however small the data, at least this many updates (the epochs grow to hold them): two
    # epochs of 2,000 texts are 126 updates, too few for the narrow widths (chosen on dev:
    # results/width/schedule/); 0: the epochs alone
    min_updates: int = 480
    batch_size: int = 32
    # a batch's pieces, padding included, at most: a batch holding a text cut at 512 pieces
    # has 16 examples, not 32 (16,384 pieces: the memory that killed a nested step); MR's
    # and TREC's batches (under 100 pieces a text) are never cut. None: batch_size alone
    max_tokens: Optional[int] = 8192
    warmup_share: float = 0.06  # of the updates, as in BERT's and RoBERTa's GLUE recipes
    seed: int = 1
    router_scale: float = 10.0  # the router moves 10x faster than the pretrained weights
    target_head_ratio: float = 0.5
    budget_weight: float = 10.0  # the criterion's default (issue 25)
    log_interval: int = 50
    start_at_budget: bool = False  # the router starts at the target budget (else at every head)
    max_updates: Optional[int] = None  # a study's update budget: stops before the last epoch ends
    # > 0: dev is also scored (and the best checkpoint saved) every N updates within an
    # epoch; 0: at each epoch's end and the last update only
    validate_interval_updates: int = 0
    save_optimizer: bool = True  # False: checkpoints of a third of the size, not resumable
    # on the CPU, the dense step's training forwards in bfloat16 autocast where the CPU has
    # bfloat16 instructions (precision.py; the command records what "auto" became): its
    # dev accuracy held against fp32's (results/width/precision/), its update 0.56x as long
    cpu_precision: str = "auto"

    def updates(self, train_examples: int) -> int:
        planned = max(self.batches(train_examples) * self.epochs, self.min_updates)
        return planned if self.max_updates is None else min(planned, self.max_updates)

    def batches(self, train_examples: int) -> int:
        """An epoch's updates at ``batch_size`` (a batch cut by ``max_tokens`` makes more)."""
        return math.ceil(train_examples / self.batch_size)

    def max_epochs(self, train_examples: int) -> int:
        """The epochs that hold ``updates``: ``epochs``, or more to reach ``min_updates``."""
        return max(self.epochs, math.ceil(self.updates(train_examples) / self.batches(train_examples)))


def encoder_args(model_pt: Path):
    """The converted encoder's model options (an argparse.Namespace), read without
    loading its weights (memory-mapped)."""
    return torch.load(model_pt, map_location="cpu", weights_only=True, mmap=True)["cfg"]["model"]


def encoder_flags(model_pt: Path) -> Tuple[List[str], float]:
    """The geometry of the converted encoder as fairseq-train options (what both
    architectures need to load it with ``--restore-file``)."""
    args = encoder_args(model_pt)
    return ["--encoder-layers", str(args.encoder_layers), "--encoder-embed-dim", str(args.encoder_embed_dim),
            "--encoder-ffn-embed-dim", str(args.encoder_ffn_embed_dim),
            "--encoder-attention-heads", str(args.encoder_attention_heads),
            "--max-positions", str(args.max_positions)], float(args.layernorm_eps)


def command(system: str, data: Path, model_dir: Path, save_dir: Path, recipe: Recipe, train_examples: int,
            num_classes: int = 2, cpu: bool = True, fp16: bool = False) -> list:
    """fairseq-train's command line for ``system`` (one of SYSTEMS), on the CPU unless
    ``cpu`` is false (then fairseq's default, the GPU), in half precision with ``fp16``."""
    flags, eps = encoder_flags(model_dir / "model.pt")
    heads = int(flags[flags.index("--encoder-attention-heads") + 1])
    updates = recipe.updates(train_examples)
    if system == "dense":  # stock fairseq: its LayerNorm eps stays 1e-5 (BERT's is 1e-12)
        model = ["--arch", "roberta", *flags, "--criterion", "sentence_prediction"]
    else:
        model = ["--arch", "budgetformer", *flags, "--layernorm-eps", repr(eps),
                 "--criterion", "budget_sentence_prediction", "--router-scale", recipe.router_scale,
                 "--target-head-ratio", recipe.target_head_ratio, "--budget-weight", recipe.budget_weight]
        if recipe.start_at_budget:
            model += ["--initial-budget", recipe.target_head_ratio * heads]
    interval = checkpoint_options(recipe)
    # --user-dir (in train_options) for both: it lets torch's safe loader read fairseq
    # checkpoints, and its task scores every validation example
    return [
        *train_options(data, save_dir, lr=recipe.lr, updates=updates,
                       warmup=max(1, round(recipe.warmup_share * updates)),
                       seed=recipe.seed, num_classes=num_classes, batch_size=recipe.batch_size,
                       max_tokens=recipe.max_tokens,
                       log_interval=recipe.log_interval, cpu=cpu), *device_options(recipe.cpu_precision, cpu, fp16),
        "--task", "budget_sentence_prediction", *model, "--max-epoch", recipe.max_epochs(train_examples), *interval,
        "--restore-file", model_dir / "model.pt", "--reset-optimizer", "--reset-dataloader", "--reset-meters",
    ]


def device_options(cpu_precision: str, cpu: bool, fp16: bool) -> list:
    """The precision of training: half precision on a GPU (``fp16``), or on the CPU
    the task's ``--cpu-precision``, resolved (bf16 or fp32) so that the recorded command
    says what ran."""
    if not cpu:
        return ["--fp16"] if fp16 else []
    return ["--cpu-precision", "bf16" if cpu_bf16(cpu_precision) else "fp32"]


def checkpoint_options(recipe: Recipe) -> list:
    """When dev is scored and what is saved. Mid-epoch validations only count if a
    checkpoint may be saved with them; one interval checkpoint is kept besides the best."""
    every = recipe.validate_interval_updates
    interval = ["--validate-interval-updates", every, "--save-interval-updates", every,
                "--keep-interval-updates", 1] if every else []
    return interval + ([] if recipe.save_optimizer else ["--no-save-optimizer-state"])
