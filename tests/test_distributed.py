"""Data-parallel training through fairseq's own distributed code, on CPU with gloo.

Stock fairseq 0.12 cannot infer a CPU job (``fairseq/distributed/utils.py`` sizes
everything by ``torch.cuda.device_count()``, which is 0 here), so the launch spells out
what it would infer, with fairseq's standard options only (no plugin code):

    torchrun --standalone --nproc_per_node 2 --no-python \\
        sh -c 'exec fairseq-train "$@" --distributed-rank "$RANK"' fairseq-train \\
        DATA ... --cpu --distributed-backend gloo --distributed-world-size 2 \\
        --distributed-init-method env:// --distributed-no-spawn --ddp-backend legacy_ddp

and two processes that each take half of every batch must reach the parameters of one
process that takes the whole batch (``--update-freq 2``: the same two half-batches,
summed). Exact comparison needs dropout and exploration noise off (each process draws
its own).

The sandwich (``--sandwich-widths N``: the full width, N-1 narrower ones and the
router's pass, each a forward pass of the same model, each backpropagated as soon as it
is computed by the task's train_step) under data parallelism:

- torch's DDP reducer, the one fairseq's ``--ddp-backend c10d`` wraps the model in
  (stock fairseq cannot build it on CPU: it passes GPU device ids): every pass but the
  last (the router's) accumulates locally under ``no_sync``, the last reduces them; every
  budgeted parameter takes part (no ``find_unused_parameters``) and the averaged
  gradient is exactly the mean of what each process computes alone with one summed loss;
- fairseq-train itself with two processes (``--ddp-backend legacy_ddp``, the CPU one)."""

import json
import re
import time

import pytest
import torch

from helpers import (
    BIN,
    CPU_DDP,
    PER_RANK,
    REPO,
    RTOL,
    build_model,
    console_script,
    make_classification_data,
    make_criterion,
    parse_metrics,
    random_tokens,
    run,
    torchrun,
    train_args,
    without_option,
)

# on the parameters after Adam's updates: absolute, as Adam moves each parameter by about
# the learning rate (1e-3) whatever its size; measured 0.0 (each process computes its
# half-batch's gradient as the single process does, and adding two gradients is exact
# in either order)
TOLERANCE = 1e-5
SAME_UPDATES = ("--max-update", 4, "--save-interval-updates", 2, "--batch-size", 8,
                "--dropout", 0, "--attention-dropout", 0, "--exploration-updates", 0, "--log-interval", 1)
# (torchrun runs fairseq-train as the tests run it: helpers.console_script, forked with torchrun's environment)


def load_model(path):
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def max_abs_diff(a, b):
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].numel())  # not empty buffers


def epoch_summary(output):
    lines = [line for line in output.splitlines() if "| train | epoch" in line]
    assert lines, output[-3000:]
    return {k: v for k, v in parse_metrics(lines[-1]).items() if k not in ("wps", "ups", "wall", "train_wall")}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_classification_data(tmp_path_factory.mktemp("ddp-data"), n_train=128, n_valid=32)


@pytest.mark.slow
def test_two_cpu_processes_equal_one_process_with_the_whole_batch(data, tmp_path):
    start = time.monotonic()
    single = run(train_args(data, tmp_path / "one", *SAME_UPDATES, "--update-freq", 2))
    single_wall = time.monotonic() - start
    start = time.monotonic()
    args = train_args(data, tmp_path / "two", *SAME_UPDATES, *CPU_DDP)
    double = torchrun(2, ["--no-python", "sh", "-c", PER_RANK, *console_script("fairseq-train"), *args[1:]])
    double_wall = time.monotonic() - start

    assert "distributed init (rank 0): env://" in double and "distributed init (rank 1): env://" in double
    assert "training on 2 devices" in double
    summary_one, summary_two = epoch_summary(single), epoch_summary(double)
    assert summary_two["bsz"] == summary_one["bsz"] == 16  # 2 x 8, reduced over the workers
    assert summary_two == summary_one
    diffs = {}
    for name in ("checkpoint_1_2.pt", "checkpoint_last.pt"):
        diffs[name] = max_abs_diff(load_model(tmp_path / "one" / name), load_model(tmp_path / "two" / name))
        assert diffs[name] <= TOLERANCE, (name, diffs[name])
    moved = max_abs_diff(load_model(tmp_path / "two" / "checkpoint_1_2.pt"), load_model(tmp_path / "two" / "checkpoint_last.pt"))
    assert moved > 5e-4  # the two updates in between changed the parameters
    training = [re.findall(r"done training in ([\d.]+) seconds", out)[-1] for out in (single, double)]
    print(f"\nmax |2 processes - 1 process|: {diffs}; moved {moved:.3g} between updates 2 and 4; "
          f"wall time (training only): 1 process {single_wall:.1f} s ({training[0]} s), "
          f"2 processes {double_wall:.1f} s ({training[1]} s)")


