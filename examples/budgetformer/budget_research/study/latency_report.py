"""The latency study's report: a row per system, data set and seed (accuracy from the
records, heads, FLOPs and latency from the group's side-by-side timing), means over
seeds, the issue's targets held, missed or pending, a paragraph generated from the
numbers, and accuracy against batch-1 and batch-32 latency per data set, the nested
model's dial drawn as a curve. Written to results/latency.{md,json} and
results/latency_DATASET.png."""

import json
import math
from pathlib import Path
from statistics import mean
from typing import Dict, List, Optional

from budget_plugin.tools.files import write_atomic, write_json
from budget_plugin.tools.progress import log
from budget_research import figures
from budget_research.study.latency import EXPORTED
from budget_research.study.measure import load_labels
from budget_research.study.nested import DIAL
from budget_research.study.plan import Run, StudyConfig
from budget_research.study.report import mean_std

MARGIN = 0.5  # points by which the nested model at 0.3 should beat importance pruning at 0.3
SLACK = 0.3  # points of test accuracy the nested model at 0.5 may lose to dense
VALUES = ("dev_accuracy", "test_accuracy", "head_ratio", "flops_ratio", "latency_b1_ratio", "latency_b32_ratio")
BASELINES = {"dense": "dense", "importance-0.5": "importance pruning 0.5", "importance-0.3": "importance pruning 0.3",
             "importance-0.2": "importance pruning 0.2", "adaprune-0.3": "fairseq AdaPrune, 4 heads",
             "layers4": "first 4 of 6 layers"}


KINDS = {"dense": "dense", "importance": "importance pruning (ratio)", "adaprune": "fairseq AdaPrune, 4 heads (0.33)",
         "layers4": "first 4 of 6 layers", "nested": "nested, per-input budgets (the dial)",
         "fixed": "nested, fixed counts", "exported": "nested, exported"}


def label(name: str) -> str:
    if name in BASELINES:
        return BASELINES[name]
    kind, ratio = name.split(" @ ")
    return {"nested": "nested, per-input", "fixed": "nested, fixed counts",
            "exported": "nested, exported"}[kind] + f" @ {ratio}"


def accuracies(name: str, records: Dict[str, dict], nested: dict, group: dict) -> Optional[Dict[str, float]]:
    """A system's dev and test accuracy: its record's, the nested record's dial, or, for
    an exported model, its fixed counts' on dev and its own measured on test."""
    if name in records:
        return {"dev_accuracy": records[name]["dev_accuracy"], "test_accuracy": records[name]["test_accuracy"]}
    kind, ratio = name.split(" @ ")
    if kind == "exported":
        return {"dev_accuracy": nested["dial_fixed"][ratio]["valid"]["accuracy"],
                "test_accuracy": group["systems"][name]["test_accuracy"]}
    scored = nested["dial_per_input" if kind == "nested" else "dial_fixed"][ratio]
    return {"dev_accuracy": scored["valid"]["accuracy"], "test_accuracy": scored["test"]["accuracy"]}


def read_json(path: Path) -> Optional[dict]:
    return json.loads(path.read_text()) if path.exists() else None


def rows_of(cfg: StudyConfig) -> List[dict]:
    """A row per system of every data set and seed whose timing is done."""
    rows = []
    for dataset in cfg.datasets:
        for seed in cfg.seeds:
            group = read_json(cfg.records / dataset / f"latency-seed{seed}.json")
            if group is None:
                continue
            nested = read_json(Run(dataset, "nested", seed).record(cfg))
            records = {name: read_json(cfg.records / dataset / f"{name}-seed{seed}.json") for name in BASELINES}
            dense = group["systems"]["dense"]
            for name, measured in group["systems"].items():
                heads = measured["heads_per_layer"]
                rows.append({
                    "dataset": dataset, "seed": seed, "name": name, **accuracies(name, records, nested, group),
                    "heads_per_layer": heads, "head_ratio": sum(heads) / (cfg.heads * cfg.layers),
                    "flops_ratio": measured["model_flops"] / dense["model_flops"],
                    "latency_b1_ratio": measured["latency_b1_ms"] / dense["latency_b1_ms"],
                    "latency_b32_ratio": measured["latency_b32_ms"] / dense["latency_b32_ms"],
                    "latency_b1_ms": measured["latency_b1_ms"], "latency_b32_ms": measured["latency_b32_ms"],
                    **({"spread": measured["spread"]} if "spread" in measured else {}),
                })
            rows.append({"dataset": dataset, "seed": seed, "name": "dense step of the nested recipe",
                         "check": True, "dev_accuracy": nested["dense_step"]["valid"],
                         "test_accuracy": nested["dense_step"]["test"],
                         "record_dev": records["dense"]["dev_accuracy"],
                         "record_test": records["dense"]["test_accuracy"]})
    return rows


