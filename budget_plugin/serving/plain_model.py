"""A fine-tuned RoBERTa or BudgetFormer classifier as a plain PyTorch module, for
export: token ids in (B x T, padded with fairseq's pad), logits out. It holds copies of
the fairseq model's own weights and modules (embeddings, layer norms, linear maps,
activations) and computes what fairseq's encoder computes at inference, written as
plain tensor operations: no router, no statistics, no ``None`` arguments, no fused
attention call, so that ``torch.onnx.export`` sees an ordinary graph. A physically cut
model (nested/export.py) is just narrower: each layer keeps its own heads and FFN
neurons, read off its weights' shapes."""

import copy
import math
from typing import Callable, List

import torch
from fairseq.modules import LearnedPositionalEmbedding
from fairseq.modules.gelu import gelu
from torch import Tensor, nn


def erf_gelu(x: Tensor) -> Tensor:
    """fairseq's ``gelu`` (erf, not tanh) in the order ONNX Runtime fuses into one Gelu
    (x * 0.5 first, then times 1 + erf(x / sqrt 2)); torch's exporter writes F.gelu as
    0.5 * (1 + erf) * x, which the runtime leaves as five element-wise passes."""
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def exportable_activation(activation: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    return erf_gelu if activation is gelu else activation


class PlainAttention(nn.Module):
    """fairseq's MultiheadAttention at inference (self-attention over a padded batch),
    with q, k and v in one projection (one matrix product where fairseq runs three) and
    q's d^-0.5 folded into its rows; padded keys masked with -inf."""

    def __init__(self, attention: nn.Module):
        super().__init__()
        self.head_dim = attention.head_dim
        self.heads = attention.q_proj.out_features // self.head_dim  # the heads this layer holds
        q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
        scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(q.in_features, 3 * q.out_features)
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([q.weight * scale, k.weight, v.weight]))
            self.qkv.bias.copy_(torch.cat([q.bias * scale, k.bias, v.bias]))
        self.out_proj = copy.deepcopy(attention.out_proj)

    def forward(self, x: Tensor, key_padding: Tensor) -> Tensor:  # x: B x T x C; key_padding: B x 1 x 1 x T
        B, T, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # each B x h x T x d
        scores = (q @ k.transpose(2, 3)).masked_fill(key_padding, float("-inf"))
        heads = torch.softmax(scores, dim=-1) @ v
        return self.out_proj(heads.transpose(1, 2).reshape(B, T, self.heads * self.head_dim))


class PlainLayer(nn.Module):
    """fairseq's TransformerEncoderLayer at inference (post- or pre-norm, as trained)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.self_attn = PlainAttention(layer.self_attn)
        self.self_attn_layer_norm, self.final_layer_norm, self.fc1, self.fc2 = (
            copy.deepcopy(getattr(layer, name)) for name in ("self_attn_layer_norm", "final_layer_norm", "fc1", "fc2"))
        self.activation_fn = exportable_activation(layer.activation_fn)
        self.normalize_before = layer.normalize_before

    def forward(self, x: Tensor, key_padding: Tensor) -> Tensor:
        for norm, block in ((self.self_attn_layer_norm, lambda y: self.self_attn(y, key_padding)),
                            (self.final_layer_norm, lambda y: self.fc2(self.activation_fn(self.fc1(y))))):
            residual = x
            x = residual + block(norm(x) if self.normalize_before else x)
            if not self.normalize_before:
                x = norm(x)
        return x


class PlainClassifier(nn.Module):
    """A fairseq RoBERTa-family classifier (its encoder and one classification head) as
    plain operations: ``forward(tokens) -> logits``."""

    def __init__(self, model: nn.Module, head: str = "sentence_classification_head"):
        super().__init__()
        encoder = model.encoder.sentence_encoder
        if not isinstance(encoder.embed_positions, LearnedPositionalEmbedding):
            raise ValueError("export needs learned positions (RoBERTa's); this encoder has none or sinusoidal ones")
        if head not in model.classification_heads:
            raise ValueError(f"the model has no classification head {head!r} (it has "
                             f"{', '.join(model.classification_heads) or 'none'})")
        self.pad = encoder.padding_idx
        self.embed_scale = float(encoder.embed_scale)
        self.embed_tokens = copy.deepcopy(encoder.embed_tokens)
        self.embed_positions = nn.Embedding.from_pretrained(encoder.embed_positions.weight.detach().clone())
        self.layernorm_embedding = copy.deepcopy(encoder.layernorm_embedding) or nn.Identity()
        self.layers = nn.ModuleList(PlainLayer(layer) for layer in encoder.layers)
        self.layer_norm = copy.deepcopy(encoder.layer_norm) or nn.Identity()  # pre-norm models' last norm
        classifier = model.classification_heads[head]
        self.dense, self.out_proj = copy.deepcopy(classifier.dense), copy.deepcopy(classifier.out_proj)
        self.pooler_activation = classifier.activation_fn
        self.eval()

    @property
    def max_positions(self) -> int:  # fairseq's learned positions start after the pad's index
        return self.embed_positions.num_embeddings - self.pad - 1

    @property
    def heads(self) -> List[int]:
        return [layer.self_attn.heads for layer in self.layers]

    @property
    def neurons(self) -> List[int]:
        return [layer.fc1.out_features for layer in self.layers]

    def forward(self, tokens: Tensor) -> Tensor:
        padding = tokens.eq(self.pad)
        real = (~padding).long()
        positions = torch.cumsum(real, dim=1) * real + self.pad  # fairseq's make_positions
        x = self.embed_tokens(tokens) * self.embed_scale + self.embed_positions(positions)
        x = self.layernorm_embedding(x) * real.unsqueeze(-1).to(x.dtype)  # padded positions zeroed, as fairseq does
        key_padding = padding[:, None, None, :]
        for layer in self.layers:
            x = layer(x, key_padding)
        features = self.layer_norm(x)[:, 0]  # <s>
        return self.out_proj(self.pooler_activation(self.dense(features)))

