"""Throughput where a production host serves (issue 41): budget_serve's ``Predictor``
(text in, label out: tokenization and batching included) on the data's real test
sentences, for the dense model and every width of the dial, fp32 and int8, each
exported as a user exports it (budget-export-onnx, cached under SAVE_DIR/onnx/ as the
serving study caches them). Three ways a host serves:

* ``1 caller, b1``: one request at a time, requests per second;
* ``4 callers, b1``: four threads sending one request at a time to one shared
  predictor (a web server's workers), requests per second in all;
* ``batch job, b32``: every text in batches of 32, texts per second.

Every predictor runs ``threads`` intra-op threads. The systems are timed in rounds that
interleave them (who goes first rotates); each figure is the median over rounds, and
each is also given against the dense model's int8 export in the same round's terms."""

import statistics
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

from budget_plugin.serving.width_latency import onnx_folder
from budget_plugin.tools.rotation import rotation
from budget_serve import Predictor

SCENARIOS = ("1 caller, b1", "4 callers, b1", "batch job, b32")
BASELINE = "dense, int8"


def one_caller(predictor, texts: Sequence[str]) -> float:
    """Requests per second, one text a request, one at a time."""
    start = time.perf_counter()
    for text in texts:
        predictor.predict([text])
    return len(texts) / (time.perf_counter() - start)


def callers(predictor, texts: Sequence[str], count: int = 4) -> float:
    """Requests per second in all, ``count`` threads each sending its share of ``texts``
    one at a time to the same predictor."""
    ready = threading.Barrier(count + 1)

    def caller(share):
        ready.wait()
        for text in share:
            predictor.predict([text])

    threads = [threading.Thread(target=caller, args=(texts[i::count],)) for i in range(count)]
    for thread in threads:
        thread.start()
    ready.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return len(texts) / (time.perf_counter() - start)


def batch_job(predictor, texts: Sequence[str], batch_size: int = 32) -> float:
    """Texts per second, all of them in batches of ``batch_size`` (sorted by length, as
    the predictor batches them)."""
    start = time.perf_counter()
    predictor.predict(list(texts), batch_size=batch_size)
    return len(texts) / (time.perf_counter() - start)


def throughput(predictors: Dict[str, object], singles: Sequence[str], batch: Sequence[str], rounds: int = 3,
               log: Callable[[str], None] = print) -> Dict[str, Dict[str, float]]:
    """{system: {scenario: median over rounds}}: ``singles`` for the b1 scenarios, ``batch``
    for the batch job; each predictor warmed up on a few texts first."""
    names = list(predictors)
    for predictor in predictors.values():
        predictor.predict(list(singles[:4]))
    found: Dict[str, Dict[str, List[float]]] = {name: {s: [] for s in SCENARIOS} for name in names}
    for round_ in range(rounds):
        for i in rotation(len(names), round_):
            name, predictor = names[i], predictors[names[i]]
            found[name]["1 caller, b1"].append(one_caller(predictor, singles))
            found[name]["4 callers, b1"].append(callers(predictor, singles))
            found[name]["batch job, b32"].append(batch_job(predictor, batch))
        log(f"round {round_ + 1}/{rounds} timed")
    return {name: {s: statistics.median(values) for s, values in rows.items()} for name, rows in found.items()}


def predictors_of(save_dir: Path, data: Path, widths: Sequence[str], threads: int, log) -> Dict[str, Predictor]:
    """Dense and each width, fp32 and int8, as budget_serve loads a user's export."""
    dense_path, nested_path = save_dir / "dense" / "checkpoint_best.pt", save_dir / "nested" / "checkpoint_best.pt"
    folders = {"dense": (dense_path, None), **{f"width {w}": (nested_path, w) for w in widths}}
    found = {}
    for name, (checkpoint, width) in folders.items():
        folder = save_dir / "onnx" / name.replace(" ", "-")
        onnx_folder(checkpoint, data, folder, width, log)
        for kind in ("fp32", "int8"):
            found[f"{name}, {kind}"] = Predictor(folder, int8=kind == "int8", threads=threads)
    return found


def report(study: dict) -> str:
    """The table: each scenario's figure and its ratio to the dense int8 export's."""
    rows = study["throughput"]
    base = rows[BASELINE]
    lines = [f"# Serving throughput: {study['dataset']} (seed {study['seed']})", "",
             f"budget_serve's Predictor on {study['singles']} test sentences one at a time and "
             f"{study['batch_texts']} in batches of 32, {study['threads']} threads per predictor, "
             f"median of {study['rounds']} interleaved rounds; x: against `{BASELINE}` (higher is faster).", "",
             "| system | " + " | ".join(f"{s} ({'texts' if 'batch' in s else 'req'}/s) | x" for s in SCENARIOS) + " |",
             "|---|" + "---|---|" * len(SCENARIOS)]
    for name, values in rows.items():
        cells = [f"{values[s]:.1f} | {values[s] / base[s]:.2f}" for s in SCENARIOS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
