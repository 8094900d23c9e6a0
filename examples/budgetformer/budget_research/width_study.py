"""The width dial on one data set and seed (examples/budgetformer/width_study.py), from
budget-finetune's SAVE_DIR: accuracy against measured CPU latency, beside dense and the
latency study's baselines.

Systems, side by side in one process (interleaved rounds, budget_research/timing.py):

* ``dense``: the recipe's dense checkpoint, fairseq's own ``roberta``;
* ``width R``: the nested checkpoint exported at width R (each layer's heads and FFN
  neurons physically cut, allocated as its dial allocates them): what one would ship;
* ``heads R``: exported at the head counts its dial runs on dev at R, every FFN neuron
  kept (today's kind of setting);
* ``per-input R``: the nested model itself, the router's per-input head budgets at mean
  ratio R and the FFN cut to width R's neurons (is per-input worth it at these widths?);
* ``heads per-input R``: the router's budgets at R, every neuron (the latency study's
  ``nested @ R``);
* ``4 of 6 layers``: the dense model's first four layers, timed here; its accuracy is the
  latency study's record of that system (trained so) for this seed.

Accuracy on dev and test (test scored once, nothing chosen on it), the encoder's FLOPs
on test, latency at batch 1 (the first ``singles`` test sentences, one at a time) and
32 (the first ``batches`` batches).

Cascades inside the one model: run width ``small``; where the top class probability is
under a threshold, run width ``large`` too. Each example's probabilities at every width
come from the exports; a cascade's batch-1 latency is small's + the escalated share x
large's (measured above). For every fixed width W, the cascade (pair and threshold)
with the best dev accuracy at a dev latency no more than W's is found on dev, then
scored on test."""

import copy
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from budget_plugin.dial.settings import Dial
from budget_plugin.dial.width import WIDTHS
from budget_plugin.nested.export import dialled_counts, pruned_checkpoint
from budget_plugin.tools.checkpoints import as_budgetformer, load_checkpoint, read
from budget_plugin.tools.evaluation import classify, count_flops, scored, split_batches, tokens
from budget_research.benchmark.dial import dialled
from budget_research.timing import latencies, machine_info

DIAL_WIDTHS = ("1", *WIDTHS)
HEAD_RATIOS = ("0.5", "0.3")
LAYERS_KEPT = 4


def first_layers(model, kept: int):
    """A copy of ``model`` with its first ``kept`` layers only (physically)."""
    cut = copy.deepcopy(model)
    encoder = cut.encoder.sentence_encoder
    encoder.layers = torch.nn.ModuleList(list(encoder.layers)[:kept])
    encoder.num_layers = kept
    return cut.eval()


@torch.no_grad()
def probabilities(model, batches: Sequence[dict]) -> torch.Tensor:
    """N x classes: each example's class probabilities."""
    return torch.cat([classify(model, tokens(sample))[0].float().softmax(-1) for sample in batches])


def gold_labels(batches: Sequence[dict]) -> torch.Tensor:
    return torch.cat([sample["target"].view(-1) for sample in batches])


def cascade(small: torch.Tensor, large: torch.Tensor, gold: torch.Tensor, threshold: float):
    """Accuracy (%) and escalated share of running ``large`` where ``small``'s top
    probability is under ``threshold``."""
    escalate = small.max(-1).values < threshold
    predicted = torch.where(escalate, large.argmax(-1), small.argmax(-1))
    return 100 * (predicted == gold).float().mean().item(), escalate.float().mean().item()


