"""The criterion's statistics: what each batch logs of its layers' budgets, heads,
neurons and FLOPs (summable over batches and workers), and the metrics fairseq prints
from their sums."""

import math
from typing import Dict, List

from fairseq.logging import metrics
from torch import Tensor


def budget_logs(layers: List[Dict[str, Tensor]], num_layers: int, nsentences: int,
                zero: Tensor) -> Dict[str, Tensor]:
    """Summable statistics: sums over examples, two keys per layer (heads, and the
    sentences that ran the layer). fairseq sums logging outputs by key position,
    with the keys of the first (across --update-freq steps and workers), so every
    output has the same keys of the same kinds: a layer that --encoder-layerdrop
    skipped adds zero heads and zero sentences."""
    logs = {}
    for i in range(num_layers):
        logs[f"heads_l{i}"], logs[f"sentences_l{i}"] = zero, 0
    for layer in layers:
        logs[f"heads_l{layer['layer']}"] = layer["heads"].sum().float()
        logs[f"sentences_l{layer['layer']}"] = nsentences
    logs["heads"] = sum((logs[f"heads_l{i}"] for i in range(num_layers)), zero)
    logs["budget"] = sum((layer["budget"].detach().sum() for layer in layers), zero)
    logs["layer_sentences"] = len(layers) * nsentences
    logs["head_slots"] = sum(layer["selected"].numel() for layer in layers)
    logs["attn_flops"] = sum((layer["attn_flops"] for layer in layers), zero)
    logs["attn_flops_full"] = sum((layer["attn_flops_full"] for layer in layers), zero)
    logs["neurons"] = sum((layer["neurons"] * nsentences for layer in layers), zero)
    logs["model_flops"] = logs["attn_flops"] + sum((layer["ffn_flops"] for layer in layers), zero)
    logs["model_flops_full"] = logs["attn_flops_full"] + sum((layer["ffn_flops_full"] for layer in layers), zero)
    return logs


def reduce_budget_metrics(logging_outputs) -> None:
    """The budget statistics of summed logging outputs as fairseq's metrics (beside
    sentence_prediction's own)."""

    def total(key):
        return sum(float(log.get(key, 0)) for log in logging_outputs)

    nsentences, sample_size = total("nsentences"), total("sample_size")
    layer_sentences = total("layer_sentences")
    if layer_sentences == 0:
        return
    metrics.log_scalar("task_loss", total("task_loss") / sample_size / math.log(2), sample_size, round=3)
    metrics.log_scalar("heads", total("heads") / layer_sentences, layer_sentences, round=2)
    metrics.log_scalar("head_ratio", total("heads") / total("head_slots"), total("head_slots"), round=3)
    layer_keys = sorted(
        {k for log in logging_outputs for k in log if k.startswith("heads_l")},
        key=lambda k: int(k[len("heads_l"):]),
    )
    for key in layer_keys:
        sentences = total("sentences_l" + key[len("heads_l"):])
        if sentences:  # else --encoder-layerdrop skipped the layer in every output
            metrics.log_scalar(key, total(key) / sentences, sentences, round=2)
    metrics.log_scalar("budget", total("budget") / layer_sentences, layer_sentences, round=2)
    flops_full = total("attn_flops_full")
    metrics.log_scalar("flops_ratio", total("attn_flops") / flops_full, flops_full, round=3)
    # the encoder layers' FLOPs (attention and FFN; not the embeddings' or the classifier's)
    model_full = total("model_flops_full")
    if model_full:
        metrics.log_scalar("model_flops_ratio", total("model_flops") / model_full, model_full, round=3)
        metrics.log_scalar("neurons", total("neurons") / layer_sentences, layer_sentences, round=1)
    for key in ("budget_term", "exploration_term", "relevance_entropy", "explore_rate", "temperature"):
        metrics.log_scalar(key, total(key) / nsentences, nsentences, round=4)
    if any("width_loss" in log for log in logging_outputs):
        metrics.log_scalar("width_loss", total("width_loss") / sample_size / math.log(2), sample_size, round=3)
    if any("distill_loss" in log for log in logging_outputs):
        metrics.log_scalar("distill_loss", total("distill_loss") / sample_size / math.log(2), sample_size, round=3)
