"""``make_batch(n)``: a batch of ``n`` samples, whatever its structure, from a few samples.

A batch is whatever torch's default collate or the user's ``collate_fn`` returns: a tensor, a
tuple or a list, a mapping (a dict, a tokenizer's ``BatchEncoding``), nested. Two makers:

- ``RepeatedBatch``: an example batch, its samples repeated cyclically to the size asked
  for: every tensor whose first dimension is the example's sample count, and every list of
  that many strings or numbers, is repeated along it, the rest is kept as it is;
- ``DatasetBatches``: batches collated from a dataset's samples, through its collate. At most
  ``DISTINCT`` samples are read and kept, and cycled to any size, so a large batch costs no
  more reads. Where the samples differ in shape (variable-length sequences), the search's
  batches (``worst``) are made of the largest samples of those read, so the limit it finds
  holds for the worst batch training will meet, and the throughput points' batches
  (``typical``) are made of samples drawn at random, as training draws them.

A repeated sample costs the model exactly what a distinct one does. Importing this module does
not import torch.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torch_autotune.errors import WorkloadError, user_code_failed
from torch_autotune.probe.workloads.messages import _article, _exception
from torch_autotune.probe.workloads.workload import MapDataset, _is_positive_int

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["DatasetBatches", "RepeatedBatch", "batch_samples", "describe_batch", "repeat_batch"]

Collate = Callable[[list[Any]], Any]


def _check_batch_size(batch_size: int) -> None:
    if not _is_positive_int(batch_size):
        raise ValueError(f"batch size must be a positive int, not {batch_size!r}")


def batch_samples(batch: Any) -> int | None:
    """The number of samples in ``batch``: the first dimension of its first tensor, in a
    mapping, a tuple or list, or a dataclass's fields (None: it holds no tensor with a
    dimension)."""
    import dataclasses

    import torch

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    children: Any = ()
    if isinstance(batch, Mapping):
        children = batch.values()
    elif isinstance(batch, (tuple, list)):
        children = batch
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        children = [getattr(batch, field.name) for field in dataclasses.fields(batch)]
    for child in children:
        found = batch_samples(child)
        if found is not None:
            return found
    return None


def _repeat(inputs: Tensor, targets: Tensor, batch_size: int) -> tuple[Tensor, Tensor]:
    """``batch_size`` samples taken cyclically from an (inputs, targets) batch (new tensors)."""
    import torch

    index = torch.arange(batch_size, device=inputs.device) % inputs.shape[0]
    return inputs.index_select(0, index), targets.index_select(0, index.to(targets.device))


def repeat_batch(batch: Any, count: int, batch_size: int) -> Any:
    """``batch`` (of ``count`` samples) grown or cut to ``batch_size`` samples, cyclically:
    every tensor whose first dimension is ``count`` is indexed along it, and so is every list
    of ``count`` items that holds no tensor (one string or number per sample); the rest (a
    scalar, a tensor of another length) is kept. A list that holds tensors is the batch's
    structure (torch's default collate batches ``(inputs, targets)`` samples as a list
    ``[inputs, targets]``), never a list of samples. The containers keep their types."""
    import torch

    from torch_autotune.apply import map_tensors

    index = torch.arange(batch_size) % count
    positions = index.tolist()

    def repeat(tensor: Tensor) -> Tensor:
        if tensor.dim() == 0 or tensor.shape[0] != count:
            return tensor
        return tensor.index_select(0, index.to(tensor.device))

    def lists(value: Any) -> Any:
        if isinstance(value, list) and len(value) == count and not _holds_tensor(value):
            return [value[i] for i in positions]
        if isinstance(value, Mapping):
            items = {key: lists(item) for key, item in value.items()}
            kind: Any = type(value)
            try:
                return kind(items)
            except Exception:
                return items
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
            return type(value)(*(lists(item) for item in value))
        if isinstance(value, (tuple, list)):
            return type(value)(lists(item) for item in value)
        return value

    return lists(map_tensors(batch, repeat))


def _holds_tensor(value: Any) -> bool:
    """Whether ``value`` is a tensor or a tuple, list or mapping with a tensor in it."""
    import torch

    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, Mapping):
        return any(_holds_tensor(item) for item in value.values())
    if isinstance(value, (tuple, list)):
        return any(_holds_tensor(item) for item in value)
    return False


class RepeatedBatch:
    """``make_batch`` from an example batch: its samples repeated to the size asked for."""

    def __init__(self, batch: Any, count: int) -> None:
        self.batch = batch
        self.count = count

    def __call__(self, batch_size: int) -> Any:
        _check_batch_size(batch_size)
        return repeat_batch(self.batch, self.count, batch_size)


def describe_batch(batch: Any, *, depth: int = 0) -> str:
    """One sample of a batch for reports: ``3x64x64 float32`` for a tensor, ``{input_ids: 128
    int64, attention_mask: 128 int64}`` for a mapping, ``(...; ...)`` for a tuple."""
    import torch

    if isinstance(batch, torch.Tensor):
        dtype = str(batch.dtype).removeprefix("torch.")
        shape = "x".join(str(size) for size in batch.shape[1:])
        return f"{shape} {dtype}" if shape else dtype
    if depth > 2:
        return "..."
    if isinstance(batch, Mapping):
        inner = ", ".join(f"{k}: {describe_batch(v, depth=depth + 1)}" for k, v in batch.items())
        return "{" + inner + "}"
    if isinstance(batch, (tuple, list)):
        return "(" + "; ".join(describe_batch(v, depth=depth + 1) for v in batch) + ")"
    if isinstance(batch, str):
        return "text"
    return type(batch).__name__


def _size(sample: Any) -> tuple[int, int]:
    """How large a sample is: the elements of its tensors and the items of its lists first,
    the characters of its text after (a sample that keeps its text beside its tokens is as
    large as its tokens: its text's length breaks ties, and ranks samples of text alone)."""
    import torch

    if isinstance(sample, torch.Tensor):
        return int(sample.numel()), 0
    if isinstance(getattr(sample, "size", None), int) and hasattr(sample, "shape"):
        return int(sample.size), 0  # a NumPy array (a datasets.Dataset in numpy format)
    if isinstance(sample, str):
        return 0, len(sample)
    if (
        isinstance(sample, (tuple, list))
        and sample
        and all(isinstance(v, (int, float, bool)) for v in sample)
    ):
        return len(sample), 0
    if isinstance(sample, (Mapping, tuple, list)):
        parts = [_size(v) for v in (sample.values() if isinstance(sample, Mapping) else sample)]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    return 1, 0


class DatasetBatches:
    """Batches collated from a dataset's own samples, through its collate (see the module).

    ``worst(n)`` (also ``self(n)``) collates the largest samples read, ``typical(n)`` samples
    drawn at random; both cycle their samples to ``n``. The first ``DISTINCT`` samples, and
    ``SPREAD`` more spread over the dataset up to its last (a dataset sorted by length, or one
    whose first samples happen to be alike, differs there), are read when the first batch is
    made; where they differ in size, up to ``SCAN`` samples spread over the dataset (at most
    ``SCAN_S`` seconds of reading) are read to find the largest, the largest and the smallest
    are collated together once (samples of different sizes need a collate that pads them), and
    ``variable`` is True. ``note`` says what was read, for the evidence. ``worker_options``:
    what the user's DataLoader gives its workers (a ``worker_init_fn``), which does not run in
    this process, where the samples are read: a sample that raises says so.
    """

    DISTINCT = 64
    SPREAD = 16
    SCAN = 1024
    SCAN_S = 3.0

    def __init__(
        self,
        dataset: MapDataset,
        collate: Collate | None,
        name: str,
        worker_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.dataset = dataset
        self.worker_options = worker_options or {}
        self.collate = collate
        self.name = name
        self._first: list[Any] | None = None
        self._largest: list[Any] | None = None
        self._random: list[Any] | None = None
        self.variable = False
        self.note = ""

    def __call__(self, batch_size: int) -> Any:
        return self.worst(batch_size)

    def worst(self, batch_size: int) -> Any:
        """``batch_size`` samples: the largest read, cycled, collated."""
        _check_batch_size(batch_size)
        self._read()
        assert self._largest is not None
        return self._collated(self._largest, batch_size)

    def typical(self, batch_size: int) -> Any:
        """``batch_size`` samples drawn at random (seeded), cycled, collated."""
        _check_batch_size(batch_size)
        self._read()
        if not self.variable:
            assert self._first is not None
            return self._collated(self._first, batch_size)
        if self._random is None:
            draw = random.Random(0)
            length = len(self.dataset)
            picks = draw.sample(range(length), min(length, self.DISTINCT))
            self._random = [self._sample(i) for i in picks]
        return self._collated(self._random, batch_size)

    def first(self) -> Any:
        """The dataset's first sample, read once."""
        self._read()
        assert self._first is not None
        return self._first[0]

    def _read(self) -> None:
        if self._first is not None:
            return
        length = len(self.dataset)
        first = [self._sample(i) for i in range(min(length, self.DISTINCT))]
        self._first = first
        read = dict(enumerate(first))
        if length > len(first):
            last = length - 1
            for i in range(self.SPREAD):
                index = len(first) + round(i * (last - len(first)) / (self.SPREAD - 1))
                if index not in read:
                    read[index] = self._sample(index)
        if len({_size(sample) for sample in read.values()}) == 1:
            self._largest = first
            return
        self.variable = True
        began = time.perf_counter()
        step = max(1, length // self.SCAN)
        for index in range(0, length, step):
            if len(read) >= self.SCAN + len(first) or time.perf_counter() - began > self.SCAN_S:
                break
            if index not in read:
                read[index] = self._sample(index)
        ranked = sorted(read.values(), key=_size, reverse=True)
        # The largest with the smallest, at once: a collate that cannot pad (torch's default
        # on token lists of different lengths) fails here, not in the first throughput point.
        collate_samples([ranked[0], ranked[-1]], self.collate, self.name)
        self._largest = ranked[: self.DISTINCT]
        self.note = (
            f"samples differ in size: the search trains on the largest of {len(read)} samples"
            f" read (of {length}), the throughput points on samples drawn at random"
        )

    def _collated(self, samples: Sequence[Any], batch_size: int) -> Any:
        chosen = [samples[i % len(samples)] for i in range(batch_size)]
        return collate_samples(chosen, self.collate, self.name)

    def _sample(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except Exception as exc:
            raise user_code_failed(self._raised(index, exc), exc) from exc

    def _raised(self, index: int, exc: Exception) -> str:
        """What a sample that raised says: the dataset's, or, where the user's DataLoader gives
        its workers a ``worker_init_fn``, that this process is no worker of theirs."""
        raised = f"'{self.name}': dataset[{index}] raised {_exception(exc)}"
        function = self.worker_options.get("worker_init_fn")
        if function is None:
            return f"{raised}; fix the dataset"
        return (
            f"{raised} in the main process, where the DataLoader's worker_init_fn"
            f" ({getattr(function, '__qualname__', 'yours')}) does not run: the probe reads the"
            " samples of its training steps there, and measures loading without workers too;"
            " open what the dataset needs on its first use in __getitem__ (once in each"
            " process) rather than in worker_init_fn"
        )


def collate_samples(samples: list[Any], collate: Collate | None, name: str) -> Any:
    """``collate(samples)``, torch's ``default_collate`` when ``collate`` is None; a failure
    is the user's (their collate), or says what cannot be batched (the default one)."""
    from torch.utils.data import default_collate

    if collate is not None:
        try:
            return collate(samples)
        except Exception as exc:
            raise user_code_failed(
                f"'{name}': the collate_fn raised {_exception(exc)} on {len(samples)} samples;"
                " fix it",
                exc,
            ) from exc
    try:
        return default_collate(samples)
    except Exception as exc:
        raise WorkloadError(
            f"'{name}': the dataset's samples cannot be batched by torch's default collate"
            f" ({_exception(exc)}; a sample is {_article(samples[0])}); give a collate_fn that"
            " batches them (a padding one for samples of different lengths)"
        ) from exc
