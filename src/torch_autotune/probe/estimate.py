"""What a training step would hold where it cannot be measured: the peak tensor memory of one
step on one device (``step_breakdown``, by kind: parameters, gradients, optimizer state,
activations), and a rank's with the model sharded with FSDP2 over ranks that are not here
(``fsdp_peak_bytes``).

The model, its optimizer and a batch are built under ``FakeTensorMode`` (shapes and dtypes,
no storage), sharded over torch's ``fake`` process group of ``world_size`` ranks as the job
would shard it (``apply.shard``), and two steps are run under ``FSDPMemTracker``, which sums
the sharded and gathered parameters, gradients, optimizer state, activations and the
all-gather and reduce-scatter buffers at the peak (torch's ``_tools``, private, as torchtitan's
estimator used them). It counts tensors only: no CUDA context, NCCL buffers, allocator
rounding or fragmentation, so a real rank needs more; the reports say "estimate". Seconds on a
CPU for a billion parameters, and nothing is allocated. Where any of this is missing from the
installed torch, or the model cannot be built under fake tensors, the estimate is None.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch_autotune.probe.step import make_optimizer
from torch_autotune.probe.trials import StepSettings
from torch_autotune.settings import FsdpSettings
from torch_autotune.wrapping import checkpoint_blocks, shard

if TYPE_CHECKING:
    from torch_autotune.probe.workloads import Workload

__all__ = ["Breakdown", "fsdp_peak_bytes", "shorter_sequence", "step_breakdown"]


@dataclass(frozen=True)
class Breakdown:
    """One training step's tensors at its peak, by kind, in bytes (an estimate: module
    docstring). ``activations`` holds what backward makes on the way (torch's "Temp": the
    gradients of activations, and of parameters before the optimizer takes them);
    ``largest_block`` is the parameters of the largest repeated block (one FSDP2 unit)."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int
    other: int
    largest_block: int = 0

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.other


def step_breakdown(
    workload: Workload,
    settings: StepSettings,
    *,
    batch_size: int,
    reshape: Callable[[Any], Any] | None = None,
) -> Breakdown | None:
    """One device's training step of ``batch_size`` samples (``reshape``: what to do to the
    batch first, e.g. ``shorter_sequence``), two fake steps under ``MemTracker``; None where
    it cannot be estimated (module docstring)."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError:  # an older torch, or one that moved them
        return None
    on_cpu = settings.settings.model_copy(update={"device": "cpu"})
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own, about fake tensors: not the user's
            model = workload.make_model()
            if on_cpu.activation_checkpointing:  # its blocks, as prepare_model wraps them
                checkpoint_blocks(model, on_cpu.blocks)
            optimizer = make_optimizer(workload, model, {})
            batch = workload.make_batch(batch_size)
            tracker = MemTracker()
            tracker.track_external(model, optimizer)
            with tracker:
                _two_steps(
                    workload,
                    on_cpu,
                    model,
                    optimizer,
                    batch if reshape is None else reshape(batch),
                    tracker=tracker,
                )
            peak = tracker.get_tracker_snapshot("peak")
    except Exception:  # an estimate never fails the run: its absence is said
        return None
    return _breakdown(peak, _largest_block(model, settings.settings.blocks))


def _breakdown(peak: dict[Any, dict[Any, int]], largest_block: int) -> Breakdown:
    """The tracker's peak snapshot, summed over devices, by kind."""
    kinds: dict[str, int] = {}
    for device in peak.values():
        for kind, size in device.items():
            name = getattr(kind, "value", kind)
            kinds[name] = kinds.get(name, 0) + int(size)
    return Breakdown(
        parameters=kinds.get("Parameter", 0),
        gradients=kinds.get("Gradient", 0),
        optimizer=kinds.get("Optstate", 0),
        activations=kinds.get("Activation", 0) + kinds.get("Temp", 0),
        other=kinds.get("Buffer", 0) + kinds.get("Other", 0),
        largest_block=largest_block,
    )


