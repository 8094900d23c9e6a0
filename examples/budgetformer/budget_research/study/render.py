"""The study's report as files: results/reproduce.json (every value), reproduce.md (the
tables, the targets and a paragraph, all generated from the values) and
reproduce_accuracy_vs_flops.png."""

import json
import os
import statistics
from pathlib import Path
from typing import List, Optional

import torch

from budget_plugin.tools.files import write_atomic, write_json
from budget_plugin.tools.progress import log
from budget_research import figures
from budget_research.study.plan import DESCRIPTION, RATIOS, Plan, StudyConfig
from budget_research.study.report import Results
from budget_research.timing import machine_info


def write_report(plan: Plan, res: Results) -> str:
    """reproduce.json, reproduce.md and the figure in the config's out_dir; the markdown
    printed and returned."""
    cfg = plan.cfg
    text = paragraph(res, cfg)
    figure = plot(res.rows, cfg, cfg.out_dir / "reproduce_accuracy_vs_flops.png")
    latency = cfg.latency
    write_json(cfg.out_dir / "reproduce.json", {
        "config": {"datasets": cfg.datasets, "seeds": cfg.seeds, "updates": cfg.updates, "lr": cfg.lr,
                   "ratios": RATIOS, "model": str(cfg.model_dir), "jobs": cfg.jobs, "torch": torch.__version__,
                   "latency": f"batch 1: first {latency.examples} test examples; batch 32: first "
                              f"{latency.batches} test batches; median of {latency.repeats} interleaved rounds",
                   **machine_info(torch.device("cpu"))},
        "choice_at_lower_ratio": plan.choice, "summary": res.summary,
        "spread": {f"{d}/{name}": s for (d, name), s in res.spreads.items()},
        "head_sets": {f"{d}/{name}": s for (d, name), s in res.head_sets.items()}, "targets": res.targets,
        "paragraph": text, "runs": res.rows, "other_runs": res.others, "plot": str(figure) if figure else None})
    table = markdown(res, text, cfg) + other_runs_table(res.others)
    write_atomic(cfg.out_dir / "reproduce.md", table)
    print("\n" + table)
    log(f"written {cfg.out_dir / 'reproduce.md'}, {cfg.out_dir / 'reproduce.json'}" + (f", {figure}" if figure else ""))
    return table


def head_sets_finding(sets: dict) -> str:
    share = [layer["share_at_modal_set"] for layer in sets["per_layer"]]
    agree = [layer["importance_agreement"] for layer in sets["per_layer"]]
    chance = statistics.mean(layer["chance"] for layer in sets["per_layer"])
    return (f"{min(share):.0%}-{max(share):.0%} of test inputs run their layer's most common head set; "
            f"their heads agree {min(agree):.2f}-{max(agree):.2f} with the dense model's importance ranking "
            f"(chance {chance:.2f})")


def spread_finding(spread: dict) -> str:
    stds = [layer["std"] for layer in spread["per_layer"]]
    classes = spread["per_class"].values()
    class_gap = max(max(c[i] for c in classes) - min(c[i] for c in classes) for i in range(len(stds)))
    varies = "vary with the input" if max(stds) >= 0.1 else "barely vary with the input"
    return (f"per-input budgets {varies}: std over test inputs per layer {', '.join(f'{s:.2f}' for s in stds)}; "
            f"largest gap between class means in a layer {class_gap:.2f} heads")


def paragraph(res: Results, cfg: StudyConfig) -> str:
    """What the numbers say, in one paragraph: each target's verdict with its numbers, and
    how the learned budgets and head sets vary with the input."""
    verdict = {True: "holds", False: "is missed", None: "is pending"}
    runs = sum(len(s["seeds"]) for systems in res.summary.values() for s in systems.values())
    text = [f"{runs} runs finished ({len(cfg.seeds)} seeds planned per system); their training took "
            f"{res.compute_s / 3600:.1f} hours of wall time ({cfg.jobs} trainings at a time on "
            f"{os.cpu_count()} cores)."]
    for t in res.targets:
        text.append(f"{t['dataset']}: \"{t['target']}\" {verdict[t['held']]} ({t['detail']}).")
    for (dataset, name), spread in res.spreads.items():
        sets = res.head_sets.get((dataset, name))
        text.append(f"{dataset}, {name}: {spread_finding(spread)}" + (f"; {head_sets_finding(sets)}." if sets else "."))
    return " ".join(text)


def trials_table(trials: dict) -> List[str]:
    """The recipe trials before the study (results/reproduce/trials.json), every one of them."""
    lines = ["### Recipe trials (before the study)", "", trials["about"], "",
             "| target head ratio | options | dev acc (head ratio) at each validation |", "|---|---|---|"]
    for t in trials["trials"]:
        seen = ", ".join(f"{v['dev_accuracy']:.1f} ({v['dev_head_ratio']:.3f}) @{v['updates']}"
                         for v in t["validations"])
        lines.append(f"| {t['target_head_ratio']} | `{' '.join(t['options']) or '(none)'}` | {seen} |")
    return lines + [""]


def other_runs_table(others: List[dict]) -> str:
    """Runs trained before the plan changed (another recipe, or a learned system not
    chosen any more): kept and shown, left out of the summary and the targets."""
    if not others:
        return ""
    lines = ["", "### Runs outside the current plan (kept, not in the summary or the targets)", "",
             "| data set | system | head ratio aimed at | seed | dev acc | test acc | heads/layer on dev |",
             "|---|---|---|---|---|---|---|"]
    for r in others:
        lines.append(f"| {r['dataset']} | {DESCRIPTION[r['system']]} | {r['ratio'] or 1.0} | {r['seed']} "
                     f"| {r['dev_accuracy']:.1f} | {r['test_accuracy']:.1f} "
                     f"| {statistics.mean(r['dev_heads_per_layer']):.2f} |")
    return "\n".join(lines + [""])


