"""Model wiring, the initial budget (what fairseq-train builds with nothing but
--target-head-ratio), the exploration schedule, the criterion's terms and metrics; and
numerical edge cases, which train without NaN or inf.

Each edge case trains a few updates in this process (the real model, criterion and Adam,
exploration on, then off) and checks, at every update, a finite loss and finite
gradients, and at the end, in evaluation (the fast path), finite outputs and budgets and
head counts within ``[--min-heads, H]``."""

import argparse
import math

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.logging import metrics
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

from budget_plugin.config import BudgetConfig
from budget_plugin.criterions.budget_sentence_prediction import BudgetSentencePredictionCriterion
from budget_plugin.dial.settings import Dial
from budget_plugin.modules import BudgetedAttention, exploration_at
from helpers import LEGACY, PLUGIN_DIR, assert_close, build_model, make_criterion, make_sample, random_tokens


@pytest.mark.parametrize(
    "arch, layers, dim, heads",
    [
        ("budgetformer", 12, 768, 12),
        ("budgetformer_base", 12, 768, 12),
        ("budgetformer_large", 24, 1024, 16),
        ("budgetformer_small", 4, 256, 8),
        ("budgetformer_tiny", 2, 64, 4),
    ],
)
def test_architectures(arch, layers, dim, heads):
    assert ARCH_MODEL_REGISTRY[arch].__name__ == "BudgetFormerModel"
    args = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](args)
    assert (args.encoder_layers, args.encoder_embed_dim, args.encoder_attention_heads) == (layers, dim, heads)
    assert args.min_heads == 1 and args.budget_pooling == "mean"


def test_extra_holds_one_stats_dict_per_layer():
    model = build_model().eval()
    tokens = random_tokens()
    logits, extra = model(tokens, classification_head_name="sentence_classification_head")
    assert logits.shape == (6, 3)
    assert len(extra["budget"]) == 2
    for stats in extra["budget"]:
        assert stats["selected"].shape == (6, 4)
        assert torch.equal(stats["selected"].sum(1), stats["heads"])


@pytest.mark.parametrize("arch, heads", [("budgetformer_tiny", 4), ("budgetformer_small", 8)])
def test_router_starts_at_full_budget_after_init_bert_params(arch, heads):
    model = build_model(arch).eval()
    for attention in model.budgeted_attentions():
        assert torch.all(attention.router.budget_proj.weight == 0)  # not init_bert_params' normal init
    _, extra = model(random_tokens(), features_only=True)
    for stats in extra["budget"]:
        assert_close(stats["budget"], heads - 0.25)
        assert (stats["heads"] == heads).all()


@pytest.mark.parametrize("heads, min_heads", [(12, 1), (16, 1), (16, 4), (12, 12)])
def test_initial_budget_rounds_to_all_heads_for_any_size(heads, min_heads):
    attention = BudgetedAttention(heads * 8, heads, BudgetConfig(min_heads=min_heads), fixed_heads=heads).eval()
    route = attention.router(torch.randn(5, 3, heads * 8), None)
    assert (route.heads == heads).all()