# Per-layer statistics under --encoder-layerdrop, through fairseq's own reduction: it
# sums the logging outputs of the --update-freq steps, then all-reduces them across
# workers by key position, with the keys of each worker's first output.
LAYERDROP = ("--head-selection", "static", "--fixed-heads", "1,3", "--encoder-layerdrop", 0.5,
             "--exploration-updates", 0, "--dropout", 0.1, "--batch-size", 8, "--max-update", 8,
             "--log-interval", 1)  # 4 updates an epoch


def per_layer_heads(output):
    """Every train_inner line's and every epoch summary's metrics."""
    logged = [parse_metrics(line) for line in output.splitlines() if "train_inner" in line or "| train | epoch" in line]
    assert len(logged) == 10, output[-3000:]  # 8 updates, 2 epochs
    return logged


@pytest.mark.slow
def test_layerdrop_statistics_survive_two_workers_and_update_freq(data, tmp_path):
    """Two processes with --update-freq 2 log every layer's heads under its own name, as
    one process over the same batches (--update-freq 4) does. Static budgets fix each
    layer's heads (1 and 3), so a sum under the wrong layer shows as another value, a
    dropped one as a missing key. fairseq seeds every process alike, but on CPU dropout
    draws as many numbers as a batch has elements, so processes whose batches differ in
    length skip different layers, as they do in real jobs."""
    single = per_layer_heads(run(train_args(data, tmp_path / "one", *LAYERDROP, "--update-freq", 4)))
    args = train_args(data, tmp_path / "two", *LAYERDROP, "--update-freq", 2, *CPU_DDP)
    double = per_layer_heads(torchrun(2, ["--no-python", "sh", "-c", PER_RANK, *console_script("fairseq-train"),
                                          *args[1:]]))

    for logged in (single, double):
        layers = [{k: v for k, v in line.items() if k.startswith("heads_l")} for line in logged]
        assert all(set(line.items()) <= {("heads_l0", 1.0), ("heads_l1", 3.0)} for line in layers), layers
        assert layers[4] == layers[9] == {"heads_l0": 1.0, "heads_l1": 3.0}  # the epochs': every layer ran
        assert any(line["heads"] != 2.0 for line in logged)  # layers were skipped (else heads = (1 + 3) / 2)
    assert [line["bsz"] for line in double] == [line["bsz"] for line in single]  # the same batches