def best_cascades(probs: Dict[str, Dict[str, torch.Tensor]], gold: Dict[str, torch.Tensor],
                  latency: Dict[str, float], fixed: Dict[str, Dict[str, float]]) -> List[dict]:
    """For each fixed width W: the cascade (small < large widths, a threshold that
    escalates some dev examples but not all) with the best dev accuracy whose dev
    batch-1 latency (a share of dense's) is at most W's; then its test accuracy and
    latency at that threshold."""
    widths = sorted(probs, key=lambda w: latency[w])
    found = []
    for at in widths:
        best = None
        for i, small in enumerate(widths):
            for large in widths[i + 1:]:
                dev_small, dev_large = probs[small]["valid"], probs[large]["valid"]
                for threshold in sorted(set(dev_small.max(-1).values.tolist()) | {0.0, 1.01}):
                    accuracy, share = cascade(dev_small, dev_large, gold["valid"], threshold)
                    cost = latency[small] + share * latency[large]
                    if 0 < share < 1 and cost <= latency[at] + 1e-9 and (best is None or accuracy > best["dev_accuracy"] + 1e-9):
                        best = {"small": small, "large": large, "threshold": threshold, "dev_accuracy": accuracy,
                                "dev_escalated": share, "dev_latency_b1": cost}
        if best is None:
            continue
        test_accuracy, share = cascade(probs[best["small"]]["test"], probs[best["large"]]["test"], gold["test"],
                                       best["threshold"])
        found.append({"at": at, **best, "test_accuracy": test_accuracy, "test_escalated": share,
                      "test_latency_b1": latency[best["small"]] + share * latency[best["large"]],
                      "fixed_dev_accuracy": fixed[at]["dev_accuracy"], "fixed_test_accuracy": fixed[at]["test_accuracy"],
                      "fixed_latency_b1": latency[at]})
    return found


def systems(save_dir: Path, data: Path):
    """The models, by name, the nested model, its task and the exports' widths."""
    nested_path = save_dir / "nested" / "checkpoint_best.pt"
    nested, task = load_checkpoint(nested_path, data)
    dense = load_checkpoint(save_dir / "dense" / "checkpoint_best.pt", data)[0]
    state = read(nested_path)
    dev = split_batches(task, 32, "valid")
    found, cuts = {"dense": dense}, {}
    for width in DIAL_WIDTHS:
        cut = nested.width_dial(width)
        cuts[f"width {width}"] = cut
        found[f"width {width}"] = as_budgetformer(pruned_checkpoint(state, list(cut.counts), list(cut.neurons)))
    for ratio in HEAD_RATIOS:
        counts = dialled_counts(nested, dev, ratio)
        cuts[f"heads {ratio}"] = Dial(counts=tuple(counts))
        found[f"heads {ratio}"] = as_budgetformer(pruned_checkpoint(state, counts))
        found[f"heads per-input {ratio}"] = dialled(nested, ratio)
    for width in ("0.5", "0.3"):
        per_input = Dial(shift=nested.dial_shift(float(width)), neurons=nested.width_dial(width).neurons)
        cuts[f"per-input {width}"] = per_input
        model = copy.deepcopy(nested).eval()
        model.dial_setting = per_input  # the model's own setting: what its forward runs
        found[f"per-input {width}"] = model
    found[f"{LAYERS_KEPT} of 6 layers"] = first_layers(dense, LAYERS_KEPT)
    return found, nested, task, cuts


def baseline_records(records: Optional[Path], dataset: str, seed: int) -> Dict[str, dict]:
    """The latency study's records of this data set and seed: accuracy (its records)
    and latency against dense (its own process), by system."""
    if records is None or not (records / dataset / f"latency-seed{seed}.json").is_file():
        return {}
    timed = json.loads((records / dataset / f"latency-seed{seed}.json").read_text())["systems"]
    found = {}
    for name in ("importance-0.2", "importance-0.3", "importance-0.5", "adaprune-0.3", "layers4"):
        path = records / dataset / f"{name}-seed{seed}.json"
        if name in timed and path.is_file():
            record = json.loads(path.read_text())
            found[name] = {"dev_accuracy": record["dev_accuracy"], "test_accuracy": record["test_accuracy"],
                           "latency_b1": timed[name]["latency_b1_ms"] / timed["dense"]["latency_b1_ms"],
                           "latency_b32": timed[name]["latency_b32_ms"] / timed["dense"]["latency_b32_ms"]}
    nested = records / dataset / f"nested-seed{seed}.json"
    if nested.is_file():
        record = json.loads(nested.read_text())
        for kind, key in (("per_input", "dial_per_input"), ("fixed", "dial_fixed")):
            for ratio, row in record[key].items():
                found[f"nested {kind} @ {ratio}"] = {"dev_accuracy": row["valid"]["accuracy"],
                                                     "test_accuracy": row["test"]["accuracy"]}
    return found


