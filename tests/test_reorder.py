"""Importance order (tools/reorder.py): every layer's heads permuted, most important
first, without changing what the model computes."""

import pytest
import torch

from budget_plugin.dial.settings import Dial
from budget_plugin.nested.reorder import head_order, reorder_heads
from budget_plugin.tools.building import build_model, size_options
from helpers import assert_close, random_tokens

VOCAB, LAYERS, H = 54, 2, 4


def build(arch="budgetformer_tiny", **options):
    if arch == "roberta":
        options.update(size_options("budgetformer_tiny"))
    return build_model(arch, VOCAB, max_positions=64, num_classes=3, **options).eval()


def importance(seed=0):
    return torch.rand(LAYERS, H, generator=torch.Generator().manual_seed(seed))


def vary_routers(model):
    """Routers whose choices differ per input and per head (a fresh one is near-uniform)."""
    with torch.no_grad():
        for attention in model.budgeted_attentions():
            router = attention.router
            if hasattr(router, "relevance_proj"):
                router.relevance_proj.weight.normal_(std=0.5)
            if hasattr(router, "budget_proj"):
                router.budget_proj.weight.normal_(std=0.05)
            if hasattr(router, "static_logits"):
                router.static_logits.normal_()
    return model


def outputs(model, tokens, **kwargs):
    with torch.no_grad():
        features, extra = model(tokens, features_only=True, **kwargs)  # kwargs: a budgetformer's dial
        logits = model.classification_heads["sentence_classification_head"](features)
    return features, logits, extra


