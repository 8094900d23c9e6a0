"""Importance order: each layer's heads permuted so that head 0 is the most important
(DynaBERT's "rewiring"), which makes every prefix of the heads the most important ones
(``--head-selection nested`` runs prefixes); and the same for each layer's FFN neurons
(:func:`reorder_neurons`: fc1's rows and bias, fc2's columns).

A permutation of the heads changes nothing the model computes, provided everything
per-head moves together: the rows of q_proj/k_proj/v_proj (weights and biases), the
columns of out_proj's weight, and the router's per-head tensors (``relevance_proj``
rows and bias, ``static_logits``, the ``kept`` buffer). It works on a state dict, so it
serves stock fairseq ``roberta`` checkpoints and BudgetFormer ones alike; the
importance matrix comes from :func:`budget_plugin.nested.importance.head_importance`."""

import re
from typing import Dict, Tuple

from torch import Tensor

ATTENTION = re.compile(r"^encoder\.sentence_encoder\.layers\.(?P<index>\d+)\.self_attn\.(?P<name>.+)$")
FFN = "encoder.sentence_encoder.layers.{}.{}"
ROWS = {f"{p}_proj.{t}" for p in "qkv" for t in ("weight", "bias")}  # head h: rows h*d:(h+1)*d
COLUMNS = {"out_proj.weight"}  # head h: columns h*d:(h+1)*d
PER_HEAD = {"relevance_proj.weight", "relevance_proj.bias", "static_logits", "kept"}  # entry h: head h
SHARED = {"out_proj.bias", "budget_proj.weight", "budget_proj.bias"}  # no head's own


def head_order(importance: Tensor) -> Tensor:
    """L x H importance -> L x H order: row l lists layer l's heads, most important first
    (ties in head order)."""
    return importance.argsort(dim=1, descending=True, stable=True)


def reorder_heads(state: Dict[str, Tensor], importance: Tensor) -> Tuple[Dict[str, Tensor], Tensor]:
    """The state dict with every layer's heads in decreasing importance, and the order
    (L x H: new head j of layer l was head ``order[l, j]``). ``importance`` is L x H,
    H the model's heads per layer. ``state`` is not changed. (A 'kept' model's
    ``--kept-heads`` then names the old indices; its ``kept`` buffer, which a
    checkpoint loads over them, names the new ones.)

    Refused: a router that draws heads by index (``random_seed``, --head-selection
    random) or runs them by position (a budget predictor without a relevance: a nested
    model, whose order is its function), and any attention tensor of unknown shape."""
    order = head_order(importance)
    layers = _attention_layers(state)
    if sorted(layers) != list(range(order.size(0))):
        raise ValueError(f"importance has {order.size(0)} layers; the state dict's attention layers are "
                         f"{sorted(layers)}")
    permuted = dict(state)
    for index, names in layers.items():
        if "random_seed" in names or ("budget_proj.weight" in names and "relevance_proj.weight" not in names):
            raise ValueError(f"layer {index}: a random or nested router picks heads by their index; "
                             "reordering would change what it computes")
        heads = order[index]
        H = heads.numel()
        for what, key in names.items():
            tensor = state[key]
            if what in ROWS:
                permuted[key] = _by_head(tensor, heads, dim=0)
            elif what in COLUMNS:
                permuted[key] = _by_head(tensor, heads, dim=1)
            elif what in PER_HEAD and tensor.size(0) == H:
                permuted[key] = tensor.index_select(0, heads.to(tensor.device))
            elif what not in SHARED:
                raise ValueError(f"{key}: not known to be per-head or shared; refusing to guess")
    return permuted, order


def reorder_neurons(state: Dict[str, Tensor], importance: Tensor) -> Tuple[Dict[str, Tensor], Tensor]:
    """The state dict with every layer's FFN neurons in decreasing importance (neuron j
    is fc1's row j and bias j, and fc2's column j; nothing else reads them), and the
    order (L x F, as :func:`reorder_heads`'). ``state`` is not changed."""
    order = head_order(importance)
    permuted = dict(state)
    for index, neurons in enumerate(order):
        keys = {name: FFN.format(index, name) for name in ("fc1.weight", "fc1.bias", "fc2.weight")}
        missing = [key for key in keys.values() if key not in state]
        if missing or state[keys["fc1.weight"]].size(0) != neurons.numel():
            raise ValueError(f"layer {index}: importance of {neurons.numel()} neurons, but the state dict has "
                             + (f"no {missing[0]}" if missing else f"{state[keys['fc1.weight']].size(0)}"))
        for name, key in keys.items():
            permuted[key] = state[key].index_select(1 if name == "fc2.weight" else 0, neurons).contiguous()
    if FFN.format(len(order), "fc1.weight") in state:
        raise ValueError(f"importance has {len(order)} layers; the state dict has more")
    return permuted, order


def _attention_layers(state: Dict[str, Tensor]) -> Dict[int, Dict[str, str]]:
    """Layer index -> {name under ``self_attn.`` (a router's without ``router.``, which
    checkpoints older than the router module lack): key}."""
    layers: Dict[int, Dict[str, str]] = {}
    for key in state:
        found = ATTENTION.match(key)
        if found:
            name = found["name"][len("router."):] if found["name"].startswith("router.") else found["name"]
            layers.setdefault(int(found["index"]), {})[name] = key
    return layers


def _by_head(tensor: Tensor, heads: Tensor, dim: int) -> Tensor:
    """``tensor``'s head blocks along ``dim`` (H equal blocks) in the order ``heads``."""
    H = heads.numel()
    if tensor.size(dim) % H:
        raise ValueError(f"a dimension of {tensor.size(dim)} does not split into {H} heads")
    blocks = tensor.unflatten(dim, (H, tensor.size(dim) // H))
    return blocks.index_select(dim, heads.to(tensor.device)).flatten(dim, dim + 1).contiguous()
