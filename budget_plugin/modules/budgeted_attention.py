"""Budgeted multi-head self-attention: the attention math of BudgetFormer.

For every input the layer predicts, from a summary ``s`` of its input,

* a head budget   ``b(x) = m + (H - m) * sigmoid(w_b . s + c_b)``  in ``[m, H]``,
* a relevance     ``p(x) = softmax(W_r s / temperature)``           over the H heads,

and runs the ``k = clamp(round(b), m, H)`` most relevant heads.  The other heads
contribute exactly zero, and at inference they are not computed at all.

Training needs gradients for two discrete choices (which heads, how many).  The
gate of head h has the forward value of the hard selection (0 or 1, so a layer at
full budget *is* a standard attention layer) and straight-through gradients:

    gate_h = sel_h + ST(sigmoid((b - rank_h - 0.5) / t)) + ST(H * p_h),    ST(z) = z - z.detach()

The soft count mask gives the budget predictor the task gradient of adding or
dropping the heads next to its boundary; the relevance term moves probability
towards heads whose output lowers the loss (a first-order estimate, available for
every head because training computes all of them).
"""

import math
from dataclasses import dataclass, field
from typing import Dict, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.modules import MultiheadAttention

POOLING_CHOICES = ChoiceEnum(["mean", "first"])
ATTENTION_PATH_CHOICES = ChoiceEnum(["fast", "reference"])
HEAD_SELECTION_CHOICES = ChoiceEnum(["learned", "static", "random"])


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
            "sigmoid((b - rank - 0.5) / t) that carries the task gradient to the budget"
        },
    )
    initial_budget: Optional[float] = field(
        default=None,
        metadata={
            "help": "budget b (in heads) the predictor starts at; default H - 0.25, "
            "which rounds to H: training (and a warm start from RoBERTa) begins at "
            "full attention"
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
            "help": "'learned': BudgetFormer's per-input budget and relevance. Baselines "
            "with a fixed budget (--fixed-heads): 'static' learns one head subset per "
            "layer shared by every input; 'random' draws each input's heads uniformly"
        },
    )
    fixed_heads: Optional[str] = field(
        default=None,
        metadata={
            "help": "heads per layer for --head-selection static/random: one number, or "
            "one per layer separated by commas; 'random' meets a fractional number on "
            "average (k drawn from its floor and ceiling), 'static' rounds it"
        },
    )


def parse_fixed_heads(text: Optional[str], num_layers: int, num_heads: int, min_heads: int):
    """'--fixed-heads 3.9' or '4,3.5,4,4' -> one float per layer, checked."""
    try:
        values = [float(v) for v in str(text).split(",")]
    except ValueError:
        values = []
    if len(values) == 1:
        values *= num_layers
    if len(values) != num_layers or not all(min_heads <= v <= num_heads for v in values):
        raise ValueError(
            f"--fixed-heads must be one number or {num_layers} comma-separated numbers "
            f"(one per layer), each in [--min-heads, {num_heads}], got {text!r}"
        )
    return values


class Exploration(NamedTuple):
    """Exploration state for one update, set by the task's schedule."""

    rate: float = 0.0  # 1 = full exploration (start of training), 0 = pure top-k exploitation
    noise: float = 0.0  # scale of the Gumbel noise on the relevance logits
    uniform: float = 0.0  # probability that an example's heads are ranked uniformly at random
    temperature: float = 1.0  # softmax temperature of the relevance distribution


class HeadRoute(NamedTuple):
    budget: Tensor  # B, continuous budget b(x) (differentiable)
    heads: Tensor  # B, heads run per example: k = clamp(round(b), m, H)
    selected: Tensor  # B x H, bool
    gate: Tensor  # B x H, forward value == selected; straight-through gradients
    relevance: Tensor  # B x H, p(x)


def straight_through(z: Tensor) -> Tensor:
    """Zero in the forward pass, the gradient of ``z`` in the backward pass."""
    return z - z.detach()


def split_heads(t: Tensor, num_heads: int) -> Tensor:
    """T x B x (H*d) -> B x H x T x d"""
    T, B, _ = t.shape
    return t.view(T, B, num_heads, -1).permute(1, 2, 0, 3)


def merge_heads(t: Tensor) -> Tensor:
    """B x H x T x d -> T x B x (H*d)"""
    B, H, T, d = t.shape
    return t.permute(2, 0, 1, 3).reshape(T, B, H * d)


