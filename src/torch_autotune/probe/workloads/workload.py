"""The workload type: a model, its optimizer and its data, as the probe trains them.

``Workload`` checks its own fields when built; ``KINDS`` are the model kinds the rules know.
Importing this module does not import torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeGuard, get_args

from torch_autotune.errors import WorkloadError
from torch_autotune.probe.workloads.messages import _listed

if TYPE_CHECKING:
    from torch import Tensor
    from torch.nn import Module
    from torch.optim import Optimizer

    from torch_autotune.evidence import WorkloadDetails

__all__ = ["KINDS", "Kind", "MapDataset", "OptimizerKind", "Workload"]

Kind = Literal["conv", "transformer", "mlp", "other"]
OptimizerKind = Literal["adam", "adamw", "sgd", "other"]
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
    ``make_optimizer(model, **kwargs)`` builds the optimizer over that model's parameters; the
    probe passes the profile's optimizer options (``fused=True``) as keyword arguments where
    ``optimizer_accepts`` says they are taken. ``make_batch(n)`` returns a batch of ``n``
    samples on the CPU, in whatever structure the workload's collate makes (a tensor, a tuple,
    a mapping, nested), always at the largest shape the workload was seen to need (the search
    runs on it); ``typical_batch(n)``, where given, a batch as training draws it (the throughput
    points run on it). ``train_step(model, batch)`` is the forward pass and the loss of one step
    (``steps``); the probe adds autocast, backward and the optimizer step. ``dataset`` yields
    single samples for the DataLoader measurement, batched by ``collate_fn`` (None: torch's
    default). ``sample_shape`` describes one sample for reports. ``max_batch_size`` caps the
    batch sizes tried (``None``: no cap), ``min_batch_size`` is where the search starts (a model
    with BatchNorm in training mode cannot train on one sample). ``optimizer`` names the kind of
    optimizer for the rules (``adamw``, ``adam``, ``sgd``, ``other``), and ``fused_by`` what
    builds it with the fused kernel whatever the profile says, in words (``optimizers.fused_by``:
    the rules then keep it on, as it trains); ``update_samples``: the samples each process
    trains per optimizer step where the workload fixes them, with what fixes them in words (a
    Trainer's ``per_device_train_batch_size x gradient_accumulation_steps``, where it
    accumulates): the global batch is kept (``compose.workload_target``); ``details`` says what the
    probe made of the user's objects (how a batch is fed to the model, what was adapted), for
    the evidence. ``rebuild`` is how another process builds it again (a built-in's name,
    ``module:factory``); None for objects in hand, which a fresh process cannot have.
    ``blocks`` names the classes of the model's repeated blocks (``pkg.model.Block``), where the
    user gives them: what activation checkpointing recomputes and FSDP2 shards, in place of
    the repeated blocks found in the module tree (``wrapping.repeated_blocks``).
    ``builds_on_device``: ``make_model()`` called under a ``torch.device`` context builds every
    parameter and buffer on that device (the built-ins: plain torch modules), so the probe
    builds it there directly (``model_on``); False for the user's objects, whose factories may
    place tensors of their own. ``worker_options``: DataLoader arguments of the user's own
    that every DataLoader of the probe's with workers takes (``worker_init_fn``,
    ``multiprocessing_context``: ``given.Kept``).
    """

    name: str
    kind: Kind
    make_model: Callable[[], Module]
    make_optimizer: Callable[..., Optimizer]
    make_batch: Callable[[int], Any]
    train_step: Callable[[Module, Any], Tensor]
    dataset: MapDataset | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    typical_batch: Callable[[int], Any] | None = None
    sample_shape: str = ""
    max_batch_size: int | None = None
    min_batch_size: int = 1
    optimizer: OptimizerKind = "adamw"
    fused_by: str | None = None
    update_samples: tuple[int, str] | None = None
    variable_shapes: bool = False
    details: Callable[[], WorkloadDetails] | None = None
    rebuild: str | None = None
    blocks: tuple[str, ...] = ()
    ranks_sharing_data: int = 1  # ``per_rank``: the ranks its dataset's samples are spread over
    builds_on_device: bool = False
    worker_options: Mapping[str, Any] = dataclass_field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"workload '{self.name}'"
        if self.kind not in KINDS:
            raise WorkloadError(f"{where}: kind {self.kind!r} is not one of {_listed(KINDS)}")
        for field in ("make_model", "make_optimizer", "make_batch", "train_step"):
            if not callable(getattr(self, field)):
                raise WorkloadError(f"{where}: {field} is not callable")
        size = self.max_batch_size
        if size is not None and not _is_positive_int(size):
            raise WorkloadError(f"{where}: max_batch_size must be a positive int or None")
        if not _is_positive_int(self.min_batch_size):
            raise WorkloadError(f"{where}: min_batch_size must be a positive int")
        if size is not None and self.min_batch_size > size:
            raise WorkloadError(
                f"{where}: min_batch_size {self.min_batch_size} is above its largest batch, {size}"
                f"{' (the number of samples in its dataset)' if self._sized_by_data() else ''}"
            )

    def per_rank(self, ranks: int) -> Workload:
        """The workload as each of ``ranks`` processes trains it: where its largest batch is
        its dataset's length, no more than each rank's share of it (a DistributedSampler
        gives each ``ceil(len / ranks)`` samples), so that an epoch has at least one step of
        the batch the probe hands out, ``drop_last`` too. Itself where nothing changes."""
        if ranks <= 1 or self.dataset is None or not self._sized_by_data():
            return self
        share = max(self.min_batch_size, -(-len(self.dataset) // ranks))
        return replace(self, max_batch_size=share, ranks_sharing_data=ranks)

    def model_on(self, device: str) -> Module:
        """A fresh model on ``device``: built there directly where the workload allows it
        (``builds_on_device``), neither initialised by the CPU first (7.7 s for GPT-2 large on
        two cores, against 1 s for its shapes alone) nor held in host memory on the way; else
        (and before torch 2.0, whose ``torch.device`` is no context) built on the CPU and
        moved."""
        import torch

        if self.builds_on_device and device != "cpu" and hasattr(torch.device, "__enter__"):
            with torch.device(device):
                return self.make_model()
        return self.make_model().to(device)

    def _sized_by_data(self) -> bool:
        """Whether ``max_batch_size`` is the dataset's length (a factory's or tune()'s default)."""
        return self.dataset is not None and len(self.dataset) == self.max_batch_size

    def loading(self) -> dict[str, Any]:
        """The arguments of ``probe.loader.measure_loader`` that are the workload's own: its
        collate_fn and its ``worker_options``."""
        return {"collate_fn": self.collate_fn, "worker_options": self.worker_options}

    def optimizer_accepts(self, **kwargs: object) -> bool:
        """Whether ``make_optimizer(model, **kwargs)`` takes these keyword arguments.

        Asked of the optimizer builder (``accepts``), else judged from its signature; ``True``
        where neither can be read (the call then decides). ``lambda params: AdamW(params)``
        takes none, so ``fused=True`` is not tried.
        """
        accepts = getattr(self.make_optimizer, "accepts", None)
        if callable(accepts):
            return bool(accepts(**kwargs))
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
