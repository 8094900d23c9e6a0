"""budget-serve, the torch-free serving distribution: its Python API on texts, the
manifest that guards the model (one text or a pair, classification or regression, the
truncation of training, the runtime it needs, a broken folder named by its file), and
the distribution installed alone on another Python."""

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import PAIRS, REPO, pair_task_training, run, wordpiece_pair_task

from budget_serve import Prediction, Predictor
from budget_serve.errors import DataError
from budget_serve.manifest import check_runtime, version

pytestmark = pytest.mark.slow
TRUNCATE = 4  # pieces per input, as budget-prepare --truncate-tokens cut the training data


def export(checkpoint: Path, data: Path, out: Path, *extra) -> Path:
    run([sys.executable, REPO / "scripts" / "export_onnx.py", checkpoint, out, "--data", data, *extra])
    return out


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """The pair task cut at TRUNCATE pieces per input, a RoBERTa trained on it, exported
    (fp32 and int8)."""
    root = tmp_path_factory.mktemp("serve-pairs")
    data, model = wordpiece_pair_task(root, TRUNCATE)
    run(pair_task_training(data, model, root / "dense", "--max-epoch", 1, dense=True))
    return data, root / "dense", export(root / "dense" / "checkpoint_best.pt", data, root / "onnx", "--int8")


def test_a_pair_is_encoded_as_its_training_data_was_cut(pairs):
    data, _, onnx = pairs
    manifest = json.loads((onnx / "manifest.json").read_text())
    assert manifest["task"] == "classification" and manifest["inputs"] == 2
    assert manifest["truncation"] == {"pieces_per_input": TRUNCATE, "positions": 128, "cut": "end"}
    assert json.loads((data / "prepared.json").read_text())["truncate_tokens"] == TRUNCATE
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(data / "input0" / "dict.txt"))
    first, second = (data_utils.load_indexed_dataset(str(data / name / "valid"), dictionary)
                     for name in ("input0", "input1"))
    predictor = Predictor(onnx)
    for i, (a, b) in enumerate(PAIRS * 4):  # the dev split's rows (helpers.py's PAIRS, 16 of them)
        trained = [0, *first[i].tolist(), 2, *second[i].tolist()]  # <s> a </s> </s> b </s>, as the task builds it
        assert predictor.encode(a, b) == trained, (a, b)
    long = " ".join(["the good film"] * 15)
    ids = predictor.encode(long, "a bad plot")
    assert ids.count(2) == 3 and len(ids) == 1 + TRUNCATE + 2 + 3 + 1  # the second text kept whole


def test_predict_takes_texts_and_agrees_with_the_fairseq_path_at_any_threads(pairs, tmp_path):
    data, dense, onnx = pairs
    texts = tmp_path / "pairs.txt"
    texts.write_text("".join(f"{a}\t{b}\n" for a, b in PAIRS * 4), encoding="utf-8")
    run([sys.executable, REPO / "scripts" / "predict.py", "--checkpoint-dir", dense, "--data", data,
         "--input", texts, "--output", tmp_path / "fairseq.tsv", "--all-scores"])
    rows = [line.split("\t") for line in (tmp_path / "fairseq.tsv").read_text().splitlines()]
    assert rows[0][:5] == ["line", "label", "probability", "probability:not_entailment", "probability:entailment"] \
        or rows[0][:5] == ["line", "label", "probability", "probability:entailment", "probability:not_entailment"]
    expected = [row[1] for row in rows[1:]]

    predictor = Predictor(onnx, threads=1)
    found = predictor.predict(PAIRS * 4)
    assert [p.label for p in found] == expected  # every line of the split
    assert all(isinstance(p, Prediction) and abs(sum(p.scores.values()) - 1) < 1e-6 for p in found)
    assert all(p.score == max(p.scores.values()) == p.scores[p.label] for p in found)
    assert [list(p.scores) for p in predictor(PAIRS, top_k=1)] == [[p.label] for p in found[:len(PAIRS)]]
    several = Predictor(onnx, threads=2).predict(PAIRS * 4)
    assert [p.label for p in several] == expected

    results, errors = {}, []

    def caller(number):
        try:
            for _ in range(3):
                results.setdefault(number, []).append(predictor.predict(PAIRS * 4, batch_size=3))
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and all(run_ == found for runs in results.values() for run_ in runs)


def test_the_callers_session_options_are_used_and_left_as_they_were(pairs):
    import onnxruntime

    _, _, onnx = pairs
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    predictor = Predictor(onnx, session_options=options)
    assert predictor.session.get_session_options().intra_op_num_threads == 1
    with pytest.raises(ValueError, match="threads or session options"):
        Predictor(onnx, threads=2, session_options=options)
    assert options.intra_op_num_threads == 1 and options.inter_op_num_threads == 0  # untouched


