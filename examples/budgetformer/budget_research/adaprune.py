"""fairseq's own head pruning (AdaPrune, ``--mha-heads-to-keep``), as its trainer's
comment describes it: rank a fine-tuned RoBERTa's heads by the magnitude of their
q/k/v weights (``MultiheadAttention._get_reserve_head_index``), prune every layer to
its N largest (``_adaptive_prune_heads``), save that checkpoint, and fine-tune it again
with ``--mha-heads-to-keep N`` so that the model fairseq builds has its shapes.

fairseq reshapes the model for such a checkpoint in its trainer only, so fairseq-validate
and the hub could not load one: the ``adaprune_sentence_prediction`` task does it (this
package is a ``--user-dir`` too: ``FAIRSEQ_OPTIONS``)."""

from dataclasses import dataclass
from pathlib import Path
from typing import List

import torch
from fairseq.tasks import register_task

from budget_plugin.tasks.budget_sentence_prediction import BudgetSentencePredictionConfig, BudgetSentencePredictionTask
from budget_plugin.tools.checkpoints import load_checkpoint, read
from budget_plugin.tools.files import atomic_path

TASK = "adaprune_sentence_prediction"
# what a fairseq command line needs to train or load an AdaPrune checkpoint
FAIRSEQ_OPTIONS = ["--user-dir", Path(__file__).resolve().parent, "--task", TASK]


def prune_attention_heads(model, reserve) -> list:
    """Cut every layer of a stock RoBERTa to the heads ``reserve(attention)`` names (as
    fairseq's (start, end) column ranges), with fairseq's own AdaPrune functions; the
    ranges per layer."""
    kept = []
    for layer in model.encoder.sentence_encoder.layers:
        attention = layer.self_attn
        kept.append(reserve(attention))
        attention._adaptive_prune_heads(reserve_head_index=kept[-1])
        attention._set_skip_embed_dim_check()
    return kept


def shape_adaprune_heads(model, heads_to_keep: int) -> None:
    """Give a stock RoBERTa the attention shapes of a checkpoint that fairseq's AdaPrune
    (``--mha-heads-to-keep``) pruned, before its weights are loaded. fairseq-train does
    this in its trainer only, so fairseq-validate and the hub could not load such a
    checkpoint; which heads are kept does not matter here, the weights replace them."""
    if heads_to_keep is None or heads_to_keep == -1:
        return
    prune_attention_heads(model, lambda attention: [(i * attention.head_dim, (i + 1) * attention.head_dim)
                                                    for i in range(heads_to_keep)])


@dataclass
class AdaPruneSentencePredictionConfig(BudgetSentencePredictionConfig):
    pass


@register_task(TASK, dataclass=AdaPruneSentencePredictionConfig)
class AdaPruneSentencePredictionTask(BudgetSentencePredictionTask):
    """The plugin's task, building a stock RoBERTa in the shapes of an AdaPrune checkpoint."""

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if from_checkpoint:
            shape_adaprune_heads(model, getattr(cfg, "mha_heads_to_keep", -1))
        return model


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
