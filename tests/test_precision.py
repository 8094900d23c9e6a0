"""Training in bfloat16 on the CPU (precision.py, the task's --cpu-precision): the task's
train_step autocasts the forwards, the gradients land on the fp32 weights and match
fp32's within bfloat16's precision, and fp32 is what runs where the CPU lacks bfloat16."""

from types import SimpleNamespace

import pytest
import torch

from budget_plugin import precision
from budget_plugin.nested import finetune
from budget_plugin.nested.recipe import NestedRecipe
from budget_plugin.option_error import OptionError
from budget_plugin.tasks.budget_sentence_prediction import BudgetSentencePredictionTask
from helpers import assert_close, make_criterion, make_sample, nested_model, without_dropout

BF16_EPS = torch.finfo(torch.bfloat16).eps  # 2^-7: a bfloat16 rounding is at most half of it


class Optimizer:  # what train_step uses of fairseq's optimizer
    def backward(self, loss):
        loss.backward()


def task(choice: str):
    return SimpleNamespace(cfg=SimpleNamespace(cpu_precision=choice), label_dictionary=None)


def gradients(choice: str, **criterion):
    """The gradient of one sandwich update (3 widths, the router's pass, FFN nested) of
    the same tiny nested model under the same seed, with autocast's state seen by the
    model's forwards, and the loss."""
    torch.manual_seed(0)
    model = without_dropout(nested_model(min_heads=1, encoder_ffn_embed_dim=32)).train()
    seen = []
    model.register_forward_pre_hook(lambda *_: seen.append(torch.is_autocast_enabled("cpu")))
    torch.manual_seed(3)
    loss, _, _ = BudgetSentencePredictionTask.train_step(
        task(choice), make_sample(), model,
        make_criterion(sandwich_widths=3, min_ffn_ratio=0.25, distill_weight=0.5, **criterion), Optimizer(), 0)
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    return grads, loss, seen


def test_bf16_gradients_match_fp32_within_bfloat16_precision():
    """Every pass autocast, the gradients fp32 (on the fp32 master weights) and within a
    few bfloat16 roundings of fp32's, relative to the gradient's scale: each product
    rounds its inputs to 8 bits (a relative error of at most eps/2 each), and the error
    of a 2-layer model's gradient is a few such roundings compounded, not their sum over
    every term. The loss, computed in fp32 from bfloat16 logits, agrees as closely."""
    ref, ref_loss, ref_seen = gradients("fp32")
    bf16, bf16_loss, bf16_seen = gradients("bf16")
    assert ref_seen == [False] * 4 and bf16_seen == [True] * 4, "the full width, 2 fixed widths, the router's"
    assert ref.keys() == bf16.keys()
    scale = max(g.abs().max().item() for g in ref.values())
    differs = False
    for name, g in bf16.items():
        assert g.dtype == torch.float32, f"{name}: its gradient accumulates in fp32"
        assert_close(g, ref[name], rtol=8 * BF16_EPS, scale=scale, msg=name)
        differs |= not torch.equal(g, ref[name])
    assert differs, "bfloat16 ran: some gradient differs from fp32's"
    assert bf16_loss.dtype == torch.float32
    assert_close(bf16_loss, ref_loss, rtol=4 * BF16_EPS)


def test_auto_is_fp32_where_the_cpu_lacks_bfloat16(monkeypatch):
    """--cpu-precision auto: bf16 where the CPU has AVX-512 BF16 or AMX, and exactly fp32's
    update elsewhere; bf16 and fp32 force either."""
    for check in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, check, lambda: False)
    assert not precision.native_bf16() and not precision.cpu_bf16("auto")
    assert precision.cpu_bf16("bf16") and not precision.cpu_bf16("fp32")
    auto, auto_loss, seen = gradients("auto")
    ref, ref_loss, _ = gradients("fp32")
    assert seen == [False] * 4
    assert auto.keys() == ref.keys() and all(torch.equal(auto[n], ref[n]) for n in ref)
    assert torch.equal(auto_loss, ref_loss)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert precision.cpu_bf16("auto")
    assert gradients("auto")[2] == [True] * 4


def test_the_recipe_records_what_auto_became(monkeypatch):
    """The recipe's commands say bf16 or fp32, never auto, so that a record says what ran
    on its machine; a GPU's takes --fp16 instead. By default the dense step is auto and
    the nested step fp32 (its accuracy in bf16 did not hold)."""
    monkeypatch.setattr(precision, "native_bf16", lambda: True)
    assert finetune.device_options("auto", cpu=True, fp16=False) == ["--cpu-precision", "bf16"]
    monkeypatch.setattr(precision, "native_bf16", lambda: False)
    assert finetune.device_options("auto", cpu=True, fp16=False) == ["--cpu-precision", "fp32"]
    assert finetune.device_options("bf16", cpu=True, fp16=False)[-1] == "bf16"
    assert finetune.device_options("auto", cpu=False, fp16=True) == ["--fp16"]
    assert (finetune.Recipe().cpu_precision, NestedRecipe().cpu_precision) == ("auto", "fp32")


def test_a_bad_precision_is_refused_naming_the_option():
    with pytest.raises(OptionError, match=r"--cpu-precision must be one of auto, bf16, fp32, got 'fp16'"):
        precision.cpu_bf16("fp16")
