"""The width dial (--width): every layer's heads and FFN neurons cut together to their
first ones; the FFN's prefix computes what a physically cut FFN computes, and the
export at a width holds only those weights and predicts what the dialled model does."""

import pytest
import torch
import torch.nn.functional as F_

from budget_plugin.dial.settings import Dial
from budget_plugin.dial.parsing import parse_width
from budget_plugin.dial.settings import Width
from budget_plugin.dial.width import allocated, uniform_width
from budget_plugin.dial.allocation import priorities
from budget_plugin.nested.export import export_width, pruned_checkpoint
from budget_plugin.tools.checkpoints import as_budgetformer
from helpers import (
    HEAD,
    assert_close,
    build_model,
    checkpoint_of,
    make_criterion,
    make_sample,
    nested_model,
    random_tokens,
    without_dropout,
)

L, H, F = 2, 4, 128  # budgetformer_tiny


@pytest.mark.parametrize("value, expected", [
    (None, None),
    ("1", Width((4, 4), (128, 128))),
    ("0.5", Width((2, 2), (64, 64))),
    ("0.3", Width((1, 1), (38, 38))),  # round(1.2) heads, round(38.4) neurons
    (0.1, Width((1, 1), (13, 13))),  # never under --min-heads
    ("1:10,4:128", Width((1, 4), (10, 128))),
])
def test_a_width_is_heads_and_neurons_per_layer(value, expected):
    assert parse_width(value, L, H, F, min_heads=1) == expected


@pytest.mark.parametrize("value", ["0", "1.2", "x", "1:10", "1:10,5:10", "1:0,1:10", "1:10,1:129", "1:2:3,1:2"])
def test_a_bad_width_is_refused_naming_the_option(value):
    with pytest.raises(ValueError, match=r"--width must be a ratio in \(0, 1\], or 2 comma-separated heads:neurons"):
        parse_width(value, L, H, F, min_heads=1)


def test_the_uniform_width_of_minilm_is_the_cut_the_latency_table_measured():
    assert uniform_width(0.3, 6, 12, 1536) == Width((4,) * 6, (461,) * 6)
    assert uniform_width(0.5, 6, 12, 1536) == Width((6,) * 6, (768,) * 6)
    assert uniform_width(0.25, 6, 12, 1536, min_heads=2) == Width((3,) * 6, (384,) * 6)


def layers_cut(model, neurons):
    """A copy of ``model`` whose layers hold only their first ``neurons`` FFN neurons."""
    state = checkpoint_of(model)
    state["cfg"]["model"].ffn_neurons = ",".join(map(str, neurons))
    weights = dict(state["model"])
    for i, f in enumerate(neurons):
        key = f"encoder.sentence_encoder.layers.{i}."
        weights[key + "fc1.weight"], weights[key + "fc1.bias"] = weights[key + "fc1.weight"][:f], \
            weights[key + "fc1.bias"][:f]
        weights[key + "fc2.weight"] = weights[key + "fc2.weight"][:, :f]
    state["model"] = weights
    return as_budgetformer(state)


@pytest.mark.parametrize("neurons", [(128, 128), (32, 100), (1, 128)])
def test_the_ffn_prefix_computes_what_a_cut_ffn_computes(neurons):
    torch.manual_seed(0)
    model = nested_model()
    tokens = random_tokens()
    dialled, extra = model(tokens, classification_head_name=HEAD, dial=Dial(neurons=neurons))
    cut = layers_cut(model, neurons)
    assert [layer.fc1.out_features for layer in cut.encoder.sentence_encoder.layers] == list(neurons)
    expected, cut_extra = cut(tokens, classification_head_name=HEAD)
    assert_close(dialled, expected)
    assert [layer["neurons"] for layer in extra["budget"]] == list(neurons)
    assert [layer["neurons"] for layer in cut_extra["budget"]] == list(neurons)
    full, _ = model(tokens, classification_head_name=HEAD)
    assert torch.equal(dialled, full) == (neurons == (128, 128))
    # the statistics: FLOPs of the neurons run, against the dense model's
    for layer, f in zip(extra["budget"], neurons):
        assert layer["ffn_flops"] / layer["ffn_flops_full"] == pytest.approx(f / F)
        assert layer["ffn_flops_full"] == 4 * tokens.size(1) * model.args.encoder_embed_dim * F * tokens.size(0)  # fc1 + fc2: 2 T C F each


