"""The sandwich (``--sandwich-widths N``: the full width, N-1 narrower ones and the
router's pass, each a forward pass of the same model, each backpropagated as soon as it
is computed by the task's train_step) under data parallelism, on CPU with gloo:

- torch's DDP reducer, the one fairseq's ``--ddp-backend c10d`` wraps the model in
  (stock fairseq cannot build it on CPU: it passes GPU device ids): every pass but the
  last (the router's) accumulates locally under ``no_sync``, the last reduces them; every
  budgeted parameter takes part (no ``find_unused_parameters``) and the averaged
  gradient is exactly the mean of what each process computes alone with one summed loss;
- fairseq-train itself with two processes (``--ddp-backend legacy_ddp``, the CPU one)."""

import json

import pytest
from test_distributed import CPU_DDP, DDP_PREAMBLE, PER_RANK, torchrun

from conftest import BIN, REPO, build_model, make_classification_data, train_args

WORKER = DDP_PREAMBLE + r"""
from budget_plugin.tasks.budget_sentence_prediction import BudgetSentencePredictionTask
criterion = BudgetSentencePredictionCriterion(
    BudgetSentencePredictionConfig(sandwich_widths=3, distill_weight=0.5, target_head_ratio=0.5),
    SimpleNamespace(label_dictionary=Dictionary()))
torch.manual_seed(0)  # the same initial model everywhere
model = build_model(num_classes=2, head_selection="nested", min_heads=1, dropout=0.0, attention_dropout=0.0).train()
for name, p in model.named_parameters():
    p.requires_grad_(not name.startswith("encoder.lm_head."))  # fairseq's LM head is unused here
alone = copy.deepcopy(model)


class Optimizer:  # what train_step uses of fairseq's optimizer
    def backward(self, loss):
        loss.backward()


wrapped = ModuleProxyWrapper(DistributedDataParallel(model, find_unused_parameters=False))
steps = []
try:
    for step in range(2):
        torch.manual_seed(100 + 10 * step + rank)  # each process: its own examples
        tokens = random_tokens()
        sample = {"net_input": {"src_tokens": tokens, "src_lengths": tokens.ne(1).sum(1)},
                  "target": torch.randint(0, 2, (6,)), "ntokens": int(tokens.ne(1).sum())}
        model.zero_grad()
        alone.zero_grad()
        torch.manual_seed(7 + step)  # the sandwich's widths: the same in every process, as fairseq seeds them
        BudgetSentencePredictionTask.train_step(None, sample, wrapped, criterion, Optimizer(), step)
        torch.manual_seed(7 + step)
        criterion(alone, sample)[0].backward()
        own = torch.cat([p.grad.flatten() for p in alone.parameters() if p.grad is not None])
        mean = own.clone()
        dist.all_reduce(mean)
        mean /= dist.get_world_size()
        averaged = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        steps.append({"diff": (averaged - mean).abs().max().item(), "own_vs_mean": (own - mean).abs().max().item(),
                      "grads": len([p for p in model.parameters() if p.grad is not None])})
    result = {"steps": steps}
except RuntimeError as error:
    result = {"error": str(error)[:800]}
with open(f"{sys.argv[2]}/result{rank}.json", "w") as f:
    json.dump(result, f)
"""


@pytest.mark.slow
def test_the_ddp_reducer_averages_the_sandwichs_gradients_exactly(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    output = torchrun(2, [script, REPO, tmp_path])
    results = [json.loads((tmp_path / f"result{rank}.json").read_text()) for rank in (0, 1)]
    trainable = sum(1 for name, _ in build_model(num_classes=2, head_selection="nested", min_heads=1).named_parameters()
                    if not name.startswith("encoder.lm_head."))
    for result in results:
        assert "error" not in result, result.get("error", "") + output[-2000:]
        for step in result["steps"]:
            assert step["diff"] < 1e-6  # the reducer's mean is the mean of each process's own (summed) gradient
            assert step["own_vs_mean"] > 1e-3  # and the processes' gradients differed
            assert step["grads"] == trainable  # every trainable parameter got a gradient


@pytest.mark.slow
def test_fairseq_train_runs_the_sandwich_in_two_processes(tmp_path):
    data = make_classification_data(tmp_path / "data", n_train=64, n_valid=16)
    args = train_args(data, tmp_path / "save", "--head-selection", "nested", "--min-heads", 1,
                      "--sandwich-widths", 3, "--max-update", 4, "--batch-size", 8, "--log-interval", 1)
    i = args.index("--exploration-updates")  # nothing to explore in a nested model
    del args[i:i + 2]
    args = [a for a in args if a != "--cpu"]  # CPU_DDP has it
    output = torchrun(2, ["--no-python", "sh", "-c", PER_RANK, BIN / "fairseq-train", *args[1:], *CPU_DDP])
    assert "done training" in output
    inner = [line for line in output.splitlines() if "| train_inner |" in line]
    assert len(inner) == 4 and all("loss=nan" not in line for line in inner), output[-3000:]
    assert "distributed init (rank 0)" in output and "distributed init (rank 1)" in output
    assert (tmp_path / "save" / "checkpoint_best.pt").is_file()
