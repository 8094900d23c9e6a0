"""What a user gets from ``pip install .`` (not editable): the plugin and its ``budget-*``
commands, run from another folder on tiny data; the studies are not installed.

The fresh virtual environment takes torch and fairseq from this one (a ``.pth`` line:
compiling fairseq again would take minutes), but not this checkout's own plugin."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from budget_plugin.tools.tiny_bert import SPECIAL_TOKENS, TINY, write_bert
from helpers import REPO

pytestmark = pytest.mark.slow  # a venv, a wheel built and installed, the recipe's steps

WORDS = ["good", "great", "fine", "bad", "dull", "awful", "the", "film", "plot", "was", "a"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("installed")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    site = Path(subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    source = root / "source"  # what the package is made of, so that the build leaves the checkout alone
    source.mkdir()
    for name in ("setup.py", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in ("budget_plugin", "budget_serve"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", source], check=True, capture_output=True, cwd=root)
    elsewhere = root / "elsewhere"  # not the checkout: nothing of it on the path
    elsewhere.mkdir()
    return venv, site, elsewhere


def command(venv, cwd, name, *args, ok=True):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    proc = subprocess.run([venv / "bin" / name, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert (proc.returncode == 0) == ok, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_the_installed_package_is_the_plugin_without_the_studies(installed):
    venv, site, elsewhere = installed
    user_dir = command(venv, elsewhere, "budget-user-dir").strip()
    assert user_dir == str(site / "budget_plugin")
    found = command(venv, elsewhere, "python", "-c", "import budget_plugin; print(budget_plugin.__version__, "
                    "budget_plugin.__file__)")
    version = (REPO / "budget_plugin" / "version.py").read_text().split('"')[1]
    assert found.split() == [version, str(site / "budget_plugin" / "__init__.py")]
    missing = command(venv, elsewhere, "python", "-c", "import budget_research", ok=False)
    assert "No module named 'budget_research'" in missing
    assert not (site / "examples").exists() and not (site / "tests").exists()


def test_a_users_steps_with_the_installed_commands(installed):
    venv, site, here = installed
    vocab = SPECIAL_TOKENS + WORDS
    bert = write_bert(here / "bert", dict(TINY, vocab_size=len(vocab)), vocab)
    command(venv, here, "budget-convert", bert, "model")
    raw = here / "raw" / "SST-2"
    raw.mkdir(parents=True)
    for split, n in (("train", 96), ("dev", 24), ("test", 24)):
        rows = ["sentence\tlabel"]
        for i in range(n):
            positive = i % 2 == 0
            word = WORDS[i % 3] if positive else WORDS[3 + i % 3]
            rows.append(f"the film was {word}\t{int(positive)}")
        (raw / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    command(venv, here, "budget-prepare", "--glue-dir", "raw", "--out-dir", "data", "--wordpiece", "model",
            "--labelled-test")
    output = command(venv, here, "budget-finetune", "model", "data/SST-2-bin", "save", "--min-heads", 1,
                     "--max-updates", 6, "--epochs", 1, "--cpu", "--threads", 1)
    assert "recipe 5/5" in output and "dev accuracy: nested --head-ratio 0.5" in output
    nested = here / "save" / "nested" / "checkpoint_best.pt"
    command(venv, here, "budget-export", nested, "export", "--head-ratio", "1,3")
    texts = here / "texts.txt"
    texts.write_text("the film was great\nthe plot was awful\n")
    predicted = command(venv, here, "budget-predict", "--checkpoint-dir", "export", "--checkpoint-file",
                        "checkpoint_pruned.pt", "--data", "data/SST-2-bin", "--input", texts)
    rows = [line.split("\t") for line in predicted.splitlines() if line[:2] in ("1\t", "2\t")]
    assert [(row[0], row[3]) for row in rows] == [("1", "1,3"), ("2", "1,3")]  # the export's heads, per line
    user_dir = command(venv, here, "budget-user-dir").strip()
    validated = command(venv, here, "python", "-m", "fairseq_cli.validate", "data/SST-2-bin", "--user-dir", user_dir,
                        "--path", "export/checkpoint_pruned.pt", "--task", "budget_sentence_prediction",
                        "--criterion", "budget_sentence_prediction", "--valid-subset", "test", "--cpu",
                        "--batch-size", 8)
    assert "| valid on 'test' subset |" in validated and "bsz 24" in validated.replace("| bsz ", "bsz ")
    # served: the nested model exported to ONNX Runtime at the export's heads, what the export predicts
    command(venv, here, "budget-export-onnx", nested, "onnx", "--data", "data/SST-2-bin", "--head-ratio", "1,3")
    served = command(venv, here, "budget-predict", "--onnx", "onnx", "--input", texts)
    assert [line.split("\t")[:2] + line.split("\t")[3:4] for line in served.splitlines() if line[:2] in ("1\t", "2\t")] \
        == [row[:2] + row[3:4] for row in rows]
