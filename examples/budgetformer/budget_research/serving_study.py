"""Serving where CPU users serve (issue 35), on one data set and seed, from
budget-finetune's SAVE_DIR: the dense model and every width of the dial in the three
runtimes a CPU user picks from, side by side in one process (interleaved rounds,
budget_research/timing.py), on the data's real test sentences.

Systems:

* ``dense, eager``: the recipe's dense checkpoint, fairseq's own ``roberta`` (the anchor
  a user has without this project);
* ``dense, eager int8``: PyTorch's dynamic int8 of it (``quantize_dynamic`` on the Linear
  layers of its plain module, serving/plain_model.py: fairseq's attention reads its
  projections' weights directly, which a quantized Linear does not hold);
* ``dense, ONNX Runtime`` and ``dense, ONNX Runtime int8``: budget-export-onnx of it;
* ``width R, eager``: the nested checkpoint exported (physically cut) at width R, in
  fairseq; ``width R, ONNX Runtime`` and ``width R, ONNX Runtime int8``: the same cut
  exported by budget-export-onnx.

Accuracy on dev and test (test scored once: settings are chosen on dev), latency at
batch 1 (the first ``singles`` test sentences, one at a time) and 32 (the first
``batches`` batches), ``threads`` threads for torch and ONNX Runtime alike. The ONNX
folders are cached under SAVE_DIR/onnx/ (re-exported when their checkpoint changes)."""

import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

from budget_plugin.nested.export import pruned_checkpoint
from budget_plugin.serving.plain_model import PlainClassifier
from budget_plugin.serving.width_latency import onnx_folder
from budget_plugin.tools.checkpoints import as_budgetformer, load_checkpoint, read
from budget_plugin.tools.evaluation import classify, split_batches, tokens
from budget_research.timing import machine_info, steady_latencies
from budget_research.width_study import DIAL_WIDTHS
from budget_serve.predictor import session

RUNTIMES = ("eager", "ONNX Runtime", "ONNX Runtime int8")


def onnx_run(folder: Path, kind: str, threads: int) -> Callable[[torch.Tensor], torch.Tensor]:
    runtime = session(folder / ("model.int8.onnx" if kind == "int8" else "model.onnx"), threads)
    return lambda x: torch.from_numpy(runtime.run(None, {"tokens": x.numpy()})[0])


def onnx_runs(name: str, folder: Path, threads: int) -> Dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """An export's two graphs, fp32 and int8, as ``NAME, ONNX Runtime`` and ``NAME, ONNX Runtime int8``."""
    return {f"{name}, ONNX Runtime": onnx_run(folder, "fp32", threads),
            f"{name}, ONNX Runtime int8": onnx_run(folder, "int8", threads)}


def dense_runs(dense) -> Dict[str, Callable]:
    """The dense fairseq model in PyTorch eager, and PyTorch's dynamic int8 of it."""
    with warnings.catch_warnings():  # torch's notice that its quantized tensors will be deprecated
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(PlainClassifier(dense), {torch.nn.Linear},
                                                           dtype=torch.qint8)
    return {"dense, eager": lambda x: classify(dense, x)[0], "dense, eager int8": quantized}


def systems(save_dir: Path, data: Path, threads: int, widths=DIAL_WIDTHS,
            log=print) -> Tuple[Dict[str, Callable], Dict[str, dict], object]:
    """Each system's run (tokens -> logits) by name, the ONNX manifests by name, the task:
    dense and, for each of ``widths``, the nested model's export, in every runtime."""
    dense_path, nested_path = save_dir / "dense" / "checkpoint_best.pt", save_dir / "nested" / "checkpoint_best.pt"
    dense, task = load_checkpoint(dense_path, data)
    nested = load_checkpoint(nested_path, data)[0]
    state = read(nested_path)
    runs = dense_runs(dense)
    manifests = {"dense": onnx_folder(dense_path, data, save_dir / "onnx" / "dense", None, log)}
    for width in widths:
        cut = nested.width_dial(width)
        model = as_budgetformer(pruned_checkpoint(state, list(cut.counts), list(cut.neurons)))
        runs[f"width {width}, eager"] = lambda x, model=model: classify(model, x)[0]
        manifests[f"width {width}"] = onnx_folder(nested_path, data, save_dir / "onnx" / f"width-{width}", width, log)
    for name in manifests:
        runs.update(onnx_runs(name, save_dir / "onnx" / name.replace(" ", "-"), threads))
    return runs, manifests, task


@torch.no_grad()
def accuracy(run: Callable[[torch.Tensor], torch.Tensor], batches: List[dict]) -> float:
    right = total = 0
    for sample in batches:
        right += int((run(tokens(sample)).argmax(-1) == sample["target"].view(-1)).sum())
        total += sample["target"].numel()
    return 100.0 * right / total