def width_study(save_dir: Path, data: Path, dataset: str, seed: int, records: Optional[Path] = None,
                threads: int = 2, singles: int = 64, batches: int = 8, repeats: int = 5, log=print) -> dict:
    """Every system's accuracy, FLOPs and latency, the cascades, and the study's
    baselines for the figure and the targets."""
    torch.set_num_threads(threads)
    models, nested, task, cuts = systems(save_dir, data)
    splits = {split: split_batches(task, 32, split) for split in ("valid", "test")}
    baselines = baseline_records(records, dataset, seed)
    found = {}
    for name, model in models.items():
        row = {}
        for split, split_batches_ in splits.items():
            key = f"{'dev' if split == 'valid' else 'test'}_accuracy"
            if name == f"{LAYERS_KEPT} of 6 layers":  # trained as such in the study: its record
                row[key] = baselines.get("layers4", {}).get(key)
            else:
                row[key] = scored(model, split_batches_).accuracy
        row["model_flops"] = count_flops(model, splits["test"]).total
        if name in cuts:
            cut = cuts[name]
            row["setting"] = {"counts": cut.counts, "neurons": cut.neurons, "shift": cut.shift}
        found[name] = row
        log(f"{name}: dev {row['dev_accuracy']}, test {row['test_accuracy']}")
    timed = {1: split_batches(task, 1, "test")[:singles], 32: splits["test"][:batches]}
    for batch_size, timed_batches in timed.items():
        log(f"latency at batch {batch_size}: {len(models)} systems, {repeats} interleaved rounds")
        for name, seconds in zip(models, latencies(list(models.values()), timed_batches, repeats)):
            found[name][f"latency_b{batch_size}_ms"] = 1000 * seconds / len(timed_batches)
    dense = found["dense"]
    for row in found.values():
        row["model_flops_ratio"] = row["model_flops"] / dense["model_flops"]
        for b in (1, 32):
            row[f"latency_b{b}"] = row[f"latency_b{b}_ms"] / dense[f"latency_b{b}_ms"]
    widths = [f"width {w}" for w in DIAL_WIDTHS]
    probs = {name: {split: probabilities(models[name], b) for split, b in splits.items()} for name in widths}
    gold = {split: gold_labels(b) for split, b in splits.items()}
    cascades = best_cascades(probs, gold, {name: found[name]["latency_b1"] for name in widths}, found)
    return {"dataset": dataset, "seed": seed, "save_dir": str(save_dir), "threads": threads,
            "timing": {"singles": singles, "batches": batches, "repeats": repeats},
            "machine": machine_info(torch.device("cpu")), "systems": found, "cascades": cascades,
            "baselines": baselines}