def test_an_input_the_model_does_not_take_is_refused_by_its_line(pairs, tmp_path):
    _, _, onnx = pairs
    predictor = Predictor(onnx)
    with pytest.raises(DataError, match="input 2: one text, but this model takes a pair"):
        predictor.predict([("a", "b"), "just one"])
    with pytest.raises(DataError, match="input 1: expected a text or a pair of texts"):
        predictor.predict([("a", "b", "c")])
    texts = tmp_path / "mixed.txt"
    texts.write_text("good film\tbad plot\nthe film\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "serve_predict.py"), "--onnx", str(onnx),
                           "--input", str(texts)], capture_output=True, text=True)
    assert proc.returncode == 2 and f"{texts}:2: one text, but this model takes a pair" in proc.stderr


def test_every_broken_file_of_an_export_is_refused_naming_it(pairs, tmp_path):
    _, _, onnx = pairs

    def broken(name, content):
        folder = tmp_path / f"{name.replace('.', '_')}-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(onnx, folder)
        (folder / name).write_bytes(content)
        return folder

    cases = {"model.onnx": "model.onnx: not a model this onnxruntime loads",
             "tokenizer.json": "tokenizer.json: not a tokenizer",
             "vocabulary.json": "vocabulary.json: not a vocabulary",
             "manifest.json": "manifest.json: not a manifest"}
    for name, message in cases.items():
        with pytest.raises(DataError, match=message):
            Predictor(broken(name, b"{not what it should be"))
    manifest = json.loads((onnx / "manifest.json").read_text())
    del manifest["special"]["eos"]
    folder = broken("manifest.json", json.dumps(manifest).encode())
    with pytest.raises(DataError, match=r"manifest.json: no id for the special symbol\(s\) eos"):
        Predictor(folder)


def test_an_old_runtime_is_refused_naming_both_versions_and_an_old_manifest_reads():
    with pytest.raises(DataError, match=r"needs onnxruntime >= 1.14; 1.13.1 is installed"):
        check_runtime({"opset": 18, "requires": {"onnxruntime": "1.14"}}, Path("m.onnx"), "1.13.1")
    check_runtime({"opset": 18, "requires": {"onnxruntime": "1.14"}}, Path("m.onnx"), "1.32.0")
    with pytest.raises(DataError, match="needs onnxruntime >= 1.14"):  # format 1 recorded only the opset
        check_runtime({"opset": 18}, Path("m.onnx"), "1.9.0")
    assert version("1.18.0+cu12") == (1, 18, 0) and version("1.20.0.dev20240101") == (1, 20, 0)


def test_a_format_1_manifest_is_served_as_before(pairs, tmp_path):
    _, _, onnx = pairs
    old = tmp_path / "old"
    shutil.copytree(onnx, old)
    manifest = json.loads((old / "manifest.json").read_text())
    for key in ("task", "inputs", "truncation", "requires"):
        manifest.pop(key)
    (old / "manifest.json").write_text(json.dumps({**manifest, "format": 1}))
    predictor = Predictor(old)
    assert predictor.inputs is None and predictor.predict(PAIRS)[0].label in predictor.labels