def test_only_the_neurons_run_are_trained():
    torch.manual_seed(0)
    model = nested_model().train()
    logits, _ = model(random_tokens(), classification_head_name=HEAD, dial=Dial(neurons=(16, 16)))
    logits.sum().backward()
    fc1, fc2 = model.encoder.sentence_encoder.layers[0].fc1, model.encoder.sentence_encoder.layers[0].fc2
    assert fc1.weight.grad[:16].abs().sum() > 0 and not fc1.weight.grad[16:].any() and not fc1.bias.grad[16:].any()
    assert fc2.weight.grad[:, :16].abs().sum() > 0 and not fc2.weight.grad[:, 16:].any()


@pytest.mark.parametrize("width", ["0.5", "1:10,3:100"])
def test_the_export_at_a_width_is_smaller_and_predicts_what_the_dialled_model_predicts(width):
    torch.manual_seed(0)
    model = nested_model()
    setting = model.width_dial(width)
    state = pruned_checkpoint(checkpoint_of(model), list(setting.counts), list(setting.neurons))
    exported = as_budgetformer(state)
    layers = exported.encoder.sentence_encoder.layers
    assert [layer.fc1.out_features for layer in layers] == list(setting.neurons)
    assert [layer.self_attn.q_proj.out_features // layer.self_attn.head_dim for layer in layers] == list(setting.counts)
    assert sum(v.numel() for v in state["model"].values()) < sum(v.numel() for v in model.state_dict().values())
    tokens = random_tokens()
    with torch.no_grad():
        assert_close(exported(tokens, classification_head_name=HEAD)[0],
                     model(tokens, classification_head_name=HEAD, dial=setting)[0])
    with pytest.raises(ValueError, match="--width 0.5: this is a fixed-width model"):
        exported.width_dial("0.5")


def test_the_allocation_ranks_every_layers_units_together_and_keeps_prefixes():
    importance = torch.tensor([[4.0, 3.0, 2.0, 1.0],  # one layer's units matter evenly...
                               [9.0, 0.1, 0.1, 0.1]])  # ... the other's in one unit
    ranked = priorities(importance[:, [2, 0, 3, 1]], kept=1)  # any order in: decreasing out
    assert torch.isinf(ranked[:, 0]).all() and (ranked[:, 1:].diff(dim=1) <= 0).all()
    assert allocated(0.5, ranked) == (3, 1)  # 4 of 8: the even layer keeps more
    assert allocated(0.25, ranked) == (1, 1)  # the kept minimum, whatever the ratio
    assert allocated(0.01, ranked) == (1, 1)
    assert allocated(1.0, ranked) == (4, 4)
    for ratio in (0.3, 0.5, 0.75):
        assert sum(allocated(ratio, ranked)) == max(2, round(ratio * 8))
    flat = priorities(torch.ones(3, 8), kept=2)  # equal priorities: the same in every layer
    assert allocated(0.5, flat) == (4, 4, 4)


def test_a_stored_allocation_dials_loads_and_exports_as_the_model_allocates():
    torch.manual_seed(0)
    model = nested_model(min_heads=1)
    assert model.width_dial("0.5") == uniform_width(0.5, L, H, F, 1).dial()
    heads = priorities(torch.tensor([[1.0, 1, 1, 1], [4.0, 0.1, 0.1, 0.1]]), kept=1)
    neurons = priorities(torch.cat([torch.ones(1, F), torch.linspace(1, 0, F)[None] ** 8]), kept=8)
    model.store_priorities(heads, neurons)
    setting = model.width_dial("0.5")
    assert setting.counts == (3, 1) and setting.neurons[0] > setting.neurons[1] >= 8
    assert sum(setting.neurons) == F
    state = checkpoint_of(model)
    loaded = as_budgetformer(state)  # the checkpoint keeps the allocation
    assert loaded.width_dial("0.5") == setting
    assert export_width(state, "0.5").dial() == setting  # and the export cuts it
    assert as_budgetformer(checkpoint_of(nested_model())).width_priorities() is None  # none stored: uniform
    model.store_priorities(None, None)
    assert model.width_dial("0.5") == uniform_width(0.5, L, H, F, 1).dial()


def test_a_width_and_a_head_ratio_are_not_given_together():
    with pytest.raises(ValueError, match="--width must be given without --head-ratio"):
        build_model(num_classes=2, head_selection="nested", width="0.5", head_ratio="1,1")
    model = build_model(num_classes=2, head_selection="nested", min_heads=1, width="1:16,2:32").eval()
    assert model.dial_setting == Dial(counts=(1, 2), neurons=(16, 32))


def test_the_sandwich_trains_ffn_widths_with_the_heads():
    """--min-ffn-ratio 0.25: the smallest width runs a quarter of every layer's neurons
    (and --min-heads), the random one draws each layer's neurons from [that, all];
    the width loss is theirs, computed here by hand under the same seed."""
    torch.manual_seed(0)
    model = without_dropout(nested_model(min_heads=1).train())
    sample = make_sample()
    criterion = make_criterion(sandwich_widths=3, min_ffn_ratio=0.25, distill_weight=0.0,
                               budget_weight=0.0, exploration_weight=0.0)
    torch.manual_seed(5)
    _, _, logs = criterion(model, sample)
    torch.manual_seed(5)
    full, _ = criterion.width_forward(model, sample, None)
    model(**sample["net_input"], features_only=True, classification_head_name=HEAD)  # the router's pass
    heads, neurons = torch.randint(1, 5, (2,)).tolist(), torch.randint(32, F + 1, (2,)).tolist()

    def width(h, f):
        logits = model(**sample["net_input"], features_only=True, classification_head_name=HEAD,
                       dial=Dial(counts=tuple(h), neurons=tuple(f)))[0]
        return F_.cross_entropy(logits, sample["target"], reduction="sum")

    expected = F_.cross_entropy(full, sample["target"], reduction="sum") + width([1, 1], [32, 32]) + \
        width(heads, neurons)
    assert_close(logs["width_loss"], expected)
    # and not what the heads alone would give
    assert logs["width_loss"].item() != pytest.approx((F_.cross_entropy(full, sample["target"], reduction="sum") +
                                                       width([1, 1], [F, F]) + width(heads, [F, F])).item(), rel=1e-4)
    assert logs["model_flops"] < logs["model_flops_full"]  # the router's pass: its own heads, every neuron


def test_min_ffn_ratio_needs_the_sandwich():
    with pytest.raises(ValueError, match="--min-ffn-ratio must be 0 unless --sandwich-widths is 2 or more"):
        make_criterion(min_ffn_ratio=0.25)
    with pytest.raises(ValueError, match=r"--min-ffn-ratio must be in \[0, 1\]"):
        make_criterion(sandwich_widths=3, min_ffn_ratio=1.5)


def test_hidden_state_distillation_adds_each_layers_mean_squared_difference_from_the_full_width():
    """--distill-hidden-weight 2: every narrower width's loss gains 2 x the sum over
    layers of the mean squared difference of its layer outputs from the full width's,
    averaged over each example's own tokens (padding left out) and features, summed
    over examples; computed here by hand under the same seed."""
    torch.manual_seed(0)
    model = without_dropout(nested_model(min_heads=1).train())
    sample = make_sample()
    pad = model.encoder.sentence_encoder.padding_idx
    sample["net_input"]["src_tokens"][0, 7:] = pad  # an example padded after 7 tokens (the others have pads too)
    criterion = make_criterion(sandwich_widths=2, min_ffn_ratio=0.25, distill_weight=0.0, distill_hidden_weight=2.0,
                               budget_weight=0.0, exploration_weight=0.0)
    torch.manual_seed(5)
    _, _, logs = criterion(model, sample)

    def run(heads, neurons):
        logits, extra = model(**sample["net_input"], features_only=True, return_all_hiddens=True,
                              classification_head_name=HEAD, dial=Dial(counts=tuple(heads), neurons=neurons))
        return logits, extra["inner_states"][1:]

    full, teacher = run([4, 4], None)
    small, states = run([1, 1], (32, 32))
    target = sample["target"]
    hidden = 0.0
    for b, tokens in enumerate(sample["net_input"]["src_tokens"]):
        real = tokens.ne(pad)
        for state, reference in zip(states, teacher):
            hidden = hidden + ((state[real, b] - reference[real, b]) ** 2).mean()
    expected = F_.cross_entropy(full, target, reduction="sum") + F_.cross_entropy(small, target, reduction="sum") \
        + 2.0 * hidden
    assert hidden.item() > 0
    assert_close(logs["width_loss"], expected)
    with pytest.raises(ValueError, match="--distill-hidden-weight must be 0 unless --sandwich-widths is 2 or more"):
        make_criterion(distill_hidden_weight=1.0)
    model.args.encoder_layerdrop = 0.1  # each pass would drop other layers: no layer would have its teacher
    with pytest.raises(ValueError, match="--distill-hidden-weight needs every layer in every pass"):
        criterion(model, sample)
