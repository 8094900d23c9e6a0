"""A pair task prepared with a pretrained model's WordPiece vocabulary: it trains and
validates end to end from the converted model, and the hub interface's encode() and
scripts/predict.py tokenize raw text exactly as the prepared data was tokenized."""

import sys

import pytest
import torch

from budget_plugin import BudgetFormerModel
from budget_plugin.data.prepare import prepare_task
from budget_plugin.tools.tiny_bert import SPECIAL_TOKENS, TINY, write_bert
from conftest import REPO, run

pytestmark = pytest.mark.slow  # converts, prepares and trains with the fairseq tools

PIECES = ["the", "film", "a", "good", "bad", "plot", "cafe", "de", "##ja", "vu", "un", "##bel", "##ie", "##va",
          "##bly", "!", ",", ".", "is", "was", "not"]
PAIRS = [  # accents, unknown words and characters, long inputs
    ("Café déjà vu!", "The film was good."),
    ("Unbelievably BAD plot, xyzzy 漢.", "the plot is not good"),
    (" ".join(["the good film"] * 15), "a bad plot"),
    ("naïve", "déjà vu, déjà vu"),
]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("wordpiece")
    vocab = SPECIAL_TOKENS + PIECES
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
    data = root / "RTE-bin"
    save = root / "ckpt"
    output = run(["fairseq-train", data, "--user-dir", REPO / "budget_plugin", "--task", "budget_sentence_prediction",
                  "--arch", "budgetformer", "--encoder-layers", 2, "--encoder-embed-dim", 32,
                  "--encoder-ffn-embed-dim", 64, "--encoder-attention-heads", 4, "--max-positions", 128,
                  "--layernorm-eps", 1e-12, "--restore-file", model / "model.pt", "--reset-optimizer",
                  "--reset-dataloader", "--reset-meters", "--criterion", "budget_sentence_prediction",
                  "--num-classes", 2, "--init-token", 0, "--separator-token", 2, "--batch-size", 16,
                  "--optimizer", "adam", "--lr", 1e-3, "--max-epoch", 2, "--save-dir", save, "--cpu",
                  "--num-workers", 0, "--seed", 1, "--no-epoch-checkpoints"])
    return data, save, output


def test_a_pair_task_prepared_with_wordpiece_trains_and_validates(prepared):
    data, save, output = prepared
    assert "Loaded checkpoint" in output and "| valid on 'valid' subset |" in output
    assert (save / "checkpoint_best.pt").is_file()
    assert (data / "tokenizer.json").is_file() is False and (data / "vocab.txt").is_file()


def test_hub_encode_equals_the_prepared_tokens(prepared):
    data, save, _ = prepared
    hub = BudgetFormerModel.from_pretrained(str(save), "checkpoint_best.pt", str(data))
    assert type(hub.bpe).__name__ == "WordPieceBPE"  # found next to the data
    hub.task.load_dataset("valid")
    dataset = hub.task.dataset("valid")
    for i, (a, b) in enumerate(PAIRS):
        prepared_tokens = dataset[i]["net_input.src_tokens"]
        assert torch.equal(hub.encode(a, b), prepared_tokens), (a, b, hub.decode(prepared_tokens))
        assert (prepared_tokens == 3).any() == (i in (1, 3))  # unknown words and characters: <unk>
    assert hub.decode(hub.encode("Café déjà vu!")) == "cafe deja vu!"


def test_predict_script_scores_what_the_prepared_data_holds(prepared, tmp_path):
    data, save, _ = prepared
    texts = tmp_path / "pairs.txt"
    texts.write_text("".join(f"{a}\t{b}\n" for a, b in PAIRS), encoding="utf-8")
    out = tmp_path / "preds.tsv"
    run([sys.executable, REPO / "scripts" / "predict.py", "--checkpoint-dir", save, "--data", data,
         "--input", texts, "--output", out, "--batch-size", 1])
    rows = [row.split("\t") for row in out.read_text().splitlines()[1:]]
    hub = BudgetFormerModel.from_pretrained(str(save), "checkpoint_best.pt", str(data))
    hub.task.load_dataset("valid")
    dataset = hub.task.dataset("valid")
    for i, row in enumerate(rows):
        with torch.no_grad():
            probs = hub.predict("sentence_classification_head", dataset[i]["net_input.src_tokens"]).exp()[0]
        label = hub.task.label_dictionary.string([probs.argmax().item() + hub.task.label_dictionary.nspecial])
        assert row[1] == label and float(row[2]) == pytest.approx(probs.max().item(), abs=1e-4)
