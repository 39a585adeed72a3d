"""What a rank would hold if the model were sharded with FSDP2 over ranks that are not here:
an estimate, where it cannot be measured, of one training step's peak tensor memory a rank.

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
from typing import TYPE_CHECKING, Any

from torch_autotune.probe.trials import StepSettings, make_optimizer
from torch_autotune.settings import FsdpSettings
from torch_autotune.wrapping import shard

if TYPE_CHECKING:
    from torch_autotune.probe.workloads import Workload

__all__ = ["fsdp_peak_bytes"]


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
    from torch_autotune.probe.trials import train_step

    model = shard(settings, workload.make_model(), mesh=mesh)
    optimizer = make_optimizer(workload, model, {})
    batch = workload.make_batch(batch_size)
    tracker = tracker_class(model, optimizer)
    with tracker:
        for step in range(2):  # the second step holds the optimizer's state
            train_step(
                workload, batch, settings, model=model, optimizer=optimizer, scaler=_NoScaler()
            )
            if step == 0:
                tracker.reset_mod_stats()  # it tracks one iteration's modules at a time
    peak = tracker.get_tracker_snapshot("peak")
    return int(max(device["Total"] for device in peak.values()))


class _NoScaler:
    """The GradScaler's calls, doing what a disabled one does (no fp16 on the fake CPU)."""

    def scale(self, loss: Any) -> Any:
        return loss

    def step(self, optimizer: Any) -> None:
        optimizer.step()

    def update(self) -> None:
        return None
