"""Shared helpers: tiny models built in-process, tiny data sets binarized with the
real fairseq-preprocess, and the fairseq command-line tools run as users run them."""

import argparse
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

# one thread per test process, set before torch reads it: `make test`'s two workers then
# share two cores without oversubscribing them, and the studies run in-process (which
# take their threads from it) time one thread
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

if not torch.cuda.is_available():  # the GPU path's Triton kernels, run by Triton's interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import forked_tools  # noqa: E402  (beside this file)
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY

import budget_plugin  # noqa: F401  (registers the plugin)
from budget_plugin.models.budgetformer import BudgetFormerModel
from budget_plugin.tools import fairseq_cli
from budget_plugin.tools.fairseq_cli import parse_metrics  # noqa: F401  (the tests' one parser too)

REPO = Path(__file__).resolve().parent.parent
PLUGIN_DIR = str(REPO / "budget_plugin")
BIN = Path(sys.executable).parent


# The files that take longest, longest first (pytest --durations): `make test` runs them
# first (--dist loadfile --no-loadscope-reorder), so that its two workers finish
# together instead of one running the last long file alone.
LONGEST_FIRST = ["test_demo.py", "test_installed.py", "test_onnx.py", "test_reproduce.py", "test_cli.py",
                 "test_latency_study.py", "test_distributed.py", "test_hub_and_warm_start.py", "test_benchmark.py",
                 "test_distributed_sandwich.py", "test_resume.py", "test_checkpoints.py", "test_hydra.py",
                 "test_glue_metrics.py", "test_convert_bert.py", "test_tools.py", "test_bad_input.py",
                 "test_determinism.py", "test_gpu_heads.py", "test_edge_cases.py", "test_dial_edges.py",
                 "test_prepare_glue.py", "test_wordpiece_data.py"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order kept


@pytest.fixture(scope="session", autouse=True)
def _fairseq_tools_forked():
    """fairseq's tools and the scripts forked from one process per test process that has
    imported torch and fairseq once (forked_tools.py); BUDGET_TESTS_FRESH_PROCESSES=1
    starts each afresh."""
    with forked_tools.fairseq_tools_forked(fairseq_cli):
        yield


def console_script(name):
    """The command line of fairseq's ``name`` as the tests run it (see above)."""
    return fairseq_cli.console_script(name)


python_script = forked_tools.python_script


def program_of(cmd):
    """``cmd`` with its program (a fairseq tool, ``python SCRIPT.py`` or another) as the
    tests run it."""
    if str(cmd[0]).startswith("fairseq-"):
        return [*console_script(cmd[0]), *map(str, cmd[1:])]
    if str(cmd[0]) == sys.executable and len(cmd) > 1 and str(cmd[1]).endswith(".py"):
        return [*python_script(cmd[1]), *map(str, cmd[2:])]
    return list(map(str, cmd))


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    torch.manual_seed(0)


class _Task:
    def __init__(self, dictionary, max_positions=64):
        self.source_dictionary = dictionary
        self._max_positions = max_positions

    def max_positions(self):
        return self._max_positions


def build_model(arch="budgetformer_tiny", vocab=50, num_classes=3, **overrides):
    """A BudgetFormer built the way fairseq-train builds it, without data."""
    dictionary = Dictionary()
    for i in range(vocab):
        dictionary.add_symbol(f"w{i}")
    args = argparse.Namespace(arch=arch, max_positions=64, **overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    model = BudgetFormerModel.build_model(args, _Task(dictionary))
    model.register_classification_head("sentence_classification_head", num_classes=num_classes)
    return model


def random_tokens(batch=6, length=12, vocab=50, pad_lengths=(12, 9, 5, 12, 2, 7)):
    """<s> w ... with right padding (pad=1) after each example's length."""
    tokens = torch.randint(4, vocab, (batch, length))
    tokens[:, 0] = 0
    for b, n in enumerate(pad_lengths[:batch]):
        tokens[b, n:] = 1
    return tokens


def run(cmd, cwd=None, timeout=600):
    """Run a fairseq CLI (from this interpreter's environment); return its output."""
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    proc = subprocess.run(program_of(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{output[-4000:]}")
    return output


def make_classification_data(root: Path, n_train=320, n_valid=100, pair=False, regression=False, seed=0):
    """A learnable toy task in GLUE-binarized layout: the label depends on the tokens."""
    rng = random.Random(seed)
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    words = [f"w{i}" for i in range(30)]
    for split, n in (("train", n_train), ("valid", n_valid)):
        files = {k: open(raw / f"{split}.{k}", "w") for k in ("input0", "input1", "label")}
        for _ in range(n):
            a = [rng.choice(words) for _ in range(rng.randint(3, 14))]
            b = [rng.choice(words) for _ in range(rng.randint(3, 10))]
            score = sum(int(w[1:]) for w in a) / len(a) / 29
            if pair:
                score = (score + sum(int(w[1:]) for w in b) / len(b) / 29) / 2
            files["input0"].write(" ".join(a) + "\n")
            files["input1"].write(" ".join(b) + "\n")
            files["label"].write(f"{score:.4f}\n" if regression else ("pos\n" if score > 0.5 else "neg\n"))
        for f in files.values():
            f.close()
    data = root / "bin"
    inputs = ("input0", "input1") if pair else ("input0",)
    for name in inputs:
        extra = ["--srcdict", data / "input0" / "dict.txt"] if name == "input1" else []
        run(["fairseq-preprocess", "--only-source", "--trainpref", raw / f"train.{name}",
             "--validpref", raw / f"valid.{name}", "--destdir", data / name, "--workers", "1", *extra])
    if regression:
        (data / "label").mkdir(parents=True, exist_ok=True)
        for split in ("train", "valid"):
            (data / "label" / f"{split}.label").write_text((raw / f"{split}.label").read_text())
    else:
        run(["fairseq-preprocess", "--only-source", "--trainpref", raw / "train.label",
             "--validpref", raw / "valid.label", "--destdir", data / "label", "--workers", "1"])
    return data


def train_args(data, save_dir, *extra, arch="budgetformer_tiny", num_classes=2, epochs=3):
    return [
        "fairseq-train", data, "--user-dir", PLUGIN_DIR, "--arch", arch,
        "--task", "budget_sentence_prediction", "--criterion", "budget_sentence_prediction",
        "--num-classes", num_classes, "--init-token", 0, "--separator-token", 2,
        "--max-positions", 64, "--batch-size", 16, "--optimizer", "adam", "--lr", "1e-3",
        "--max-epoch", epochs, "--save-dir", save_dir, "--cpu", "--num-workers", 0,
        "--log-format", "simple", "--log-interval", 5, "--seed", 1,
        "--best-checkpoint-metric", "loss", "--no-epoch-checkpoints",
        "--exploration-updates", 30, *extra,
    ]


def routed_attention(embed_dim, heads):
    """A BudgetedAttention in eval mode whose router varies: relevance weights N(0, 1) (so
    examples choose different heads) and a budget that moves with the input."""
    from budget_plugin.config import BudgetConfig
    from budget_plugin.modules import BudgetedAttention

    attention = BudgetedAttention(embed_dim, heads, BudgetConfig(), fixed_heads=heads)
    with torch.no_grad():
        attention.router.relevance_proj.weight.normal_(std=1.0)
        attention.router.budget_proj.weight.normal_(std=4.0 / embed_dim**0.5)
        attention.router.budget_proj.bias.zero_()
    return attention.eval()


@torch.no_grad()
def recomputed(checkpoint, data, split):
    """A checkpoint on a split, recomputed here as a check on what a script reported:
    its accuracy as fairseq logs it (rounded to 0.1) and, for a BudgetFormer, the heads
    each input ran (N x L x H bool; None for a stock model)."""
    from budget_plugin.tools.checkpoints import load_checkpoint
    from budget_plugin.tools.evaluation import classify, heads_per_input, samples, tokens

    model, task = load_checkpoint(checkpoint, data)
    batches = list(samples(task, split, 64))
    correct = sum((classify(model, tokens(b))[0].argmax(-1) == b["target"].view(-1)).sum().item() for b in batches)
    accuracy = round(100 * correct / sum(b["target"].numel() for b in batches), 1)
    return accuracy, (heads_per_input(model, batches)[0] if hasattr(model, "budgeted_attentions") else None)


# a WordPiece pair task (test_wordpiece_data.py, test_onnx.py): accents, unknown words
# and characters, long inputs, and a vocab.txt-only tokenizer
WORDPIECE_PIECES = ["the", "film", "a", "good", "bad", "plot", "cafe", "de", "##ja", "vu", "un", "##bel", "##ie",
                    "##va", "##bly", "!", ",", ".", "is", "was", "not"]
PAIRS = [  # accents, unknown words and characters, long inputs
    ("Café déjà vu!", "The film was good."),
    ("Unbelievably BAD plot, xyzzy 漢.", "the plot is not good"),
    (" ".join(["the good film"] * 15), "a bad plot"),
    ("naïve", "déjà vu, déjà vu"),
]




def wordpiece_pair_task(root: Path):
    """A tiny BERT with WordPiece's vocabulary converted into ``root``/model and an RTE-like
    pair task prepared with it into ``root``/RTE-bin; returns (data, model folder)."""
    from budget_plugin.data.prepare import prepare_task
    from budget_plugin.tools.tiny_bert import SPECIAL_TOKENS, TINY, write_bert

    vocab = SPECIAL_TOKENS + WORDPIECE_PIECES
    bert = write_bert(root / "bert", dict(TINY, vocab_size=len(vocab), max_position_embeddings=128), vocab)
    model = root / "model"
    run([sys.executable, REPO / "scripts" / "convert_bert.py", bert, model])
    raw = root / "RTE"
    raw.mkdir()
    for split, n in (("train", 64), ("dev", 16)):
        rows = ["index\tsentence1\tsentence2\tlabel"]
        rows += [f"{i}\t{a}\t{b}\t{'entailment' if i % 2 else 'not_entailment'}"
                 for i, (a, b) in enumerate(PAIRS * (n // len(PAIRS)))]
        (raw / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (raw / "test.tsv").write_text("index\tsentence1\tsentence2\n0\tgood\tbad\n", encoding="utf-8")
    prepare_task(raw, root, wordpiece=model, max_positions=128, log=lambda m: None)
    return root / "RTE-bin", model


def pair_task_training(data: Path, model: Path, save: Path, *extra, dense: bool = False) -> list:
    """fairseq-train's command line fine-tuning the converted tiny BERT on the pair task:
    a BudgetFormer (BERT's LayerNorm eps), or with ``dense`` a stock RoBERTa."""
    model_options = (["--arch", "roberta", "--criterion", "sentence_prediction"] if dense else
                     ["--arch", "budgetformer", "--layernorm-eps", 1e-12, "--criterion", "budget_sentence_prediction"])
    return ["fairseq-train", data, "--user-dir", REPO / "budget_plugin", "--task", "budget_sentence_prediction",
            *model_options, "--encoder-layers", 2, "--encoder-embed-dim", 32,
            "--encoder-ffn-embed-dim", 64, "--encoder-attention-heads", 4, "--max-positions", 128,
            "--restore-file", model / "model.pt", "--reset-optimizer", "--reset-dataloader", "--reset-meters",
            "--num-classes", 2, "--init-token", 0, "--separator-token", 2, "--batch-size", 16,
            "--optimizer", "adam", "--lr", 1e-3, "--max-epoch", 2, "--save-dir", save, "--cpu",
            "--num-workers", 0, "--seed", 1, "--no-epoch-checkpoints", *extra]