def summarise(rows: List[dict]) -> Dict[str, Dict[str, dict]]:
    """Per data set and system: the mean and std over seeds of every value, and the seeds."""
    summary: Dict[str, Dict[str, dict]] = {}
    for row in rows:
        if row.get("check"):
            continue
        mine = [r for r in rows if (r["dataset"], r["name"]) == (row["dataset"], row["name"])]
        summary.setdefault(row["dataset"], {})[row["name"]] = {
            "seeds": [r["seed"] for r in mine],
            **{key: dict(zip(("mean", "std"), mean_std([r[key] for r in mine]))) for key in VALUES}}
    return summary


def nested_curve(systems: Dict[str, dict], key: str) -> List[tuple]:
    """The nested model's per-input dial and exported models as (latency ratio, test
    accuracy, name), fastest first."""
    names = [f"nested @ {r}" for r in DIAL] + [f"exported @ {r}" for r in EXPORTED]
    return sorted((systems[n][key]["mean"], systems[n]["test_accuracy"]["mean"], n) for n in names if n in systems)


def target(dataset: str, text: str, held: Optional[bool], detail: str) -> dict:
    return {"dataset": dataset, "target": text, "held": held, "detail": detail}


def targets(summary: Dict[str, Dict[str, dict]], seeds: int) -> List[dict]:
    """The issue's targets per data set on test means (pending until every seed is in);
    the first also across data sets."""
    found, beats = [], []
    for dataset, s in summary.items():
        done = all(len(v["seeds"]) == seeds for v in s.values())

        def test(name):
            return s[name]["test_accuracy"]["mean"]

        gap = test("nested @ 0.3") - test("importance-0.3")
        std = s["nested @ 0.3"]["test_accuracy"]["std"]
        beats.append(gap >= MARGIN if done else None)
        found.append(target(dataset, f"nested @ 0.3 >= importance pruning 0.3 - one seed std ({std:.2f})",
                            (gap >= -std) if done else None, f"{gap:+.2f} points ({test('nested @ 0.3'):.2f} vs "
                            f"{test('importance-0.3'):.2f})"))
        loss = test("dense") - test("nested @ 0.5")
        found.append(target(dataset, f"nested @ 0.5 within {SLACK} of dense", (loss <= SLACK) if done else None,
                            f"{-loss:+.2f} points ({test('nested @ 0.5'):.2f} vs {test('dense'):.2f})"))
        for ratio in [r for r in DIAL if r != "1" and float(r) >= 0.3]:
            diff = test(f"nested @ {ratio}") - test(f"fixed @ {ratio}")
            found.append(target(dataset, f"per-input >= fixed counts @ {ratio}", (diff >= 0) if done else None,
                                f"{diff:+.2f} points"))
        layers_b1 = s["layers4"]["latency_b1_ratio"]["mean"]
        reach = [(acc, name, lat) for lat, acc, name in nested_curve(s, "latency_b1_ratio") if lat <= layers_b1]
        fastest = nested_curve(s, "latency_b1_ratio")[0]
        if reach:
            acc, name, lat = max(reach)
            detail = (f"{name} at b1 {lat:.3f} of dense: {acc:.2f} vs 4 layers {test('layers4'):.2f} "
                      f"(b1 {layers_b1:.3f})")
            held = acc > test("layers4")
        else:
            detail = (f"no nested setting is as fast as 4 layers (b1 {layers_b1:.3f} of dense); the fastest, "
                      f"{fastest[2]}, runs at {fastest[0]:.3f} with {fastest[1]:.2f} vs {test('layers4'):.2f}")
            held = False
        found.append(target(dataset, "nested beats 4 layers at 4 layers' b1 latency", held if done else None, detail))
    wins = [b for b in beats if b is not None]
    found.insert(0, target("all", f"nested @ 0.3 >= importance pruning 0.3 + {MARGIN} on >= 2 of 3 data sets",
                           sum(wins) >= 2 if len(wins) == len(beats) == 3 else None,
                           f"{sum(wins)} of {len(beats)} data sets at +{MARGIN} or more"
                           + ("" if len(wins) == len(beats) else f" ({len(beats) - len(wins)} not complete)")))
    return found


