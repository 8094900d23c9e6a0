"""Preparing one task folder (GLUE layout) for fairseq: read and check the TSV files,
train a sentencepiece model (or take a pretrained model's WordPiece vocabulary), encode
and binarize every split into ``<name>-bin/``."""

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Callable, Optional, Union

from budget_plugin.data.binarize import BinarizeJob, TaskSummary, encode_split, run_binarize_jobs
from budget_plugin.data.glue_layout import LAYOUTS, Layout
from budget_plugin.data.tsv import read_task
from budget_plugin.data.vocabulary import (
    FAIRSEQ_SPECIALS,
    SPM_MODEL_NAME,
    label_order,
    load_sentencepiece,
    sentencepiece_vocabulary,
    train_sentencepiece,
    wordpiece_vocabulary,
    write_source_dict,
    write_vocab_file,
)
from budget_plugin.tools.errors import DataError
from budget_plugin.tools.files import building_dir, write_json

# the prepared folder's record of how its inputs were made (read by budget-predict and the ONNX export)
PREPARED = "prepared.json"


def prepared_record(data: Path) -> dict:
    """A prepared data folder's record (empty for a folder prepared before it was kept)."""
    path = Path(data) / PREPARED
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _log(message: str) -> None:
    print(f"[prepare] {message}", file=sys.stderr, flush=True)


