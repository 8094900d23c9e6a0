"""The BudgetFormer encoder layer: fairseq's encoder layer with budgeted self-attention."""

from typing import Dict, Optional, Tuple

from torch import Tensor

from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

from .budgeted_attention import BudgetConfig, BudgetedAttention


class BudgetedEncoderLayer(TransformerEncoderLayerBase):
    """A post-/pre-norm encoder layer whose attention runs a per-input head budget.

    ``forward`` returns ``(x, stats)``: the layer's statistics travel to the criterion
    through return values (collected by :class:`BudgetTransformerEncoder`)."""

    def __init__(self, cfg, budget: BudgetConfig):
        self.budget = budget  # read by build_self_attention, called from super().__init__
        super().__init__(cfg)

    def build_self_attention(self, embed_dim, cfg):
        return BudgetedAttention(
            embed_dim,
            cfg.encoder.attention_heads,
            self.budget,
            dropout=cfg.attention_dropout,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
        )

    def forward(
        self,
        x: Tensor,
        encoder_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Dict[str, Tensor]]:
        if attn_mask is not None:
            raise NotImplementedError("budgeted attention does not take an attn_mask")
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, stats = self.self_attn.forward_budgeted(x, encoder_padding_mask)
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