# Real torch DDP (the reducer fairseq's --ddp-backend c10d uses, here on CPU with gloo)
# around the real model and criterion: examples and processes that select different
# heads leave no budgeted-attention parameter unused; only RoBERTa's LM head is.
# A worker's first lines: argv[1] the repository, argv[2] where it writes its result.
DDP_PREAMBLE = r"""
import copy, json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
from types import SimpleNamespace
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from helpers import build_model, random_tokens
from budget_plugin.criterions.budget_sentence_prediction import (
    BudgetSentencePredictionConfig, BudgetSentencePredictionCriterion)
from fairseq.data import Dictionary
from fairseq.distributed import ModuleProxyWrapper

dist.init_process_group("gloo")
rank = dist.get_rank()
"""
# Both ranks leave together: a rank that exits while gloo still holds its peer's
# connection can abort the other one at exit ("terminate called without an active
# exception"), after its result was written.
DDP_EPILOGUE = r"""
dist.barrier()
dist.destroy_process_group()
"""
DDP_WORKER = DDP_PREAMBLE + r"""
criterion = BudgetSentencePredictionCriterion(
    BudgetSentencePredictionConfig(), SimpleNamespace(label_dictionary=Dictionary()))

def attempt(find_unused_parameters, train_lm_head):
    torch.manual_seed(0)  # the same initial model everywhere
    # 2 of 4 heads; update 0 of 10: exploring at rate 1
    model = build_model(num_classes=2, initial_budget=1.8, exploration_updates=10).train()
    for name, p in model.named_parameters():
        p.requires_grad_(train_lm_head or not name.startswith("encoder.lm_head."))
    wrapped = ModuleProxyWrapper(DistributedDataParallel(model, find_unused_parameters=find_unused_parameters))
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    torch.manual_seed(100 + rank)  # each process: its own examples and exploration noise
    head_sets, choices = set(), []
    try:
        for step in range(3):
            tokens = random_tokens()
            sample = {"net_input": {"src_tokens": tokens, "src_lengths": tokens.ne(1).sum(1)},
                      "target": torch.randint(0, 2, (6,)), "ntokens": int(tokens.ne(1).sum())}
            loss, _, logs = criterion(wrapped, sample)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                _, extra = model(tokens, features_only=True)
            rows = [row for layer in extra["budget"] for row in layer["selected"].int().tolist()]
            head_sets |= {tuple(row) for row in rows}
            choices.append(rows)
    except RuntimeError as error:
        return {"error": str(error)[:600]}
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(every, flat)
    return {"rank_diff": (every[0] - every[1]).abs().max().item(), "head_sets": sorted(head_sets),
            "choices": choices}

result = {
    "strict": attempt(find_unused_parameters=False, train_lm_head=False),
    "find_unused": attempt(find_unused_parameters=True, train_lm_head=True),
    "lm_head_unused": attempt(find_unused_parameters=False, train_lm_head=True),
}
# one file per rank: two processes printing long lines to one pipe can interleave them
with open(f"{sys.argv[2]}/result{rank}.json", "w") as f:
    json.dump(result, f)
"""


def worker_results(tmp_path, source: str):
    """``source`` run as two torchrun workers; each rank's result (result{rank}.json), and
    the run's output."""
    script = tmp_path / "worker.py"
    script.write_text(source + DDP_EPILOGUE)
    output = torchrun(2, [script, REPO, tmp_path])
    files = [tmp_path / f"result{rank}.json" for rank in (0, 1)]
    assert all(f.exists() for f in files), output[-3000:]
    return [json.loads(f.read_text()) for f in files], output


@pytest.mark.slow
def test_ddp_reducer_sees_every_budgeted_parameter_used(tmp_path):
    results, _ = worker_results(tmp_path, DDP_WORKER)
    for result in results:
        # without find_unused_parameters, DDP raises on any parameter left out of the loss:
        # with the LM head frozen, every other parameter (routers included) is used
        strict = result["strict"]
        assert "error" not in strict, strict
        assert strict["rank_diff"] == 0.0
        assert len(strict["head_sets"]) > 1  # examples ran different heads
        assert all(0 < sum(s) < 4 for s in strict["head_sets"])
        assert result["find_unused"].get("rank_diff") == 0.0, result["find_unused"]
        # and the LM head is what --find-unused-parameters is for
        assert "did not receive grad" in result["lm_head_unused"].get("error", "") or \
               "not used in producing loss" in result["lm_head_unused"].get("error", ""), result["lm_head_unused"]
    assert results[0]["strict"]["choices"] != results[1]["strict"]["choices"]  # and processes too
    print("\nDDP without find_unused_parameters, LM head trainable:", results[0]["lm_head_unused"]["error"])


