"""BudgetFormer's encoder: fairseq's TransformerEncoder whose layers are budgeted (each
layer's heads, and an export's FFN neurons, its own), inside RoBERTa's encoder."""

from typing import List, Optional

import torch
from fairseq.models.roberta import RobertaEncoder
from fairseq.models.transformer import TransformerConfig, TransformerEncoder
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from fairseq.utils import safe_getattr

from ..config import BudgetConfig
from ..dial.settings import Dial
from ..modules import BudgetedEncoderLayer
from ..option_error import require


def ffn_neurons_per_layer(args) -> List[Optional[int]]:
    """--ffn-neurons: each layer's FFN neurons (an export's), or None per layer (all of
    --encoder-ffn-embed-dim)."""
    value, layers = safe_getattr(args, "ffn_neurons", None), args.encoder_layers
    if value is None:
        return [None] * layers
    try:
        neurons = [int(v) for v in str(value).split(",")]
    except ValueError:
        neurons = []
    require(len(neurons) == layers and all(1 <= n <= args.encoder_ffn_embed_dim for n in neurons), "ffn_neurons",
            f"{layers} comma-separated whole numbers in [1, --encoder-ffn-embed-dim = {args.encoder_ffn_embed_dim}]",
            value)
    return neurons


class BudgetTransformerEncoder(TransformerEncoder):
    """fairseq's TransformerEncoder whose layers are budgeted and whose forward also
    returns every layer's budget statistics (``encoder_out["budget"]``)."""

    def __init__(self, args, dictionary, embed_tokens, budget: BudgetConfig):
        # read by build_encoder_layer, which super().__init__ calls once per layer
        self.budget = budget
        self.layer_heads = enumerate(budget.heads_per_layer(args.encoder_layers, args.encoder_attention_heads))
        self.layer_neurons = iter(ffn_neurons_per_layer(args))
        super().__init__(args, dictionary, embed_tokens)
        del self.layer_heads, self.layer_neurons
        if budget.head_selection == "kept":
            kept = budget.kept_heads_per_layer(args.encoder_layers, args.encoder_attention_heads)
            # indexed: iterating a LayerDropModuleList in training skips layers at random
            for i, heads in enumerate(kept):
                self.layers[i].self_attn.router.keep(heads)
        if budget.relevance_prior is not None:
            prior = budget.relevance_prior_per_layer(args.encoder_layers, args.encoder_attention_heads)
            for i, scores in enumerate(prior):
                self.layers[i].self_attn.router.prefer(scores)

    def build_encoder_layer(self, cfg):
        return BudgetedEncoderLayer(TransformerConfig.from_namespace(cfg), self.budget, *next(self.layer_heads),
                                    neurons=next(self.layer_neurons))

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens=False, token_embeddings=None,
                dial: Optional[Dial] = None):
        return self.forward_scriptable(src_tokens, src_lengths, return_all_hiddens, token_embeddings, dial)

    def forward_scriptable(
        self, src_tokens, src_lengths=None, return_all_hiddens=False, token_embeddings=None,
        dial: Optional[Dial] = None,
    ):
        """``dial``: the budget dial for this call (every layer's part handed to its
        router as an argument); None: no dial."""
        dial = dial or Dial()
        padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = bool(padding_mask.any())
        x, embedding = self.forward_embedding(src_tokens, token_embeddings)
        if has_pads:
            x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        states = [x] if return_all_hiddens else []
        layer_stats = []
        for layer in self.layers:
            x, stats = layer(x, encoder_padding_mask=padding_mask if has_pads else None, dial=dial.layer(layer.index))
            layer_stats.append(stats)
            if return_all_hiddens:
                states.append(x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)

        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [padding_mask],  # B x T
            "encoder_embedding": [embedding],  # B x T x C
            "encoder_states": states,  # List[T x B x C]
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [(~padding_mask).sum(dim=1, dtype=torch.int32).reshape(-1, 1)],
            "budget": layer_stats,  # List[Dict[str, Tensor]], one per layer run
        }


class BudgetFormerEncoder(RobertaEncoder):
    def build_encoder(self, args, dictionary, embed_tokens):
        encoder = BudgetTransformerEncoder(args, dictionary, embed_tokens, BudgetConfig.fill_args(args))
        encoder.apply(init_bert_params)
        return encoder

    def forward(self, src_tokens, features_only=False, return_all_hiddens=False, masked_tokens=None,
                dial: Optional[Dial] = None, **unused):
        # RobertaEncoder.forward's, handing the dial on
        x, extra = self.extract_features(src_tokens, return_all_hiddens=return_all_hiddens, dial=dial)
        if not features_only:
            x = self.output_layer(x, masked_tokens=masked_tokens)
        return x, extra

    def extract_features(self, src_tokens, return_all_hiddens=False, dial: Optional[Dial] = None, **kwargs):
        encoder_out = self.sentence_encoder(
            src_tokens,
            return_all_hiddens=return_all_hiddens,
            token_embeddings=kwargs.get("token_embeddings", None),
            dial=dial,
        )
        features = encoder_out["encoder_out"][0].transpose(0, 1)  # B x T x C
        inner_states = encoder_out["encoder_states"] if return_all_hiddens else None
        return features, {"inner_states": inner_states, "budget": encoder_out["budget"]}
