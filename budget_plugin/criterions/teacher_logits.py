"""Reading the cached teacher logits that ``--distill-logits`` names."""

import torch
from torch import Tensor

from ..option_error import OptionError


def load_teacher_logits(path: str) -> Tensor:
    """The N x classes float tensor that --distill-logits names, read with torch's safe loader."""
    try:
        logits = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # only reading happens here: any failure is an unreadable file
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise OptionError(f"--distill-logits {path}: cannot read it ({first})") from None
    if not isinstance(logits, Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        raise OptionError(f"--distill-logits {path}: expected a float tensor of N examples x classes, "
                          f"got {type(logits).__name__} {getattr(logits, 'shape', '')}")
    if not torch.isfinite(logits).all():
        raise OptionError(f"--distill-logits {path}: holds NaN or infinite values")
    return logits
