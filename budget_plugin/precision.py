"""The precision of training on the CPU (the task's ``--cpu-precision``): bfloat16
autocast where the CPU computes bfloat16 natively, fp32 elsewhere.

fairseq's ``--amp`` autocasts on CUDA only, and its ``--bf16`` casts the whole model,
its master weights and optimizer state included. Under torch's CPU autocast the weights,
their gradients and the optimizer state stay fp32: only the matrix products (linear,
bmm, scaled-dot-product attention, whose CPU kernels keep the softmax's sums in fp32)
run in bfloat16, and the losses are computed in fp32 (the criteria's log-softmax, the
distillation terms and the router's budget all cast to fp32 first). On CPUs without
bfloat16 instructions (AVX-512 BF16 or AMX) the casts cost more than they save."""

import contextlib
from typing import ContextManager

import torch

from .option_error import require

CHOICES = ("auto", "bf16", "fp32")  # auto: bf16 where native_bf16(), else fp32


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 products in hardware (x86's AVX-512 BF16 or AMX)."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, check, lambda: False)() for check in checks)


def cpu_bf16(choice: str) -> bool:
    """Whether ``--cpu-precision choice`` trains in bfloat16 on this CPU."""
    require(choice in CHOICES, "cpu_precision", "one of " + ", ".join(CHOICES), choice)
    return choice == "bf16" or (choice == "auto" and native_bf16())


def training_autocast(choice: str, model: torch.nn.Module, cuda_amp: bool) -> ContextManager:
    """The autocast of a training forward: on CUDA, fairseq's (``--amp``: ``cuda_amp``);
    on the CPU, bfloat16 where ``cpu_bf16(choice)`` and the weights are fp32 (``--bf16``
    has cast them already)."""
    weight = next(model.parameters())
    if weight.device.type == "cuda":
        return torch.autocast("cuda", enabled=cuda_amp)
    if weight.device.type == "cpu" and weight.dtype == torch.float32 and cpu_bf16(choice):
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def outside_autocast(model: torch.nn.Module) -> ContextManager:
    """A backward pass inside a training forward's autocast (the criterion's own passes):
    autocast switched off, so that the backward runs in the dtypes its forward recorded."""
    return torch.autocast(next(model.parameters()).device.type, enabled=False)
