"""A tiny random BERT folder (config.json, model.safetensors, vocab.txt) in the layout
Hugging Face models ship in: what budget-convert reads. For the tests and the
main job's offline ``--quick`` form, where no pretrained model can be fetched."""

import json
from pathlib import Path
from typing import Dict, Optional, Sequence

import torch

TINY = {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
        "intermediate_size": 64, "max_position_embeddings": 40, "type_vocab_size": 2, "vocab_size": 30,
        "layer_norm_eps": 1e-12, "hidden_act": "gelu", "position_embedding_type": "absolute",
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
# BERT's layout: [PAD] first, unused slots, then [UNK] [CLS] [SEP] [MASK], then pieces
SPECIAL_TOKENS = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LAYER_NORM_KEYS = ("attention.output.LayerNorm", "output.LayerNorm")


def bert_weights(config: Dict = TINY, seed: int = 0) -> Dict[str, torch.Tensor]:
    """Random BERT weights under transformers' names, at BERT-like scales (embeddings of
    std 0.02-0.05, where the LayerNorm eps matters; LayerNorm gains around 1)."""
    gen = torch.Generator().manual_seed(seed)
    d, f = config["hidden_size"], config["intermediate_size"]

    def rand(*shape, std=0.2, mean=0.0):
        return torch.randn(*shape, generator=gen) * std + mean

    w = {"embeddings.word_embeddings.weight": rand(config["vocab_size"], d, std=0.05),
         "embeddings.position_embeddings.weight": rand(config["max_position_embeddings"], d, std=0.02),
         "embeddings.token_type_embeddings.weight": rand(config["type_vocab_size"], d, std=0.02),
         "embeddings.LayerNorm.weight": rand(d, std=0.1, mean=1.0), "embeddings.LayerNorm.bias": rand(d, std=0.1)}
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            w[p + name + ".weight"], w[p + name + ".bias"] = rand(d, d), rand(d, std=0.05)
        w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"] = rand(f, d), rand(f, std=0.05)
        w[p + "output.dense.weight"], w[p + "output.dense.bias"] = rand(d, f, std=0.15), rand(d, std=0.05)
        for name in LAYER_NORM_KEYS:
            w[p + name + ".weight"], w[p + name + ".bias"] = rand(d, std=0.1, mean=1.0), rand(d, std=0.1)
    w["pooler.dense.weight"], w["pooler.dense.bias"] = rand(d, d), rand(d)
    return w


def write_bert(folder: Path, config: Dict = TINY, vocab: Optional[Sequence[str]] = None,
               weights: Optional[Dict[str, torch.Tensor]] = None, weights_file: str = "model.safetensors") -> Path:
    """Write the folder as given (mismatches included: the converter's tests need them);
    ``vocab`` defaults to the specials and ``w0 w1 ...`` up to the config's vocab_size."""
    from safetensors.torch import save_file

    vocab = vocab or SPECIAL_TOKENS + [f"w{i}" for i in range(config["vocab_size"] - len(SPECIAL_TOKENS))]
    folder.mkdir(parents=True, exist_ok=True)
    weights = bert_weights(config) if weights is None else weights
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    if weights_file.endswith(".safetensors"):
        save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / weights_file))
    else:
        torch.save(weights, folder / weights_file)
    return folder
