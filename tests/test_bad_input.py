"""Bad options and bad input are refused in one line that names them, never with a
traceback: the model's and the criterion's options when they are built (and by
fairseq-train before any checkpoint), text that is not UTF-8 for scripts/predict.py,
TSVs, folders and options for data preparation, and, through the real fairseq-validate,
a data folder or split that cannot be scored; and a user's own labelled test.tsv,
prepared with --labelled-test, is scored like dev.tsv. (A feature's own refusals stay
with it: the dial's in test_dial.py, --width's in test_width.py, the BERT conversion's
in test_convert_bert.py, the ONNX export's in test_onnx.py.)"""

import contextlib
import io
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fairseq.data import Dictionary, indexed_dataset
from fairseq.tasks.sentence_prediction import SentencePredictionConfig

from budget_plugin.cli import predict
from budget_plugin.cli import prepare as prepare_glue
from budget_plugin.data.glue_layout import LAYOUTS
from budget_plugin.data.prepare import prepare_task
from budget_plugin.data.tsv import read_task
from budget_plugin.tasks.budget_sentence_prediction import BudgetSentencePredictionTask, DataSplitError
from budget_plugin.tools.errors import DataError, run_cli
from budget_plugin.tools.fairseq_cli import validation_metrics
from budget_serve import texts
from helpers import (
    BIN,
    PLUGIN_DIR,
    REPO,
    build_model,
    console_script,
    make_criterion,
    make_rte,
    make_sst2,
    run,
    sentence,
    train_args,
    write_tsv,
)

# --------------------------------------------------------------------------------------
# Options: refused by name when the model or the criterion is built
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, kwargs, option",
    [
        (make_criterion, {"budget_weight": -1.0}, "--budget-weight"),
        (make_criterion, {"exploration_weight": -0.1}, "--exploration-weight"),
        (make_criterion, {"target_head_ratio": 1.5}, "--target-head-ratio"),
        (make_criterion, {"target_head_ratio": -0.5}, "--target-head-ratio"),
        (build_model, {"exploration_uniform": 1.5}, "--exploration-uniform"),
        (build_model, {"exploration_updates": -1}, "--exploration-updates"),
        (build_model, {"temperature_start": 0.0}, "--temperature-start"),
        (build_model, {"temperature_end": -1.0}, "--temperature-end"),
        (build_model, {"exploration_noise": -1.0}, "--exploration-noise"),
        (build_model, {"exploration_schedule": "step"}, "--exploration-schedule"),
        (build_model, {"min_heads": 0}, "--min-heads"),
        (build_model, {"min_heads": 5}, "--min-heads"),
        (build_model, {"encoder_embed_dim": 66}, "--encoder-embed-dim"),
        (build_model, {"budget_pooling": "max"}, "--budget-pooling"),
        (build_model, {"budget_mask_temperature": 0.0}, "--budget-mask-temperature"),
        (build_model, {"initial_budget": 4.5}, "--initial-budget"),
        (build_model, {"attention_path": "sparse"}, "--attention-path"),
    ],
)
def test_bad_settings_fail_when_built_naming_the_option(make, kwargs, option):
    with pytest.raises(ValueError, match=option):
        make(**kwargs)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(head_selection="static"), "--fixed-heads must be one number or 2"),
        (dict(head_selection="random", fixed_heads="1,2,3"), "--fixed-heads must be one number or 2"),
        (dict(head_selection="random", fixed_heads="0.5"), "each in [--min-heads, 4]"),
        (dict(head_selection="static", fixed_heads="two"), "got 'two'"),
        (dict(fixed_heads="2"), "--fixed-heads must be unset unless --head-selection"),
        (dict(head_selection="pruning", fixed_heads="2"), "--head-selection must be one of"),
        (dict(head_selection="pruned", fixed_heads="2.5"), "each in [--min-heads, 4] and whole"),
        (dict(head_selection="pruned", fixed_heads="2", initial_budget=2.0), "--initial-budget does nothing"),
    ],
)
def test_bad_baseline_settings_name_the_option(overrides, message):
    with pytest.raises(ValueError) as error:
        build_model(**overrides)
    assert message in str(error.value)