def fmt(value: dict, digits: int) -> str:
    return f"{value['mean']:.{digits}f} ± {value['std']:.{digits}f}"


def paragraph(summary: Dict[str, Dict[str, dict]], rows: List[dict], cfg: StudyConfig) -> str:
    """Per data set: at the latency of head ratio 0.3 the most accurate system; per-input
    against fixed budgets; one nested model against models fine-tuned for one budget; and
    where the per-input budgets differ by class or input length."""
    parts = []
    for dataset, s in summary.items():
        test = {name: v["test_accuracy"]["mean"] for name, v in s.items()}
        b1 = {name: v["latency_b1_ratio"]["mean"] for name, v in s.items()}
        at = b1["nested @ 0.3"]
        fast = {n: a for n, a in test.items() if b1[n] <= at}
        best = max(fast, key=fast.get)
        diffs = ", ".join(f"{r}: {test[f'nested @ {r}'] - test[f'fixed @ {r}']:+.2f}" for r in DIAL if r != "1")
        single = ", ".join(f"{r}: {test[f'nested @ {r}'] - test[f'importance-{r}']:+.2f}"
                           for r in ("0.5", "0.3", "0.2"))
        spreads = {r: [row["spread"] for row in rows if (row["dataset"], row["name"]) == (dataset, f"nested @ {r}")]
                   for r in DIAL if r != "1"}
        varies = ", ".join(f"{r}: {mean(sp['std'] for sp in found):.3f}" for r, found in spreads.items())
        spread = spreads["0.3"]
        names = load_labels(cfg.data_dir / f"{dataset}-bin")
        by_class = ", ".join(f"{names[int(c)]}: {mean(sp['per_class'][c] for sp in spread):.3f}"
                             for c in sorted(spread[0]["per_class"], key=int))
        quartiles = [mean(sp["per_length_quartile"][q] for sp in spread) for q in range(4)]
        correlations = [sp["length_correlation"] for sp in spread if not math.isnan(sp["length_correlation"])]
        corr = (f"length-ratio correlation {mean(correlations):+.2f}" if correlations else
                "every input as long as the others: all were cut to the same length")
        seeds = len(s["dense"]["seeds"])
        parts.append(
            f"**{dataset}** ({seeds} seed{'s' if seeds > 1 else ''}). At the batch-1 latency of the nested model at 0.3 "
            f"({at:.3f} of dense) the most accurate system is {label(best)} ({fast[best]:.2f} test; dense "
            f"{test['dense']:.2f} at 1.000). Per-input budgets against the same model's fixed counts, test points by "
            f"ratio: {diffs}; how far the inputs' head ratios spread (std over test inputs) by ratio: {varies} "
            f"(0: every input ran the fixed counts). The one nested model against importance pruning fine-tuned for "
            f"one budget: {single}. Per-input head ratio at 0.3 by gold class: {by_class}; by input-length quartile, "
            f"shortest first: {', '.join(f'{x:.3f}' for x in quartiles)} ({corr}).")
    return "\n\n".join(parts)