def ranks(scores: Tensor) -> Tensor:
    """Rank of every entry along the last dimension, 0 = highest score."""
    order = scores.argsort(dim=-1, descending=True, stable=True)
    return order.argsort(dim=-1, stable=True)


def keep_mask(key_padding_mask: Optional[Tensor]) -> Optional[Tensor]:
    """fairseq's padding mask (True = pad, B x T) as an SDPA mask (True = attend)."""
    if key_padding_mask is None:
        return None
    return ~key_padding_mask.bool()[:, None, None, :]


class BudgetedAttention(MultiheadAttention):
    """Self-attention that runs a per-input number of heads.

    It keeps fairseq's ``q_proj``/``k_proj``/``v_proj``/``out_proj`` (head h owns rows
    ``h*d:(h+1)*d`` of q/k/v and those columns of ``out_proj``), so RoBERTa weights
    load by name; the router adds ``relevance_proj`` (C -> H) and ``budget_proj`` (C -> 1).
    """

    def __init__(self, embed_dim: int, num_heads: int, budget: BudgetConfig, **kwargs):
        super().__init__(embed_dim, num_heads, self_attention=True, **kwargs)
        if not 1 <= budget.min_heads <= num_heads:
            raise ValueError(
                f"--min-heads must be in [1, {num_heads}] (the number of heads), "
                f"got {budget.min_heads}"
            )
        self.min_heads = budget.min_heads
        self.pooling = budget.budget_pooling
        self.mask_temperature = budget.budget_mask_temperature
        self.initial_budget = budget.initial_budget
        self.fast_path = budget.attention_path == "fast"
        self.head_selection = budget.head_selection
        self.relevance_proj = nn.Linear(embed_dim, num_heads)
        self.budget_proj = nn.Linear(embed_dim, 1)
        if self.head_selection == "static":  # one relevance for every input
            self.static_logits = nn.Parameter(torch.zeros(num_heads))
        if self.head_selection == "random":
            # seeds the draws at inference; a buffer, so that a checkpoint replays them
            self.register_buffer("random_seed", torch.randint(1 << 62, ()))
            self._generator: Optional[torch.Generator] = None
        self.reset_router_parameters()
        self.exploration = Exploration()
        self.forced_heads: Optional[int] = None  # benchmarks and tests fix k here
        self.fixed_heads: float = float(num_heads)  # --fixed-heads of this layer, set by the encoder

    def reset_router_parameters(self):
        """Near-uniform relevance, and a budget that starts at ``initial_budget``.

        Called again by the model after RoBERTa's ``init_bert_params`` has re-initialised
        every ``nn.Linear``."""
        H, m = self.num_heads, self.min_heads
        start = H - 0.25 if self.initial_budget is None else self.initial_budget
        fraction = min(max((start - m) / (H - m), 1e-3), 1 - 1e-3) if H > m else 0.5
        nn.init.normal_(self.relevance_proj.weight, std=0.02)
        if self.head_selection == "static":
            nn.init.normal_(self.static_logits, std=0.02)
        nn.init.zeros_(self.relevance_proj.bias)
        nn.init.zeros_(self.budget_proj.weight)
        nn.init.constant_(self.budget_proj.bias, math.log(fraction / (1 - fraction)))

    def train(self, mode: bool = True):
        # fairseq's optimizers update ``p.data`` in place, which bumps no version
        # counter, so the head-major cache cannot see them; every update happens in
        # training mode, so a mode switch is the moment to forget it
        self._head_major = None
        return super().train(mode)

    # ------------------------------------------------------------------ routing

    def summarize(self, x: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
        """T x B x C -> B x C, blind to padding."""
        if self.pooling == "first":
            return x[0]
        if key_padding_mask is None:
            return x.mean(dim=0)
        keep = (~key_padding_mask.bool()).type_as(x).unsqueeze(1)  # B x 1 x T
        # one batched product on a view of x: no T x B x C temporary, unlike (x * keep).sum(0)
        total = torch.bmm(keep, x.transpose(0, 1)).squeeze(1)  # B x C
        return total / keep.sum(dim=-1).clamp_min(1.0)

    def rank_heads(self, logits: Tensor) -> Tensor:
        """Rank of every head (0 = most relevant), explored while training.

        Gumbel noise of scale 1 on ``logits / temperature`` makes the top-k a sample
        without replacement from p (Gumbel-top-k); with probability ``uniform`` an
        example's ranking is replaced by a uniformly random permutation."""
        scores = logits.detach() / self.exploration.temperature
        noise, uniform = self.exploration.noise, self.exploration.uniform
        if self.training and (noise > 0 or uniform > 0):
            gumbel = -torch.empty_like(scores).exponential_().log()
            scores = scores + noise * gumbel
            if uniform > 0:
                at_random = torch.rand_like(scores[:, :1]) < uniform
                scores = torch.where(at_random, gumbel, scores)
        return ranks(scores)

    def uniform_draw(self, shape, device) -> Tensor:
        """Uniform numbers for --head-selection random: the global (per-update seeded)
        generator while training, the layer's own seeded one at inference."""
        if self.training:
            return torch.rand(shape, device=device)
        if self._generator is None or self._generator.device != torch.device(device):
            self._generator = torch.Generator(device=device).manual_seed(int(self.random_seed))
        return torch.rand(shape, device=device, generator=self._generator)

    def route(self, x: Tensor, key_padding_mask: Optional[Tensor]) -> HeadRoute:
        H, m, B = self.num_heads, self.min_heads, x.size(1)
        if self.head_selection == "learned":
            summary = self.summarize(x, key_padding_mask)
            logits = self.relevance_proj(summary).float()
            budget = m + (H - m) * torch.sigmoid(self.budget_proj(summary).float().squeeze(-1))
            heads = budget.detach().round().clamp(m, H).long()
        else:  # baselines: a fixed budget, no router
            budget = x.new_full((B,), self.fixed_heads, dtype=torch.float)
            if self.head_selection == "static":
                logits = self.static_logits.float().expand(B, H)
                heads = budget.round().long()
            else:  # floor or ceiling, so that the mean is the fractional budget
                logits = x.new_zeros((B, H), dtype=torch.float)
                fraction = self.fixed_heads - math.floor(self.fixed_heads)
                heads = math.floor(self.fixed_heads) + (self.uniform_draw(B, x.device) < fraction).long()
        if self.forced_heads is not None:
            heads = torch.full_like(heads, self.forced_heads)
        relevance = torch.softmax(logits / self.exploration.temperature, dim=-1)
        if self.head_selection == "random":
            rank = ranks(self.uniform_draw((B, H), x.device))
        else:
            rank = self.rank_heads(logits)
        selected = rank < heads.unsqueeze(-1)
        soft_count = torch.sigmoid(
            (budget.unsqueeze(-1) - rank.to(budget.dtype) - 0.5) / self.mask_temperature
        )
        gate = (
            selected.to(budget.dtype)
            + straight_through(soft_count)
            + straight_through(H * relevance)
        )
        return HeadRoute(budget, heads, selected, gate, relevance)

    # ------------------------------------------------------------- attention

    def _dropout_p(self) -> float:
        return self.dropout_module.p if self.training else 0.0

    def attend_all_heads(
        self, x: Tensor, key_padding_mask: Optional[Tensor], gate: Tensor
    ) -> Tensor:
        """Reference path: every head computed, each scaled by its gate before out_proj."""
        q, k, v = (split_heads(proj(x), self.num_heads) for proj in (self.q_proj, self.k_proj, self.v_proj))
        heads = F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep_mask(key_padding_mask), dropout_p=self._dropout_p()
        )
        heads = heads * gate.to(heads.dtype)[:, :, None, None]
        return self.out_proj(merge_heads(heads))

    # The fast path. On CPU its cost is its GEMMs plus whatever feeds them, so the
    # feeding is kept cheap: at batch 1 (or when every example runs the same heads)
    # weights are only sliced, never copied; otherwise the batch is processed head by
    # head on the examples that chose that head, and the output projection is one
    # batched product per chunk of examples on their own gathered out_proj columns.
    # Gathered out_proj columns per chunk: at most 4 MB (the allocator recycles small
    # temporaries; big ones are page-faulted in anew), and no more than the context
    # buffer, so that peak memory keeps falling with the budget on short inputs.
    _CHUNK_FLOATS = 1 << 20

    @staticmethod
    def _head_runs(heads: Tensor) -> "list[tuple[int, int]]":
        """Ascending head indices as maximal runs of consecutive heads, [start, stop)."""
        runs: "list[tuple[int, int]]" = []
        for h in heads.tolist():
            if runs and runs[-1][1] == h:
                runs[-1] = (runs[-1][0], h + 1)
            else:
                runs.append((h, h + 1))
        return runs

    def attend_heads(
        self,
        x: Tensor,
        key_padding_mask: Optional[Tensor],
        heads: Tensor,
    ) -> Tensor:
        """Attention of the given heads (ascending indices) for every example of ``x``:
        their rows of q/k/v, their columns of out_proj. The cost is proportional to
        ``len(heads)``.

        Every run of consecutive heads is one product on views of the weights
        (``weight[rows]``, ``out_proj.weight[:, rows]``); the runs' outputs are
        accumulated into one buffer by ``addmm``."""
        T, B, C = x.shape
        d = self.head_dim
        mask = keep_mask(key_padding_mask)
        out: Optional[Tensor] = None
        for start, stop in self._head_runs(heads.flatten()):
            rows = slice(start * d, stop * d)
            q, k, v = (
                split_heads(F.linear(x, p.weight[rows], None if p.bias is None else p.bias[rows]), stop - start)
                for p in (self.q_proj, self.k_proj, self.v_proj)
            )
            heads_out = merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
            heads_out = heads_out.view(T * B, (stop - start) * d)
            weight = self.out_proj.weight[:, rows].t()
            if out is not None and torch.is_grad_enabled():  # autograd refuses out=
                out = torch.addmm(out, heads_out, weight)
            elif out is not None:  # in place; out= rather than addmm_: FlopCounterMode counts addmm only
                torch.addmm(out, heads_out, weight, out=out)
            elif self.out_proj.bias is not None:
                out = torch.addmm(self.out_proj.bias, heads_out, weight)
            else:
                out = torch.mm(heads_out, weight)
        assert out is not None, "attend_heads needs at least one head"
        return out.view(T, B, C)

    def head_major_weights(self) -> "tuple[Tensor, Optional[Tensor], Tensor]":
        """q/k/v rows of every head side by side (H x 3d x C, and H x 3d biases), and
        out_proj's columns of every head (H x d x C), so that one head's or one
        example's weights are a single gather. Cached until a weight changes: in-place
        updates and ``load_state_dict`` bump the tensors' versions, and ``train()``
        drops the cache for the writes that do not (fairseq's optimizers)."""
        projections = (self.q_proj, self.k_proj, self.v_proj, self.out_proj)
        key = tuple((p.weight.data_ptr(), p.weight._version) for p in projections)
        key += tuple((p.bias.data_ptr(), p.bias._version) for p in projections if p.bias is not None)
        cached = getattr(self, "_head_major", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        H, d, C = self.num_heads, self.head_dim, self.embed_dim
        with torch.no_grad():  # an inference cache: never part of a graph
            qkv = torch.cat([p.weight.view(H, d, C) for p in projections[:3]], dim=1)
            bias = None
            if self.q_proj.bias is not None:
                bias = torch.cat([p.bias.view(H, d) for p in projections[:3]], dim=1)
            out = self.out_proj.weight.view(C, H, d).permute(1, 2, 0).contiguous()
        self._head_major = (key, (qkv, bias, out))
        return qkv, bias, out

    def attend_selected_heads(
        self, x: Tensor, key_padding_mask: Optional[Tensor], selected: Tensor
    ) -> Tensor:
        """Fast inference path: only the selected heads of every example are computed.

        Head by head, the examples that chose head h are gathered and run through h's
        q/k/v rows (one product) and attention; each result lands in its example's
        next free slot of a B x T x k_max x d buffer. The output projection is then a
        batched product of every example's slots with its own heads' out_proj columns
        (gathered), in chunks of examples sorted by k, so that an example with fewer
        heads than ``k_max`` pads its chunk (with exact zeros) only up to its
        chunk's largest k. No example is looped over; every product is proportional to
        the heads run. Returns T x B x C (a transposed view of a B x T x C buffer)."""
        if bool(selected.all()):  # full budget: exactly fairseq's own attention
            return super().forward(
                x, x, x, key_padding_mask=key_padding_mask, need_weights=False
            )[0]
        T, B, C = x.shape
        H, d = self.num_heads, self.head_dim
        if B == 1 or bool((selected == selected[:1]).all()):  # one head set: weight views
            return self.attend_heads(x, key_padding_mask, selected[0].nonzero().flatten())

        qkv_weight, qkv_bias, out_weight = self.head_major_weights()
        mask = keep_mask(key_padding_mask)
        heads_per_example = selected.sum(dim=1)
        k_max = int(heads_per_example.max())
        slot = selected.long().cumsum(dim=1) - 1  # B x H: slot of head h in example b
        context = x.new_zeros(B, T, k_max, d)
        examples_per_head = selected.sum(dim=0)
        active = examples_per_head.nonzero().flatten()
        by_head = selected.t().nonzero()[:, 1].split(examples_per_head[active].tolist())
        for h, examples in zip(active.tolist(), by_head):
            one_head = self._one_head(x, mask, examples, qkv_weight[h], None if qkv_bias is None else qkv_bias[h])
            context[examples, :, slot[examples, h]] = one_head

        # each example's heads in ascending order, k_max of them (a padded slot names
        # head 0: its context is zero, so it adds exactly nothing)
        head_of_slot = torch.where(selected, torch.arange(H, device=x.device), H)
        head_of_slot = head_of_slot.sort(dim=1).values[:, :k_max].clamp_max(H - 1)
        order = heads_per_example.argsort(stable=True)
        per_chunk = max(1, min(self._CHUNK_FLOATS, context.numel()) // (k_max * d * C))
        out = x.new_empty(B, T, C)
        for chunk in order.split(per_chunk):
            k = int(heads_per_example[chunk[-1]])  # the chunk's largest
            self._project_chunk(out, context, chunk, out_weight, head_of_slot[chunk, :k])
        return out.transpose(0, 1)

    def _one_head(self, x: Tensor, mask: Optional[Tensor], examples: Tensor, weight: Tensor,
                  bias: Optional[Tensor]) -> Tensor:
        """Head h (its 3d x C q/k/v rows) on the given examples: B_h x T x d.
        (A method of its own, so that each head's temporaries are freed before the next.)"""
        if examples.numel() < x.size(1):
            x = x.index_select(1, examples)  # T x B_h x C
            mask = None if mask is None else mask.index_select(0, examples)
        qkv = F.linear(x, weight, bias).permute(1, 0, 2).unsqueeze(1)  # B_h x 1 x T x 3d
        return F.scaled_dot_product_attention(*qkv.split(self.head_dim, dim=-1), attn_mask=mask).squeeze(1)

    def _project_chunk(self, out: Tensor, context: Tensor, chunk: Tensor, out_weight: Tensor,
                       heads: Tensor):
        """out[chunk] = out_proj of the chunk's context slots, each example with its own
        heads' columns (``heads``: n x k)."""
        (n, k), (_, T, C), d = heads.shape, out.shape, self.head_dim
        first = int(chunk[0])
        contiguous = bool((chunk == torch.arange(first, first + n, device=chunk.device)).all())
        weight = out_weight.index_select(0, heads.flatten()).view(n, k * d, C)
        chunk_context = context[first:first + n] if contiguous else context.index_select(0, chunk)
        chunk_context = chunk_context[:, :, :k].reshape(n, T, k * d)
        bias = self.out_proj.bias if self.out_proj.bias is not None else out.new_zeros(C)
        if contiguous and not torch.is_grad_enabled():  # autograd refuses out=
            torch.baddbmm(bias, chunk_context, weight, out=out[first:first + n])
        else:
            out.index_copy_(0, chunk, torch.baddbmm(bias, chunk_context, weight))

    # ---------------------------------------------------------------- forward

    def forward_budgeted(
        self, x: Tensor, key_padding_mask: Optional[Tensor] = None
    ) -> "tuple[Tensor, Dict[str, Tensor]]":
        """x: T x B x C. Returns the attention output and this layer's statistics."""
        route = self.route(x, key_padding_mask)
        if self.training or not self.fast_path:
            out = self.attend_all_heads(x, key_padding_mask, route.gate)
        else:
            out = self.attend_selected_heads(x, key_padding_mask, route.selected)
        used, full = self.flops(x.size(0), route.heads, router=self.head_selection == "learned")
        stats = {
            "budget": route.budget,
            "heads": route.heads,
            "selected": route.selected,
            "relevance": route.relevance,
            "attn_flops": used,
            "attn_flops_full": full,
            "rate": self.exploration.rate,
            "temperature": self.exploration.temperature,
        }
        return out, stats

    def flops(self, seq_len: int, heads: Tensor, router: bool = True) -> "tuple[Tensor, Tensor]":
        """Attention FLOPs of this batch (multiply-add = 2), router included, and the
        FLOPs all heads would cost. Per head and example: q/k/v/out projections
        8 T C d, scores and weighted values 4 T^2 d."""
        T, C, d, H = seq_len, self.embed_dim, self.head_dim, self.num_heads
        per_head = 8.0 * T * C * d + 4.0 * T * T * d
        router = (T * C + 2.0 * C * (H + 1)) if router else 0.0
        used = heads.sum().to(torch.float64) * per_head + heads.numel() * router
        full = torch.full_like(used, heads.numel() * H * per_head)
        return used, full
