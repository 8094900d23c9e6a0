"""The BudgetFormer encoder layer: fairseq's encoder layer with budgeted self-attention."""

from typing import Dict, Optional, Tuple

import torch.nn.functional as F
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from torch import Tensor

from ..config import BudgetConfig
from ..dial.settings import NO_DIAL, LayerDial
from .budgeted_attention import BudgetedAttention
from .flops import ffn_flops


class BudgetedEncoderLayer(TransformerEncoderLayerBase):
    """A post-/pre-norm encoder layer whose attention runs a per-input head budget.

    ``forward`` returns ``(x, stats)``: the layer's statistics travel to the criterion
    through return values (collected by the encoder into ``extra["budget"]``);
    ``stats["layer"]`` is the layer's index, which ``--encoder-layerdrop`` makes
    differ from its place in that list.

    Its FFN runs a prefix of its neurons when the call's ``dial`` names a width (an
    importance-ordered model: nested/reorder.py): slices of fc1's rows and fc2's
    columns, so a narrower width computes less. An exported layer holds only its
    ``neurons`` (default: ``--encoder-ffn-embed-dim``)."""

    def __init__(self, cfg, budget: BudgetConfig, index: int, fixed_heads: float, neurons: Optional[int] = None):
        # read by build_self_attention, build_fc1 and build_fc2, which super().__init__ calls
        self.budget, self.fixed_heads = budget, fixed_heads
        self.full_neurons = cfg.encoder.ffn_embed_dim  # the dense model's: what FLOP ratios compare with
        self.neurons = neurons or self.full_neurons
        super().__init__(cfg)
        self.index = index

    def build_fc1(self, input_dim, output_dim, q_noise, qn_block_size):
        return super().build_fc1(input_dim, self.neurons, q_noise, qn_block_size)

    def build_fc2(self, input_dim, output_dim, q_noise, qn_block_size):
        return super().build_fc2(self.neurons, output_dim, q_noise, qn_block_size)

    def build_self_attention(self, embed_dim, cfg):
        return BudgetedAttention(
            embed_dim,
            cfg.encoder.attention_heads,
            self.budget,
            self.fixed_heads,
            dropout=cfg.attention_dropout,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
        )

    def forward(
        self,
        x: Tensor,
        encoder_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor] = None,
        dial: LayerDial = NO_DIAL,
    ) -> Tuple[Tensor, Dict[str, Tensor]]:
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, stats = self.self_attn(x, key_padding_mask=encoder_padding_mask, attn_mask=attn_mask, dial=dial)
        stats["layer"] = self.index
        x = self.residual_connection(self.dropout_module(x), residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)

        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        neurons = self.neurons if dial.neurons is None else min(dial.neurons, self.neurons)
        stats["neurons"] = neurons
        stats["ffn_flops"], stats["ffn_flops_full"] = ffn_flops(x.size(0), x.size(1), self.embed_dim, neurons,
                                                                self.full_neurons)
        x = self.residual_connection(self.dropout_module(self.feed_forward(x, neurons)), residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        return x, stats

    def feed_forward(self, x: Tensor, neurons: int) -> Tensor:
        """fc2(activation(fc1(x))) over the layer's first ``neurons`` neurons."""
        if neurons >= self.neurons:  # the modules themselves (what hooks, e.g. the importance's, see)
            return self.fc2(self.activation_dropout_module(self.activation_fn(self.fc1(x))))
        hidden = F.linear(x, self.fc1.weight[:neurons], self.fc1.bias[:neurons])
        return F.linear(self.activation_dropout_module(self.activation_fn(hidden)), self.fc2.weight[:, :neurons],
                        self.fc2.bias)
