"""The losses of the built-in workloads, and the default for a user's: cross-entropy or MSE."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


def _cross_entropy(outputs: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy of logits and integer class targets, classes on dim 1 or on the last dim.

    ``(N, C)``/``(N,)`` and ``(N, C, d...)``/``(N, d...)`` follow torch (classes on dim 1);
    ``(N, S, C)``/``(N, S)`` (a language model's logits) is flattened to ``(N*S, C)``/``(N*S)``.
    """
    import torch.nn.functional as F

    torch_layout = outputs.shape[:1] + outputs.shape[2:] == targets.shape
    if not torch_layout and outputs.shape[:-1] == targets.shape:
        return F.cross_entropy(outputs.flatten(0, -2), targets.flatten())
    return F.cross_entropy(outputs, targets)


def _mse(outputs: Tensor, targets: Tensor) -> Tensor:
    """Mean squared error (for floating-point targets)."""
    import torch.nn.functional as F

    return F.mse_loss(outputs, targets)


def _default_loss(targets: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
    """Cross-entropy for integer targets, MSE for anything else."""
    import torch

    integer = not (targets.dtype.is_floating_point or targets.dtype.is_complex)
    return _cross_entropy if integer and targets.dtype != torch.bool else _mse
