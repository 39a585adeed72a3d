"""Where a profile trains: the device, the training processes on this node, the devices and the
CPUs each process has, and the multiple its batch should have, each with its reason.

One pure function, ``derive_topology``, computes it from the snapshot, the user's
``processes_per_node`` and two decisions of the rules: the device (rules D1, E1-E7) and whether
the profile computes in a type that runs on Tensor Cores (AMP or TF32). The rules engine stores
it in the profile (``Profile.topology``); a profile written before it was stored gets the one
its settings, snapshot and preferences give. Everything that needs one of these counts reads it
there: the rules (the CPUs each process has for its DataLoader workers and threads, F1 and G3;
the processes a global batch is spread over, L1), the probe (the worker counts it measures per
process, the multiple its batch sizes are rounded to, K4) and the exporters (Lightning's devices,
accelerate's processes).

Part of the data model's ground floor: pydantic, the standard library and the other data-model
modules only.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from torch_autotune.bounds import MAX_ACCELERATORS, BatchSize, CpuCount
from torch_autotune.hardware import Accelerator, Backend, HardwareSnapshot, Host
from torch_autotune.invariants import device_accelerators
from torch_autotune.settings import StrictModel

__all__ = ["TENSOR_CORE_MULTIPLE", "Topology", "derive_topology", "topology_problems"]

TENSOR_CORE_MULTIPLE = 8
"""Catalog K4: batch sizes in multiples of 8 map onto NVIDIA Tensor Cores under AMP or TF32
(PyTorch's performance tuning guide: "set sizes to multiples of 8")."""

DeviceCount = Annotated[int, Field(ge=0, le=MAX_ACCELERATORS)]


class Topology(StrictModel):
    """How a profile's training is laid out on this node, each count with why."""

    device: Literal["cuda", "mps", "cpu"] = Field(
        description="The torch device type the profile trains on, as settings.device."
    )
    processes_per_node: CpuCount = Field(
        description="Training processes on this node: the DDP ranks, torchrun --nproc-per-node."
    )
    processes_reason: str
    devices_per_process: DeviceCount = Field(
        description="Accelerators each process drives: 1 on a GPU (a DDP rank drives one), 0 on "
        "the CPU."
    )
    devices_reason: str
    cpus_per_process: CpuCount = Field(
        description="Usable CPUs (affinity and container quota) each process may keep busy with "
        "its DataLoader workers and threads."
    )
    cpus_reason: str
    batch_multiple: BatchSize = Field(
        description="Batch sizes are rounded down to a multiple of this (K4), for the precision "
        "the rules chose, which the probe measures with; a size below it stays."
    )
    multiple_reason: str
    nodes: CpuCount = Field(
        default=1, description="Nodes of the job, each running processes_per_node processes."
    )
    nodes_reason: str = "1: one node"
    backend: Literal["nccl", "gloo"] | None = Field(
        default=None,
        description="The torch.distributed back end the processes communicate over; None: one "
        "training process, no process group.",
    )
    backend_reason: str = "none: one training process, so no process group"

    @property
    def world_size(self) -> int:
        """Training processes in the job: every node's."""
        return self.nodes * self.processes_per_node


def derive_topology(
    snapshot: HardwareSnapshot,
    processes_per_node: int | None,
    *,
    device: str,
    tensor_core_math: bool,
    nodes: int | None = None,
) -> Topology:
    """The topology of a profile that trains on ``device`` ('cuda', 'mps' or 'cpu', as the
    rules chose it) of ``snapshot``, with ``processes_per_node`` training processes where the
    user gave them (None: one per GPU, one on the CPU and on MPS) on each of ``nodes`` nodes
    (None: one), computing in a type that runs on Tensor Cores (AMP or TF32) where
    ``tensor_core_math``. Pure."""
    targets = device_accelerators(device, snapshot)
    processes, processes_reason = _processes(device, targets, processes_per_node, snapshot)
    devices, devices_reason = _devices(device)
    cpus, cpus_reason = _cpus(snapshot.host, processes)
    multiple, multiple_reason = _multiple(device, targets, tensor_core_math)
    count = 1 if nodes is None or device == "mps" else nodes
    nodes_reason = "1: one node" if count == 1 else f"{count}: as the job runs (its nodes)"
    backend, backend_reason = _backend(device, targets, processes, count)
    return Topology(
        nodes=count,
        nodes_reason=nodes_reason,
        backend=backend,
        backend_reason=backend_reason,
        device=device,  # type: ignore[arg-type]  # validated: one of the three
        processes_per_node=processes,
        processes_reason=processes_reason,
        devices_per_process=devices,
        devices_reason=devices_reason,
        cpus_per_process=cpus,
        cpus_reason=cpus_reason,
        batch_multiple=multiple,
        multiple_reason=multiple_reason,
    )


def _processes(
    device: str, targets: list[Accelerator], asked: int | None, snapshot: HardwareSnapshot
) -> tuple[int, str]:
    """(training processes on this node, why)."""
    if device == "mps":
        text = "1: MPS is one GPU, and torch.distributed has no MPS back end"
        if asked is not None and asked > 1:
            text += f" ({asked} processes were asked for)"
        return 1, text
    if asked is not None:
        text = f"{asked}: as asked (processes per node)"
        gpus = len(targets)
        if device == "cpu" and asked > 1:
            text += "; on the CPU the DDP ranks communicate over gloo"
        elif device == "cuda" and asked > gpus:
            text += (
                f"; more than the {gpus} GPU(s), which they share (NCCL refuses two ranks on "
                "one GPU; DDP over gloo runs them)"
            )
        elif device == "cuda" and asked < gpus:
            text += f"; {gpus - asked} of the {gpus} GPUs stay idle"
        return asked, text
    if device == "cpu":
        text = "1: training on the CPU: one process, whose threads use the CPUs"
        if snapshot.accelerators:
            text += ", whatever GPUs the machine has (the device's decision says why)"
        return 1, text
    gpus = max(1, len(targets))
    if gpus == 1:
        return 1, "1: one process for the one GPU"
    return gpus, f"{gpus}: one per GPU, as DDP runs them (torchrun --nproc-per-node={gpus})"


def _backend(
    device: str, targets: list[Accelerator], processes: int, nodes: int
) -> tuple[Literal["nccl", "gloo"] | None, str]:
    """(the torch.distributed back end, why): NCCL (RCCL on ROCm) between GPUs, gloo on the
    CPU and where ranks share a GPU (NCCL refuses two ranks on one GPU)."""
    if processes * nodes == 1:
        return None, "none: one training process, so no process group"
    if device != "cuda":
        return "gloo", "gloo: the ranks train on the CPU, and NCCL is for GPUs"
    if processes > max(1, len(targets)):
        return "gloo", (
            f"gloo: {processes} ranks share {len(targets)} GPU(s) on a node, and NCCL refuses two "
            "ranks on one GPU"
        )
    rocm = any(a.backend is Backend.ROCM for a in targets)
    return "nccl", "nccl: " + (
        "RCCL, ROCm's NCCL, between the GPUs" if rocm else "NVIDIA's collectives between GPUs"
    )


def _devices(device: str) -> tuple[int, str]:
    """(accelerators each process drives, why)."""
    if device == "cpu":
        return 0, "0: training on the CPU"
    if device == "mps":
        return 1, "1: the Apple GPU, which the one process drives"
    return 1, "1: each process drives one GPU (a DDP rank, the GPU of its LOCAL_RANK)"


def _cpus(host: Host, processes: int) -> tuple[int, str]:
    """(CPUs each process may keep busy, why): the usable CPUs shared by the processes."""
    usable = host.cpus_usable
    if processes == 1:
        return usable, f"{usable}: the usable CPUs (affinity and container quota), one process"
    each = max(1, usable // processes)
    text = f"{each}: the {usable} usable CPU(s) (affinity and container quota) shared by "
    text += f"{processes} processes"
    if processes > usable:
        text += "; more processes than CPUs, so each has one and they oversubscribe them"
    return each, text


def _multiple(device: str, targets: list[Accelerator], tensor_core_math: bool) -> tuple[int, str]:
    """(the multiple batch sizes are rounded down to, why): catalog K4."""
    nvidia = [a for a in targets if a.backend is Backend.CUDA]
    if device != "cuda" or not nvidia:
        where = {"cpu": "the CPU", "mps": "an Apple GPU"}.get(device, "AMD GPUs")
        return 1, f"1: K4's multiple of 8 is for NVIDIA Tensor Cores, and this trains on {where}"
    lacking = sorted({a.name for a in nvidia if a.tensor_cores is not True})
    if lacking:
        return 1, f"1: {', '.join(lacking)}: no Tensor Cores known to the snapshot (K4)"
    if not tensor_core_math:
        return 1, "1: neither AMP nor TF32, so float32 matmuls do not run on Tensor Cores (K4)"
    return TENSOR_CORE_MULTIPLE, (
        f"{TENSOR_CORE_MULTIPLE}: Tensor Cores run AMP and TF32 matmuls fastest where the "
        f"sizes, the batch among them, are multiples of {TENSOR_CORE_MULTIPLE} (K4)"
    )


def topology_problems(topology: Topology, device: str, snapshot: HardwareSnapshot) -> list[str]:
    """What no machine can run in a profile's topology: another device than its settings, a
    device per process on the CPU or none on a GPU, several processes on MPS, more CPUs than
    the machine has. Each as 'where: what is wrong (how to fix)'."""
    fix = "delete 'topology' and it is derived again from the settings and the snapshot"
    problems = []
    if topology.device != device:
        problems.append(
            f"topology.device: {topology.device}, but settings.device is {device} ({fix})"
        )
    if (topology.devices_per_process == 0) != (topology.device == "cpu"):
        problems.append(
            f"topology.devices_per_process: {topology.devices_per_process} on "
            f"{topology.device}: a process on the CPU drives no GPU, one on a GPU at least one "
            f"({fix})"
        )
    if topology.device == "mps" and topology.processes_per_node > 1:
        problems.append(
            f"topology.processes_per_node: {topology.processes_per_node} on MPS, which trains "
            f"in one process ({fix})"
        )
    processes, usable = topology.processes_per_node, snapshot.host.cpus_usable
    if topology.cpus_per_process * processes > max(usable, processes):
        problems.append(
            f"topology.cpus_per_process: {processes} process(es) x {topology.cpus_per_process} "
            f"CPUs is more than the {usable} usable ({fix})"
        )
    return problems
