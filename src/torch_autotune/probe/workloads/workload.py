"""The workload type: a model, its optimizer and its data, as the probe trains them.

``Workload`` checks its own fields when built; ``KINDS`` are the model kinds the rules know.
Importing this module does not import torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeGuard, get_args

from torch_autotune.errors import WorkloadError
from torch_autotune.probe.workloads.messages import _listed

if TYPE_CHECKING:
    from torch import Tensor
    from torch.nn import Module
    from torch.optim import Optimizer

__all__ = ["KINDS", "Kind", "MapDataset", "Workload"]

Kind = Literal["conv", "transformer", "mlp", "other"]
KINDS: tuple[str, ...] = get_args(Kind)
"""The model kinds the rules know (``Preferences.model_kind``)."""


class MapDataset(Protocol):
    """A map-style dataset: ``len()`` samples, ``dataset[i]`` for ``0 <= i < len``."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A model, its optimizer and its data, as the probe trains them.

    ``make_model()`` returns a fresh model (on the CPU, in training mode) at every call.
    ``make_optimizer(params, **kwargs)`` builds the optimizer; the probe passes the profile's
    optimizer options (``fused=True``) as keyword arguments where ``optimizer_accepts`` says
    they are taken. ``make_batch(n)`` returns ``(inputs, targets)`` of ``n`` samples on the CPU,
    always at the same (worst-case) shape. ``dataset`` yields single samples for the DataLoader
    measurement. ``sample_shape`` describes one sample for reports. ``max_batch_size`` caps
    the batch sizes tried (``None``: no cap).
    """

    name: str
    kind: Kind
    make_model: Callable[[], Module]
    make_optimizer: Callable[..., Optimizer]
    make_batch: Callable[[int], tuple[Tensor, Tensor]]
    dataset: MapDataset | None = None
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    sample_shape: str = ""
    max_batch_size: int | None = None

    def __post_init__(self) -> None:
        where = f"workload '{self.name}'"
        if self.kind not in KINDS:
            raise WorkloadError(f"{where}: kind {self.kind!r} is not one of {_listed(KINDS)}")
        for field in ("make_model", "make_optimizer", "make_batch", "loss_fn"):
            if not callable(getattr(self, field)):
                raise WorkloadError(f"{where}: {field} is not callable")
        size = self.max_batch_size
        if size is not None and not _is_positive_int(size):
            raise WorkloadError(f"{where}: max_batch_size must be a positive int or None")

    def optimizer_accepts(self, **kwargs: object) -> bool:
        """Whether ``make_optimizer(params, **kwargs)`` takes these keyword arguments.

        Judged from the factory's signature; ``True`` where it cannot be read (the call then
        decides). ``lambda params: AdamW(params)`` takes none, so ``fused=True`` is not tried.
        """
        try:
            signature = inspect.signature(self.make_optimizer)
        except (TypeError, ValueError):
            return True
        try:
            signature.bind(object(), **kwargs)
        except TypeError:
            return False
        return True


def _is_positive_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an int of at least 1: a batch size (``True`` is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
