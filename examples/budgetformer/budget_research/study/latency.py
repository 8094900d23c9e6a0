"""The latency study's runs and measurements (examples/budgetformer/latency_study.py), per data set and
seed, in this order, each recorded once beside the accuracy study's records:

1. ``nested`` (tools/study/nested.py): the nested model and its dial;
2. the baselines, trained by the accuracy study's train(): importance pruning at 0.2
   (the dense record's importance, at the per-layer counts the nested dial ran on dev at
   0.2), fairseq's AdaPrune at 4 heads per layer (0.33) and the first 4 of 6 layers;
3. ``latency-seedN.json``: every system side by side in one process on the test split:
   heads per layer, whole-model FLOPs, CPU latency at batch 1 and 32 (interleaved,
   rotating rounds), and, for the nested model's per-input budgets, how they spread over
   classes and input lengths. Importance pruning at 0.5 and 0.3 has records but no
   checkpoints (the accuracy study kept none); every importance-pruned model is timed
   physically pruned to its per-layer counts (see systems())."""

import time
from dataclasses import asdict
from typing import Dict, List, Optional, Tuple

import torch

from budget_plugin.nested.export import pruned_checkpoint
from budget_plugin.nested.importance import kept_heads, kept_heads_option
from budget_plugin.tools.checkpoints import as_budgetformer, load_checkpoint, read
from budget_plugin.tools.evaluation import (
    accuracy_and_ratio,
    count_flops,
    heads_per_input,
    layer_heads,
    split_batches,
    tokens,
)
from budget_plugin.tools.files import write_json
from budget_plugin.tools.progress import log
from budget_research.benchmark.dial import dialled
from budget_research.study.nested import DIAL, train_nested, twin_counts
from budget_research.study.plan import Latency, Run, StudyConfig, cached_record, cores, finished
from budget_research.study.train import train
from budget_research.timing import latencies, machine_info

ADAPRUNE_HEADS = 4  # head ratio 0.3 of 12 heads, rounded up as the learned budgets at 0.3 mostly did
LAYERS_KEPT = "0,1,2,3"  # fairseq's --encoder-layers-to-keep: the converted encoder's first 4 of 6 layers
RECORDED_IMPORTANCE = (0.5, 0.3)  # importance pruning the accuracy study recorded
EXPORTED = ("0.3", "0.2")  # the nested model's counts exported as physically smaller models
TIMING = Latency(examples=64)  # the accuracy study's timing, with twice its single sentences


def baselines(dataset: str, seed: int, nested: dict, cfg: StudyConfig) -> List[Tuple[Run, List[str]]]:
    """The baseline runs of a data set and seed and what each adds to the recipe."""
    dense = finished(Run(dataset, "dense", seed), cfg)
    if dense is None:
        raise SystemExit(f"error: {Run(dataset, 'dense', seed).record(cfg)}: no dense record (the accuracy "
                         "study's: examples/budgetformer/reproduce.py), whose importance the baselines use")
    kept = kept_heads(torch.tensor(dense["importance"]), twin_counts(nested, "0.2"))
    return [
        (Run(dataset, "importance", seed, 0.2), ["--head-selection", "kept", "--kept-heads", kept_heads_option(kept)]),
        (Run(dataset, "adaprune", seed, 0.3), ["--mha-heads-to-keep", str(ADAPRUNE_HEADS), "--restore-file", "ADAPRUNED"]),
        (Run(dataset, "layers4", seed), ["--encoder-layers-to-keep", LAYERS_KEPT]),
    ]


def run_group(dataset: str, seed: int, cfg: StudyConfig) -> dict:
    """Everything of a data set and seed, each step done once; the latency record."""
    nested = train_nested(Run(dataset, "nested", seed), cfg)
    records = {run.name: train(run, options, cfg) for run, options in baselines(dataset, seed, nested, cfg)}
    for ratio in RECORDED_IMPORTANCE:
        run = Run(dataset, "importance", seed, ratio)
        records[run.name] = finished(run, cfg)
        if records[run.name] is None:
            raise SystemExit(f"error: {run.record(cfg)}: no record of the accuracy study's importance pruning")
    return measure_group(dataset, seed, cfg, nested, records)


def run_all(cfg: StudyConfig, deadline: Optional[float] = None) -> None:
    """Every data set and seed (a seed at a time), until the ``deadline`` (a
    time.time()) has passed: a group under way finishes."""
    for seed in cfg.seeds:
        for dataset in cfg.datasets:
            if deadline is not None and time.time() > deadline:
                log("the time given is up: run the study again to go on")
                return
            run_group(dataset, seed, cfg)