def head_sets_table(sets: dict) -> List[str]:
    lines = ["### Which heads the learned runs chose (test inputs, mean over seeds)", "",
             "Per layer: the share of inputs that ran the layer's most common head set, and the "
             "agreement of an input's k heads with the layer's k most important (the dense model's "
             "importance; chance k/H in brackets).", "",
             "| data set | run | seeds | inputs at the most common set, per layer | agreement with importance, "
             "per layer |", "|---|---|---|---|---|"]
    for (dataset, name), s in sets.items():
        share = " ".join(f"{layer['share_at_modal_set']:.2f}" for layer in s["per_layer"])
        agree = " ".join(f"{layer['importance_agreement']:.2f} ({layer['chance']:.2f})" for layer in s["per_layer"])
        lines.append(f"| {dataset} | {name} | {s['seeds']} | {share} | {agree} |")
    return lines + [""]


def markdown(res: Results, text: str, cfg: StudyConfig) -> str:
    """The trials, a table per data set, the learned budgets' spread and head sets, the targets, the paragraph."""
    trials = cfg.records / "trials.json"
    lines = trials_table(json.loads(trials.read_text())) if trials.exists() else []
    for dataset, systems in res.summary.items():
        lines += [f"### {dataset} (test accuracy: mean +- std over seeds; ratios against dense of the same seed)", "",
                  "| system | head ratio aimed at | seeds | test acc | per seed | dev acc | heads/layer (test) "
                  "| head ratio | attn FLOPs ratio | model FLOPs ratio | latency ratio b1 | latency ratio b32 "
                  "| train wall (s) |", "|" + "---|" * 13]
        for s in systems.values():
            per_seed = " ".join(f"{a:.1f}" for a in s["test_accuracy"])
            if "measured_seeds" in s:
                heads = " ".join(f"{h:.1f}" for h in s["heads_per_layer"])
                measured = (f"{heads} | {s['head_ratio']:.3f} | {s['attn_flops_ratio']:.3f} | {s['flops_ratio']:.3f} "
                            f"| {s['latency_b1_ratio']:.2f} | {s['latency_b32_ratio']:.2f} | {s['train_wall_s']:.0f}")
            else:
                measured = "(not measured: the seed's runs are not all done) | | | | | | "
            lines.append(f"| {DESCRIPTION[s['system']]} | {s['ratio'] or 1.0} | {len(s['seeds'])} "
                         f"| {s['test_accuracy_mean']:.2f} +- {s['test_accuracy_std']:.2f} | {per_seed} "
                         f"| {s['dev_accuracy_mean']:.2f} | {measured} |")
        lines.append("")
    for (dataset, name), spread in res.spreads.items():
        classes = list(spread["per_class"])
        lines += [f"{DESCRIPTION[name.split('-')[0]]} ({name}) on {dataset}: heads per test input "
                  f"(mean over {spread['seeds']} seeds)", "",
                  "| layer | mean | std | min | max | share at mode | "
                  + " | ".join(f"class {c}" for c in classes) + " |",
                  "|" + "---|" * (6 + len(classes))]
        for i, layer in enumerate(spread["per_layer"]):
            by_class = " | ".join(f"{spread['per_class'][c][i]:.2f}" for c in classes)
            lines.append(f"| {i} | {layer['mean']:.2f} | {layer['std']:.2f} | {layer['min']} | {layer['max']} "
                         f"| {layer['share_at_mode']:.2f} | {by_class} |")
        lines.append("")
    lines += head_sets_table(res.head_sets) if res.head_sets else []
    lines += ["### Targets", "", "| data set | target | held | numbers |", "|---|---|---|---|"]
    for t in res.targets:
        held = {True: "yes", False: "**no**", None: "pending"}[t["held"]]
        lines.append(f"| {t['dataset']} | {t['target']} | {held} | {t['detail']} |")
    return "\n".join(lines + ["", text, ""])


def plot(rows: List[dict], cfg: StudyConfig, path: Path) -> Optional[Path]:
    """Test accuracy against the whole-model FLOPs ratio, a point per run and seed."""
    plt = figures.pyplot()
    if plt is None:
        log("no matplotlib: no plot (pip install -e '.[viz]')")
        return None
    rows = [r for r in rows if "flops_ratio" in r]
    if not rows:
        return None
    fig, axes = plt.subplots(1, len(cfg.datasets), figsize=(5.5 * len(cfg.datasets), 4.2), squeeze=False)
    markers = dict(zip(DESCRIPTION, "o*PsD^v"))
    colours = {None: "black", RATIOS[0]: "tab:blue", RATIOS[1]: "tab:red"}
    for ax, dataset in zip(axes[0], cfg.datasets):
        for name in dict.fromkeys(r["name"] for r in rows if r["dataset"] == dataset):
            mine = [r for r in rows if r["dataset"] == dataset and r["name"] == name]
            ax.scatter([r["flops_ratio"] for r in mine], [r["test_accuracy"] for r in mine],
                       marker=markers[mine[0]["system"]], color=colours[mine[0]["ratio"]], alpha=0.75,
                       label=f"{DESCRIPTION[mine[0]['system']]} ({mine[0]['ratio'] or 1.0})")
        ax.set_title(f"{dataset}: one point per seed")
        ax.set_xlabel("whole-model FLOPs ratio (vs dense)")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    return figures.save(fig, path)
