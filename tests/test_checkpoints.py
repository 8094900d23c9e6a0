"""Checkpoints are data, not code: loading stays ``weights_only=True``, and a checkpoint of
another architecture fails naming the keys that do not fit.

The checkpoints are written by fairseq's own ``Trainer.save_checkpoint`` in this process
(what fairseq-train writes, at update 0), so no training is needed; the data folders hold
only the dictionaries, which is all fairseq reads before it loads a model."""

import os
import pickle
import subprocess

import pytest
import torch

from helpers import BIN, PLUGIN_DIR, train_args, without_option

TASK = ["--task", "budget_sentence_prediction", "--criterion", "budget_sentence_prediction"]
ROUTER_KEY = "encoder.sentence_encoder.layers.1.self_attn.router.budget_proj.weight"
ALIEN_KEY = "encoder.sentence_encoder.layers.1.self_attn.alien_proj.weight"


def dictionaries(root):
    """What fairseq-preprocess would write as dictionaries for make_classification_data."""
    (root / "input0").mkdir(parents=True)
    (root / "label").mkdir()
    (root / "input0" / "dict.txt").write_text("".join(f"w{i} {100 - i}\n" for i in range(30)))
    (root / "label" / "dict.txt").write_text("pos 160\nneg 160\n")
    return root


def fresh_checkpoint(argv, path):
    """A fairseq checkpoint of the model that ``fairseq-train argv`` builds, written by
    fairseq's Trainer (update 0)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    args = options.parse_args_and_arch(options.get_training_parser(), [str(a) for a in argv[1:]])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    trainer.consolidate_optimizer()  # as checkpoint_utils.save_checkpoint does first
    trainer.save_checkpoint(str(path), {"train_iterator": {"epoch": 1}, "val_loss": None})
    return path


class Payload:
    """Unpickling this creates ``path``: what a malicious checkpoint would do."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def run_failing(cmd):
    proc = subprocess.run([str(BIN / cmd[0]), *map(str, cmd[1:])], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode != 0, proc.stdout[-3000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    data = dictionaries(root / "data")
    checkpoint = fresh_checkpoint(train_args(data, root / "unused"), root / "budgetformer.pt")
    return root, data, checkpoint


def evil_copy(checkpoint, path, marker):
    state = torch.load(checkpoint, weights_only=True)
    state["extra_state"]["note"] = Payload(marker)
    torch.save(state, path)
    return path


def test_the_payload_is_live_when_loaded_unsafely(setup, tmp_path):
    """The control: the same payload does run when safety is switched off."""
    _, _, checkpoint = setup
    marker = tmp_path / "pwned"
    evil = evil_copy(checkpoint, tmp_path / "evil.pt", marker)
    state = torch.load(evil, weights_only=False)
    state["extra_state"]["note"].close()
    assert marker.exists()


def test_torch_load_refuses_code_after_import_budget_plugin(setup, tmp_path):
    import budget_plugin  # noqa: F401  (what the allow-list adds must not let code in)

    _, _, checkpoint = setup
    marker = tmp_path / "pwned"
    evil = evil_copy(checkpoint, tmp_path / "evil.pt", marker)
    with pytest.raises(pickle.UnpicklingError, match="Unsupported global: GLOBAL io.open"):
        torch.load(evil, weights_only=True)
    with pytest.raises(pickle.UnpicklingError, match="Unsupported global: GLOBAL io.open"):
        torch.load(evil)  # torch >= 2.6: weights_only=True is the default fairseq relies on
    assert not marker.exists()
    torch.load(checkpoint)  # the genuine one loads


@pytest.mark.slow
def test_fairseq_validate_refuses_a_checkpoint_that_would_run_code(setup, tmp_path):
    _, data, checkpoint = setup
    marker = tmp_path / "pwned"
    evil = evil_copy(checkpoint, tmp_path / "evil.pt", marker)
    output = run_failing(["fairseq-validate", data, "--user-dir", PLUGIN_DIR, "--path", evil, *TASK,
                          "--cpu", "--num-workers", 0, "--batch-size", 8])
    assert "Weights only load failed" in output, output[-3000:]
    assert "Unsupported global: GLOBAL io.open" in output
    assert not marker.exists(), "the checkpoint's payload ran"


@pytest.mark.slow
def test_missing_and_unexpected_keys_are_named(setup, tmp_path):
    """A BudgetFormer checkpoint with a router weight removed and an unknown weight added."""
    _, data, checkpoint = setup
    state = torch.load(checkpoint, weights_only=True)
    state["model"][ALIEN_KEY] = state["model"].pop(ROUTER_KEY)
    torch.save(state, tmp_path / "edited.pt")
    output = run_failing(["fairseq-validate", data, "--user-dir", PLUGIN_DIR, "--path", tmp_path / "edited.pt",
                          *TASK, "--cpu", "--num-workers", 0, "--batch-size", 8])
    assert "Error(s) in loading state_dict for BudgetFormerModel" in output, output[-3000:]
    assert f'Missing key(s) in state_dict: "{ROUTER_KEY}"' in output
    assert f'Unexpected key(s) in state_dict: "{ALIEN_KEY}"' in output


@pytest.mark.slow
def test_roberta_of_another_size_does_not_warm_start_budgetformer(setup):
    """RoBERTa with 3 layers given to budgetformer_tiny (2 layers) with --restore-file:
    fairseq's trainer wraps the strict load error, and both messages reach the user."""
    root, data, _ = setup
    argv = train_args(data, root / "unused")
    argv[argv.index("--arch"):argv.index("--arch") + 2] = [
        "--arch", "roberta", "--encoder-layers", 3, "--encoder-embed-dim", 64,
        "--encoder-ffn-embed-dim", 128, "--encoder-attention-heads", 4]
    task = argv.index("budget_sentence_prediction")
    argv[task] = argv[task + 2] = "sentence_prediction"
    roberta = fresh_checkpoint(without_option(argv, "--exploration-updates"), root / "roberta3.pt")
    assert type(torch.load(roberta, weights_only=True)["cfg"]["model"]).__name__ == "Namespace"

    output = run_failing(train_args(data, root / "ckpt", "--restore-file", roberta, "--reset-optimizer",
                                    "--reset-dataloader", "--reset-meters", "--disable-validation"))
    assert f"Cannot load model parameters from checkpoint {roberta}; please ensure that the architectures match" in output
    assert "Error(s) in loading state_dict for BudgetFormerModel" in output
    assert 'Unexpected key(s) in state_dict: "encoder.sentence_encoder.layers.2.' in output
    assert not list((root / "ckpt").glob("*.pt"))