def kept_counts(options: List[str]) -> List[int]:
    """The per-layer head counts of an importance-pruning run's --kept-heads."""
    return [len(layer.split(",")) for layer in options[options.index("--kept-heads") + 1].split(";")]


def systems(dataset: str, seed: int, cfg: StudyConfig, nested: dict, records: Dict[str, dict]):
    """The models timed side by side, by name, and the task. Importance pruning is timed
    as what one would ship, a physically pruned model of its per-layer counts (its
    training ran BudgetFormer's 'kept' heads, which gathers them at every forward; latency
    and FLOPs depend on the counts, not the weights)."""
    run = Run(dataset, "nested", seed)
    data, folder = run.data(cfg), run.checkpoints(cfg)
    model, task = load_checkpoint(folder / "nested" / "checkpoint_best.pt", data)
    nested_state = read(folder / "nested" / "checkpoint_best.pt")

    def physical(counts: List[int]):
        return as_budgetformer(pruned_checkpoint(nested_state, counts))

    found = {"dense": load_checkpoint(folder / "dense" / "checkpoint_best.pt", data)[0]}
    for name, record in records.items():
        if record["system"] == "importance":
            found[name] = physical(kept_counts(record["options"]))
        else:
            trained = Run(record["dataset"], record["system"], record["seed"], record["ratio"])
            found[name] = load_checkpoint(trained.checkpoints(cfg) / "checkpoint_best.pt", data)[0]
    for ratio in DIAL:
        found[f"nested @ {ratio}"] = dialled(model, ratio)
        if ratio != "1":
            found[f"fixed @ {ratio}"] = dialled(model, ",".join(map(str, twin_counts(nested, ratio))))
    for ratio in EXPORTED:
        found[f"exported @ {ratio}"] = physical(twin_counts(nested, ratio))
    return found, task


def spread(model, batches: List[dict], pad: int) -> dict:
    """Where per-input budgets differ: the mean head ratio per gold class and per
    quartile of input length (tokens), and the correlation of length and head ratio."""
    selected, targets = heads_per_input(model, batches)
    ratio = selected.float().mean(dim=(1, 2))  # N: each input's share of every head of every layer
    lengths = torch.cat([tokens(b).ne(pad).sum(1) for b in batches]).float()
    order = lengths.argsort()
    quartiles = [ratio[q].mean().item() for q in order.tensor_split(4)]
    edges = [lengths[q].max().item() for q in order.tensor_split(4)]
    # undefined (NaN) where every input has the same length or head ratio
    correlation = torch.corrcoef(torch.stack([lengths, ratio]))[0, 1].item()
    return {"per_class": {int(c): ratio[targets == c].mean().item() for c in targets.unique().tolist()},
            "per_length_quartile": quartiles, "length_quartile_max_tokens": edges,
            "length_correlation": correlation, "std": ratio.std().item()}


def measure_group(dataset: str, seed: int, cfg: StudyConfig, nested: dict, records: Dict[str, dict]) -> dict:
    """Heads, FLOPs and CPU latency of every system of a data set and seed on test, side
    by side (cached: redone only when a record it was made from changed)."""
    path = cfg.records / dataset / f"latency-seed{seed}.json"
    timing = cfg.latency
    stamp = {"nested": nested["finished"], **{name: r["finished"] for name, r in records.items()},
             "timing": asdict(timing)}
    if (group := cached_record(path, made_from=stamp)) is not None:
        return group
    torch.set_num_threads(cores())  # one model at a time: every core the study may use
    models, task = systems(dataset, seed, cfg, nested, records)
    log(f"{dataset} seed {seed}: heads, FLOPs and latency of {len(models)} systems side by side")
    batches = split_batches(task, 32, "test")
    found = {}
    for name, model in models.items():
        found[name] = {"heads_per_layer": layer_heads(model, batches),
                       "model_flops": count_flops(model, batches).total}
        if name.startswith("exported"):  # the exported model computes what the dial's fixed counts compute
            found[name]["test_accuracy"] = accuracy_and_ratio(model, batches)[0]
        if name.startswith("nested @") and name != "nested @ 1":
            found[name]["spread"] = spread(model, batches, task.source_dictionary.pad())
    timed = {1: split_batches(task, 1, "test")[:timing.examples], 32: batches[:timing.batches]}
    for batch_size, timed_batches in timed.items():
        for name, seconds in zip(models, latencies(list(models.values()), timed_batches, timing.repeats)):
            found[name][f"latency_b{batch_size}_ms"] = 1000 * seconds / len(timed_batches)
    group = {"dataset": dataset, "seed": seed, "made_from": stamp, "threads": torch.get_num_threads(),
             "machine": machine_info(torch.device("cpu")), "systems": found,
             "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_json(path, group)
    return group
