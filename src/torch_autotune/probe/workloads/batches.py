"""``make_batch(n)``: a batch of any size from a few samples, repeated along dim 0.

A repeated sample costs the model exactly what a distinct one does, so a workload keeps a few
samples (the user's example batch or a dataset's first samples here, a pool of synthetic data
in ``synthetic``) and repeats them to the size asked for. Importing this module does not import
torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch_autotune.errors import WorkloadError, user_code_failed
from torch_autotune.probe.workloads.messages import _article, _exception
from torch_autotune.probe.workloads.workload import MapDataset, _is_positive_int

if TYPE_CHECKING:
    from torch import Tensor


def _check_batch_size(batch_size: int) -> None:
    if not _is_positive_int(batch_size):
        raise ValueError(f"batch size must be a positive int, not {batch_size!r}")


def _repeat(inputs: Tensor, targets: Tensor, batch_size: int) -> tuple[Tensor, Tensor]:
    """``batch_size`` samples taken cyclically from a batch along dim 0 (new tensors)."""
    import torch

    index = torch.arange(batch_size, device=inputs.device) % inputs.shape[0]
    return inputs.index_select(0, index), targets.index_select(0, index.to(targets.device))


class _RepeatedBatch:
    """``make_batch`` from an example batch: its samples repeated to the size asked for."""

    def __init__(self, inputs: Tensor, targets: Tensor) -> None:
        self.inputs = inputs
        self.targets = targets

    def __call__(self, batch_size: int) -> tuple[Tensor, Tensor]:
        _check_batch_size(batch_size)
        return _repeat(self.inputs, self.targets, batch_size)


class _DatasetBatches:
    """``make_batch`` from a dataset: its first samples, collated, repeated to the size asked.

    At most ``DISTINCT`` samples are read (and kept), so a large batch costs no more reads.
    """

    DISTINCT = 64

    def __init__(self, dataset: MapDataset, name: str) -> None:
        self.dataset = dataset
        self.name = name
        self._first: tuple[Tensor, Tensor] | None = None

    def __call__(self, batch_size: int) -> tuple[Tensor, Tensor]:
        _check_batch_size(batch_size)
        wanted = min(batch_size, len(self.dataset), self.DISTINCT)
        if self._first is None or self._first[0].shape[0] < wanted:
            self._first = self._collate(wanted)
        return _repeat(*self._first, batch_size)

    def _collate(self, count: int) -> tuple[Tensor, Tensor]:
        import torch
        from torch.utils.data import default_collate

        samples = [self._sample(index) for index in range(count)]
        try:
            batch = default_collate(samples)
        except Exception as exc:
            raise WorkloadError(
                f"'{self.name}': the dataset's samples cannot be batched ({_exception(exc)});"
                " samples must be (inputs, targets) tensors of one shape, or give example_batch"
                " at the largest shape"
            ) from exc
        if not (isinstance(batch, Sequence) and len(batch) == 2) or not all(
            isinstance(t, torch.Tensor) for t in batch
        ):
            raise WorkloadError(
                f"'{self.name}': dataset[0] is {_article(samples[0])}, not an (inputs,"
                " targets) pair; return one from __getitem__, or give example_batch"
            )
        return batch[0], batch[1]

    def _sample(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except Exception as exc:
            raise user_code_failed(
                f"'{self.name}': dataset[{index}] raised {_exception(exc)}; fix the dataset", exc
            ) from exc
