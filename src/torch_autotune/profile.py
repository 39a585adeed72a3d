"""The optimization profile: the settings a training script applies, each with its reason.

A ``Profile`` is strict (``extra="forbid"``), versioned (``schema_version``) and self-checking:
the cross-field invariants (``torch_autotune.invariants``) are enforced whenever a profile is
built or loaded, so a hand-edited file that asks for bf16 on a V100 or persistent workers
without workers is refused with a message that names the problem, never applied. The snapshot
the profile was made from travels inside it (``provenance.snapshot``), so every check can be
made on any machine.

Part of the data model's ground floor: it imports pydantic, the standard library, ``hardware``
and the other data-model modules only. The methods that apply a profile import ``apply`` when
they run.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from torch_autotune.bounds import (
    BatchSize,
    BlockNames,
    CpuCount,
    GlobalBatch,
    PositiveBytes,
    Seed,
    WorkerCount,
)
from torch_autotune.evidence import (
    COMPILED,
    EAGER,
    AllocatorRecord,
    BatchChoice,
    CompileRecord,
    Evidence,
    LoaderRecord,
    OptimizerMemoryRecord,
    PhaseRecord,
    RanksRecord,
    SearchTrialRecord,
    ThroughputRecord,
    VariantRecord,
    WorkloadDetails,
)
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.invariants import (
    batch_problems,
    settings_problems,
    target_accelerators,
    torch_release,
)
from torch_autotune.settings import (
    ALLOWED_ENVIRONMENT,
    Backends,
    BatchSettings,
    Compile,
    DataLoaderSettings,
    EnvVar,
    MatmulPrecision,
    Mode,
    OptimizerSettings,
    Precision,
    Settings,
    Source,
    StrictModel,
    settings_paths,
)
from torch_autotune.topology import Topology, derive_topology, topology_problems

__all__ = [
    "ALLOWED_ENVIRONMENT",
    "COMPILED",
    "EAGER",
    "PROFILE_SCHEMA_VERSION",
    "AllocatorRecord",
    "Backends",
    "BatchChoice",
    "BatchSettings",
    "Compile",
    "CompileRecord",
    "DataLoaderSettings",
    "Decision",
    "EnvVar",
    "Evidence",
    "LoaderRecord",
    "MatmulPrecision",
    "Mode",
    "OptimizerMemoryRecord",
    "OptimizerSettings",
    "PhaseRecord",
    "Precision",
    "Preferences",
    "Profile",
    "Provenance",
    "RanksRecord",
    "SearchTrialRecord",
    "Settings",
    "Source",
    "ThroughputRecord",
    "Topology",
    "VariantRecord",
    "WorkloadDetails",
    "fingerprint",
    "profile_problems",
    "settings_paths",
    "target_accelerators",
    "torch_release",
]

PROFILE_SCHEMA_VERSION: Literal[2] = 2
"""Version of the profile schema written by this release."""


class Preferences(StrictModel):
    """What the user tells the engine about the workload and what they want."""

    mode: Mode = Mode.SPEED
    model_kind: Literal["conv", "transformer", "mlp", "other"] = "other"
    fixed_shapes: bool = True  # every batch has the same input shape (images of one size)
    optimizer: Literal["adam", "adamw", "sgd", "other"] = "adamw"
    optimizer_fused_by: Annotated[str, Field(max_length=256)] | None = None  # fixes fused=True
    processes_per_node: CpuCount | None = None  # DDP ranks; default: one per GPU (topology)
    nodes: CpuCount | None = None  # the job's nodes, each with processes_per_node; default one
    memory_limit_bytes: PositiveBytes | None = None  # --memory-limit: the device memory to use
    seed: Seed = 0  # used by the reproducible mode
    allow_p100_fp16: bool = False  # catalog A5: fp16 on P100 only as an opt-in
    num_workers: WorkerCount | None = None  # the user's own DataLoader worker count
    target_global_batch: GlobalBatch | None = None  # the global batch accumulation keeps
    # what made the target where the user gave none (a Trainer's accumulation), in words; with
    # no target, what made one above MAX_GLOBAL_BATCH, which is not kept (compose.workload_target)
    target_global_batch_from: Annotated[str, Field(max_length=256)] | None = None
    max_batch_size: BatchSize | None = None  # --max-batch-size: the largest batch tried
    blocks: BlockNames | None = None  # the workload's blocks (its classes), where it names them


class Decision(StrictModel):
    """One setting, its value, and why."""

    setting: str = Field(description="Dotted path into Settings, e.g. 'precision.dtype'.")
    value: str | Seed | float | bool | None  # an int is a count or a seed: the seed's range
    rule: str = Field(description="Stable id of the rule that decided it, e.g. 'A1'.")
    reason: str
    source: Source


class Provenance(StrictModel):
    """Where the profile comes from."""

    fingerprint: str = Field(description="Hash of the hardware and software the profile fits.")
    machine_id: str = Field(description="Hash of the host name: which machine wrote it.")
    tool_version: str
    torch_version: str | None
    created_at: datetime
    preferences: Preferences = Field(description="What the profile was asked for.")
    snapshot: HardwareSnapshot


_UNREAD = Topology(
    device="cpu",
    processes_per_node=1,
    processes_reason="1: the profile was refused",
    devices_per_process=0,
    devices_reason="0: the profile was refused",
    cpus_per_process=1,
    cpus_reason="1: the profile was refused",
    batch_multiple=1,
    multiple_reason="1: the profile was refused",
)
"""What ``_derived_topology`` gives a profile without settings or provenance, which is refused
for them: pydantic calls a default factory even where a required field is missing."""


def _derived_topology(data: dict[str, Any]) -> Topology:
    """The topology of a profile that has none (written before it was stored), from its
    settings, snapshot and preferences, as the rules engine derives it."""
    settings: Settings | None = data.get("settings")
    provenance: Provenance | None = data.get("provenance")
    if settings is None or provenance is None:
        return _UNREAD  # never kept: the profile lacks a required field
    return derive_topology(
        provenance.snapshot,
        provenance.preferences.processes_per_node,
        device=settings.device,
        tensor_core_math=settings.precision.autocast or settings.matmul.tf32,
        nodes=provenance.preferences.nodes,
    )


class Profile(StrictModel):
    """A validated optimization profile for one machine."""

    schema_version: Literal[2] = PROFILE_SCHEMA_VERSION
    mode: Mode
    measured: bool = Field(description="Whether any setting was measured on the machine.")
    settings: Settings
    decisions: tuple[Decision, ...]
    notes: tuple[str, ...] = ()
    provenance: Provenance
    topology: Topology = Field(
        default_factory=_derived_topology,
        description="Where it trains: the training processes on this node, the devices and "
        "CPUs of each, the batch's multiple. A profile written before it was stored gets the "
        "one its settings, snapshot and preferences give.",
    )
    evidence: Evidence | None = Field(default=None, description="The probe's measurements.")

    @model_validator(mode="after")
    def _invariants(self) -> Profile:
        problems = profile_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def decision(self, setting: str) -> Decision | None:
        """The decision behind one setting (the last one, when a later rule overrode it)."""
        found = [d for d in self.decisions if d.setting == setting]
        return found[-1] if found else None

    # --- using the profile in a training script (torch is imported only when these run) ----

    @property
    def device(self) -> str:
        """The torch device type to train on: 'cuda', 'mps' or 'cpu'."""
        return self.settings.device

    @property
    def batch_size(self) -> int | None:
        """The batch size per training process the probe measured here (None: rules only,
        nothing measured: keep your own)."""
        return self.settings.batch.batch_size

    @property
    def grad_accum_steps(self) -> int:
        """Batches whose gradients are accumulated before each optimizer step (1: every
        batch steps): what keeps ``--target-batch`` with the batch that fits."""
        return self.settings.batch.grad_accum_steps

    def apply(self) -> None:
        """Apply the global torch settings (TF32, cuDNN, determinism, threads, seed, env).
        ValueError where its CPU threads or DataLoader workers are more than this machine can
        run (a profile made for a larger one)."""
        from torch_autotune.apply import apply_torch_settings

        apply_torch_settings(self.settings)

    def dataloader_kwargs(self, *, training: bool = True, **yours: Any) -> dict[str, Any]:
        """Keyword arguments for a ``torch.utils.data.DataLoader``: the profile's (workers,
        pin_memory, ...) with ``yours`` (batch_size, shuffle, drop_last, ...) merged in, so
        ``DataLoader(dataset, **profile.dataloader_kwargs(batch_size=64, shuffle=True))``
        never gets an argument twice.

        Yours win where both give one, but for a reproducible profile's ``worker_init_fn``:
        yours runs after its seeding (``apply.SeededWorkerInit``), so every worker draws the
        same numbers with yours as without it (yours None: its seeding alone). Where yours
        have no workers (``num_workers=0``), the profile's ``persistent_workers`` and
        ``prefetch_factor`` are left out: torch refuses them without workers. A training
        loader gets ``drop_last=True`` where the probe found that batch 1 raises (BatchNorm's
        one value per channel): an epoch's last batch of 1 would raise too; your
        ``drop_last=False`` there warns (``ProfileUseWarning``). An evaluation loader
        (``training=False``) leaves it to you: a model in eval mode takes batch 1, and every
        sample should be scored. With your ``batch_sampler``, drop_last is the batch
        sampler's to say (torch refuses it beside one).
        """
        from torch_autotune.apply import dataloader_kwargs, seeded_worker_init

        kwargs = dataloader_kwargs(self.settings)
        if "worker_init_fn" in kwargs and "worker_init_fn" in yours:
            yours = {**yours, "worker_init_fn": seeded_worker_init(yours["worker_init_fn"])}
        if training and self.drops_last and "batch_sampler" not in yours:
            kwargs["drop_last"] = True
            if yours.get("drop_last", True) is False:
                _warn_drop_last(self)
        if yours.get("num_workers", kwargs["num_workers"]) == 0:
            kwargs.pop("persistent_workers", None)
            kwargs.pop("prefetch_factor", None)
        return {**kwargs, **yours}

    @property
    def drops_last(self) -> bool:
        """Whether the training loader should drop an epoch's last, smaller batch: the probe
        found that batch 1 raises (``WorkloadDetails.raised_below``), and so would it."""
        details = None if self.evidence is None else self.evidence.details
        return details is not None and details.raised_below

    def autocast(self) -> AbstractContextManager[Any]:
        """The autocast context for forward and loss (a no-op context when AMP is off)."""
        from torch_autotune.apply import autocast

        return autocast(self.settings)

    def grad_scaler(self) -> Any:
        """A GradScaler, enabled only when the profile trains in fp16."""
        from torch_autotune.apply import grad_scaler

        return grad_scaler(self.settings)

    def optimizer_kwargs(self, optimizer: Any = None) -> dict[str, Any]:
        """Keyword arguments for the optimizer (``fused=True`` where the profile chose the
        fused kernel). Give its class, ``profile.optimizer_kwargs(torch.optim.RMSprop)``, for
        only what it takes: an argument it has none for is left out, with one warning
        (``ProfileUseWarning``). Without it, every argument, for Adam and AdamW."""
        from torch_autotune.apply import optimizer_kwargs

        return optimizer_kwargs(self.settings, optimizer)

    def prepare_model(self, model: Any) -> Any:
        """Apply memory format, then (a job's profile, in a process group of several ranks)
        DDP with the profile's options or FSDP2 where it shards (``parallelize``), then
        torch.compile; returns the model to train. A model already wrapped is not wrapped
        again: the blocks are checkpointed once, on the model inside DDP, as the probe measured
        them (a Hugging Face model by its own switch, never its layers wrapped as well)."""
        from torch_autotune.apply import compile_model, prepare_model
        from torch_autotune.wrapping import parallelize

        if self.topology.world_size == 1:
            return prepare_model(self.settings, model)
        eager = self.settings.model_copy(update={"compile": Compile()})
        return compile_model(self.settings, parallelize(self.settings, prepare_model(eager, model)))

    def parallelize(self, model: Any) -> Any:
        """The model as the job's ranks train it, where a process group of several ranks is
        initialised: in ``DistributedDataParallel`` with the profile's DDP options, on the GPU
        of this rank (call ``torch.cuda.set_device(local_rank)`` first), or sharded with FSDP2
        where the profile says; the model as it is otherwise, or already wrapped."""
        from torch_autotune.wrapping import parallelize

        return parallelize(self.settings, model)


def _warn_drop_last(profile: Profile) -> None:
    """The user's drop_last=False on a training loader whose last batch of 1 would raise."""
    import warnings

    from torch_autotune.errors import ProfileUseWarning
    from torch_autotune.records import last_batches, small_batch_error

    warnings.warn(
        ProfileUseWarning(
            f"drop_last=False: in the probe {small_batch_error(profile)}, so an epoch whose last"
            f" batch holds {last_batches(profile)} raises too; leave drop_last to the profile for"
            " training, or pass training=False for an evaluation loader"
        ),
        stacklevel=3,
    )


def profile_problems(profile: Profile) -> list[str]:
    """Every broken invariant of a profile, as 'where: what is wrong (how to fix)'."""
    settings = profile.settings
    problems: list[str] = []
    if profile.mode is not profile.provenance.preferences.mode:
        problems.append("mode: differs from provenance.preferences.mode")
    topology = profile.topology
    problems += settings_problems(
        settings,
        profile.provenance.snapshot,
        profile.provenance.torch_version,
        (topology.cpus_per_process, topology.processes_per_node),
    )
    problems += topology_problems(profile.topology, settings.device, profile.provenance.snapshot)
    problems += batch_problems(settings, profile.evidence)
    unknown = sorted({d.setting for d in profile.decisions} - settings_paths())
    if unknown:
        problems.append(f"decisions: unknown settings {', '.join(unknown)}")
    return problems


# --- fingerprint --------------------------------------------------------------------------------


def fingerprint(snapshot: HardwareSnapshot) -> str:
    """16 hex digits that change when anything a profile depends on changes.

    Covers the GPUs (name, compute capability, memory, SMs, MIG slice), the driver and CUDA,
    torch and the CUDA/HIP it was built for, Python's minor version, the OS and the CPUs usable.
    Free memory and timings are left out: they change from run to run.
    """
    h, s = snapshot.host, snapshot.software
    identity = {
        "accelerators": [
            [a.name, a.compute_capability, a.memory_total_bytes, a.sm_count, a.backend.value]
            for a in snapshot.accelerators
        ],
        "driver": [s.nvidia_driver_version, s.cuda_driver_version],
        "torch": [s.torch_version, s.torch_cuda_version, s.torch_hip_version],
        "python": ".".join(s.python_version.split(".")[:2]),
        "os": [h.os_name, h.cpu_architecture],
        "cpus": [h.cpu_model, h.cpus_usable],
    }
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