def test_only_the_lm_head_is_unused_when_heads_differ_per_example():
    """What DDP's unused-parameter check looks at, in one process: after one backward
    through the criterion, which parameters have no gradient."""
    model = build_model(num_classes=2, initial_budget=1.8, exploration_updates=10).train()
    criterion = make_criterion()
    tokens = random_tokens()
    sample = {"net_input": {"src_tokens": tokens, "src_lengths": tokens.ne(1).sum(1)},
              "target": torch.tensor([0, 1, 0, 1, 1, 0]), "ntokens": int(tokens.ne(1).sum())}
    outputs = []
    hook = model.register_forward_hook(lambda m, a, out: outputs.append(out))
    loss, _, _ = criterion(model, sample)
    hook.remove()
    loss.backward()
    selected = [layer["selected"] for layer in outputs[-1][1]["budget"]]
    assert any(len({tuple(r) for r in s.tolist()}) > 1 for s in selected)  # heads differ per example
    assert all(not bool(s.all()) for s in selected)  # and some heads were left out
    unused = sorted(n for n, p in model.named_parameters() if p.grad is None)
    assert unused == ["encoder.lm_head.bias", "encoder.lm_head.dense.bias", "encoder.lm_head.dense.weight",
                      "encoder.lm_head.layer_norm.bias", "encoder.lm_head.layer_norm.weight"]
    for attention in model.budgeted_attentions():
        for name, p in attention.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert attention.router.relevance_proj.weight.grad.abs().sum() > 0
        assert attention.router.budget_proj.weight.grad.abs().sum() > 0


# ---------------------------------------------------------- the sandwich under data parallelism

SANDWICH_WORKER = DDP_PREAMBLE + r"""
from budget_plugin.option_error import OptionError
from budget_plugin.tasks.budget_sentence_prediction import BudgetSentencePredictionTask


class Optimizer:  # what train_step uses of fairseq's optimizer
    def backward(self, loss):
        loss.backward()


FP32_TASK = SimpleNamespace(cfg=SimpleNamespace(cpu_precision="fp32"))  # what train_step reads of the task


def sandwich_steps(no_router_pass, find_unused):
    criterion = BudgetSentencePredictionCriterion(
        BudgetSentencePredictionConfig(sandwich_widths=3, distill_weight=0.5, target_head_ratio=0.5,
                                       no_router_pass=no_router_pass),
        SimpleNamespace(label_dictionary=Dictionary()))
    torch.manual_seed(0)  # the same initial model everywhere
    model = build_model(num_classes=2, head_selection="nested", min_heads=1, dropout=0.0,
                        attention_dropout=0.0).train()
    for name, p in model.named_parameters():
        p.requires_grad_(not name.startswith("encoder.lm_head."))  # fairseq's LM head is unused here
    alone = copy.deepcopy(model)
    wrapped = ModuleProxyWrapper(DistributedDataParallel(model, find_unused_parameters=find_unused))
    steps = []
    for step in range(2):
        torch.manual_seed(100 + 10 * step + rank)  # each process: its own examples
        tokens = random_tokens()
        sample = {"net_input": {"src_tokens": tokens, "src_lengths": tokens.ne(1).sum(1)},
                  "target": torch.randint(0, 2, (6,)), "ntokens": int(tokens.ne(1).sum())}
        model.zero_grad()
        alone.zero_grad()
        torch.manual_seed(7 + step)  # the sandwich's widths: the same in every process, as fairseq seeds them
        BudgetSentencePredictionTask.train_step(FP32_TASK, sample, wrapped, criterion, Optimizer(), step)
        torch.manual_seed(7 + step)
        criterion(alone, sample)[0].backward()
        own = torch.cat([p.grad.flatten() for p in alone.parameters() if p.grad is not None])
        mean = own.clone()
        dist.all_reduce(mean)
        mean /= dist.get_world_size()
        averaged = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        steps.append({"diff": (averaged - mean).abs().max().item(), "own_vs_mean": (own - mean).abs().max().item(),
                      "scale": max(averaged.abs().max().item(), mean.abs().max().item()),
                      "grads": len([p for p in model.parameters() if p.grad is not None])})
    return {"steps": steps}


result = {}
for name, options in {"router": (False, False), "no router": (True, True), "refused": (True, False)}.items():
    try:
        result[name] = sandwich_steps(*options)
    except (RuntimeError, OptionError) as error:
        result[name] = {"error": str(error)[:800]}
with open(f"{sys.argv[2]}/result{rank}.json", "w") as f:
    json.dump(result, f)
"""


