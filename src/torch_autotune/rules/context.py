"""What every rule sees, and what every rule returns.

A rule is a plain function ``rule(ctx: Context) -> Iterable[Finding]``: no hardware, no I/O,
no torch. ``Context`` holds the snapshot, the probe's measurements (if any), the user's
preferences, and the settings decided by the rules before it (``ctx.get``), so a rule can build
on an earlier decision (channels_last needs the precision rule's AMP) without re-deriving it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from torch_autotune.bounds import STRICT, BatchSize, CpuCount, WorkerCount
from torch_autotune.evidence import AllocatorRecord, BatchChoice, OptimizerMemoryRecord
from torch_autotune.hardware import Accelerator, Backend, HardwareSnapshot, Vendor
from torch_autotune.invariants import device_accelerators
from torch_autotune.profile import Mode, Preferences, Source, torch_release
from torch_autotune.topology import Topology, derive_topology

__all__ = ["Context", "Finding", "Measurements", "Preferences"]


class Measurements(BaseModel):
    """What the probe ran on this machine (filled by the probe; None before it exists)."""

    model_config = STRICT

    batch_size: BatchSize | None = None
    num_workers: WorkerCount | None = None
    workers_reason: str | None = None  # how the probe chose num_workers, or why it did not
    batch_reason: str | None = None  # how the batch was chosen, where not by the step alone
    compile_enabled: bool | None = None  # torch.compile kept or dropped by measurement
    compile_reason: str | None = None  # measured: why, with the numbers; else why not measured
    batch_choice: BatchChoice | None = None  # how the probe chose batch_size, as facts
    unused_parameters: int | None = None  # parameters DDP's first step left without a gradient
    fsdp_reason: str | None = None  # the ranks sharded the model with FSDP2: why, with numbers
    checkpointing_reason: str | None = None  # activation checkpointing kept: why, with numbers
    checkpointing_note: str | None = None  # why the probe did not measure it, or did not keep it
    memory_budget: float | None = None  # compile's activation memory budget, where kept
    memory_budget_reason: str | None = None  # why kept, or why not measured or not kept
    optimizer_memory: OptimizerMemoryRecord | None = None  # fused against foreach, where measured
    allocator: AllocatorRecord | None = None  # J1's setting in a fresh process, or why not
    cpu_threads: CpuCount | None = None  # where threads_reason: fed fastest (None: torch's)
    threads_reason: str | None = None  # the CPU threads measured fed by the DataLoader


@dataclass(frozen=True)
class Finding:
    """One decision a rule makes: set ``setting`` to ``value`` because ``reason``."""

    setting: str
    value: Any
    rule: str
    reason: str
    source: Source = Source.INFERRED


@dataclass
class Context:
    """The inputs of every rule, plus the settings decided so far."""

    snapshot: HardwareSnapshot
    preferences: Preferences = field(default_factory=Preferences)
    measurements: Measurements | None = None
    decided: dict[str, Any] = field(default_factory=dict)

    def get(self, setting: str) -> Any:
        """The value an earlier rule decided for ``setting`` (KeyError if none did)."""
        return self.decided[setting]

    @property
    def mode(self) -> Mode:
        return self.preferences.mode

    @property
    def torch(self) -> tuple[int, int] | None:
        """Installed torch as (major, minor), None when absent or unparsable."""
        return torch_release(self.snapshot.software.torch_version)

    def torch_at_least(self, major: int, minor: int) -> bool:
        return self.torch is not None and self.torch >= (major, minor)

    @property
    def device(self) -> str:
        """The device the backend rule chose ('cuda', 'mps' or 'cpu')."""
        return str(self.decided.get("device", "cpu"))

    @property
    def gpus(self) -> list[Accelerator]:
        """The accelerators the profile trains on (all of the chosen back end)."""
        return device_accelerators(self.device, self.snapshot)

    @property
    def nvidia(self) -> bool:
        """Training on NVIDIA GPUs (CUDA, not ROCm)."""
        gpus = self.gpus
        return bool(gpus) and all(a.vendor is Vendor.NVIDIA for a in gpus)

    @property
    def rocm(self) -> bool:
        gpus = self.gpus
        return bool(gpus) and all(a.backend is Backend.ROCM for a in gpus)

    @property
    def weakest_cc(self) -> tuple[int, int] | None:
        """Lowest compute capability among the GPUs: a mixed box gets what all of them run."""
        ccs = [a.compute_capability for a in self.gpus]
        if not ccs or any(cc is None for cc in ccs):
            return None
        return min(cc for cc in ccs if cc is not None)

    @property
    def all_tensor_cores(self) -> bool:
        return bool(self.gpus) and all(a.tensor_cores is True for a in self.gpus)

    @property
    def fewest_sms(self) -> int | None:
        counts = [a.sm_count for a in self.gpus if a.sm_count is not None]
        return min(counts) if counts else None

    @property
    def topology(self) -> Topology:
        """Where the profile trains (``topology.derive_topology``): the training processes on
        this node, the CPUs of each, the batch's multiple; from the snapshot, the preferences
        and the device, precision and TF32 decided so far (the multiple is K4's once the
        precision and TF32 rules ran; the engine stores the one of the final settings)."""
        tensor_core_math = bool(self.decided.get("precision.autocast")) or bool(
            self.decided.get("matmul.tf32")
        )
        return derive_topology(
            self.snapshot,
            self.preferences.processes_per_node,
            device=self.device,
            tensor_core_math=tensor_core_math,
            nodes=self.preferences.nodes,
        )