def prepare_task(
    task_dir: Union[str, Path],
    out_dir: Union[str, Path],
    *,
    layout: Union[str, Layout, None] = None,
    name: Optional[str] = None,
    labelled_test: bool = False,
    spm_model: Union[str, Path, None] = None,
    wordpiece: Union[str, Path, None] = None,
    vocab_size: int = 8000,
    model_type: str = "unigram",
    max_positions: int = 512,
    truncate: Optional[int] = None,
    workers: int = 1,
    skip_bad_rows: bool = False,
    log: Callable[[str], None] = _log,
) -> TaskSummary:
    """Prepare one task folder into `out_dir/<name>-bin/` and return what was written.

    `layout` is a GLUE task name (default: the folder's name) or a Layout; `name` names the
    output (default: the folder's name). With `labelled_test`, test files carry labels in the
    dev columns and are binarized with their labels (for our own held-out splits).
    `wordpiece` (a tokenizer.json, vocab.txt or budget-convert's output folder)
    tokenizes with a pretrained model's vocabulary instead of a sentencepiece model.
    `truncate` keeps each input's first pieces only (long documents, for a model whose
    position embeddings are longer than the length it should train on).
    """
    # sentencepiece needs more pieces than its four specials; fairseq-preprocess divides by --workers
    for option, value, least in (("--truncate-tokens", truncate, 1), ("--vocab-size", vocab_size, 5),
                                 ("--max-positions", max_positions, 1), ("--workers", workers, 1)):
        if value is not None and value < least:
            raise DataError(f"{option} must be >= {least}, got {value}")
    task_dir, out_dir = Path(task_dir), Path(out_dir)
    name = name or task_dir.name
    if not isinstance(layout, Layout):
        key = layout or task_dir.name
        if key not in LAYOUTS:
            raise DataError(f"unknown task layout {key!r}; known: {', '.join(LAYOUTS)}")
        layout = LAYOUTS[key]
    if not task_dir.is_dir():
        raise DataError(f"missing input folder: {task_dir}")
    if spm_model is not None and not Path(spm_model).is_file():
        raise DataError(f"missing sentencepiece model: {spm_model}")
    if spm_model is not None and wordpiece is not None:
        raise DataError("give --spm-model or --wordpiece, not both")
    if spm_model is not None:
        load_sentencepiece(Path(spm_model))  # refused here, naming the user's file, not its copy
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"--out-dir {out_dir}: not a folder")

    splits = read_task(task_dir, layout, labelled_test=labelled_test, skip_bad_rows=skip_bad_rows, log=log)
    train = splits[0]
    target = out_dir / f"{name}-bin"

    with building_dir(target) as tmp:
        work = tmp / "work"  # plain-text intermediates, removed before the rename
        work.mkdir()

        # 1. The tokenizer, stored next to the data (from_pretrained looks there).
        if wordpiece is not None:
            vocab = wordpiece_vocabulary(Path(wordpiece), tmp)
        else:
            model_path = tmp / SPM_MODEL_NAME
            if spm_model is None:
                text_path = work / "spm_train.txt"
                with open(text_path, "w", encoding="utf-8") as f:
                    for texts in train.texts:
                        f.writelines(t + "\n" for t in texts)
                log(f"training a {model_type} sentencepiece model ({vocab_size} pieces) on {train.path}")
                train_sentencepiece(text_path, model_path.with_suffix(""), vocab_size, model_type, log)
                source = f"{model_type} trained on {train.path.name} (requested {vocab_size})"
            else:
                shutil.copyfile(spm_model, model_path)
                source = f"reused {spm_model}"
            vocab = sentencepiece_vocabulary(model_path, source)
            vocab_file = model_path.with_suffix(".vocab")
            if not vocab_file.exists():
                write_vocab_file(load_sentencepiece(model_path), vocab_file)

        # 2. One source dictionary for input0 and input1.
        dict_path = work / "dict.txt"
        write_source_dict(vocab, dict_path)
        known = set(vocab.symbols)

        # 3. Encode every split, keeping every line.
        summaries = []
        for split in splits:
            log(f"encoding {split.path.name} ({len(split.texts)} rows)")
            summaries.append(encode_split(vocab.encode, split, work, known, layout.num_inputs, max_positions,
                                          truncate))

        # 4. Label files: classes for fairseq-preprocess, or plain floats for regression
        #    (sentence_prediction reads `label/<split>.label` itself).
        jobs = [BinarizeJob(f"input{i}", tmp / f"input{i}", dict_path, splits) for i in range(layout.num_inputs)]
        labelled = [s for s in splits if s.labels is not None]
        label_dir = tmp / "label"
        if layout.regression:
            label_dir.mkdir()
            for s in labelled:
                # STS-B scores are 0-5; fairseq's recipe prints `$1 / 5.0` with awk (%.6g).
                with open(label_dir / f"{s.name}.label", "w", encoding="utf-8") as f:
                    f.writelines(f"{float(y) / 5.0:.6g}\n" for y in s.labels)
            labels = None
        else:
            labels = label_order(train.labels)
            label_dict = work / "label_dict.txt"
            with open(label_dict, "w", encoding="utf-8") as f:
                f.writelines(f"{lab} {n}\n" for lab, n in labels)
            for s in labelled:
                with open(work / f"{s.name}.label", "w", encoding="utf-8") as f:
                    f.writelines(y + "\n" for y in s.labels)
            jobs.append(BinarizeJob("label", label_dir, label_dict, labelled))

        # 5. Binarize with the real fairseq-preprocess.
        run_binarize_jobs(work, jobs, workers, log)
        shutil.rmtree(work)
        # 6. What serving needs to cut and read inputs as they were here (budget-export-onnx)
        write_json(tmp / PREPARED, {"inputs": layout.num_inputs, "regression": bool(layout.regression),
                                    "truncate_tokens": truncate, "max_positions": max_positions})

    return TaskSummary(
        name=name,
        out_dir=target,
        tokenizer=vocab.source,
        vocab_size=vocab.size,
        dict_size=len(vocab.symbols) + len(FAIRSEQ_SPECIALS),
        max_positions=max_positions,
        labels=labels,
        splits=summaries,
    )


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared with examples/budgetformer/get_data.py."""
    group = parser.add_argument_group("preparation")
    group.add_argument("--spm-model", type=Path,
                       help="reuse this sentencepiece model instead of training one per task")
    group.add_argument("--wordpiece", type=Path,
                       help="tokenize with a pretrained model's WordPiece vocabulary (its tokenizer.json, "
                       "vocab.txt, or budget-convert's output folder) instead of a sentencepiece model")
    group.add_argument("--vocab-size", type=int, default=8000,
                       help="sentencepiece vocabulary size; less if the text is too small (default: %(default)s)")
    group.add_argument("--model-type", default="unigram", choices=["unigram", "bpe", "char", "word"],
                       help="sentencepiece model type (default: %(default)s)")
    group.add_argument("--max-positions", type=int, default=512,
                       help="report examples longer than this, counting <s>/</s> (default: %(default)s)")
    group.add_argument("--truncate-tokens", type=int, metavar="N",
                       help="keep only the first N pieces of every input (long documents: BBC News's articles "
                       "average ~480 WordPiece pieces; 254 fits <s> and </s> into 256 positions)")
    group.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers (default: %(default)s)")
    group.add_argument("--skip-bad-rows", action="store_true",
                       help="skip and count malformed rows instead of stopping at the first one")


def prepare_options(args: argparse.Namespace) -> dict:
    """The keyword arguments of prepare_task() taken from add_prepare_arguments()'s options."""
    return dict(
        spm_model=args.spm_model,
        wordpiece=args.wordpiece,
        vocab_size=args.vocab_size,
        model_type=args.model_type,
        max_positions=args.max_positions,
        truncate=args.truncate_tokens,
        workers=args.workers,
        skip_bad_rows=args.skip_bad_rows,
    )