@pytest.mark.parametrize("options, message", [
    (dict(head_selection="kept"), "--kept-heads must be 2 ';'-separated lists"),
    (dict(head_selection="kept", kept_heads="0;4"), r"head indices in \[0, 4\)"),
    (dict(head_selection="kept", kept_heads="0;1", fixed_heads="2"), "--fixed-heads must be unset"),
    (dict(kept_heads="0;1"), "--kept-heads must be unset unless --head-selection is kept"),
])
def test_kept_heads_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        build_model(**options)


@pytest.mark.parametrize("options, message", [
    (dict(relevance_prior="0,1,2,3"), r"--relevance-prior must be 2 ';'-separated lists .* of 4 comma-separated"),
    (dict(relevance_prior="0,1,2;0,1,2,3"), "of 4 comma-separated finite numbers"),
    (dict(relevance_prior="0,1,2,nan;0,1,2,3"), "finite numbers"),
    (dict(relevance_prior="0,1,2,3;0,1,2,3", head_selection="static", fixed_heads="2"),
     "--relevance-prior must be unset unless --head-selection is learned"),
])
def test_relevance_prior_is_checked(options, message):
    with pytest.raises(ValueError, match=message):
        build_model(**options)


@pytest.mark.parametrize("overrides, option", [
    (dict(exploration_noise=0.5), "--exploration-noise"),
    (dict(exploration_uniform=0.2), "--exploration-uniform"),
    (dict(exploration_schedule="cosine"), "--exploration-schedule"),
    (dict(temperature_start=3.0), "--temperature-start"),
    (dict(head_selection="static", fixed_heads="2", initial_budget=2.0), "--initial-budget"),
    (dict(head_selection="random", fixed_heads="2", budget_pooling="first"), "--budget-pooling"),
    (dict(head_selection="kept", kept_heads="0;1", exploration_updates=10, temperature_end=2.0),
     "--temperature-end"),
])
def test_options_that_do_nothing_in_a_mode_are_refused_by_name(overrides, option):
    with pytest.raises(ValueError, match=f"{option} does nothing with --head-selection"):
        build_model(**overrides)


def test_exploration_options_are_accepted_with_a_schedule():
    build_model(exploration_updates=10, exploration_noise=0.5, temperature_start=3.0)


@pytest.mark.parametrize("options, message", [
    (dict(fixed_heads="2"), "--fixed-heads must be unset unless --head-selection is static or random"),
    (dict(kept_heads="0;1"), "--kept-heads must be unset unless --head-selection is kept"),
    (dict(relevance_prior="0,1,2,3;0,1,2,3"), "--relevance-prior must be unset unless --head-selection is learned"),
    (dict(exploration_updates=10), "--exploration-updates does nothing with --head-selection nested"),
    (dict(exploration_updates=10, exploration_noise=0.5), "--exploration-noise does nothing"),
    (dict(temperature_end=2.0), "--temperature-end does nothing with --head-selection nested"),
    (dict(temperature_start=3.0), "--temperature-start does nothing"),
])
def test_options_that_do_nothing_for_nested_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        build_model(head_selection="nested", **options)