def measured(runs: Dict[str, Callable], task, singles: int, batches: int, repeats: int, log=print,
             timed_split: str = "test", max_repeats: Optional[int] = None) -> Dict[str, dict]:
    """Each run's dev and test accuracy and its latency at batch 1 and 32 (ms) on
    ``timed_split``'s first inputs, interleaved: ``repeats`` rounds, or with ``max_repeats``
    from ``repeats`` up to it until every median is steady (timing.steady_latencies; the
    rounds taken are each row's ``rounds_b1`` and ``rounds_b32``)."""
    splits = {split: split_batches(task, 32, split) for split in ("valid", "test")}
    found = {name: {f"{'dev' if split == 'valid' else 'test'}_accuracy": accuracy(run, b)
                    for split, b in splits.items()} for name, run in runs.items()}
    timed = {1: split_batches(task, 1, timed_split)[:singles], 32: splits[timed_split][:batches]}
    for batch_size, timed_batches in timed.items():
        seconds, rounds = steady_latencies(list(runs.values()), timed_batches, repeats, max_repeats or repeats)
        log(f"latency at batch {batch_size}: {len(runs)} systems, {rounds} interleaved rounds")
        for name, value in zip(runs, seconds):
            found[name].update({f"latency_b{batch_size}_ms": 1000 * value / len(timed_batches),
                                f"rounds_b{batch_size}": rounds})
    return found


@torch.no_grad()
def onnx_equality(runs: Dict[str, Callable], task, split: str = "test") -> Dict[str, float]:
    """The largest difference of each ONNX fp32 graph's logits from its fairseq model's on
    ``split`` (the exports check themselves on dev), by setting."""
    batches = split_batches(task, 32, split)
    found = {}
    for name in runs:
        setting = name[:-len(", eager")]
        if name.endswith(", eager") and f"{setting}, ONNX Runtime" in runs:
            graph, model = runs[f"{setting}, ONNX Runtime"], runs[name]
            found[setting] = max(float((graph(tokens(b)) - model(tokens(b))).abs().max()) for b in batches)
    return found


def serving_study(save_dir: Path, data: Path, dataset: str, seed: int, threads: int = 2, singles: int = 64,
                  batches: int = 8, repeats: int = 5, log=print) -> dict:
    torch.set_num_threads(threads)
    runs, manifests, task = systems(save_dir, data, threads, log=log)
    found = measured(runs, task, singles, batches, repeats, log)
    return {"dataset": dataset, "seed": seed, "save_dir": str(save_dir), "threads": threads,
            "test_max_abs_logit_difference": onnx_equality(runs, task),
            "timing": {"singles": singles, "batches": batches, "repeats": repeats},
            "machine": machine_info(torch.device("cpu")), "systems": found,
            "exports": {name: {key: m[key] for key in ("heads", "neurons", "model_flops_ratio", "checked_on")}
                        for name, m in manifests.items()}}


def ratio(study: dict, name: str, anchor: str, batch: int) -> float:
    found = study["systems"]
    return found[name][f"latency_b{batch}_ms"] / found[anchor][f"latency_b{batch}_ms"]


def targets(study: dict) -> List[dict]:
    """Issue 35's targets, each held or missed with its figures. The setting is chosen on
    dev: the fastest width (ONNX Runtime, batch 1) within 1.0 point of dense on dev."""
    found, out = study["systems"], []

    def add(target: str, held: bool, figures: str) -> None:
        out.append({"target": target, "held": bool(held), "figures": figures})

    def chosen(runtime: str, anchor: str) -> Optional[str]:
        near = [f"width {w}" for w in DIAL_WIDTHS
                if found[f"width {w}, {runtime}"]["dev_accuracy"] >= found[anchor]["dev_accuracy"] - 1.0]
        return min(near, key=lambda n: found[f"{n}, {runtime}"]["latency_b1_ms"]) if near else None

    dense = "dense, ONNX Runtime"
    fp32 = chosen("ONNX Runtime", dense)
    if fp32 is None:
        add("fp32: a width within 1.0 of dense on dev", False, "none")
    else:
        row = found[f"{fp32}, ONNX Runtime"]
        b1, b32 = ratio(study, f"{fp32}, ONNX Runtime", dense, 1), ratio(study, f"{fp32}, ONNX Runtime", dense, 32)
        test_gap = row["test_accuracy"] - found[dense]["test_accuracy"]
        add(f"fp32: {fp32} (chosen on dev) on ONNX Runtime within 1.0 of dense on test, at most 0.6x dense ONNX "
            "Runtime at batch 1 and 32", b1 <= 0.6 and b32 <= 0.6 and test_gap >= -1.0,
            f"test {row['test_accuracy']:.2f} vs {found[dense]['test_accuracy']:.2f} ({test_gap:+.2f}); "
            f"b1 {b1:.3f}, b32 {b32:.3f}")
    int8 = chosen("ONNX Runtime int8", dense)  # int8's own loss counted: against dense fp32
    if int8 is None:
        add("int8: a width within 1.0 of dense fp32 on dev", False, "none")
    else:
        name = f"{int8}, ONNX Runtime int8"
        row = found[name]
        b1 = ratio(study, name, "dense, ONNX Runtime int8", 1)
        test_gap = row["test_accuracy"] - found[dense]["test_accuracy"]
        add(f"int8: {int8} (chosen on dev) on ONNX Runtime int8 within 1.0 of dense fp32 on test, at most 0.7x "
            "dense ONNX Runtime int8 at batch 1", b1 <= 0.7 and test_gap >= -1.0,
            f"test {row['test_accuracy']:.2f} ({test_gap:+.2f}); b1 {b1:.3f} "
            f"(b32 {ratio(study, name, 'dense, ONNX Runtime int8', 32):.3f})")
        against = ratio(study, name, "dense, eager int8", 1)
        add("int8 export at least 2x faster than PyTorch's dynamic int8 of dense at batch 1", against <= 0.5,
            f"{against:.3f}x its latency ({1 / against:.2f}x faster)")
    worst = max(export["checked_on"]["max_abs_logit_difference"]["fp32"] for export in study["exports"].values())
    add("fp32 ONNX logits equal fairseq's within 1e-4 (dev, every export)", worst < 1e-4, f"largest {worst:.1e}")
    if "test_max_abs_logit_difference" in study:
        worst = max(study["test_max_abs_logit_difference"].values())
        add("fp32 ONNX logits equal fairseq's within 1e-4 (test, every export)", worst < 1e-4, f"largest {worst:.1e}")
    return out


