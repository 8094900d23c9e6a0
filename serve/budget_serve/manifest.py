"""An export's ``manifest.json``: what the model is (classification or regression, one
text or a pair, its labels), how its inputs were cut in training, and what it needs
from the runtime. Read once at load; anything missing or wrong is refused in one line
naming the file."""

import json
from pathlib import Path
from typing import Dict, Tuple

from .errors import DataError

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 2
REQUIRED = ("files", "special", "labels", "max_positions", "heads")
# the oldest onnxruntime that runs each ONNX opset (its compatibility table)
ONNXRUNTIME_FOR_OPSET = {17: "1.13", 18: "1.14", 19: "1.15", 20: "1.17", 21: "1.18", 22: "1.20"}
# what a format-1 manifest (written before these were recorded) is read as
FORMAT_1 = {"task": "classification", "inputs": None, "truncation": {"pieces_per_input": None}}


def version(text: str) -> Tuple[int, ...]:
    """'1.14.1' -> (1, 14, 1); a suffix ('1.18.0+cu12', '1.20.0.dev1') is ignored."""
    numbers = []
    for part in text.split("+")[0].split("."):
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


def read_manifest(folder: Path) -> dict:
    """The folder's manifest, format 1 brought to today's keys; refused naming the file."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise DataError(f"{folder}: no {MANIFEST} (not a budget-export-onnx folder)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"{path}: not a manifest ({error})") from None
    found = manifest.get("format") if isinstance(manifest, dict) else None
    if found not in (1, MANIFEST_FORMAT):
        raise DataError(f"{path}: format {found!r}; this budget_serve reads formats 1 and {MANIFEST_FORMAT} "
                        "(a newer export needs a newer budget-serve)")
    missing = [key for key in REQUIRED if key not in manifest]
    if missing:
        raise DataError(f"{path}: no {', '.join(missing)} (written by another version, or edited)")
    if found == 1:
        manifest = {**FORMAT_1, **manifest}
    if manifest["task"] not in ("classification", "regression") or manifest["inputs"] not in (None, 1, 2):
        raise DataError(f"{path}: task {manifest['task']!r} with {manifest['inputs']!r} inputs is not one this "
                        "budget_serve serves (classification or regression, of 1 or 2 texts)")
    special = manifest["special"]
    absent = [name for name in ("bos", "pad", "eos", "unk") if not isinstance(special.get(name), int)]
    if absent:
        raise DataError(f"{path}: no id for the special symbol(s) {', '.join(absent)}")
    return manifest


def check_runtime(manifest: dict, path: Path, installed: str) -> None:
    """Refuse an installed onnxruntime older than the export's graph needs."""
    needed = manifest.get("requires", {}).get("onnxruntime") or ONNXRUNTIME_FOR_OPSET.get(manifest.get("opset"))
    if needed and version(installed) < version(needed):
        raise DataError(f"{path}: the export's graph (ONNX opset {manifest.get('opset')}) needs onnxruntime >= "
                        f"{needed}; {installed} is installed: upgrade it (pip install -U onnxruntime)")


def runtime_requirements(opset: int) -> Dict[str, str]:
    """What an export at ``opset`` needs of the serving side (the manifest's ``requires``)."""
    return {"onnxruntime": ONNXRUNTIME_FOR_OPSET[opset]}
