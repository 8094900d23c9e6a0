"""What each width costs where a CPU user serves it: the dense model and the nested one at
each width exported to ONNX Runtime int8 (budget-export-onnx's folders, cached under
SAVE_DIR/onnx/ and exported anew only when their checkpoint changes), timed side by side
in this process on the dev split's own inputs, at batch 1 (examples one at a time) and at
batch 32, in budget_serve's session; and the user's pick, the fastest width within a
point of dense's dev accuracy. budget-finetune prints it when the export extra is
installed."""

import json
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from budget_plugin.serving.onnx_export import export_onnx, sha256
from budget_plugin.tools.evaluation import tokens
from budget_plugin.tools.rotation import rotation

DENSE = "dense"
WITHIN = 1.0  # points of dev accuracy a pick may lose against dense


def onnx_folder(checkpoint: Path, data: Path, folder: Path, width: Optional[str], log: Callable[[str], None]) -> dict:
    """The export's manifest, exported anew (with int8) unless ``folder`` holds this
    checkpoint's at this width."""
    manifest = folder / "manifest.json"
    if manifest.is_file():
        found = json.loads(manifest.read_text())
        if found["source"]["sha256"] == sha256(checkpoint) and found["setting"]["width"] == width \
                and "int8" in found["files"]:
            return found
    log(f"exporting {checkpoint} at width {width or 'whole'} to {folder}")
    return export_onnx(checkpoint, data, folder, width=width, int8=True, log=lambda line: log("    " + line))


def timed_inputs(batches: Sequence[dict], pad: int, singles: int, batch_count: int):
    """The first ``singles`` examples one at a time (their padding taken off) and the
    first ``batch_count`` batches, as int64 arrays."""
    rows = [row for sample in batches for row in tokens(sample)]
    one_at_a_time = [row[row.ne(pad)].view(1, -1).numpy() for row in rows[:singles]]
    return one_at_a_time, [tokens(sample).numpy() for sample in batches[:batch_count]]


def int8_latency(folders: Dict[str, Path], batches32: Sequence[dict], pad: int, threads: int = 2,
                 rounds: int = 5, singles: int = 64, batch_count: int = 4) -> Dict[str, Dict[str, float]]:
    """{name: {"b1": ms per example, "b32": ms per batch}}: each folder's int8 graph in
    budget_serve's session, the median over ``rounds`` rounds that time every folder in
    turn (who goes first rotates)."""
    from budget_serve.predictor import session

    runs = {name: session(folder / "model.int8.onnx", threads) for name, folder in folders.items()}
    ones, batches = timed_inputs(batches32, pad, singles, batch_count)
    found: Dict[str, Dict[str, List[float]]] = {name: {"b1": [], "b32": []} for name in runs}
    names = list(runs)
    for name in names:  # warm-up: the first run of a session allocates
        runs[name].run(None, {"tokens": batches[0]})
    for round_ in range(rounds):
        for name in (names[i] for i in rotation(len(names), round_)):
            for key, inputs in (("b1", ones), ("b32", batches)):
                start = time.perf_counter()
                for x in inputs:
                    runs[name].run(None, {"tokens": x})
                found[name][key].append(1e3 * (time.perf_counter() - start) / len(inputs))
    return {name: {key: statistics.median(values) for key, values in rows.items()} for name, rows in found.items()}


def pick(dev: Dict[str, float], latency: Dict[str, Dict[str, float]]) -> Optional[str]:
    """The width (a name of ``dev`` other than dense) fastest at batch 1 among those within
    WITHIN points of dense's dev accuracy; None if none is."""
    kept = [name for name in dev if name != DENSE and dev[name] >= dev[DENSE] - WITHIN]
    return min(kept, key=lambda name: latency[name]["b1"]) if kept else None


def width_table(dev: Dict[str, float], latency: Dict[str, Dict[str, float]], chosen: Optional[str]) -> List[str]:
    """The summary's lines: dev accuracy, int8 ms at batch 1 and 32 and their ratio to
    dense's, the pick marked."""
    base = latency[DENSE]
    lines = [f"{'':3}{'':12} {'dev acc':>8} {'int8 b1 ms':>11} {'x dense':>8} {'int8 b32 ms':>12} {'x dense':>8}"]
    for name in dev:
        row = latency[name]
        mark = "->" if name == chosen else ""
        lines.append(f"{mark:3}{name:12} {dev[name]:8.2f} {row['b1']:11.2f} {row['b1'] / base['b1']:8.2f} "
                     f"{row['b32']:12.2f} {row['b32'] / base['b32']:8.2f}")
    lines.append(f"-> the fastest width within {WITHIN:g} point of dense's dev accuracy: " +
                 (chosen or "none") + " (ONNX Runtime int8, this machine)")
    return lines


def serving_summary(save_dir: Path, data: Path, checkpoints: Dict[str, Path], dev: Dict[str, float],
                    batches32: Sequence[dict], pad: int, threads: int,
                    log: Callable[[str], None]) -> Tuple[List[str], Optional[str]]:
    """Export dense (``checkpoints["dense"]``) and each width of ``dev`` ("width R", from
    ``checkpoints["nested"]``) under SAVE_DIR/onnx/, time their int8 graphs; the summary's
    lines and the pick (a name of ``dev``, or None)."""
    folders = {}
    for name in dev:
        width = None if name == DENSE else name.split()[-1]
        folders[name] = save_dir / "onnx" / name.replace(" ", "-")
        onnx_folder(checkpoints[DENSE if width is None else "nested"], data, folders[name], width, log)
    log(f"timing every export's int8 graph on dev, batch 1 and 32, {threads} threads")
    latency = int8_latency(folders, batches32, pad, threads)
    chosen = pick(dev, latency)
    return width_table(dev, latency, chosen), chosen
