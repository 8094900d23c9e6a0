"""budget_plugin.tools, the scripts' shared tooling: atomic files, fairseq's command
lines and logs, models built from the architecture registry, checkpoints read one way
(the archives of pinned packages: test_registry.py; the studies' records:
studies/test_study_tools.py)."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.roberta import RobertaModel

from budget_plugin.dial.settings import Dial
from budget_plugin.models.budgetformer import BudgetFormerModel
from budget_plugin.tools import fairseq_cli
from budget_plugin.tools.building import (
    architecture_args,
    build_model,
    dictionary,
    size_flags,
    size_of,
    size_options,
    twin,
)
from budget_plugin.tools.checkpoints import as_budgetformer, load_checkpoint, model_options, read
from budget_plugin.tools.errors import DataError
from budget_plugin.tools import memory
from budget_plugin.tools.files import atomic_path, building_dir, write_atomic, write_json
from helpers import assert_close


def plain_file_mode():
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


# ----------------------------------------------------------------------- files


def test_write_atomic_writes_text_bytes_and_json_with_plain_permissions(tmp_path):
    text, data, obj = tmp_path / "a" / "t.md", tmp_path / "b.bin", tmp_path / "c.json"
    write_atomic(text, "héllo\n")  # the folder is created
    write_atomic(data, b"\x00\xff")
    write_json(obj, {"x": [1, 2.5]})
    assert text.read_text(encoding="utf-8") == "héllo\n"
    assert data.read_bytes() == b"\x00\xff"
    assert obj.read_text() == '{\n  "x": [\n    1,\n    2.5\n  ]\n}\n'
    # a private temporary file (mkstemp's 0600) would make the result unreadable to others
    assert stat.S_IMODE(text.stat().st_mode) == plain_file_mode()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b.bin", "c.json", "t.md"]


@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path, error):
    target = tmp_path / "report.json"
    write_atomic(target, "old, complete\n")
    with pytest.raises(type(error)):
        with atomic_path(target) as tmp:
            tmp.write_text("half of the new")
            assert target.read_text() == "old, complete\n"  # nothing seen before the rename
            raise error
    assert target.read_text() == "old, complete\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_atomic_path_keeps_the_suffix_for_writers_that_pick_a_format_by_it(tmp_path):
    with atomic_path(tmp_path / "plot.png") as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".png" and tmp.name.startswith(".plot.png.")
        torch.save({"a": 1}, tmp)
    assert torch.load(tmp_path / "plot.png") == {"a": 1}


def test_building_dir_swaps_in_only_complete_folders(tmp_path):
    target = tmp_path / "X-bin"
    with building_dir(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".X-bin.tmp-")
        assert not target.exists()
        (tmp / "a").write_text("1")
    assert (target / "a").read_text() == "1"
    with building_dir(target) as tmp:
        (tmp / "b").write_text("2")
        assert (target / "a").exists()  # the old folder stays until the new one is complete
    assert sorted(p.name for p in target.iterdir()) == ["b"]
    with pytest.raises(KeyboardInterrupt):
        with building_dir(target) as tmp:
            (tmp / "c").write_text("3")
            raise KeyboardInterrupt
    assert sorted(p.name for p in target.iterdir()) == ["b"]
    assert [p.name for p in tmp_path.iterdir()] == ["X-bin"]


# ----------------------------------------------------------------------- fairseq's logs

VALID_LINE = ("2024-05-01 12:00:00 | INFO | valid | epoch 003 | valid on 'valid' subset | loss 0.693 | "
              "nll_loss 0.01 | accuracy 87.5 | heads_l0 3.25 | heads_l1 2 | wps 1.2e+05 | lr 1e-05 | bsz 60 | "
              "num_updates 39")
TRAIN_LINE = ("2024-05-01 12:00:00 | INFO | train_inner | epoch 001:     10 / 13 loss=1.009, nll_loss=0.032, "
              "lr=5e-05, gnorm=2.3, delta=-1.5e-3, gb_free=None, wall=3")


FREED_HEAP = """
import gc, importlib.util, re, sys
spec = importlib.util.spec_from_file_location("memory", sys.argv[1])  # not the package: it imports fairseq
memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(memory)
def rss(): return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024
blocks = [bytearray(4000) for _ in range(50000)]  # 200 MB of malloc's heap, under its mmap threshold
top = bytearray(4000)  # allocated after them: the heap cannot shrink from its end
del blocks; gc.collect()
before = rss()
print(memory.release_freed_memory(), before, rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; malloc_trim is glibc's")
def test_freed_heap_is_handed_back_before_a_child_runs():
    # a fresh interpreter: this one's heap holds whatever earlier tests left
    module = Path(memory.__file__)
    out = subprocess.run([sys.executable, "-c", FREED_HEAP, module], capture_output=True, text=True, check=True).stdout
    released, before, after = out.split()
    assert released == "True" and float(before) - float(after) > 150, out


def test_parse_metrics_reads_both_forms_exponents_and_negative_numbers():
    valid = fairseq_cli.parse_metrics(VALID_LINE)
    assert valid == {"epoch": 3.0, "loss": 0.693, "nll_loss": 0.01, "accuracy": 87.5, "heads_l0": 3.25,
                     "heads_l1": 2.0, "wps": 1.2e5, "lr": 1e-05, "bsz": 60.0, "num_updates": 39.0}
    train = fairseq_cli.parse_metrics(TRAIN_LINE)
    assert train == {"loss": 1.009, "nll_loss": 0.032, "lr": 5e-05, "gnorm": 2.3, "delta": -1.5e-3, "wall": 3.0}
    assert fairseq_cli.parse_metrics("| loss -0.5 | ppl inf | head_ratio .75") == {
        "loss": -0.5, "ppl": float("inf"), "head_ratio": 0.75}
    assert fairseq_cli.parse_metrics("| valid on 'valid' subset | lr 1e-05x") == {}


def test_validations_and_the_best_one_of_a_training_log():
    log = "\n".join([
        VALID_LINE.replace("accuracy 87.5", "accuracy 80").replace("epoch 003", "epoch 001"),
        TRAIN_LINE,
        VALID_LINE.replace("epoch 003", "epoch 002"),
        VALID_LINE.replace("valid on 'valid'", "valid on 'test'"),
        VALID_LINE,  # ties the best: fairseq keeps the later one
        VALID_LINE.replace("accuracy 87.5", "accuracy 85").replace("epoch 003", "epoch 004"),
    ])
    found = fairseq_cli.validation_metrics(log)
    assert [m["epoch"] for m in found] == [1, 2, 3, 4]
    assert [m["epoch"] for m in fairseq_cli.validation_metrics(log, "test")] == [3]
    assert fairseq_cli.best_validation(log)["epoch"] == 3
    with pytest.raises(fairseq_cli.CommandFailed, match="no validation line"):
        fairseq_cli.best_validation(TRAIN_LINE)


# ----------------------------------------------------------------------- running commands


def test_console_script_is_this_environments():
    # the function itself (conftest's session fixture stands in front of it: `.fresh`)
    console_script = getattr(fairseq_cli.console_script, "fresh", fairseq_cli.console_script)
    [exe] = console_script("fairseq-train")
    assert os.path.dirname(exe) == os.path.dirname(sys.executable)


def test_run_returns_the_output_keeps_a_log_and_echoes_progress(tmp_path, capsys):
    lines = ["step 1", "2024-05-01 12:00:00 | INFO | fairseq_cli.train | valid on x | accuracy 9", "plain | line"]
    script = f"import os; print(*{lines!r}, sep=chr(10)); print('threads', os.environ['OMP_NUM_THREADS'])"
    log = tmp_path / "out.log"
    output = fairseq_cli.run([sys.executable, "-c", script], log_path=log, threads=3,
                             progress=lambda line: "|" in line)
    assert output == "\n".join(lines) + "\nthreads 3\n"
    assert log.read_text() == output
    assert capsys.readouterr().out == "    valid on x | accuracy 9\n    plain | line\n"  # fairseq's prefix cut


def test_run_fails_with_the_exit_status_and_the_output_tail(tmp_path):
    script = "import sys; print('line ' * 2000); print('what went wrong'); sys.exit(3)"
    with pytest.raises(fairseq_cli.CommandFailed) as failure:
        fairseq_cli.run([sys.executable, "-c", script], log_path=tmp_path / "x.log")
    message = str(failure.value)
    assert "failed (3, log " in message and message.endswith("what went wrong\n")
    assert len(message) < 4200  # the tail, not the whole output


def test_run_stops_a_command_at_its_timeout():
    with pytest.raises(fairseq_cli.CommandFailed, match=r"timed out \(0.5s\)"):
        fairseq_cli.run([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                        timeout=0.5)


# ----------------------------------------------------------------------- building

BUDGETFORMER_ARCHS = sorted(a for a, model in ARCH_MODEL_REGISTRY.items() if model is BudgetFormerModel)
LARGE = {"budgetformer_large"}  # 300M parameters: seconds and GBs to build


@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow) if a in LARGE else a
                                  for a in BUDGETFORMER_ARCHS])
