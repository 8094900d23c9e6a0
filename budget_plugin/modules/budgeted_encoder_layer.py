"""The BudgetFormer encoder layer: fairseq's encoder layer with budgeted self-attention."""

from typing import Dict, Optional, Tuple

from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from torch import Tensor

from ..config import BudgetConfig
from .budgeted_attention import BudgetedAttention
from .router import NO_DIAL, LayerDial


class BudgetedEncoderLayer(TransformerEncoderLayerBase):
    """A post-/pre-norm encoder layer whose attention runs a per-input head budget.

    ``forward`` returns ``(x, stats)``: the layer's statistics travel to the criterion
    through return values (collected by the encoder into ``extra["budget"]``);
    ``stats["layer"]`` is the layer's index, which ``--encoder-layerdrop`` makes
    differ from its place in that list."""

    def __init__(self, cfg, budget: BudgetConfig, index: int, fixed_heads: float):
        # read by build_self_attention, which super().__init__ calls
        self.budget, self.fixed_heads = budget, fixed_heads
        super().__init__(cfg)
        self.index = index

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
        x = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        x = self.residual_connection(self.dropout_module(self.fc2(x)), residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        return x, stats
