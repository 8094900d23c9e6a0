"""Issue 42's study over seeds (seeds_study.py's records): each system's accuracy (mean
and standard deviation over seeds) against its latency as a share of the dense model's
on ONNX Runtime int8 (each seed's ratio in its own process, then their mean); the width a
user picks, chosen on dev; the issue's targets held or missed with their figures; one
accuracy-latency figure per data set."""

import statistics
from pathlib import Path
from typing import Dict, List, Optional

from budget_research.seeds_study import ALONE
from budget_research.width_study import DIAL_WIDTHS

ANCHOR = "dense, ONNX Runtime int8"  # what a CPU user gets without this project
DENSE = "dense, ONNX Runtime"  # dense fp32: the accuracy every width must keep (int8's loss counted)
WITHIN = 1.0
SEEDS = 3
# the batch size each data set's pick is made at: batch 32 for the short sentences, batch
# 1 for BBC News's long articles (where its target is)
PICK_BATCH = {"MR": 32, "TREC": 32, "BBC": 1}


def mean_sd(values: List[float]) -> Dict[str, float]:
    return {"mean": statistics.mean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0}


def flops(exports: Dict[str, dict], setting: str) -> float:
    """A system's FLOPs as a share of dense's (an export's ratio is of its own layers)."""
    found = exports.get(setting, exports["dense"])
    return found["model_flops_ratio"] * len(found["heads"]) / len(exports["dense"]["heads"])


def summarize(records: List[dict]) -> dict:
    """One data set's seeds: per system, accuracy and latency ratios over the seeds."""
    names = list(records[0]["systems"])
    rows = {}
    for name in names:
        found = [r["systems"][name] for r in records]
        ratios = {b: [f[f"latency_b{b}_ms"] / r["systems"][ANCHOR][f"latency_b{b}_ms"] for f, r in zip(found, records)]
                  for b in (1, 32)}
        rows[name] = {"dev": mean_sd([f["dev_accuracy"] for f in found]),
                      "test": mean_sd([f["test_accuracy"] for f in found]),
                      "b1": mean_sd(ratios[1]), "b32": mean_sd(ratios[32]),
                      "flops": flops(records[0]["exports"], name.split(", ")[0])}
    return {"dataset": records[0]["dataset"], "seeds": [r["seed"] for r in records], "systems": rows,
            "anchor_ms": {b: statistics.mean(r["systems"][ANCHOR][f"latency_b{b}_ms"] for r in records)
                          for b in (1, 32)}}


def pick(summary: dict, runtime: str = "ONNX Runtime int8") -> Optional[str]:
    """The fastest width (at the data set's pick batch) whose mean dev accuracy is within a
    point of dense fp32's: chosen on dev."""
    rows, batch = summary["systems"], f"b{PICK_BATCH[summary['dataset']]}"
    near = [w for w in DIAL_WIDTHS if rows[f"width {w}, {runtime}"]["dev"]["mean"]
            >= rows[DENSE]["dev"]["mean"] - WITHIN]
    return min(near, key=lambda w: rows[f"width {w}, {runtime}"][batch]["mean"]) if near else None


def targets(summary: dict) -> List[dict]:
    """The issue's targets on one data set, each held or missed with its figures."""
    rows, dataset, out = summary["systems"], summary["dataset"], []
    dense_test = rows[DENSE]["test"]["mean"]

    def add(target: str, held: bool, figures: str) -> None:
        out.append({"dataset": dataset, "target": target, "held": bool(held), "figures": figures})

    chosen = pick(summary)
    limits = {1: 0.5} if dataset == "BBC" else {32: 0.5, 1: 0.6}
    wanted = " and ".join(f"<= {x}x at batch {b}" for b, x in limits.items())
    if chosen is None:
        add(f"a width within {WITHIN} of dense fp32 on test at {wanted}", False, "no width within a point on dev")
    else:
        row = rows[f"width {chosen}, ONNX Runtime int8"]
        gap = row["test"]["mean"] - dense_test
        fast = all(row[f"b{b}"]["mean"] <= x for b, x in limits.items())
        add(f"a width within {WITHIN} of dense fp32 on test at {wanted} of dense int8",
            fast and gap >= -WITHIN,
            f"width {chosen} int8 (chosen on dev): test {row['test']['mean']:.2f} vs {dense_test:.2f} ({gap:+.2f}); "
            f"b1 {row['b1']['mean']:.3f}x, b32 {row['b32']['mean']:.3f}x")
    for runtime in ("ONNX Runtime", "ONNX Runtime int8"):
        row = rows[f"width 0.3, {runtime}"]
        gap = row["test"]["mean"] - dense_test
        add(f"width 0.3 ({runtime}) within {WITHIN} of dense fp32 on test", gap >= -WITHIN,
            f"{row['test']['mean']:.2f} vs {dense_test:.2f} ({gap:+.2f})")
    for width in ALONE:
        nested, alone = rows[f"width {width}, ONNX Runtime"]["test"]["mean"], \
            rows[f"width {width} alone, ONNX Runtime"]["test"]["mean"]
        add(f"nested width {width} within 0.5 of the model fine-tuned for it alone (test, fp32)",
            nested >= alone - 0.5, f"{nested:.2f} vs {alone:.2f} ({nested - alone:+.2f})")
    return out