@pytest.mark.slow
def test_the_ddp_reducer_averages_the_sandwichs_gradients_exactly(tmp_path):
    """With the router's pass (every parameter used, no unused-parameter search) and
    without it (--no-router-pass: the routers get no gradient, so DDP must look for
    unused parameters; without --find-unused-parameters it is refused by name)."""
    results, output = worker_results(tmp_path, SANDWICH_WORKER)
    named = list(build_model(num_classes=2, head_selection="nested", min_heads=1).named_parameters())
    trainable = sum(1 for name, _ in named if not name.startswith("encoder.lm_head."))
    routers = sum(1 for name, _ in named if ".router." in name)
    assert routers > 0
    for result in results:
        for name, expected in {"router": trainable, "no router": trainable - routers}.items():
            assert "error" not in result[name], result[name].get("error", "") + output[-2000:]
            for step in result[name]["steps"]:
                # the reducer's mean is the mean of each process's own (summed) gradient, up to
                # float32's rounding of sums taken in another order (the passes' gradients
                # accumulated one by one, then averaged over the processes)
                assert step["diff"] <= RTOL * step["scale"], (name, step)
                assert step["own_vs_mean"] > 1e-3  # and the processes' gradients differed
                assert step["grads"] == expected, name  # every trainable parameter got a gradient
        assert "needs --find-unused-parameters" in result["refused"].get("error", ""), result["refused"]


@pytest.mark.slow
def test_fairseq_train_runs_the_sandwich_in_two_processes(tmp_path):
    data = make_classification_data(tmp_path / "data", n_train=64, n_valid=16)
    args = train_args(data, tmp_path / "save", "--head-selection", "nested", "--min-heads", 1,
                      "--sandwich-widths", 3, "--max-update", 4, "--batch-size", 8, "--log-interval", 1)
    args = without_option(args, "--exploration-updates")  # nothing to explore in a nested model
    args = [a for a in args if a != "--cpu"]  # CPU_DDP has it
    output = torchrun(2, ["--no-python", "sh", "-c", PER_RANK, BIN / "fairseq-train", *args[1:], *CPU_DDP])
    assert "done training" in output
    inner = [line for line in output.splitlines() if "| train_inner |" in line]
    assert len(inner) == 4 and all("loss=nan" not in line for line in inner), output[-3000:]
    assert "distributed init (rank 0)" in output and "distributed init (rank 1)" in output
    assert (tmp_path / "save" / "checkpoint_best.pt").is_file()


# ---------------------------------------------------------- why stock fails on CPU


def test_why_stock_fairseq_does_not_infer_a_cpu_job(monkeypatch):
    """The three ways stock fairseq 0.12 gets a CPU job wrong, each from
    fairseq/distributed/utils.py when torch.cuda.device_count() == 0 (made so here, so
    that the test holds on a GPU machine too)."""
    from fairseq.dataclass.configs import DistributedTrainingConfig, FairseqConfig
    from fairseq.distributed import utils as distributed_utils
    from omegaconf import OmegaConf

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    for key, value in {"MASTER_ADDR": "localhost", "MASTER_PORT": "29500", "WORLD_SIZE": "2", "RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    # 1. torchrun alone: the default world size is max(1, #GPUs) = 1, so nothing is
    #    initialised and every process trains alone
    cfg = OmegaConf.structured(DistributedTrainingConfig(tpu=False))
    assert cfg.distributed_world_size == 1
    distributed_utils.infer_init_method(cfg)
    assert cfg.distributed_init_method is None
    # 2. torchrun + --distributed-world-size 2: device_id = rank % #GPUs
    cfg = OmegaConf.structured(DistributedTrainingConfig(distributed_world_size=2, tpu=False))
    with pytest.raises(ZeroDivisionError):
        distributed_utils.infer_init_method(cfg)
    # 3. fairseq's own launcher (--distributed-init-method without --distributed-no-spawn)
    #    spawns min(#GPUs, world size) = 0 processes, trains nothing and exits 0
    spawned, trained = [], []
    monkeypatch.setattr(torch.multiprocessing, "spawn", lambda fn, args, nprocs, join: spawned.append(nprocs))
    full = OmegaConf.structured(FairseqConfig)
    full.distributed_training.distributed_world_size = 2
    full.distributed_training.distributed_init_method = "tcp://localhost:29500"
    distributed_utils.call_main(full, lambda cfg: trained.append(cfg))
    assert spawned == [0] and trained == []
