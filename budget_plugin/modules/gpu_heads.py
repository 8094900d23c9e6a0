"""Executing a chosen subset of heads on a GPU: three Triton kernels per layer, whatever
the batch's head sets, and no host synchronisation.

The CPU path (head_subset.py) sorts the batch and loops over ranges of examples on the
host; on a GPU every such decision is a synchronisation and every range a handful of
launches, which cost more than the heads they save. Here the work is laid out as a
grid over (example, head) pairs that does not depend on the selection, and a program
whose pair was not selected returns at once, so the cost is the selected pairs' FLOPs
plus one idle program per skipped tile:

1. ``_qkv_kernel``: q/k/v of every selected (example, head): x[b] @ W_h^T, straight
   from fairseq's T x B x C activations (strided, never copied), into a B x H x T x 3d
   buffer;
2. ``_attention_kernel``: flash attention (online softmax, fp32 statistics) of every
   selected pair, honouring the key padding mask;
3. ``_out_kernel``: every example's output tile, summed over its selected heads'
   out_proj columns (a loop over H whose skipped heads cost a branch), written
   in fairseq's T x B x C layout.

Shapes are fixed by (T, B, C, H), so a forward pass can be captured in a CUDA graph. The
buffers are sized for every pair (B x H x T x 3d and B x H x T x d, of which only the
selected pairs are written): on a GPU the budget saves time, not memory.
Products accumulate in fp32; with fp32 inputs they use TF32 exactly when torch's own
matmuls do (``torch.backends.cuda.matmul.allow_tf32``). ``TRITON_INTERPRET=1`` runs the
kernels on CPU tensors, which is how the tests check them on machines without a GPU."""

from typing import Optional

import torch
from torch import Tensor

from .head_subset import HeadMajorWeights

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU path needs none of this
    triton = None


def available(x: Tensor) -> bool:
    """Whether ``x`` takes the Triton path: a CUDA tensor, and Triton installed. (The
    interpreter runs the kernels on CPU tensors too, but only tests call them so.)"""
    return triton is not None and x.is_cuda