def targets(study: dict) -> List[dict]:
    """Issue 34's targets, each held or missed with its figures (choices made on dev)."""
    found, base = study["systems"], study["baselines"]
    dense = found["dense"]
    rows = []

    def add(target: str, held: bool, figures: str) -> None:
        rows.append({"target": target, "held": held, "figures": figures})

    full = found["width 1"]["dev_accuracy"] - dense["dev_accuracy"]
    add("full width within 0.3 of dense on dev", full >= -0.3,
        f"dev {found['width 1']['dev_accuracy']:.2f} vs dense {dense['dev_accuracy']:.2f} ({full:+.2f})")
    for mine, theirs in (("width 1", "nested per_input @ 1"), *((f"heads per-input {r}", f"nested per_input @ {r}")
                                                                 for r in HEAD_RATIOS),
                         *((f"heads {r}", f"nested fixed @ {r}") for r in HEAD_RATIOS)):
        if theirs in base:
            gap = found[mine]["dev_accuracy"] - base[theirs]["dev_accuracy"]
            add(f"heads-only {mine} within 0.3 of the heads-only record ({theirs}) on dev", gap >= -0.3,
                f"dev {found[mine]['dev_accuracy']:.2f} vs record {base[theirs]['dev_accuracy']:.2f} ({gap:+.2f})")
    widths = [name for name in found if name.startswith("width ")]

    def best_under(latency: float) -> Optional[str]:
        fast = [name for name in widths if found[name]["latency_b1"] <= latency]
        return max(fast, key=lambda name: found[name]["dev_accuracy"], default=None)

    half = best_under(0.55)
    if half is None:
        add("a setting at most 0.55x dense at batch 1, within 1.0 of dense on dev and test", False,
            "no width reaches 0.55x: the fastest is " +
            f"{min(found[name]['latency_b1'] for name in widths):.2f}x")
    else:
        row = found[half]
        gaps = [row[f"{s}_accuracy"] - dense[f"{s}_accuracy"] for s in ("dev", "test")]
        add("a setting at most 0.55x dense at batch 1, within 1.0 of dense on dev and test",
            min(gaps) >= -1.0, f"{half} (the most accurate on dev under 0.55x): {row['latency_b1']:.2f}x, dev "
            f"{row['dev_accuracy']:.2f} ({gaps[0]:+.2f}), test {row['test_accuracy']:.2f} ({gaps[1]:+.2f})")
    layers = found[f"{LAYERS_KEPT} of 6 layers"]
    if "layers4" in base:
        match = best_under(layers["latency_b1"])
        if match is None:
            add("at the 4-layer model's batch-1 latency, 1.0 more accurate than it", False,
                f"no width is as fast as 4 of 6 layers ({layers['latency_b1']:.2f}x)")
        else:
            row = found[match]
            gaps = [row[f"{s}_accuracy"] - base["layers4"][f"{s}_accuracy"] for s in ("dev", "test")]
            add("at the 4-layer model's batch-1 latency, 1.0 more accurate than it (dev and test)",
                min(gaps) >= 1.0, f"{match} at {row['latency_b1']:.2f}x (4 of 6 layers: {layers['latency_b1']:.2f}x "
                f"here): dev {row['dev_accuracy']:.2f} vs {base['layers4']['dev_accuracy']:.2f} ({gaps[0]:+.2f}), "
                f"test {row['test_accuracy']:.2f} vs {base['layers4']['test_accuracy']:.2f} ({gaps[1]:+.2f})")
    return rows


def counts_text(setting: Optional[dict]) -> str:
    if not setting:
        return ""
    heads = "/".join(map(str, setting["counts"])) if setting["counts"] else "per input"
    neurons = "/".join(map(str, setting["neurons"])) if setting["neurons"] else "all"
    return f"{heads} ; {neurons}"


