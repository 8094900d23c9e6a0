"""The budget dial's speed on a data set's real test sentences (``examples/budgetformer/benchmark.py
--checkpoint NESTED --data DATA``): one calibrated nested checkpoint, in one process and
side by side (interleaved, rotating rounds: budget_research/timing.py), as

* ``dense``: fairseq's own ``roberta`` with the checkpoint's weights (every head);
* ``nested @ R``: the checkpoint dialled to mean head ratio R, per-input budgets;
* ``fixed @ R``: the same weights at the per-layer counts the dial ran at R on the dev
  sentences (their means made whole with the same total: chosen on dev), every input
  alike, no router: the static twin;
* ``pruned @ R``: those counts exported as a physically smaller model
  (budget_plugin/nested/export.py), the latency limit of that budget.

At batch 1 (the first ``singles`` test sentences, one at a time) and 32 (the split's
batches), and the whole model's FLOPs over the test split; the table gives each
system's latency and FLOPs against dense's."""

import copy
import time
from typing import Dict, List, Optional, Sequence

import torch

from budget_plugin.dial.parsing import parse_head_ratio
from budget_plugin.nested.export import pruned_checkpoint, whole_counts
from budget_plugin.tools.building import twin
from budget_plugin.tools.checkpoints import as_budgetformer, load_checkpoint, read
from budget_plugin.tools.evaluation import count_flops, layer_heads, split_batches, tokens
from budget_research.timing import latencies, machine_info

RATIOS = ("1", "0.5", "0.3")


def dialled(model, head_ratio: str):
    """A copy of ``model`` that runs at ``head_ratio`` (its own setting from now on)."""
    copied = copy.deepcopy(model)
    L, H = model.args.encoder_layers, model.args.encoder_attention_heads
    copied.head_ratio = parse_head_ratio(head_ratio, L, H, model.budget.min_heads)
    copied.reset_dial()
    return copied.eval()


def fixed_counts(model, batches: Sequence[dict]) -> List[int]:
    """The per-layer counts of a fixed budget like ``model``'s: its mean heads per layer
    over the batches, made whole (whole_counts)."""
    return whole_counts(layer_heads(model, batches))


def dial_benchmark(checkpoint: str, data: str, ratios: Sequence[str] = RATIOS, repeats: int = 5,
                   singles: int = 200, threads: int = 2, batches_timed: Optional[int] = None,
                   only: Optional[Sequence[str]] = None) -> Dict:
    """Every system's latency at batch 1 (the first ``singles`` test sentences) and 32
    (the first ``batches_timed`` batches; all by default), its heads per layer and head
    ratio on the test split, and the machine; ratios against dense are the report's.
    ``only``: the systems measured besides dense (default: all)."""
    torch.set_num_threads(threads)
    nested, task = load_checkpoint(checkpoint, data)
    H = nested.args.encoder_attention_heads
    batches, dev = split_batches(task, 32, "test"), split_batches(task, 32, "valid")
    systems = {"dense": twin(nested, "roberta")}
    counts = {}
    for ratio in ratios:
        systems[f"nested @ {ratio}"] = dialled(nested, ratio)
        if float(ratio) < 1:
            counts[ratio] = fixed_counts(systems[f"nested @ {ratio}"], dev)
            systems[f"fixed @ {ratio}"] = dialled(nested, ",".join(map(str, counts[ratio])))
            systems[f"pruned @ {ratio}"] = as_budgetformer(pruned_checkpoint(read(checkpoint), counts[ratio]))
    if only is not None:
        systems = {name: model for name, model in systems.items() if name == "dense" or name in only}
    found = {}
    for name, model in systems.items():
        heads = layer_heads(model, batches)
        found[name] = {"heads_per_layer": heads, "head_ratio": sum(heads) / (H * len(heads)),
                       "model_flops": count_flops(model, batches).total}
    models = list(systems.values())
    singles_batches = split_batches(task, 1, "test")[:singles]
    for batch_size, timed in ((1, singles_batches), (32, batches[:batches_timed])):
        began = time.time()
        for name, seconds in zip(systems, latencies(models, timed, repeats)):
            found[name][f"latency_b{batch_size}_ms"] = 1000 * seconds / len(timed)
        found["dense"][f"wall_b{batch_size}_s"] = round(time.time() - began, 1)
    return {"checkpoint": str(checkpoint), "data": str(data), "threads": threads, "repeats": repeats,
            "singles": len(singles_batches), "test_examples": sum(tokens(b).size(0) for b in batches),
            "machine": machine_info(torch.device("cpu")), "systems": found}


def dial_table(report: Dict) -> str:
    """The markdown table: per system, heads, and latency against dense at batch 1 and 32."""
    rows = report["systems"]
    dense = rows["dense"]
    lines = ["| system | head ratio (test) | heads per layer | model FLOPs / dense | b1 ms | b1 / dense | b32 ms "
             "| b32 / dense |", "|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['head_ratio']:.3f} | {' '.join(f'{h:.1f}' for h in r['heads_per_layer'])} "
                     f"| {r['model_flops'] / dense['model_flops']:.3f} "
                     f"| {r['latency_b1_ms']:.2f} | {r['latency_b1_ms'] / dense['latency_b1_ms']:.3f} "
                     f"| {r['latency_b32_ms']:.1f} | {r['latency_b32_ms'] / dense['latency_b32_ms']:.3f} |")
    return "\n".join(lines)