def report(study: dict) -> str:
    found = study["systems"]
    lines = [f"## {study['dataset']} (seed {study['seed']})", "",
             f"![accuracy against batch-1 latency]({study['dataset']}-seed{study['seed']}.png)", "",
             "| system | FLOPs / dense | b1 / dense eager | b32 / dense eager | b1 / dense, same runtime "
             "| b32 / dense, same runtime | dev acc | test acc |", "|---|---|---|---|---|---|---|---|"]
    for name, row in found.items():
        setting, runtime = name.split(", ", 1)
        anchor = f"dense, {runtime}"
        flops = study["exports"].get(setting, {}).get("model_flops_ratio", 1.0)
        lines.append(f"| {name} | {flops:.3f} | {ratio(study, name, 'dense, eager', 1):.3f} | "
                     f"{ratio(study, name, 'dense, eager', 32):.3f} | {ratio(study, name, anchor, 1):.3f} | "
                     f"{ratio(study, name, anchor, 32):.3f} | {row['dev_accuracy']:.2f} | {row['test_accuracy']:.2f} |")
    dense = found["dense, eager"]
    lines += ["", f"Dense in eager: {dense['latency_b1_ms']:.2f} ms at batch 1, {dense['latency_b32_ms']:.1f} ms at "
              f"batch 32 ({study['threads']} threads for torch and ONNX Runtime).", "", "Targets:", ""]
    lines += [f"- {'held' if t['held'] else 'MISSED'}: {t['target']}: {t['figures']}" for t in study["targets"]]
    return "\n".join(lines) + "\n"


def figure(study: dict, path: Path) -> Optional[Path]:
    """Test accuracy against batch-1 latency (a share of dense in eager) for every width
    in each runtime, dense in each, and PyTorch's dynamic int8 of dense."""
    from budget_research.figures import pyplot, save

    plt = pyplot()
    if plt is None:
        return None
    found = study["systems"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for runtime, style in zip(RUNTIMES, ("o-", "s-", "^-")):
        names = [f"width {w}, {runtime}" for w in DIAL_WIDTHS]
        line, = ax.plot([ratio(study, n, "dense, eager", 1) for n in names],
                        [found[n]["test_accuracy"] for n in names], style, label=f"--width R, {runtime}")
        dense = f"dense, {runtime}"
        ax.plot([ratio(study, dense, "dense, eager", 1)], [found[dense]["test_accuracy"]], "*", markersize=12,
                color=line.get_color(), label=f"dense, {runtime}")
        for w, n in zip(DIAL_WIDTHS, names):
            ax.annotate(w, (ratio(study, n, "dense, eager", 1), found[n]["test_accuracy"]),
                        textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.plot([ratio(study, "dense, eager int8", "dense, eager", 1)], [found["dense, eager int8"]["test_accuracy"]],
            "kx", markersize=9, label="dense, PyTorch dynamic int8")
    ax.set_xscale("log")
    ax.set_xlabel("batch-1 latency / dense in PyTorch eager (CPU, log scale)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{study['dataset']}, seed {study['seed']}: the width dial in three runtimes")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    return save(fig, path)