def ordered(names) -> List[str]:
    """Systems in the report's order: dense, the nested widths, the baselines; fp32 then int8."""
    key = {n: i for i, n in enumerate(["dense", *(f"width {w}" for w in DIAL_WIDTHS),
                                       *(f"width {w} alone" for w in ALONE), "4 of 6 layers"])}
    runtimes = ("eager", "eager int8", "ONNX Runtime", "ONNX Runtime int8")
    return sorted(names, key=lambda n: (key.get(n.split(", ")[0], len(key)), runtimes.index(n.split(", ")[1])))


def report(summaries: List[dict]) -> str:
    lines = ["# One nested fine-tuning against one model per width, over seeds (issue 42)", "",
             "Generated by `examples/budgetformer/seeds_study.py` from `DATASET-seedN.json`; "
             "`README.md` says what was run and what it says.", ""]
    for s in summaries:
        partial = "" if len(s["seeds"]) >= SEEDS else f" ({len(s['seeds'])} of {SEEDS}: provisional)"
        lines += [f"## {s['dataset']}: seeds {', '.join(map(str, s['seeds']))}{partial}", "",
                  f"![{s['dataset']}]({s['dataset']}.png)", "",
                  "Latency as a share of dense on ONNX Runtime int8 in the same process (dense int8: "
                  f"{s['anchor_ms'][1]:.2f} ms at batch 1, {s['anchor_ms'][32]:.1f} ms at batch 32); "
                  "accuracy mean ± sd over the seeds.", "",
                  "| system | FLOPs | b1 | b32 | dev | test |", "|---|---|---|---|---|---|"]
        for name in ordered(s["systems"]):
            r = s["systems"][name]
            lines.append(f"| {name} | {r['flops']:.3f} | {r['b1']['mean']:.3f} | {r['b32']['mean']:.3f} | "
                         f"{r['dev']['mean']:.2f} ± {r['dev']['sd']:.2f} | "
                         f"{r['test']['mean']:.2f} ± {r['test']['sd']:.2f} |")
        lines += ["", "Targets:", ""]
        lines += [f"- {'held' if t['held'] else 'MISSED'}: {t['target']}: {t['figures']}" for t in targets(s)]
        lines.append("")
    return "\n".join(lines)


def figure(summary: dict, path: Path) -> Optional[Path]:
    """Test accuracy (mean over seeds) against latency as a share of dense int8, at batch
    1 and 32: the nested widths as lines, every other system as a marker."""
    from budget_research.figures import pyplot, save

    plt = pyplot()
    if plt is None:
        return None
    rows = summary["systems"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, batch in zip(axes, ("b1", "b32")):
        for runtime, style in (("ONNX Runtime", "o--"), ("ONNX Runtime int8", "o-")):
            names = [f"width {w}, {runtime}" for w in DIAL_WIDTHS]
            ax.plot([rows[n][batch]["mean"] for n in names], [rows[n]["test"]["mean"] for n in names], style,
                    label=f"one nested model, {runtime}")
            for w, n in zip(DIAL_WIDTHS, names):
                ax.annotate(w, (rows[n][batch]["mean"], rows[n]["test"]["mean"]), textcoords="offset points",
                            xytext=(3, 3), fontsize=7)
        for name, marker, color in (("width 0.5 alone", "s", "tab:green"), ("width 0.3 alone", "D", "tab:purple"),
                                    ("4 of 6 layers", "^", "tab:gray"), ("dense", "*", "tab:red")):
            for runtime, fill in (("ONNX Runtime", "none"), ("ONNX Runtime int8", "full")):
                r = rows[f"{name}, {runtime}"]
                ax.plot([r[batch]["mean"]], [r["test"]["mean"]], marker, color=color, markersize=9, fillstyle=fill,
                        label=f"{name}, {runtime}")
        r = rows["dense, eager int8"]
        ax.plot([r[batch]["mean"]], [r["test"]["mean"]], "kx", markersize=9, label="dense, PyTorch dynamic int8")
        ax.set_xscale("log")
        ax.set_xlabel(f"latency at batch {batch[1:]} / dense on ONNX Runtime int8 (log)")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel(f"test accuracy, mean of {len(summary['seeds'])} seeds (%)")
    axes[1].legend(fontsize=6, loc="lower right")
    fig.suptitle(f"{summary['dataset']}: one nested model against one model per width")
    return save(fig, path)
