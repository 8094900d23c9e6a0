"""What a user gets from ``pip install ./serve .`` (not editable): the plugin and its
``budget-*`` commands, run from another folder on tiny data; the studies are not installed.

The fresh virtual environment takes torch and fairseq from this one (a ``.pth`` line:
compiling fairseq again would take minutes), but not this checkout's own plugin."""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from helpers import REPO

from budget_plugin.nested.finetune import encoder_flags
from budget_plugin.tools.tiny_bert import SPECIAL_TOKENS, TINY, write_bert

pytestmark = pytest.mark.slow  # a venv, a wheel built and installed, the recipe's steps

COMMANDS = re.findall(r'^\s*"(budget-[\w-]+)": "', (REPO / "setup.py").read_text(), re.M)  # setup.py's COMMANDS
WORDS = ["good", "great", "fine", "bad", "dull", "awful", "the", "film", "plot", "was", "a"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("installed")
    venv = root / "venv"
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))  # the test extra's: seconds, where pip takes ten
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, venv] if uv else [sys.executable, "-m", "venv", venv],
                   check=True)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([venv / "bin" / "python", "-c", purelib],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    source = root / "source"  # what the package is made of, so that the build leaves the checkout alone
    source.mkdir()
    for name in ("setup.py", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package, folder in (("budget_plugin", "budget_plugin"), ("serve", "serve")):
        shutil.copytree(REPO / folder, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    installer = [uv, "pip", "install", "--python", venv / "bin" / "python"] if uv else \
        [venv / "bin" / "python", "-m", "pip", "install"]
    # budget-serve first: the plugin requires it
    subprocess.run([*installer, "--quiet", "--no-deps", "--no-index", "--no-build-isolation", source / "serve", source],
                   check=True, capture_output=True, cwd=root)
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
    # every command is installed (the recipe's runs end to end in studies/test_demo.py); a nested
    # model trained the way a user trains one with fairseq-train and the installed plugin
    assert all((venv / "bin" / name).is_file() for name in COMMANDS)
    user_dir = str(site / "budget_plugin")  # what budget-user-dir prints (the test above)
    flags, eps = encoder_flags(here / "model" / "model.pt")
    command(venv, here, "python", "-m", "fairseq_cli.train", "data/SST-2-bin", "--user-dir", user_dir,
            "--restore-file", "model/model.pt", "--reset-optimizer", "--reset-dataloader", "--reset-meters", "--arch", "budgetformer",
            *flags, "--layernorm-eps", eps, "--task", "budget_sentence_prediction", "--criterion",
            "budget_sentence_prediction", "--head-selection", "nested", "--min-heads", 1, "--sandwich-widths", 3,
            "--num-classes", 2, "--init-token", 0, "--separator-token", 2, "--batch-size", 16, "--optimizer", "adam",
            "--lr", "1e-3", "--max-update", 6, "--save-dir", "save/nested", "--cpu", "--num-workers", 0, "--seed", 1,
            "--no-epoch-checkpoints")
    nested = here / "save" / "nested" / "checkpoint_best.pt"
    command(venv, here, "budget-export", nested, "export", "--head-ratio", "1,3")
    texts = here / "texts.txt"
    texts.write_text("the film was great\nthe plot was awful\n")
    predicted = command(venv, here, "budget-predict", "--checkpoint-dir", "export", "--checkpoint-file",
                        "checkpoint_pruned.pt", "--data", "data/SST-2-bin", "--input", texts)
    rows = [line.split("\t") for line in predicted.splitlines() if line[:2] in ("1\t", "2\t")]
    assert [(row[0], row[3]) for row in rows] == [("1", "1,3"), ("2", "1,3")]  # the export's heads, per line
    validated = command(venv, here, "python", "-m", "fairseq_cli.validate", "data/SST-2-bin", "--user-dir", user_dir,
                        "--path", "export/checkpoint_pruned.pt", "--task", "budget_sentence_prediction",
                        "--criterion", "budget_sentence_prediction", "--valid-subset", "test", "--cpu",
                        "--batch-size", 8)
    assert "| valid on 'test' subset |" in validated and "bsz 24" in validated.replace("| bsz ", "bsz ")
    # served: the nested model exported to ONNX Runtime at the export's heads, what the export predicts
    command(venv, here, "budget-export-onnx", nested, "onnx", "--data", "data/SST-2-bin", "--head-ratio", "1,3")
    served = command(venv, here, "budget-serve-predict", "--onnx", "onnx", "--input", texts)
    served_rows = [line.split("\t") for line in served.splitlines() if line[:2] in ("1\t", "2\t")]
    assert [row[:2] + row[3:4] for row in served_rows] == [row[:2] + row[3:4] for row in rows]