MODELS = {
    "roberta": dict(arch="roberta"),
    "learned": dict(initial_budget=2.5),
    "static": dict(head_selection="static", fixed_heads="2"),
    "kept": dict(head_selection="kept", kept_heads="0,3;1,2,3"),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_permuted_heads_compute_what_the_original_computes(name):
    model = build(**MODELS[name])
    if name != "roberta":
        vary_routers(model)
    permuted_state, order = reorder_heads(model.state_dict(), importance())
    permuted = build(**MODELS[name])
    permuted.load_state_dict(permuted_state)
    tokens = random_tokens(vocab=50)
    (features, logits, extra), (features2, logits2, extra2) = outputs(model, tokens), outputs(permuted, tokens)
    # not bitwise: out_proj sums the heads' outputs in their new order
    assert_close(features2, features)
    assert_close(logits2, logits)
    assert not torch.equal(order, torch.arange(H).expand(LAYERS, H)), "a real permutation"
    for before, after, layer_order in zip(extra.get("budget", []), extra2.get("budget", []), order):
        # new head j is old head order[j]: the same heads run, under their new indices
        assert torch.equal(after["selected"], before["selected"][:, layer_order])
        assert len({tuple(s.tolist()) for s in before["selected"]}) > 1 or name != "learned", "inputs differ"


def test_the_order_sorts_importance_descending_and_moves_the_weights():
    scores = importance(seed=3)
    model = build(arch="roberta")
    state, order = reorder_heads(model.state_dict(), scores)
    for layer in range(LAYERS):
        assert sorted(order[layer].tolist()) == list(range(H))
        ranked = scores[layer, order[layer]]
        assert torch.all(ranked[:-1] >= ranked[1:])
        d = model.args.encoder_embed_dim // H
        best = int(scores[layer].argmax())
        key = f"encoder.sentence_encoder.layers.{layer}.self_attn."
        original = model.state_dict()
        assert torch.equal(state[key + "q_proj.weight"][:d], original[key + "q_proj.weight"][best * d:(best + 1) * d])
        assert torch.equal(state[key + "out_proj.weight"][:, :d],
                           original[key + "out_proj.weight"][:, best * d:(best + 1) * d])
        assert torch.equal(state[key + "out_proj.bias"], original[key + "out_proj.bias"])
    assert head_order(torch.tensor([[0.2, 0.5, 0.5, 0.1]])).tolist() == [[1, 2, 0, 3]], "ties keep head order"


@pytest.mark.parametrize("options, message", [
    (dict(head_selection="random", fixed_heads="2"), "picks heads by their index"),
    (dict(head_selection="nested"), "picks heads by their index"),
])
def test_routers_that_pick_heads_by_index_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        reorder_heads(build(**options).state_dict(), importance())


def test_importance_of_the_wrong_shape_is_refused():
    state = build(arch="roberta").state_dict()
    with pytest.raises(ValueError, match="importance has 3 layers"):
        reorder_heads(state, torch.rand(3, H))
    with pytest.raises(ValueError, match="does not split into 5 heads"):
        reorder_heads(state, torch.rand(LAYERS, 5))
    state["encoder.sentence_encoder.layers.0.self_attn.bias_k"] = torch.zeros(1, 1, 64)
    with pytest.raises(ValueError, match="bias_k: not known to be per-head"):
        reorder_heads(state, importance())


def test_a_reordered_dense_model_runs_its_most_important_heads_as_a_nested_prefix():
    """The recipe: fine-tuned dense roberta -> reorder -> --head-selection nested. At k
    heads the nested model runs exactly what importance pruning ('kept', the original
    weights) runs with the k most important heads; at H, what roberta runs."""
    dense, scores = build(arch="roberta"), importance(seed=5)
    state, order = reorder_heads(dense.state_dict(), scores)
    nested = build(head_selection="nested")
    nested.load_state_dict(state, strict=False)  # the routers keep their fresh start
    tokens = random_tokens(vocab=50)
    assert_close(outputs(nested, tokens, dial=Dial.heads_per_layer(H, LAYERS))[1], outputs(dense, tokens)[1])
    for k in (1, 2, 3):
        kept = build(head_selection="kept", kept_heads=";".join(
            ",".join(map(str, layer[:k].tolist())) for layer in order))
        kept.load_state_dict(dense.state_dict(), strict=False)
        features, logits, extra = outputs(nested, tokens, dial=Dial.heads_per_layer(k, LAYERS))
        assert all(layer["selected"][:, :k].all() and not layer["selected"][:, k:].any() for layer in extra["budget"])
        assert_close(logits, outputs(kept, tokens)[1])


def test_importance_is_the_models_own_gradient_whatever_the_twins_router():
    """Michel et al.'s |dL/d gate| through the importance twin equals the stock model's
    own gradient: the twin's router (freshly initialised, so different on every call)
    adds no straight-through gradient of its own."""
    import torch.nn.functional as F

    from budget_plugin.nested.importance import importance_of
    from budget_plugin.tools.building import build_model, twin

    torch.manual_seed(0)
    model = build_model("budgetformer_tiny", 50, num_classes=2, max_positions=64).eval()
    batches = [{"net_input": {"src_tokens": random_tokens()}, "target": torch.tensor([0, 1, 1, 0, 1, 0])}]
    torch.manual_seed(1)
    first, neurons = importance_of(model, batches)
    torch.manual_seed(2)
    again = importance_of(model, batches)
    assert torch.equal(again.heads, first) and torch.equal(again.neurons, neurons)

    stock = twin(model, "roberta")  # fairseq's own attention: gate each head by hand
    gates = []

    def gate(module, inputs):
        (x,) = inputs
        g = torch.ones(x.size(1), 4, requires_grad=True)
        gates.append(g)
        return (x * g.repeat_interleave(x.size(-1) // 4, dim=1),)

    masks = []

    def mask(module, inputs):  # each FFN neuron's activation, before fc2
        (x,) = inputs
        m = torch.ones(x.size(1), x.size(-1), requires_grad=True)
        masks.append(m)
        return (x * m,)

    for layer in stock.encoder.sentence_encoder.layers:
        layer.self_attn.onnx_trace = True  # fairseq's Python path, which calls out_proj (the fused one does not)
        layer.self_attn.out_proj.register_forward_pre_hook(gate)
        layer.fc2.register_forward_pre_hook(mask)
    logits, _ = stock(batches[0]["net_input"]["src_tokens"], classification_head_name="sentence_classification_head")
    grads = torch.autograd.grad(F.cross_entropy(logits, batches[0]["target"], reduction="sum"), gates + masks)
    for found, wanted in ((first, grads[:2]), (neurons, grads[2:])):
        expected = torch.stack([g.abs().sum(0) for g in wanted]) / 6
        expected = expected / expected.norm(dim=1, keepdim=True)
        assert_close(found, expected, msg=f"{found} {expected}")
    assert neurons.shape == (2, 128) and neurons.min() >= 0 and neurons.std() > 0


@pytest.mark.parametrize("name", ["roberta", "learned"])
def test_permuted_neurons_compute_what_the_original_computes(name):
    from budget_plugin.nested.reorder import reorder_neurons

    torch.manual_seed(0)
    model = build(**MODELS[name])
    if name != "roberta":
        vary_routers(model)
    F = model.encoder.sentence_encoder.layers[0].fc1.out_features
    neurons = torch.rand(LAYERS, F, generator=torch.Generator().manual_seed(3))
    state, order = reorder_neurons(model.state_dict(), neurons)
    assert torch.equal(order, neurons.argsort(dim=1, descending=True))
    for layer in range(LAYERS):  # the weights moved: neuron 0 is now the most important one
        key = f"encoder.sentence_encoder.layers.{layer}."
        assert torch.equal(state[key + "fc1.weight"][0], model.state_dict()[key + "fc1.weight"][order[layer, 0]])
        assert torch.equal(state[key + "fc2.weight"][:, 0], model.state_dict()[key + "fc2.weight"][:, order[layer, 0]])
        assert not torch.equal(state[key + "fc1.weight"], model.state_dict()[key + "fc1.weight"])
    permuted = build(**MODELS[name])
    permuted.load_state_dict(state)
    tokens = random_tokens(vocab=VOCAB)
    assert_close(outputs(permuted, tokens)[1], outputs(model, tokens)[1])


def test_neuron_importance_of_the_wrong_shape_is_refused():
    from budget_plugin.nested.reorder import reorder_neurons

    state = build().state_dict()
    with pytest.raises(ValueError, match="layer 0: importance of 5 neurons, but the state dict has 128"):
        reorder_neurons(state, torch.rand(LAYERS, 5))
    with pytest.raises(ValueError, match="importance has 1 layers; the state dict has more"):
        reorder_neurons(state, torch.rand(1, 128))