@pytest.mark.slow
def test_bad_setting_fails_in_fairseq_train_before_any_checkpoint(tmp_path):
    data = tmp_path / "data"  # fairseq builds the model before it reads any data
    (data / "input0").mkdir(parents=True)
    (data / "label").mkdir()
    (data / "input0" / "dict.txt").write_text("".join(f"w{i} 1\n" for i in range(30)))
    (data / "label" / "dict.txt").write_text("pos 1\nneg 1\n")
    save = tmp_path / "ckpt"
    cmd = train_args(data, save, "--min-heads", 9)
    proc = subprocess.run([str(BIN / cmd[0]), *map(str, cmd[1:])], capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    # one line, no traceback (config.OptionError)
    assert "\nerror: --min-heads must be in [1, 4] (--encoder-attention-heads), got 9\n" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "| train_inner |" not in output and "num_updates" not in output
    assert not list(tmp_path.rglob("*.pt"))


# --------------------------------------------------------------------------------------
# The user's texts and data: what the sections below share
# --------------------------------------------------------------------------------------

SST2_HEADER = ["sentence", "label"]


def quiet(message: str) -> None:
    pass


def last_error(capsys) -> str:
    """The one line a script printed for its refusal (checked: no traceback before it)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def own_task(root: Path, rng: random.Random, labelled_test: bool = True) -> Path:
    """A user's own SST-2-layout folder: train/dev/test.tsv; the test file labelled (dev's
    rows in reverse order, so that a misaligned label changes the score) or in GLUE's
    test columns."""
    task = root / "SST-2"
    train = [[sentence(rng), str(i % 2)] for i in range(40)]
    dev = [[sentence(rng), str(i % 2)] for i in range(12)]
    write_tsv(task / "train.tsv", SST2_HEADER, train)
    write_tsv(task / "dev.tsv", SST2_HEADER, dev)
    if labelled_test:
        write_tsv(task / "test.tsv", SST2_HEADER, dev[::-1])
    else:
        write_tsv(task / "test.tsv", ["index", "sentence"], [[i, text] for i, (text, _) in enumerate(dev)])
    return task


# --------------------------------------------------------------------------------------
# scripts/predict.py: its input is read, and refused, before the model loads
# --------------------------------------------------------------------------------------

NOT_UTF8 = b"a good film\r\ncaf\xe9 noir\n"  # Latin-1, as a Windows editor might save it


def test_predict_refuses_a_file_that_is_not_utf8_naming_file_and_line(tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_bytes(NOT_UTF8)
    args = ["--checkpoint-dir", str(tmp_path / "never-loaded"), "--data", str(tmp_path), "--input", str(texts)]
    assert predict.main(args) == 2
    assert last_error(capsys) == (f"error: {texts}:2: invalid UTF-8 byte 0xe9 at byte 4; the input must be UTF-8 "
                                  "(convert it first, e.g. with iconv -f latin1 -t utf-8)")


def test_predict_refuses_standard_input_that_is_not_utf8(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(NOT_UTF8)))
    assert predict.main(["--checkpoint-dir", str(tmp_path), "--data", str(tmp_path)]) == 2
    assert last_error(capsys).startswith("error: <stdin>:2: invalid UTF-8 byte 0xe9 at byte 4;")


def test_predict_reads_crlf_and_a_byte_order_mark_as_plain_text():
    stream = io.BytesIO("\ufeffa good film\r\nfirst\tsecond\r\n".encode())
    assert texts.read_examples(stream, "x") == [["a good film"], ["first", "second"]]


@pytest.mark.parametrize("line", [b"\n", b"a\tb\tc\n", b"a\t \n"])
def test_predict_refuses_a_line_without_one_or_two_texts(line):
    with pytest.raises(DataError, match=r"^x:2: expected one text or two tab-separated texts"):
        texts.read_examples(io.BytesIO(b"fine\n" + line), "x")


@pytest.mark.parametrize("problem,status", [("no checkpoint", 2), ("no input file", 1)])
def test_predict_refuses_missing_files_in_one_line(tmp_path, monkeypatch, capsys, problem, status):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a good film\n")))
    args = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--data", str(tmp_path)]
    if problem == "no input file":
        args += ["--input", str(tmp_path / "absent.txt")]
    assert predict.main(args) == status
    assert str(tmp_path / ("absent.txt" if problem == "no input file" else "ckpt")) in last_error(capsys)


def test_predict_refuses_a_batch_size_below_one(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:  # argparse's own refusal: usage, then one line
        predict.main(["--checkpoint-dir", str(tmp_path), "--data", str(tmp_path), "--batch-size", "0"])
    assert exit_.value.code == 2 and last_error(capsys).endswith("error: --batch-size must be >= 1, got 0")


# --------------------------------------------------------------------------------------
# Preparation: options, TSV files and folders
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("option,value,message", [
    ("vocab_size", 0, "--vocab-size must be >= 5, got 0"),
    ("workers", 0, "--workers must be >= 1, got 0"),
    ("max_positions", 0, "--max-positions must be >= 1, got 0"),
    ("truncate", 0, "--truncate-tokens must be >= 1, got 0"),
])
def test_prepare_refuses_out_of_range_options_before_reading(tmp_path, option, value, message):
    with pytest.raises(DataError, match=f"^{message}$"):
        prepare_task(tmp_path / "absent", tmp_path / "out", layout="SST-2", log=quiet, **{option: value})
    assert not (tmp_path / "out").exists()


def test_prepare_refuses_an_out_dir_that_is_a_file_and_a_tokenizer_that_is_not_one(tmp_path):
    task = own_task(tmp_path, random.Random(0))
    file = tmp_path / "file"
    file.write_bytes(b"\xff\xfe not a model\n")
    with pytest.raises(DataError, match=f"^--out-dir {re.escape(str(file))}: not a folder$"):
        prepare_task(task, file, labelled_test=True, log=quiet)
    # named as given, not as its copy in the temporary output folder
    with pytest.raises(DataError, match=f"^{re.escape(str(file))}: not a sentencepiece model"):
        prepare_task(task, tmp_path / "out", labelled_test=True, spm_model=file, log=quiet)
    with pytest.raises(DataError, match=f"^--wordpiece {re.escape(str(file))}: .*UTF-8"):
        prepare_task(task, tmp_path / "out", labelled_test=True, wordpiece=file, log=quiet)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


@pytest.mark.parametrize("split", ["dev", "test"])
@pytest.mark.parametrize("skip_bad_rows", [False, True])
def test_a_split_without_usable_rows_is_refused(tmp_path, split, skip_bad_rows):
    """fairseq cannot binarize an empty split (its reader fails on an empty file)."""
    task = own_task(tmp_path, random.Random(1))
    write_tsv(task / f"{split}.tsv", SST2_HEADER, [b"\t1\n"] if skip_bad_rows else [])
    message = f"{task / split}.tsv: no usable rows" + (" (1 skipped)" if skip_bad_rows else "")
    with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
        read_task(task, LAYOUTS["SST-2"], labelled_test=True, skip_bad_rows=skip_bad_rows, log=quiet)


@pytest.mark.parametrize("labelled_file", [True, False])
def test_a_test_file_must_match_labelled_test(tmp_path, labelled_file):
    """A test file with dev.tsv's header is labelled; read without --labelled-test, its
    labels would become texts (SST-2's test columns are index, sentence), and an
    unlabelled one read with it would lose a text column to the labels."""
    task = own_task(tmp_path, random.Random(2), labelled_test=labelled_file)
    with pytest.raises(DataError) as refused:
        read_task(task, LAYOUTS["SST-2"], labelled_test=not labelled_file, skip_bad_rows=False, log=quiet)
    assert str(refused.value) == f"{task / 'test.tsv'}:1: " + (
        "header 'sentence\\tlabel' is dev.tsv's, so the file looks labelled: prepare with --labelled-test "
        "(or give it the task's test columns)" if labelled_file else
        "header 'index\\tsentence' is not dev.tsv's 'sentence\\tlabel', but --labelled-test reads test files "
        "with the dev file's columns")
    splits = read_task(task, LAYOUTS["SST-2"], labelled_test=labelled_file, skip_bad_rows=False, log=quiet)
    assert (splits[2].labels is not None) == labelled_file


def test_the_system_refusing_a_file_is_one_line(tmp_path, capsys):
    def write_into_a_file():
        (tmp_path / "file").write_text("")
        (tmp_path / "file" / "x").write_text("")

    assert run_cli(write_into_a_file) == 1
    assert last_error(capsys) == f"error: [Errno 20] Not a directory: '{tmp_path / 'file' / 'x'}'"


def corrupt(path: Path, line: int, new: bytes) -> None:
    """Replace 1-based `line` of a file with raw bytes."""
    lines = path.read_bytes().split(b"\n")
    lines[line - 1] = new
    path.write_bytes(b"\n".join(lines))


BAD_INPUTS = [
    # (task, file, line, replacement or None to delete the file, expected message part)
    ("SST-2", "train.tsv", 4, b"a good film\t1\textra", "expected 2 tab-separated columns, found 3"),
    ("SST-2", "dev.tsv", 3, b"\t1", "empty text in column 1"),
    ("SST-2", "dev.tsv", 2, b"a fine film .\t7", "label '7' never occurs in train.tsv"),
    ("SST-2", "train.tsv", 5, b"caf\xe9 noir .\t1", "invalid UTF-8 byte 0xe9"),
    ("SST-2", "test.tsv", 3, b"2\t   ", "empty text in column 2"),
    ("SST-2", "train.tsv", 1, b"sentence\tlabel\tmore", "header has 3 columns, expected 2"),
    ("SST-2", "test.tsv", None, None, "missing input file"),
    ("RTE", "dev.tsv", 2, b"0\tA premise .\t\tentailment", "empty text in column 3"),
    ("RTE", "train.tsv", 6, b"", "expected 4 tab-separated columns, found 0"),
]


@pytest.mark.parametrize("task,name,line,replacement,message", BAD_INPUTS)
def test_bad_tsv_input_is_reported_with_file_and_line(tmp_path, capsys, task, name, line, replacement, message):
    glue, out = tmp_path / "glue", tmp_path / "out"
    (make_sst2 if task == "SST-2" else make_rte)(glue, random.Random(1))
    path = glue / task / name
    if replacement is None:
        path.unlink()
    else:
        corrupt(path, line, replacement)

    rc = prepare_glue.main(["--glue-dir", str(glue), "--out-dir", str(out), "--tasks", task])

    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith("error: ") and message in err[-1]
    assert (f"{path}:{line}:" if line else str(path)) in err[-1]
    assert not any("Traceback" in e for e in err)
    assert not out.exists() or not any(out.iterdir())  # nothing written, not even a temp folder


@pytest.mark.slow
def test_prepare_glue_script_exits_2_with_one_line(tmp_path):
    glue = tmp_path / "glue"
    make_sst2(glue, random.Random(2))
    corrupt(glue / "SST-2" / "dev.tsv", 4, b"no label here")
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "prepare_glue.py"), "--glue-dir", str(glue),
         "--out-dir", str(tmp_path / "out")],
        capture_output=True, text=True,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if not line.startswith("[prepare]")]
    assert errors == [f"error: {glue / 'SST-2' / 'dev.tsv'}:4: expected 2 tab-separated columns, found 1"
                      " (use --skip-bad-rows to skip such rows)"]


# --------------------------------------------------------------------------------------
# The task: missing folders and splits, and scoring a split without labels
# --------------------------------------------------------------------------------------


def no_labels(data: Path) -> str:
    """The line that refuses to score data's unlabelled test split."""
    return (f"error: split 'test' of {data} has no labels, so it cannot be scored (it can be predicted: "
            "budget-predict); if its TSV file is labelled, prepare it again with budget-prepare "
            "--labelled-test")


def binarized(root: Path, splits=("train", "valid", "test"), labelled=("train", "valid")) -> Path:
    """A tiny binarized folder written in this process (fairseq-preprocess's layout)."""
    for key, symbols, names in (("input0", ["a", "b"], splits), ("label", ["pos", "neg"], labelled)):
        dictionary = Dictionary()
        for symbol in symbols:
            dictionary.add_symbol(symbol)
        (root / key).mkdir(parents=True)
        dictionary.save(str(root / key / "dict.txt"))
        for name in names:
            builder = indexed_dataset.make_builder(str(root / key / f"{name}.bin"), "mmap", len(dictionary))
            for i in range(5):
                builder.add_item(torch.IntTensor([dictionary.index(symbols[i % 2]), dictionary.eos()]))
            builder.finalize(str(root / key / f"{name}.idx"))
    return root


def setup_task(data: Path) -> BudgetSentencePredictionTask:
    cfg = SentencePredictionConfig(data=str(data), num_classes=2, init_token=0, separator_token=2, max_positions=64,
                                   regression_target=False, classification_head_name="head", seed=1)
    return BudgetSentencePredictionTask.setup_task(cfg)


def first_batch(task, split):
    task.load_dataset(split)
    return next(iter(task.get_batch_iterator(task.dataset(split), max_sentences=8).next_epoch_itr(shuffle=False)))


def test_an_unlabelled_split_loads_for_prediction_and_refuses_to_be_scored(tmp_path):
    task = setup_task(binarized(tmp_path))
    sample = first_batch(task, "test")  # what the hub, predict.py and the measurements do
    assert "target" not in sample and sample["net_input"]["src_tokens"].shape == (5, 3)
    with pytest.raises(DataSplitError) as refused:
        task.valid_step(sample, model=None, criterion=None)
    assert refused.value.code == no_labels(tmp_path)

    labelled = first_batch(task, "valid")  # a labelled split reaches fairseq's valid_step
    scored = task.valid_step(labelled, torch.nn.Identity(), lambda model, s: (s["target"].sum(), 5, {}))
    assert scored[1] == 5


def test_a_missing_split_or_folder_is_named(tmp_path):
    task = setup_task(binarized(tmp_path / "data"))
    with pytest.raises(DataSplitError, match="^error: .*data: no split 'tset' .*; it has: test, train, valid$"):
        task.load_dataset("tset")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataSplitError, match=r"empty: not a binarized data folder \(no input0/dict.txt or "):
        setup_task(tmp_path / "empty")