if triton is not None:

    @triton.jit
    def _qkv_kernel(x_ptr, stride_xt, stride_xb, w_ptr, bias_ptr, sel_ptr, out_ptr, T, C, H,
                    D3: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
        pair = tl.program_id(0).to(tl.int64)  # axis 0: B*H may pass the 65,535 of the others
        if tl.load(sel_ptr + pair) != 0:  # (an if, not an early return: older Triton compiles it too)
            b, h = pair // H, pair % H
            t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
            n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, C, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                a = tl.load(x_ptr + t[:, None] * stride_xt + b * stride_xb + k[None, :],
                            mask=(t[:, None] < T) & (k[None, :] < C), other=0.0)
                w = tl.load(w_ptr + (h * D3 + n[:, None]) * C + k[None, :],
                            mask=(n[:, None] < D3) & (k[None, :] < C), other=0.0)
                acc += tl.dot(a, tl.trans(w), input_precision=PRECISION)
            if HAS_BIAS:
                acc += tl.load(bias_ptr + h * D3 + n, mask=n < D3, other=0.0).to(tl.float32)[None, :]
            out = out_ptr + (pair * T + t[:, None]) * D3 + n[None, :]
            tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(t[:, None] < T) & (n[None, :] < D3))

    @triton.jit
    def _attention_kernel(qkv_ptr, pad_ptr, sel_ptr, out_ptr, T, H, scale, D: tl.constexpr,
                          BLOCK_D: tl.constexpr, HAS_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
        pair = tl.program_id(0).to(tl.int64)
        if tl.load(sel_ptr + pair) != 0:
            b = pair // H
            m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
            i = tl.arange(0, BLOCK_D)
            row = qkv_ptr + pair * T * 3 * D  # this pair's T x 3d block: q | k | v
            q = tl.load(row + m[:, None] * 3 * D + i[None, :], mask=(m[:, None] < T) & (i[None, :] < D), other=0.0)
            top = tl.full((BLOCK_M,), -1.0e30, dtype=tl.float32)  # finite: a fully padded tile adds 0, not NaN
            total = tl.zeros((BLOCK_M,), dtype=tl.float32)
            acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
            for n0 in range(0, T, BLOCK_N):
                n = n0 + tl.arange(0, BLOCK_N)
                keep = n < T
                if HAS_PAD:
                    keep = keep & (tl.load(pad_ptr + b * T + n, mask=n < T, other=1) == 0)
                kv_mask = keep[:, None] & (i[None, :] < D)
                k = tl.load(row + n[:, None] * 3 * D + D + i[None, :], mask=kv_mask, other=0.0)
                v = tl.load(row + n[:, None] * 3 * D + 2 * D + i[None, :], mask=kv_mask, other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
                s = tl.where(keep[None, :], s, float("-inf"))
                new_top = tl.maximum(top, tl.max(s, axis=1))
                p = tl.exp(s - new_top[:, None])
                correction = tl.exp(top - new_top)
                total = total * correction + tl.sum(p, axis=1)
                acc = acc * correction[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
                top = new_top
            acc = acc / tl.where(total > 0, total, 1.0)[:, None]  # an example of padding only: zeros
            out = out_ptr + (pair * T + m[:, None]) * D + i[None, :]
            tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(m[:, None] < T) & (i[None, :] < D))

    @triton.jit
    def _out_kernel(ctx_ptr, w_ptr, bias_ptr, sel_ptr, out_ptr, stride_ot, stride_ob, T, C, H,
                    D: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr,
                    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
        i = tl.arange(0, BLOCK_D)
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        for h in range(0, H):
            if tl.load(sel_ptr + b * H + h) != 0:
                ctx = tl.load(ctx_ptr + ((b * H + h) * T + t[:, None]) * D + i[None, :],
                              mask=(t[:, None] < T) & (i[None, :] < D), other=0.0)
                w = tl.load(w_ptr + (h * D + i[:, None]) * C + n[None, :],
                            mask=(i[:, None] < D) & (n[None, :] < C), other=0.0)
                acc += tl.dot(ctx, w, input_precision=PRECISION)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + n, mask=n < C, other=0.0).to(tl.float32)[None, :]
        out = out_ptr + t[:, None] * stride_ot + b * stride_ob + n[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(t[:, None] < T) & (n[None, :] < C))


def _precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"  # ignored by tl.dot for half inputs


def attend_selected(x: Tensor, key_padding_mask: Optional[Tensor], selected: Tensor,
                    weights: HeadMajorWeights) -> Tensor:
    """The selected heads (``selected``: B x H, bool) of every example of ``x`` (T x B x C,
    its last dimension contiguous). Returns T x B x C. Launches three kernels and reads
    nothing back to the host."""
    T, B, C = x.shape
    H, d = selected.shape[1], weights.out.size(1)
    if x.dtype != weights.qkv.dtype:
        raise ValueError(f"the input is {x.dtype} and the weights {weights.qkv.dtype}: tl.dot needs one dtype")
    if x.stride(2) != 1:
        x = x.contiguous()
    sel = selected.to(torch.uint8).contiguous()
    pad = None if key_padding_mask is None else key_padding_mask.to(torch.uint8).contiguous()
    precision = _precision(x.dtype)
    block_d = max(16, triton.next_power_of_2(d))
    block_t = 64 if T > 32 else 32

    qkv = x.new_empty(B, H, T, 3 * d)  # unselected pairs stay unwritten and unread
    grid = (B * H, triton.cdiv(T, block_t), triton.cdiv(3 * d, 64))
    _qkv_kernel[grid](x, x.stride(0), x.stride(1), weights.qkv, weights.qkv_bias, sel, qkv, T, C, H,
                      D3=3 * d, HAS_BIAS=weights.qkv_bias is not None, BLOCK_T=block_t, BLOCK_N=64,
                      BLOCK_K=32, PRECISION=precision)

    context = x.new_empty(B, H, T, d)
    grid = (B * H, triton.cdiv(T, block_t))
    _attention_kernel[grid](qkv, pad, sel, context, T, H, d ** -0.5, D=d, BLOCK_D=block_d,
                            HAS_PAD=pad is not None, BLOCK_M=block_t, BLOCK_N=32, PRECISION=precision)

    out = x.new_empty(T, B, C)
    grid = (B, triton.cdiv(T, block_t), triton.cdiv(C, 64))
    _out_kernel[grid](context, weights.out, weights.out_bias, sel, out, out.stride(0), out.stride(1), T, C, H,
                      D=d, BLOCK_D=block_d, HAS_BIAS=weights.out_bias is not None, BLOCK_T=block_t,
                      BLOCK_N=64, PRECISION=precision)
    return out