def test_a_registered_architecture_builds_at_the_registrys_size(arch):
    registered = architecture_args(arch)  # what fairseq-train --arch ARCH would run with
    model = build_model(arch, vocab=12)
    layers = model.encoder.sentence_encoder.layers
    attention = layers[0].self_attn
    built = (len(layers), attention.embed_dim, layers[0].fc1.out_features, attention.num_heads)
    assert built == tuple(size_of(arch)) == (registered.encoder_layers, registered.encoder_embed_dim,
                                              registered.encoder_ffn_embed_dim, registered.encoder_attention_heads)
    assert type(model) is BudgetFormerModel and model.args.arch == arch
    assert model.encoder.sentence_encoder.embed_tokens.num_embeddings == 12


def test_the_registered_sizes_differ_from_each_other():
    """A registry whose sized architectures all fell back to one default would pass the test above."""
    sizes = {arch: size_of(arch) for arch in BUDGETFORMER_ARCHS}
    assert len({sizes[a] for a in ("budgetformer_tiny", "budgetformer_small", "budgetformer_base",
                                   "budgetformer_large")}) == 4
    assert sizes["budgetformer"] == sizes["budgetformer_base"] == size_of("roberta")


def test_stock_roberta_of_a_budgetformers_size():
    stock = build_model("roberta", vocab=20, max_positions=32, num_classes=3, **size_options("budgetformer_tiny"))
    budget = build_model("budgetformer_tiny", vocab=20, max_positions=32)
    assert type(stock) is RobertaModel and size_of(stock.args) == size_of(budget.args)
    assert stock.args.max_positions == 32 and "sentence_classification_head" in stock.classification_heads
    # the same weights, less the routers
    assert set(stock.encoder.state_dict()) == {k for k in budget.encoder.state_dict() if ".router." not in k}
    flags = size_flags("budgetformer_tiny")
    assert dict(zip(flags[::2], flags[1::2])) == {
        "--encoder-layers": "2", "--encoder-embed-dim": "64", "--encoder-ffn-embed-dim": "128",
        "--encoder-attention-heads": "4"}