# --------------------------------------------------------------------------------------
# End to end: scripts/prepare_glue.py --labelled-test, fairseq-train, fairseq-validate
# --------------------------------------------------------------------------------------


def refusal(cmd, stdin: bytes = b"") -> str:
    """Run a command that must refuse (exit status 1 or 2, no traceback); the last line
    of its standard error."""
    program = console_script(cmd[0]) if str(cmd[0]).startswith("fairseq-") else [str(cmd[0])]
    proc = subprocess.run([*program, *map(str, cmd[1:])], input=stdin, capture_output=True, timeout=300)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode in (1, 2) and "Traceback" not in err, (proc.returncode, err[-3000:])
    return err.strip().splitlines()[-1]


def validate_args(data, checkpoint, subsets):
    return ["fairseq-validate", data, "--user-dir", PLUGIN_DIR, "--path", checkpoint, "--valid-subset", subsets,
            "--task", "budget_sentence_prediction", "--criterion", "budget_sentence_prediction",
            "--batch-size", 16, "--cpu", "--num-workers", 0]


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """A user's own folder prepared with --labelled-test, and a model trained on it."""
    root = tmp_path_factory.mktemp("own")
    own_task(root / "mydata", random.Random(3))
    with contextlib.redirect_stdout(io.StringIO()):
        assert prepare_glue.main(["--glue-dir", str(root / "mydata"), "--out-dir", str(root), "--vocab-size", "100",
                                  "--labelled-test"]) == 0
    data = root / "SST-2-bin"
    run(train_args(data, root / "ckpt", epochs=1))
    return data, root / "ckpt" / "checkpoint_best.pt"