def report(study: dict) -> str:
    """The markdown of one data set's study."""
    found = study["systems"]
    lines = [f"## {study['dataset']} (seed {study['seed']})", "",
             f"![accuracy against batch-1 latency]({study['dataset']}-seed{study['seed']}.png)", "",
             "| system | heads ; FFN neurons per layer | FLOPs / dense | b1 / dense | b32 / dense | dev acc "
             "| test acc |",
             "|---|---|---|---|---|---|---|"]
    for name, row in found.items():
        accuracy = " | ".join("-" if row[key] is None else f"{row[key]:.2f}" for key in ("dev_accuracy",
                                                                                       "test_accuracy"))
        lines.append(f"| {name} | {counts_text(row.get('setting'))} | {row['model_flops_ratio']:.3f} | "
                     f"{row['latency_b1']:.3f} | {row['latency_b32']:.3f} | {accuracy} |")
    dense = found["dense"]
    lines += ["", f"Dense: {dense['latency_b1_ms']:.2f} ms at batch 1, {dense['latency_b32_ms']:.1f} ms at batch 32 "
              f"({study['threads']} threads). The 4-layer model's accuracy is the latency study's record; "
              "it is timed here.", "", "Cascades (the best on dev at each fixed width's latency; then test once):", "",
              "| at the latency of | cascade | threshold | escalated dev / test | b1 dev / test | dev acc (fixed) "
              "| test acc (fixed) |", "|---|---|---|---|---|---|---|"]
    for row in study["cascades"]:
        lines.append(f"| {row['at']} ({row['fixed_latency_b1']:.3f}) | {row['small']} -> {row['large']} | "
                     f"{row['threshold']:.3f} | {row['dev_escalated']:.2f} / {row['test_escalated']:.2f} | "
                     f"{row['dev_latency_b1']:.3f} / {row['test_latency_b1']:.3f} | {row['dev_accuracy']:.2f} "
                     f"({row['fixed_dev_accuracy']:.2f}) | {row['test_accuracy']:.2f} ({row['fixed_test_accuracy']:.2f}) |")
    lines += ["", "Targets:", ""] + [f"- {'held' if t['held'] else 'MISSED'}: {t['target']}: {t['figures']}"
                                     for t in study["targets"]]
    return "\n".join(lines) + "\n"


def figure(study: dict, path: Path) -> Optional[Path]:
    """Test accuracy against batch-1 latency (a share of dense's): the width dial, the
    heads-only settings, per-input widths, the cascades and the study's baselines."""
    from budget_research.figures import pyplot, save

    plt = pyplot()
    if plt is None:
        return None
    found, base = study["systems"], study["baselines"]
    fig, ax = plt.subplots(figsize=(7, 4.5))

    def series(names: Sequence[str], label: str, style: str) -> None:
        rows = [found[n] for n in names if n in found]
        ax.plot([r["latency_b1"] for r in rows], [r["test_accuracy"] for r in rows], style, label=label)

    series([f"width {w}" for w in DIAL_WIDTHS], "--width R (exported)", "o-")
    for w in DIAL_WIDTHS:
        row = found[f"width {w}"]
        ax.annotate(w, (row["latency_b1"], row["test_accuracy"]), textcoords="offset points", xytext=(4, 4),
                    fontsize=8)
    series([f"heads {r}" for r in HEAD_RATIOS], "--head-ratio R, heads only (exported)", "s")
    series([f"per-input {w}" for w in ("0.5", "0.3")], "per-input heads at width R", "^")
    layers = found[f"{LAYERS_KEPT} of 6 layers"]
    if layers["test_accuracy"] is not None:
        ax.plot([layers["latency_b1"]], [layers["test_accuracy"]], "v", label="4 of 6 layers (timed here)")
    cascades = study["cascades"]
    ax.plot([c["test_latency_b1"] for c in cascades], [c["test_accuracy"] for c in cascades], "x",
            label="cascades (chosen on dev)")
    ax.plot([1.0], [found["dense"]["test_accuracy"]], "k*", markersize=12, label="dense")
    timed = [(name, row) for name, row in base.items() if "latency_b1" in row]
    if timed:
        ax.plot([row["latency_b1"] for _, row in timed], [row["test_accuracy"] for _, row in timed], "D",
                color="grey", label="latency study's baselines (its process)")
        for name, row in timed:
            ax.annotate(name, (row["latency_b1"], row["test_accuracy"]), textcoords="offset points", xytext=(4, -10),
                        fontsize=7, color="grey")
    ax.set_xlabel("batch-1 latency / dense (CPU, 2 threads)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{study['dataset']}, seed {study['seed']}: one nested model's width dial")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return save(fig, path)