def _largest_block(model: Any, names: str | None) -> int:
    """Bytes of the parameters of the largest block (``wrapping.model_blocks``: the classes
    ``names`` gives, else the repeated blocks), 0 where there is none."""
    from torch_autotune.wrapping import model_blocks

    blocks = model_blocks(model, names)
    return max(
        (sum(p.numel() * p.element_size() for p in b.parameters()) for b in blocks), default=0
    )


def shorter_sequence(batch: Any, length: int) -> Any:
    """``batch`` with every tensor of two or more dimensions whose second is the sequence's
    (``sequence_length``) cut to its first ``length`` positions; the rest as they are."""
    import torch
    from torch.utils._pytree import tree_map

    full = sequence_length(batch)

    def cut(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] == full:
            return value[:, :length]
        return value

    return tree_map(cut, batch)


def sequence_length(batch: Any) -> int | None:
    """The length of the token sequences in ``batch``: the second dimension of its integer
    tensors of two dimensions (token ids, ``input_ids``, labels), where they all agree and it
    is above 1; None for a batch of anything else (images, vectors)."""
    import torch
    from torch.utils._pytree import tree_leaves

    lengths = {
        leaf.shape[1]
        for leaf in tree_leaves(batch)
        if isinstance(leaf, torch.Tensor)
        and leaf.dim() == 2
        and not leaf.is_floating_point()
        and leaf.dtype is not torch.bool
    }
    if len(lengths) != 1:
        return None
    (length,) = lengths
    return int(length) if length > 1 else None


def fsdp_peak_bytes(
    workload: Workload, settings: StepSettings, *, world_size: int, batch_size: int
) -> int | None:
    """The estimated peak bytes a rank holds in a training step of ``batch_size`` samples with
    the model sharded over ``world_size`` ranks (module docstring); None where it cannot be
    estimated. Only where no process group is initialised (it makes torch's fake one)."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return None
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        from torch.distributed.device_mesh import init_device_mesh
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError:  # an older torch, or one that moved them
        return None
    sharded = settings.settings.model_copy(
        update={"device": "cpu", "fsdp": FsdpSettings(enabled=True)}
    )
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (world_size,))  # outside the fake mode: it reads values
        with FakeTensorMode(allow_non_fake_inputs=True), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own, about fake tensors: not the user's
            return _peak(workload, sharded, batch_size, mesh, FSDPMemTracker)
    except Exception:  # an estimate never fails the run: its absence is said
        return None
    finally:
        dist.destroy_process_group()


def _peak(workload: Workload, settings: Any, batch_size: int, mesh: Any, tracker_class: Any) -> int:
    """Two fake steps of the sharded model under the tracker; its peak 'Total' in bytes."""
    model = workload.make_model()
    if settings.activation_checkpointing:  # checkpointed, then sharded, as prepare_model does
        checkpoint_blocks(model, settings.blocks)
    model = shard(settings, model, mesh=mesh)
    optimizer = make_optimizer(workload, model, {})
    batch = workload.make_batch(batch_size)
    tracker = tracker_class(model, optimizer)
    with tracker:
        _two_steps(workload, settings, model, optimizer, batch, tracker=tracker)
    peak = tracker.get_tracker_snapshot("peak")
    return int(max(device["Total"] for device in peak.values()))


def _two_steps(
    workload: Workload, settings: Any, model: Any, optimizer: Any, batch: Any, *, tracker: Any
) -> None:
    """Two training steps under ``tracker``: the second holds the optimizer's state."""
    from torch_autotune.probe.step import train_step

    for step in range(2):
        train_step(workload, batch, settings, model=model, optimizer=optimizer, scaler=_NoScaler())
        if step == 0:
            tracker.reset_mod_stats()  # it tracks one iteration's modules at a time


class _NoScaler:
    """The GradScaler's calls, doing what a disabled one does (no fp16 on the fake CPU)."""

    def scale(self, loss: Any) -> Any:
        return loss

    def step(self, optimizer: Any) -> None:
        optimizer.step()

    def update(self) -> None:
        return None