@pytest.mark.slow
def test_a_labelled_test_split_is_scored_like_dev(labelled):
    data, checkpoint = labelled
    output = run(validate_args(data, checkpoint, "valid,test"))
    [valid], [test] = validation_metrics(output, "valid"), validation_metrics(output, "test")
    # the test file is dev's rows reversed: every example scored, with its own label
    assert test["bsz"] == valid["bsz"] == 12
    assert test["accuracy"] == valid["accuracy"] and test["loss"] == valid["loss"]


@pytest.mark.slow
def test_fairseq_validate_refuses_an_unlabelled_split_in_one_line(labelled, tmp_path):
    data, checkpoint = labelled
    unlabelled = tmp_path / "SST-2-bin"  # as prepare_glue.py writes it without --labelled-test
    shutil.copytree(data, unlabelled)
    for path in (unlabelled / "label").glob("test.*"):
        path.unlink()
    assert refusal(validate_args(unlabelled, checkpoint, "test")) == no_labels(unlabelled)


@pytest.mark.slow
def test_predict_script_refuses_standard_input_that_is_not_utf8(tmp_path):
    """The real standard input, its bytes (Python's text stdin would turn them into surrogates)."""
    cmd = [sys.executable, REPO / "scripts" / "predict.py", "--checkpoint-dir", tmp_path, "--data", tmp_path]
    assert refusal(cmd, stdin=NOT_UTF8).startswith("error: <stdin>:2: invalid UTF-8 byte 0xe9 at byte 4;")


@pytest.mark.slow
def test_an_option_fairseq_cannot_honour_is_refused_in_one_line(labelled):
    """The model's option errors (config.OptionError) reach fairseq's command line as one
    line, not a traceback: here a budget dial on a checkpoint never calibrated."""
    data, checkpoint = labelled
    line = refusal([*validate_args(data, checkpoint, "valid"), "--head-ratio", "0.5"])
    assert line.startswith("error: --head-ratio R needs the budget dial's calibration"), line
