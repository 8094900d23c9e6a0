"""Models built in this process from a registered architecture name, the way
fairseq-train builds them but without data. Sizes are read from fairseq's
``ARCH_CONFIG_REGISTRY``, never copied."""

import argparse
from typing import Dict, List, NamedTuple, Optional, Union

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

import budget_plugin  # noqa: F401  (registers the budgetformer architectures)
from budget_plugin.dial.state_format import DIAL_BUFFERS
from budget_plugin.tools.errors import DataError

SIZE_OPTIONS = ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads")


class Size(NamedTuple):
    layers: int
    embed_dim: int
    ffn_embed_dim: int
    heads: int


def architecture_args(arch: str, args: Optional[argparse.Namespace] = None, **overrides) -> argparse.Namespace:
    """A copy of ``args`` (a namespace or a mapping such as a checkpoint's ``cfg.model``;
    default none) with ``overrides``, completed by the architecture's registered
    function, as fairseq-train completes its options."""
    if arch not in ARCH_CONFIG_REGISTRY:
        raise ValueError(f"unknown architecture {arch!r}")
    options = {} if args is None else vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    args = argparse.Namespace(**options)  # a copy: the caller's options stay as they were
    vars(args).update(overrides, arch=arch)
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def size_of(arch: Union[str, argparse.Namespace]) -> Size:
    """The registered size of an architecture (a name), or a model's (its options)."""
    args = architecture_args(arch) if isinstance(arch, str) else arch
    return Size(*(getattr(args, option) for option in SIZE_OPTIONS))


def size_options(arch: str) -> Dict[str, int]:
    """The architecture's size as keyword arguments of :func:`build_model`."""
    return dict(zip(SIZE_OPTIONS, size_of(arch)))


def size_flags(arch: str) -> List[str]:
    """The architecture's size as fairseq-train options: a stock ``roberta`` of the
    same size as a BudgetFormer is ``--arch roberta *size_flags("budgetformer_small")``."""
    return [item for option, value in size_options(arch).items()
            for item in ("--" + option.replace("_", "-"), str(value))]


def dictionary(size: int) -> Dictionary:
    """A dictionary of exactly ``size`` symbols, fairseq's four specials included."""
    words = Dictionary()
    while len(words) < size:
        words.add_symbol(f"w{len(words)}")
    return words


class StubTask:
    """What a model's ``build_model`` reads of its task: the vocabulary and the
    longest input."""

    def __init__(self, source_dictionary: Dictionary, max_positions: int):
        self.source_dictionary = source_dictionary
        self._max_positions = max_positions

    def max_positions(self) -> int:
        return self._max_positions


def build_model(
    arch: str,
    vocab: int = 1000,
    *,
    max_positions: Optional[int] = None,
    args: Optional[argparse.Namespace] = None,
    num_classes: Optional[int] = None,
    **overrides,
):
    """A model of a registered architecture (``budgetformer_small``, ``roberta``, ...)
    with ``vocab`` embeddings and ``max_positions`` (default: ``args``', else 512);
    ``args``: start from these options (a checkpoint's);
    ``overrides``: options by name (``encoder_layers=2``, ``min_heads=2``, ...);
    ``num_classes``: add the ``sentence_classification_head``."""
    if max_positions is not None:
        overrides["max_positions"] = max_positions
    args = architecture_args(arch, args, **overrides)
    if not hasattr(args, "max_positions"):  # fairseq-train would take --tokens-per-sample's
        args.max_positions = 512
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, StubTask(dictionary(vocab), args.max_positions))
    if num_classes is not None:
        model.register_classification_head("sentence_classification_head", num_classes=num_classes)
    return model


def copy_weights(source_state: Dict[str, torch.Tensor], target: torch.nn.Module, classification_heads: bool = False):
    """Load a model's weights into another of the same size, across stock ``roberta`` and
    BudgetFormer: every weight but the routers', the budget dial's and the format's (which
    one side may lack) and, unless
    asked for, the classification heads'. Anything else that does not match raises."""
    state = {k: v for k, v in source_state.items() if classification_heads or not k.startswith("classification_heads.")}
    for name in DIAL_BUFFERS:  # a dial's tables have the source's number of rows
        if name in state and hasattr(target, name):
            setattr(target, name, getattr(target, name).new_empty(state[name].shape))
    missing, unexpected = target.load_state_dict(state, strict=False)
    # the dial's calibration and the state dict's format too (dial/state_format.py)
    missing = [k for k in missing if ".router." not in k and k not in (*DIAL_BUFFERS, "budget_format")]
    unexpected = [k for k in unexpected if ".router." not in k and k not in (*DIAL_BUFFERS, "budget_format")]
    if missing or unexpected:
        raise DataError(f"weights do not match: missing {missing[:5]}, unexpected {unexpected[:5]}")


def twin(model, arch: Optional[str] = None, **options):
    """A model of ``arch`` (default: ``model``'s own) with ``model``'s options, ``options``
    changed (None removes one: the architecture's default applies), and its weights,
    classification heads included, on its device and dtype, in eval mode. The routers'
    weights are copied where both sides have routers; a side that lacks them keeps its own."""
    args = argparse.Namespace(**vars(model.args))
    for key, value in options.items():
        if value is None:
            vars(args).pop(key, None)
        else:
            setattr(args, key, value)
    embed = model.encoder.sentence_encoder.embed_tokens
    built = build_model(arch or args.arch, embed.num_embeddings, args=args)
    for name, head in model.classification_heads.items():
        built.register_classification_head(name, num_classes=head.out_proj.out_features,
                                           inner_dim=head.dense.out_features)
    copy_weights(model.state_dict(), built, classification_heads=True)
    return built.to(device=embed.weight.device, dtype=embed.weight.dtype).eval()