def test_building_from_a_checkpoints_options_keeps_them_and_copies_them():
    args = architecture_args("budgetformer_tiny", min_heads=2, max_positions=40)
    model = build_model("budgetformer_tiny", vocab=30, args=args, head_selection="static", fixed_heads="2")
    assert (model.args.min_heads, model.args.max_positions, model.args.head_selection) == (2, 40, "static")
    assert args.head_selection == "learned"  # the caller's options are untouched
    assert len(dictionary(30)) == 30


# ----------------------------------------------------------------------- checkpoints and twins


def test_loading_a_checkpoint_names_a_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"checkpoint .*nope\.pt: no such file or folder"):
        load_checkpoint(tmp_path / "nope.pt", tmp_path)
    (tmp_path / "model.pt").write_bytes(b"")
    with pytest.raises(DataError, match=r"data folder .*missing: no such file or folder"):
        load_checkpoint(tmp_path / "model.pt", tmp_path / "missing")
    with pytest.raises(DataError, match=r"checkpoint .*model\.pt: cannot be read"):
        read(tmp_path / "model.pt")
    torch.save({"weights": {}}, tmp_path / "other.pt")
    with pytest.raises(DataError, match=r"other\.pt: not a fairseq checkpoint"):
        read(tmp_path / "other.pt")


def test_a_roberta_checkpoint_becomes_a_budgetformer_computing_the_same():
    stock = build_model("roberta", vocab=30, max_positions=32, num_classes=3, **size_options("budgetformer_tiny"))
    state = {"model": stock.state_dict(), "cfg": {"model": stock.args}}
    assert model_options(state) is stock.args and model_options({"model": {}, "args": stock.args}) is stock.args
    budget = as_budgetformer(state)
    assert type(budget) is BudgetFormerModel and size_of(budget.args) == size_of(stock.args)
    tokens = torch.randint(4, 30, (3, 9))
    with torch.no_grad():  # routers at full budget: RoBERTa's features and logits
        for kwargs in ({"features_only": True}, {"classification_head_name": "sentence_classification_head"}):
            assert_close(budget(tokens, **kwargs)[0], stock.eval()(tokens, **kwargs)[0])
    with pytest.raises(DataError, match="no RoBERTa model options"):
        as_budgetformer({"model": stock.state_dict()})


def test_a_twin_has_the_weights_and_the_changed_options():
    model = build_model("budgetformer_tiny", vocab=30, max_positions=32, num_classes=2, min_heads=2).eval()
    static = twin(model, head_selection="static", fixed_heads="3", min_heads=None)
    assert (static.args.head_selection, static.args.fixed_heads) == ("static", "3")
    assert static.args.min_heads != 2 and model.args.head_selection == "learned"  # None: the default; a copy
    stock = twin(model, "roberta")
    assert type(stock) is RobertaModel and not stock.training
    tokens = torch.randint(4, 30, (2, 7))
    with torch.no_grad():
        want = model(tokens, classification_head_name="sentence_classification_head", dial=Dial(counts=(4, 4)))[0]
    with torch.no_grad():
        assert_close(stock(tokens, classification_head_name="sentence_classification_head")[0], want)