def sts_task(root: Path, model: Path) -> Path:
    """A tiny STS-B (a regression pair task) prepared with ``model``'s WordPiece."""
    from budget_plugin.data.prepare import prepare_task

    raw = root / "STS-B"
    raw.mkdir()
    columns = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    for split, n in (("train", 48), ("dev", 12)):
        rows = [columns + "\tscore"] + [f"{i}\tg\tf\t2012\t{i}\ts\ts\t{a}\t{b}\t{(i % 6) * 5 / 6:.2f}"
                                        for i, (a, b) in enumerate(PAIRS * (n // len(PAIRS)))]
        (raw / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (raw / "test.tsv").write_text(columns + "\n0\tg\tf\t2012\t0\ts\ts\tgood\tbad\n", encoding="utf-8")
    prepare_task(raw, root, wordpiece=model, max_positions=128, log=lambda m: None)
    return root / "STS-B-bin"


def test_a_regression_model_is_served_as_a_score(pairs, tmp_path):
    model = pairs[1].parent / "model"  # the pair task's converted tiny BERT
    data = sts_task(tmp_path, model)
    command = pair_task_training(data, model, tmp_path / "dense", "--max-epoch", 1, dense=True)
    command[command.index("--num-classes") + 1] = 1
    run([*command, "--regression-target", "--best-checkpoint-metric", "loss"])
    onnx = export(tmp_path / "dense" / "checkpoint_best.pt", data, tmp_path / "onnx")
    manifest = json.loads((onnx / "manifest.json").read_text())
    assert manifest["task"] == "regression" and manifest["labels"] == [] and "mse" in manifest["checked_on"]
    found = Predictor(onnx).predict(PAIRS)
    assert all(p.label is None and p.scores == {} for p in found)
    texts = tmp_path / "pairs.txt"
    texts.write_text("".join(f"{a}\t{b}\n" for a, b in PAIRS), encoding="utf-8")
    served = subprocess.run([sys.executable, str(REPO / "scripts" / "serve_predict.py"), "--onnx", str(onnx),
                             "--input", str(texts)], capture_output=True, text=True, check=True).stdout
    run([sys.executable, REPO / "scripts" / "predict.py", "--checkpoint-dir", tmp_path / "dense", "--data", data,
         "--input", texts, "--output", tmp_path / "fairseq.tsv"])
    fairseq_rows = [line.split("\t") for line in (tmp_path / "fairseq.tsv").read_text().splitlines()]
    rows = [line.split("\t") for line in served.splitlines()]
    assert rows[0][:2] == fairseq_rows[0][:2] == ["line", "score"]
    for mine, theirs, prediction in zip(rows[1:], fairseq_rows[1:], found):
        assert abs(float(mine[1]) - float(theirs[1])) <= 2e-4 and abs(float(mine[1]) - prediction.score) <= 1e-4


def other_python():
    """The oldest Python of another minor version than this one, 3.9 or newer, that the
    machine has (pyenv's or on the PATH): the oldest the distribution promises to serve on."""
    candidates = [*Path.home().glob(".pyenv/versions/3.*/bin/python"),
                  *(Path(found) for minor in range(9, 15) if (found := shutil.which(f"python3.{minor}")))]
    minors = {}
    for path in candidates:
        probe = subprocess.run([str(path), "-c", "import sys, venv; print(sys.version_info[1])"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and 9 <= int(probe.stdout) != sys.version_info[1]:
            minors.setdefault(int(probe.stdout), path)
    return minors[min(minors)] if minors else None


def fresh_environment(python: Path, folder: Path) -> Path:
    """A virtual environment of ``python`` with the serving distribution and its
    dependencies alone: uv (the test extra's; seconds where pip takes half a minute), else
    venv and pip. Skips where the package index cannot be reached."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv:
        subprocess.run([uv, "venv", "-q", "-p", str(python), str(folder)], check=True, env=env)
        install = [uv, "pip", "install", "-q", "--python", str(folder / "bin" / "python"), str(REPO / "serve")]
    else:
        subprocess.run([str(python), "-m", "venv", str(folder)], check=True, env=env)
        install = [str(folder / "bin" / "python"), "-m", "pip", "install", "-q", str(REPO / "serve")]
    done = subprocess.run(install, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        pytest.skip(f"budget-serve's dependencies could not be installed (no package index?): {done.stderr[-300:]}")
    return folder / "bin"


def test_the_serving_distribution_serves_alone_on_another_python(pairs, tmp_path):
    python = other_python()
    if python is None:
        pytest.skip("no Python of another minor version (3.9+) on this machine")
    _, _, onnx = pairs
    bin_ = fresh_environment(python, tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    listed = subprocess.run([str(bin_ / "python"), "-c", "import importlib.metadata as m, json; print(json.dumps("
                             "sorted(d.metadata['Name'].lower() for d in m.distributions())))"],
                            capture_output=True, text=True, check=True, env=env, cwd=tmp_path).stdout
    installed = set(json.loads(listed))
    assert {"budget-serve", "onnxruntime", "tokenizers", "numpy"} <= installed
    assert not installed & {"torch", "fairseq-fixed", "budget-plugin"}
    probe = subprocess.run([str(bin_ / "python"), "-c", "import torch"], capture_output=True, text=True,
                           env=env, cwd=tmp_path)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr
    texts = tmp_path / "pairs.txt"
    texts.write_text("".join(f"{a}\t{b}\n" for a, b in PAIRS), encoding="utf-8")
    served = subprocess.run([str(bin_ / "budget-serve-predict"), "--onnx", str(onnx), "--input", str(texts)],
                            capture_output=True, text=True, env=env, cwd=tmp_path)
    assert served.returncode == 0, served.stderr
    here = [p.label for p in Predictor(onnx).predict(PAIRS)]
    assert [line.split("\t")[1] for line in served.stdout.splitlines()[1:]] == here
