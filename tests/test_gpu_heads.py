"""The GPU path (gpu_heads.py): its Triton kernels equal the reference on every layout
and dtype, the module takes it on CUDA tensors, and a layer's forward on a GPU reads
nothing back to the host and launches the same kernels whatever the head sets.

Without a GPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET),
on CPU tensors: the same code, checked for values (bfloat16 excepted: the interpreter's
``tl.dot`` mishandles it). The synchronisation and launch-count tests need CUDA."""

import pytest
import torch

from budget_plugin.dial.settings import LayerDial
from budget_plugin.modules import gpu_heads
from helpers import assert_close, routed_attention

pytest.importorskip("triton")

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}  # relative to the output's scale


def make_attention(embed_dim, heads, seed=0):
    torch.manual_seed(seed)
    return routed_attention(embed_dim, heads)


def inputs(T, B, C, padded, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, C, generator=generator)
    if not padded or B == 1:
        return x, None
    lengths = torch.randint(1, T + 1, (B,), generator=generator)
    lengths[0] = T
    return x, torch.arange(T)[None, :] >= lengths[:, None]


def check(attention, x, padding, selected, dtype):
    """The Triton path in ``dtype`` on DEVICE against the fp32 reference on CPU."""
    with torch.no_grad():
        expected = attention.attend_all_heads(x, padding, selected.float())
        weights = [None if w is None else w.to(DEVICE, dtype) for w in attention.head_major_weights()]
        out = gpu_heads.attend_selected(x.to(DEVICE, dtype), None if padding is None else padding.to(DEVICE),
                                        selected.to(DEVICE), type(attention.head_major_weights())(*weights))
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    assert_close(out, expected, rtol=TOLERANCE[dtype])


DTYPES = [torch.float32, torch.float16,
          pytest.param(torch.bfloat16, marks=pytest.mark.skipif(not CUDA, reason="the interpreter's tl.dot mishandles bf16"))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,B,C,H", [(7, 1, 64, 4), (40, 5, 64, 4), (33, 3, 96, 3), (12, 6, 128, 2)])
@pytest.mark.parametrize("padded", [False, True])
def test_kernels_equal_the_reference(dtype, T, B, C, H, padded):
    """Head dims 16, 32 and 64; lengths that fill no block; batch 1 and mixed head sets
    (learned budgets: every example its own count); with and without padding."""
    attention = make_attention(C, H)
    x, padding = inputs(T, B, C, padded)
    with torch.no_grad():
        selected = attention.router(x, padding, gate=False).selected
    check(attention, x, padding, selected, dtype)


def test_a_head_no_example_chose_and_an_example_with_every_head():
    attention = make_attention(64, 4)
    x, padding = inputs(20, 4, 64, padded=True, seed=1)
    selected = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 1, 0], [1, 0, 1, 0]], dtype=torch.bool)
    check(attention, x, padding, selected, torch.float32)


def test_the_module_takes_the_triton_path_where_it_is_available(monkeypatch):
    """On CUDA tensors BudgetedAttention runs gpu_heads (without a GPU: forced, on CPU
    tensors, interpreted); a budget known on the host to be full runs fairseq's attention."""
    attention = make_attention(64, 4).to(DEVICE)
    x, padding = inputs(10, 3, 64, padded=True)
    x, padding = x.to(DEVICE), padding.to(DEVICE)
    calls = []
    real = gpu_heads.attend_selected
    if not CUDA:
        monkeypatch.setattr(gpu_heads, "available", lambda t: True)
    monkeypatch.setattr(gpu_heads, "attend_selected", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        out, stats = attention(x, key_padding_mask=padding)
        expected = attention.attend_all_heads(x, padding, stats["selected"].float())
        assert calls == [1]
        assert_close(out, expected, rtol=TOLERANCE[torch.float32])
        attention(x, key_padding_mask=padding, dial=LayerDial(heads=4))
    assert calls == [1], "every head: fairseq's own attention, not the kernels"


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_layer_on_the_gpu_never_synchronises_with_the_host(dtype):
    attention = make_attention(128, 4).to("cuda", dtype)
    x, padding = inputs(50, 8, 128, padded=True)
    x, padding = x.to("cuda", dtype), padding.cuda()
    with torch.no_grad():
        attention(x, key_padding_mask=padding)  # compile and cache outside the check
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out, _ = attention(x, key_padding_mask=padding)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(out).all()


@needs_cuda
def test_the_kernels_launched_do_not_depend_on_the_head_sets():
    attention = make_attention(128, 4).cuda()
    x, padding = inputs(50, 8, 128, padded=True)
    x, padding = x.cuda(), padding.cuda()

    def kernels(selected):
        with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            gpu_heads.attend_selected(x, padding, selected, attention.head_major_weights())
            torch.cuda.synchronize()
        return sorted(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)

    few = torch.zeros(8, 4, dtype=torch.bool, device="cuda")
    few[:, 0] = True
    many = torch.rand(8, 4, device="cuda") < 0.7
    many[:, 1] = True
    kernels(few)  # warm
    launched = kernels(few)
    assert {"_qkv_kernel", "_attention_kernel", "_out_kernel"} <= set(launched), launched
    assert launched == kernels(many)