def fairseq_train_model(*flags):
    """The model fairseq-train would build from this command line (no training)."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        str(LEGACY / "data"), "--user-dir", PLUGIN_DIR, "--arch", "budgetformer_tiny",
        "--task", "budget_sentence_prediction", "--criterion", "budget_sentence_prediction", "--num-classes", "2",
        "--max-positions", "64", "--cpu", *flags])
    cfg = convert_namespace_to_omegaconf(args)
    return tasks.setup_task(cfg.task).build_model(cfg.model)


@pytest.mark.parametrize("ratio, start", [(None, 2.0), ("0.25", 1.0), ("0.75", 3.0)])
def test_fairseq_train_starts_the_budget_at_the_target_with_the_studys_router_scale(ratio, start):
    model = fairseq_train_model(*(["--target-head-ratio", ratio] if ratio else []))
    assert model.args.router_scale == 10.0 and model.args.initial_budget == start  # saved with the checkpoint
    with torch.no_grad():
        _, extra = model.eval()(torch.tensor([[0, 5, 6, 7, 2]]), features_only=True)
    for layer in extra["budget"]:  # H = 4 heads: the budget starts at ratio x H
        assert layer["budget"].item() == pytest.approx(start, abs=5e-3)  # (at m: clamped inside the sigmoid)


def test_without_a_target_the_budget_starts_at_every_head():
    model = build_model(router_scale=10.0)  # no criterion options: e.g. a hydra config's model section
    with torch.no_grad():
        _, extra = model.eval()(torch.tensor([[0, 5, 6, 7, 2]]), features_only=True)
    assert [layer["heads"].item() for layer in extra["budget"]] == [4, 4]


def test_a_dials_counts_hold_for_its_call_only():
    model = build_model().eval()
    tokens = random_tokens()
    _, extra = model(tokens, features_only=True, dial=Dial.heads_per_layer(1, 2))
    assert all((s["heads"] == 1).all() for s in extra["budget"])
    _, extra = model(tokens, features_only=True)
    assert all((s["heads"] == 4).all() for s in extra["budget"]), "the learned (full) budget again"
    with pytest.raises(ValueError, match=r"a dial's heads must be in \[1, 4\], got 5"):
        model(tokens, features_only=True, dial=Dial(counts=(1, 5)))
    with pytest.raises(ValueError, match="a dial's heads: 3 counts for 2 layers"):
        Dial.heads_per_layer([1, 2, 3], 2)


def test_layerdrop_keeps_every_layers_keys_in_every_logging_output():
    """--encoder-layerdrop skips layers in training. fairseq sums logging outputs (over
    --update-freq steps, then workers) key by key position, with the keys of the first
    output: so every output carries every layer's keys, in the same order and of the same
    kinds, and a skipped layer adds zero heads and zero sentences. Summed that way, the
    per-layer means are those of the layers that ran (static budgets of 1 and 3 heads)."""
    model = build_model(encoder_layerdrop=0.5, head_selection="static", fixed_heads="1,3")
    sample = make_sample()
    ran = []
    model.register_forward_hook(lambda module, args, out: ran.append({s["layer"]: s for s in out[1]["budget"]}))
    every_layer = make_criterion()(model.eval(), sample)[2]
    model.train()
    logs = []
    for seed in range(8):
        torch.manual_seed(seed)
        logs.append(make_criterion()(model, sample)[2])
        assert list(logs[-1]) == list(every_layer)
        assert [torch.is_tensor(v) for v in logs[-1].values()] == [torch.is_tensor(v) for v in every_layer.values()]
        for i in range(2):
            stats = ran[-1].get(i)
            assert logs[-1][f"sentences_l{i}"] == (6 if stats else 0)
            assert logs[-1][f"heads_l{i}"].item() == (stats["heads"].sum().item() if stats else 0)
        assert logs[-1]["layer_sentences"] == 6 * len(ran[-1])
    assert {(0,), (1,), ()} <= {tuple(sorted(layers)) for layers in ran[1:]}  # each layer skipped alone, and both
    summed = {k: sum(log[k] for log in logs) for k in logs[0]}  # as fairseq's _fast_stat_sync_sum
    with metrics.aggregate() as agg:
        BudgetSentencePredictionCriterion.reduce_metrics([summed])
    found = agg.get_smoothed_values()
    for i in range(2):
        assert found[f"heads_l{i}"] == (1, 3)[i]


def test_padding_does_not_change_predictions():
    model = build_model().eval()
    tokens = random_tokens(batch=2, length=12, pad_lengths=(12, 6))
    alone = model(tokens[1:, :6], classification_head_name="sentence_classification_head")[0]
    batched = model(tokens, classification_head_name="sentence_classification_head")[0]
    assert_close(alone[0], batched[1])


def test_schedule_anneals_exploration_and_temperature():
    cfg = BudgetConfig(exploration_updates=100, temperature_start=2.0, temperature_end=1.0, exploration_uniform=0.2)
    start, middle, end, late = (exploration_at(cfg, n) for n in (0, 50, 100, 10_000))
    assert (start.rate, start.noise, start.uniform, start.temperature) == (1.0, 1.0, 0.2, 2.0)
    assert middle.rate == pytest.approx(0.5) and middle.temperature == pytest.approx(1.5)
    assert end == late and end.rate == 0.0 and end.temperature == 1.0 and end.noise == 0
    assert exploration_at(cfg, 0, training=False) == end, "evaluation never explores"
    cosine = BudgetConfig(exploration_updates=100, exploration_schedule="cosine")
    assert exploration_at(cosine, 25).rate == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert exploration_at(BudgetConfig(), 0).rate == 0.0, "off by default"


def test_the_model_owns_its_schedule_through_set_num_updates():
    model = build_model(exploration_updates=100).train()
    model.set_num_updates(25)
    assert model.exploration().rate == pytest.approx(0.75)
    assert all(a.router.num_updates == 25 for a in model.budgeted_attentions())
    assert model.eval().exploration().rate == 0.0


def layer_stats(budgets, heads=4):
    budgets = torch.tensor(budgets)
    return {"budget": budgets, "selected": torch.zeros(len(budgets), heads, dtype=torch.bool)}


def test_budget_term_linear_and_towards_target():
    layers = [layer_stats([4.0, 2.0]), layer_stats([1.0, 1.0])]
    linear = make_criterion(target_head_ratio=None).budget_term(layers)
    assert linear.item() == pytest.approx((1.0 + 0.5 + 0.25 + 0.25) / 4)
    towards = make_criterion(target_head_ratio=0.5).budget_term(layers)
    assert towards.item() == pytest.approx(((0.75 - 0.5) ** 2 + (0.25 - 0.5) ** 2) / 2)


def test_criterion_loss_is_cross_entropy_plus_the_budget_and_exploration_terms():
    """The expected loss is computed here from the model's own output, not from the
    criterion's logs: sum of cross-entropies + n * 2.0 * mean_l (mean_b b/H - 0.5)^2
    - n * 0.5 * rate * mean entropy / log H, at rate 0.75 (update 25 of 100)."""
    model = build_model(num_classes=2, exploration_updates=100, dropout=0.0, attention_dropout=0.0).train()
    model.set_num_updates(25)
    sample = make_sample()
    torch.manual_seed(0)
    logits, extra = model(**sample["net_input"], features_only=True,
                          classification_head_name="sentence_classification_head")
    torch.manual_seed(0)  # the same exploration draws in the criterion's call
    loss, n, logs = make_criterion(budget_weight=2.0, exploration_weight=0.5, target_head_ratio=0.5)(model, sample)

    task = torch.nn.functional.cross_entropy(logits, sample["target"], reduction="sum")
    ratios = torch.stack([layer["budget"].mean() / 4 for layer in extra["budget"]])
    p = torch.stack([layer["relevance"] for layer in extra["budget"]])
    entropy = (-(p * p.log()).sum(-1) / math.log(4)).mean()
    expected = task + 6 * 2.0 * ((ratios - 0.5) ** 2).mean() - 6 * 0.5 * 0.75 * entropy
    assert n == 6
    assert_close(loss, expected)
    assert_close(logs["task_loss"], task)
    assert logs["explore_rate"] == pytest.approx(6 * 0.75)
    assert logs["head_slots"] == 2 * 4 * 6 and "heads_l1" in logs
    loss.backward()
    router = model.encoder.sentence_encoder.layers[0].self_attn.router
    assert router.budget_proj.weight.grad.abs().sum() > 0


def test_distillation_mixes_the_teachers_softened_distribution_in_training(tmp_path):
    """--distill-logits: in training the cross-entropy becomes (1 - w) CE + w T^2
    KL(teacher || model), the teacher's row chosen by the example's id; evaluation
    ignores it (the logits are the training set's)."""
    teacher = torch.randn(10, 2)
    torch.save(teacher, tmp_path / "teacher.pt")
    model = build_model(num_classes=2, dropout=0.0, attention_dropout=0.0).train()
    sample = {**make_sample(), "id": torch.tensor([9, 0, 3, 4, 7, 1])}
    options = dict(budget_weight=0.0, exploration_weight=0.0)
    torch.manual_seed(0)
    plain, _, _ = make_criterion(**options)(model, sample)
    torch.manual_seed(0)
    logits = model(**sample["net_input"], features_only=True, classification_head_name="sentence_classification_head")[0]
    torch.manual_seed(0)
    distilled, _, logs = make_criterion(**options, distill_logits=str(tmp_path / "teacher.pt"), distill_weight=0.25,
                                        distill_temperature=2.0)(model, sample)
    p_teacher = torch.softmax(teacher[sample["id"]] / 2.0, dim=-1)
    kl = (p_teacher * (p_teacher.log() - torch.log_softmax(logits / 2.0, dim=-1))).sum()
    assert_close(logs["distill_loss"], 4.0 * kl)
    assert_close(distilled, 0.75 * plain + 0.25 * 4.0 * kl)
    assert_close(logs["task_loss"], plain, msg="task_loss stays the cross-entropy")
    model.eval()
    evaluated, _, logs = make_criterion(**options, distill_logits=str(tmp_path / "teacher.pt"))(model, sample)
    assert "distill_loss" not in logs


def test_distillation_refuses_logits_that_do_not_fit(tmp_path):
    torch.save({"not": "a tensor"}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=r"--distill-logits .*bad\.pt: expected a float tensor"):
        make_criterion(distill_logits=str(tmp_path / "bad.pt"))
    torch.save(torch.randn(4, 3), tmp_path / "three.pt")
    model = build_model(num_classes=2).train()
    sample = {**make_sample(), "id": torch.arange(6)}
    with pytest.raises(ValueError, match="holds 4 examples x 3 classes; this batch has example ids up to 5 and 2"):
        make_criterion(distill_logits=str(tmp_path / "three.pt"))(model, sample)


def test_reduce_metrics_over_several_logging_outputs():
    """Two workers' (or two batches') logs: every metric is a ratio of sums."""
    logs = [
        dict(loss=4.0, task_loss=3.0, ntokens=30, nsentences=2, sample_size=2, ncorrect=1, heads_l0=6.0,
             sentences_l0=2, heads_l1=2.0, sentences_l1=2, heads=8.0, budget=7.0, layer_sentences=4,
             head_slots=16, attn_flops=30.0, attn_flops_full=100.0, budget_term=0.2, exploration_term=-1.0,
             relevance_entropy=1.0, explore_rate=1.0, temperature=3.0),
        dict(loss=2.0, task_loss=2.0, ntokens=20, nsentences=3, sample_size=3, ncorrect=3, heads_l1=9.0,
             sentences_l1=3, heads=9.0, budget=8.0, layer_sentences=3, head_slots=12, attn_flops=40.0,
             attn_flops_full=60.0, budget_term=0.3, exploration_term=-2.0, relevance_entropy=2.0,
             explore_rate=0.5, temperature=3.0),
    ]
    with metrics.aggregate() as agg:
        BudgetSentencePredictionCriterion.reduce_metrics(logs)
    found = agg.get_smoothed_values()
    assert found["loss"] == pytest.approx(6.0 / 5 / math.log(2), abs=1e-3)
    assert found["task_loss"] == pytest.approx(5.0 / 5 / math.log(2), abs=1e-3)
    assert found["accuracy"] == pytest.approx(80.0)
    assert found["heads"] == pytest.approx(17 / 7, abs=0.01)
    assert found["head_ratio"] == pytest.approx(17 / 28, abs=1e-3)
    assert found["heads_l0"] == pytest.approx(3.0) and found["heads_l1"] == pytest.approx(11 / 5)
    assert found["budget"] == pytest.approx(15 / 7, abs=0.01)
    assert found["flops_ratio"] == pytest.approx(70 / 160, abs=1e-3)
    assert found["explore_rate"] == pytest.approx(1.5 / 5)
    assert found["budget_term"] == pytest.approx(0.5 / 5)


# --------------------------------------------------------------------------------------
# Numerical edge cases train without NaN or inf
# --------------------------------------------------------------------------------------

H = 4  # budgetformer_tiny
MAX_POSITIONS = 64  # helpers.build_model
EXPLORATION = 3  # updates: exploration anneals over the first half of train_updates()'s six


def tiny(**overrides):
    return build_model(num_classes=2, exploration_updates=EXPLORATION, **overrides)


def labelled(tokens, labels=None):
    labels = torch.arange(len(tokens)) % 2 if labels is None else labels
    return {"net_input": {"src_tokens": tokens, "src_lengths": tokens.ne(1).sum(1)},
            "target": labels, "ntokens": int(tokens.ne(1).sum())}


def train_updates(model, batches, updates=6, lr=1e-3, **criterion_cfg):
    """A few Adam updates through the real criterion; every loss and gradient finite.
    Returns every layer's statistics on the last batch in evaluation (fast path)."""
    criterion = make_criterion(**criterion_cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for update in range(updates):
        model.train()
        model.set_num_updates(update)  # as fairseq's train_step does
        loss, _, logs = criterion(model, batches[update % len(batches)])
        assert torch.isfinite(loss), (update, loss)
        assert all(torch.isfinite(torch.as_tensor(v)).all() for v in logs.values()), logs
        optimizer.zero_grad()
        loss.backward()
        for name, p in model.named_parameters():
            assert p.grad is None or torch.isfinite(p.grad).all(), (update, name)
        optimizer.step()
    model.eval()
    tokens = batches[-1]["net_input"]["src_tokens"]
    with torch.no_grad():
        logits, extra = model(tokens, classification_head_name="sentence_classification_head")
    assert torch.isfinite(logits).all()
    m = model.budget.min_heads
    for stats in extra["budget"]:
        assert torch.isfinite(stats["budget"]).all()
        assert ((m <= stats["budget"]) & (stats["budget"] <= H)).all(), stats["budget"]
        assert ((m <= stats["heads"]) & (stats["heads"] <= H)).all(), stats["heads"]
        assert torch.equal(stats["selected"].sum(1), stats["heads"])
    return extra["budget"]


def random_batch(batch, length, vocab=50):
    tokens = torch.randint(4, vocab, (batch, length))
    tokens[:, 0] = 0
    tokens[:, -1] = 2
    return tokens


def test_length_one_inputs():
    only_bos = torch.zeros(4, 1, dtype=torch.long)  # "<s>": one token, nothing to pool but it
    one_word = torch.tensor([[0, 7, 2], [0, 12, 2], [0, 30, 2], [0, 44, 2]])  # "<s> w </s>"
    mixed = torch.tensor([[0, 1, 1], [0, 9, 2], [0, 1, 1], [0, 21, 2]])  # "<s>" padded among them
    for pooling in ("mean", "first"):
        model = tiny(budget_pooling=pooling)
        train_updates(model, [labelled(only_bos), labelled(one_word), labelled(mixed)])


def test_inputs_at_max_positions():
    model = tiny()
    full = random_batch(4, MAX_POSITIONS)
    train_updates(model, [labelled(full)])
    with pytest.raises(IndexError):  # one token more is out of the position table
        model(random_batch(1, MAX_POSITIONS + 1), features_only=True)


def test_one_example_almost_all_padding():
    tokens = random_batch(4, MAX_POSITIONS)
    tokens[2, 1:] = 1  # "<s>" and 63 pads
    tokens[3, 2:] = 1
    tokens[3, 1] = 2
    model = tiny()
    stats = train_updates(model, [labelled(tokens)])
    # padding cannot change the choice: the padded example alone gets what it got in the batch
    with torch.no_grad():
        _, alone = model(tokens[2:3, :1], features_only=True)
    for batched, single in zip(stats, alone["budget"]):
        assert_close(batched["budget"][2], single["budget"][0])
        assert torch.equal(batched["selected"][2], single["selected"][0])


def test_min_heads_one_and_a_huge_budget_weight_ends_at_one_head():
    model = tiny(min_heads=1)
    batches = [labelled(random_batch(8, 12)), labelled(random_batch(8, 20))]
    stats = train_updates(model, batches, updates=16, lr=1e-2, budget_weight=1e4, target_head_ratio=None)
    for layer in stats:
        assert (layer["heads"] == 1).all(), layer["heads"]
        assert (layer["budget"] < 1.5).all()


def test_min_heads_equal_to_the_number_of_heads():
    model = tiny(min_heads=H)
    stats = train_updates(model, [labelled(random_batch(6, 10))], budget_weight=10.0)
    for layer in stats:
        assert (layer["heads"] == H).all() and (layer["budget"] == H).all()
        assert layer["selected"].all()