def markdown(summary, found: List[dict], text: str, rows: List[dict]) -> str:
    lines = ["# Latency study: accuracy against measured CPU latency", "",
             "Generated by `examples/budgetformer/latency_study.py` from the records in `results/reproduce/` (means ± std over "
             "seeds; latency and FLOPs against dense in the same process, 2 threads; test scored once, counts "
             "chosen on dev).", ""]
    for dataset, s in summary.items():
        lines += [f"## {dataset}", "", f"![accuracy against latency](latency_{dataset}.png)", "",
                  "| system | seeds | dev acc | test acc | head ratio | FLOPs / dense | b1 / dense | b32 / dense |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, v in s.items():
            lines.append(f"| {label(name)} | {len(v['seeds'])} | {fmt(v['dev_accuracy'], 2)} | "
                         f"{fmt(v['test_accuracy'], 2)} | {v['head_ratio']['mean']:.3f} | "
                         f"{v['flops_ratio']['mean']:.3f} | {fmt(v['latency_b1_ratio'], 3)} | "
                         f"{fmt(v['latency_b32_ratio'], 3)} |")
        lines.append("")
    lines += ["## Targets", "", "| data set | target | held | figure |", "|---|---|---|---|"]
    for t in found:
        held = {True: "yes", False: "**no**", None: "pending"}[t["held"]]
        lines.append(f"| {t['dataset']} | {t['target']} | {held} | {t['detail']} |")
    checks = [r for r in rows if r.get("check")]
    # fairseq-validate's log, which the records read, rounds to one decimal
    same = sum((round(r["dev_accuracy"], 1), round(r["test_accuracy"], 1)) == (r["record_dev"], r["record_test"])
               for r in checks)
    lines += ["", "## What the numbers say", "", text, "",
              f"The nested recipe's dense step retrains the accuracy study's dense run (its checkpoint was not "
              f"kept): dev and test accuracy equal the record's in {same} of {len(checks)} data sets and seeds.", ""]
    return "\n".join(lines)


def plot(dataset: str, summary: Dict[str, dict], rows: List[dict], path: Path) -> Optional[Path]:
    """Test accuracy against b1 and b32 latency (vs dense): a small point per seed, the
    mean with its std; the nested model's per-input dial and fixed counts as curves."""
    plt = figures.pyplot()
    if plt is None:
        log("no matplotlib: no plot (pip install -e '.[viz]')")
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    styles = {"dense": ("black", "o"), "importance": ("tab:orange", "s"), "adaprune": ("tab:brown", "D"),
              "layers4": ("tab:purple", "^"), "nested": ("tab:blue", "o"), "fixed": ("tab:cyan", "v"),
              "exported": ("tab:green", "*")}
    for ax, key in zip(axes, ("latency_b1_ratio", "latency_b32_ratio")):
        for kind, dashes in (("nested", "-"), ("fixed", "--")):
            curve = sorted((v[key]["mean"], v["test_accuracy"]["mean"]) for n, v in summary.items()
                           if n.startswith(kind + " @"))
            ax.plot([c[0] for c in curve], [c[1] for c in curve], dashes, color=styles[kind][0], alpha=0.6)
        labelled = set()
        for name, v in summary.items():
            kind = name.split(" @ ")[0].split("-")[0]
            colour, marker = styles[kind]
            mine = [r for r in rows if (r["dataset"], r["name"]) == (dataset, name)]
            ax.scatter([r[key] for r in mine], [r["test_accuracy"] for r in mine], color=colour, marker=marker,
                       s=12, alpha=0.35)
            ax.errorbar(v[key]["mean"], v["test_accuracy"]["mean"], xerr=v[key]["std"],
                        yerr=v["test_accuracy"]["std"], color=colour, marker=marker, markersize=7,
                        label=None if kind in labelled else KINDS[kind])
            labelled.add(kind)
            ratio = name.split(" @ ")[1] if " @ " in name else name.partition("-")[2]
            if ratio and kind != "fixed":  # the fixed counts sit at the dial's ratios
                ax.annotate(ratio, (v[key]["mean"], v["test_accuracy"]["mean"]), textcoords="offset points",
                            xytext=(4, 4), fontsize=7, color=colour)
        ax.set_xlabel(f"CPU latency at batch {key.split('_')[1][1:]} / dense (2 threads)")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0].set_title(f"{dataset}: mean ± std over seeds (small: each seed)")
    axes[1].legend(fontsize=7, loc="lower right")
    return figures.save(fig, path)


def write_report(cfg: StudyConfig) -> str:
    """results/latency.{md,json} and the plots; the markdown."""
    rows = rows_of(cfg)
    summary = summarise(rows)
    if not summary:
        log("no data set and seed is timed yet: no latency report")
        return ""
    found = targets(summary, len(cfg.seeds))
    text = paragraph(summary, rows, cfg)
    for dataset, s in summary.items():
        plot(dataset, s, rows, cfg.out_dir / f"latency_{dataset}.png")
    report = markdown(summary, found, text, rows)
    write_atomic(cfg.out_dir / "latency.md", report)
    write_json(cfg.out_dir / "latency.json", {"rows": rows, "summary": summary, "targets": found, "paragraph": text})
    log(f"wrote {cfg.out_dir / 'latency.md'}")
    return report
