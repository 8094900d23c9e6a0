"""fairseq's own head pruning (AdaPrune, ``--mha-heads-to-keep``), as its trainer's
comment describes it: rank a fine-tuned RoBERTa's heads by the magnitude of their
q/k/v weights (``MultiheadAttention._get_reserve_head_index``), prune every layer to
its N largest (``_adaptive_prune_heads``), save that checkpoint, and fine-tune it again
with ``--mha-heads-to-keep N`` so that the model fairseq builds has its shapes."""

from pathlib import Path
from typing import List

import torch

from ..tasks.budget_sentence_prediction import prune_attention_heads
from .checkpoints import load_checkpoint, read
from .files import atomic_path


def prune_by_magnitude(model, heads_to_keep: int) -> List[List[int]]:
    """Prune a stock RoBERTa in place to each layer's ``heads_to_keep`` heads of largest
    q/k/v magnitude, with fairseq's own functions; the kept heads per layer, largest first."""
    kept = prune_attention_heads(model, lambda attention: attention._get_reserve_head_index(heads_to_keep))
    head_dim = model.encoder.sentence_encoder.layers[0].self_attn.head_dim
    return [[start // head_dim for start, _ in layer] for layer in kept]


def magnitude_pruned(checkpoint: Path, data: Path, out: Path, heads_to_keep: int) -> List[List[int]]:
    """Write ``checkpoint`` pruned by fairseq's magnitude ranking to ``out`` (no optimizer
    state), with ``--mha-heads-to-keep`` in its options; the kept heads per layer."""
    model, _ = load_checkpoint(checkpoint, data)
    kept = prune_by_magnitude(model, heads_to_keep)
    state = read(checkpoint)
    state["model"] = {key: value.detach().clone() for key, value in model.state_dict().items()}
    state["cfg"]["model"].mha_heads_to_keep = heads_to_keep
    state["last_optimizer_state"] = None
    with atomic_path(out) as tmp:
        torch.save(state, tmp)
    return kept
