"""The optimization profile: the settings a training script applies, each with its reason.

A ``Profile`` is strict (``extra="forbid"``), versioned (``schema_version``) and self-checking:
the cross-field invariants below are enforced whenever a profile is built or loaded, so a
hand-edited file that asks for bf16 on a V100 or persistent workers without workers is refused
with a message that names the problem, never applied. The snapshot the profile was made from
travels inside it (``provenance.snapshot``), so every check can be made on any machine.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from torch_autotune.bench import BenchEvidence
from torch_autotune.bounds import (
    STRICT,
    AccumSteps,
    BatchSize,
    Bytes,
    CpuCount,
    PrefetchFactor,
    Seed,
    SmallCount,
    WorkerCount,
)
from torch_autotune.hardware import Accelerator, Backend, HardwareSnapshot, Vendor

PROFILE_SCHEMA_VERSION: Literal[1] = 1
"""Version of the profile schema written by this release."""


class _Strict(BaseModel):
    model_config = STRICT


class Mode(str, Enum):
    """What the profile optimises for."""

    SPEED = "speed"  # everything that makes training faster on this machine
    BALANCED = "balanced"  # speed without torch.compile's start-up cost and recompiles
    REPRODUCIBLE = "reproducible"  # deterministic kernels, TF32 off, seeded workers


class Source(str, Enum):
    """Where a decision's value comes from."""

    MEASURED = "measured"  # run on this machine by the probe
    INFERRED = "inferred"  # derived by a rule from the snapshot
    USER = "user"  # set by the user (e.g. autotune --workers)


# Environment variables a profile may set: a fixed allow-list, never arbitrary names.
EnvVar = Literal[
    "PYTORCH_CUDA_ALLOC_CONF",
    "CUBLAS_WORKSPACE_CONFIG",
    "HIPBLAS_WORKSPACE_CONFIG",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
]
ALLOWED_ENVIRONMENT: tuple[str, ...] = EnvVar.__args__  # type: ignore[attr-defined]


class Preferences(_Strict):
    """What the user tells the engine about the workload and what they want."""

    mode: Mode = Mode.SPEED
    model_kind: Literal["conv", "transformer", "mlp", "other"] = "other"
    fixed_shapes: bool = True  # every batch has the same input shape (images of one size)
    optimizer: Literal["adam", "adamw", "sgd", "other"] = "adamw"
    processes_per_node: CpuCount | None = None  # DDP ranks; default: one per GPU
    seed: Seed = 0  # used by the reproducible mode
    allow_p100_fp16: bool = False  # catalog A5: fp16 on P100 only as an opt-in
    num_workers: WorkerCount | None = None  # the user's own DataLoader worker count


class Precision(_Strict):
    """Mixed precision: torch.autocast(device, dtype) and a GradScaler for fp16."""

    autocast: bool
    dtype: Literal["float32", "float16", "bfloat16"]
    grad_scaler: bool


class MatmulPrecision(_Strict):
    """TF32 for float32 matmuls and convolutions, in the one API the installed torch wants.

    ``api`` is ``allow_tf32`` (torch.backends.cuda.matmul/cudnn.allow_tf32, torch < 2.9) or
    ``fp32_precision`` (torch.backends.*.fp32_precision, torch >= 2.9); mixing them raises in
    torch (rules catalog B2, S5), so a profile holds exactly one. ``None``: set nothing.
    """

    tf32: bool
    api: Literal["allow_tf32", "fp32_precision"] | None


class Backends(_Strict):
    """cuDNN autotuner and determinism switches."""

    cudnn_benchmark: bool
    cudnn_deterministic: bool
    deterministic_algorithms: bool


class Compile(_Strict):
    """torch.compile."""

    enabled: bool
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None


class DataLoaderSettings(_Strict):
    """Keyword arguments for torch.utils.data.DataLoader."""

    num_workers: WorkerCount
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: PrefetchFactor | None = Field(
        description="Batches each worker loads ahead; None keeps torch's default (2 with workers)."
    )
    seed_workers: bool = Field(description="Seed every worker from one generator (reproducible).")


class OptimizerSettings(_Strict):
    """Keyword arguments for the optimizer (Adam/AdamW)."""

    fused: bool


class BatchSettings(_Strict):
    """Filled by the probe: a batch size is only ever one that ran on this machine."""

    batch_size: BatchSize | None
    grad_accum_steps: AccumSteps


class Settings(_Strict):
    """Everything a training script applies."""

    device: Literal["cuda", "mps", "cpu"] = Field(
        description="torch device type; ROCm GPUs are 'cuda' in torch."
    )
    precision: Precision
    matmul: MatmulPrecision
    backends: Backends
    compile: Compile
    memory_format: Literal["contiguous_format", "channels_last"]
    dataloader: DataLoaderSettings
    optimizer: OptimizerSettings
    cpu_threads: CpuCount | None = Field(description="torch.set_num_threads; None: default.")
    seed: Seed | None
    environment: dict[EnvVar, str] = Field(
        description="Set before torch starts CUDA; only the allow-listed variables."
    )
    batch: BatchSettings


class Decision(_Strict):
    """One setting, its value, and why."""

    setting: str = Field(description="Dotted path into Settings, e.g. 'precision.dtype'.")
    value: str | Seed | float | bool | None  # an int is a count or a seed: the seed's range
    rule: str = Field(description="Stable id of the rule that decided it, e.g. 'A1'.")
    reason: str
    source: Source


class Provenance(_Strict):
    """Where the profile comes from."""

    fingerprint: str = Field(description="Hash of the hardware and software the profile fits.")
    machine_id: str = Field(description="Hash of the host name: which machine wrote it.")
    tool_version: str
    torch_version: str | None
    created_at: datetime
    preferences: Preferences = Field(description="What the profile was asked for.")
    snapshot: HardwareSnapshot


class SearchTrialRecord(_Strict):
    """One trial of the batch-size search, as the probe ran it."""

    batch_size: BatchSize
    fits: bool
    peak_memory_bytes: Bytes | None
    seconds: float | None = Field(ge=0, description="Wall time of the trial, warm-up included.")
    step: str = Field(description="Why this size: start, model, predict, verify, double, ...")
    warmup_s: float | None = Field(
        default=None, ge=0, description="The first step's cost beyond a steady step."
    )
    step_s: float | None = Field(default=None, ge=0, description="One steady training step.")
    predicted_s: float | None = Field(
        default=None, ge=0, description="What the time model predicted before the trial."
    )
    left_s: float | None = Field(
        default=None, ge=0, description="Seconds the phase had left when the trial was decided."
    )


class ThroughputRecord(_Strict):
    """Training throughput measured at one batch size."""

    batch_size: BatchSize
    samples_per_s: float = Field(gt=0)
    relative_spread: float = Field(ge=0, description="(max - min) / median of the repeats.")
    steady: bool = Field(
        default=True,
        description="The last timed blocks agreed within 5%; noisy points are not chosen.",
    )
    compiled: bool = Field(default=False, description="Measured under torch.compile.")
    warmup_s: float | None = Field(
        default=None, ge=0, description="The first step's cost beyond a steady step."
    )
    blocks: SmallCount = Field(default=0, description="Timed blocks of steps.")
    peak_memory_bytes: Bytes | None = Field(
        default=None, description="Allocator peak during the point, when known."
    )


class PhaseRecord(_Strict):
    """How long one phase of the probe took."""

    name: str
    seconds: float = Field(ge=0)
    allowed_s: float | None = Field(default=None, ge=0, description="The phase's share.")


class CompileRecord(_Strict):
    """torch.compile measured against eager training, or why it was not."""

    mode: str
    measured: bool
    kept: bool
    reason: str
    predicted_s: float | None = Field(default=None, ge=0, description="Compile time expected.")
    compile_s: float | None = Field(default=None, ge=0, description="Compile time paid.")
    batch_size: BatchSize | None = None
    eager_samples_per_s: float | None = Field(default=None, gt=0)
    compiled_samples_per_s: float | None = Field(default=None, gt=0)
    payoff_minutes: float | None = Field(
        default=None, ge=0, description="Training time after which the compile has paid off."
    )


class LoaderRecord(_Strict):
    """DataLoader throughput with one worker count."""

    num_workers: WorkerCount
    samples_per_s: float | None = Field(description="None: the candidate failed.")
    error: str | None = None


class Evidence(_Strict):
    """What the probe ran and measured on the machine: the basis of every measured setting."""

    workload: str
    device: str
    max_batch_size: BatchSize = Field(description="Largest batch that trained.")
    fastest_batch_size: BatchSize = Field(description="Smallest batch within 3% of the best.")
    batch_size: BatchSize = Field(description="Recommended: margin, rounding, run once more.")
    limited_by: str = Field(description="memory, cap, host RAM, time, or budget")
    limit_reason: str | None = Field(
        default=None, description="What stopped the search, with the numbers."
    )
    search: tuple[SearchTrialRecord, ...]
    throughput: tuple[ThroughputRecord, ...]
    loader: tuple[LoaderRecord, ...] = ()
    workers_reason: str | None = None
    budget_s: float = Field(gt=0)
    elapsed_s: float = Field(ge=0)
    memory_limit_bytes: Bytes | None = Field(
        default=None, description="Bytes the trials could use on the device (None: unknown)."
    )
    bench: BenchEvidence | None = Field(
        default=None, description="autotune bench: baseline, tuned and each setting's effect."
    )
    phases: tuple[PhaseRecord, ...] = Field(default=(), description="Time per phase.")
    compile: CompileRecord | None = Field(
        default=None, description="torch.compile measured (speed mode, where it can run)."
    )
    warnings: tuple[str, ...] = Field(default=(), description="What the user should know.")


class Profile(_Strict):
    """A validated optimization profile for one machine."""

    schema_version: Literal[1] = PROFILE_SCHEMA_VERSION
    mode: Mode
    measured: bool = Field(description="Whether any setting was measured on the machine.")
    settings: Settings
    decisions: tuple[Decision, ...]
    notes: tuple[str, ...] = ()
    provenance: Provenance
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

    def apply(self) -> None:
        """Apply the global torch settings (TF32, cuDNN, determinism, threads, seed, env)."""
        from torch_autotune.apply import apply_torch_settings

        apply_torch_settings(self)

    def dataloader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for torch.utils.data.DataLoader."""
        from torch_autotune.apply import dataloader_kwargs

        return dataloader_kwargs(self)

    def autocast(self) -> AbstractContextManager[Any]:
        """The autocast context for forward and loss (a no-op context when AMP is off)."""
        from torch_autotune.apply import autocast

        return autocast(self)

    def grad_scaler(self) -> Any:
        """A GradScaler, enabled only when the profile trains in fp16."""
        from torch_autotune.apply import grad_scaler

        return grad_scaler(self)

    def optimizer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for Adam/AdamW (fused where it is stable)."""
        from torch_autotune.apply import optimizer_kwargs

        return optimizer_kwargs(self)

    def prepare_model(self, model: Any) -> Any:
        """Apply memory format and torch.compile; returns the model to train."""
        from torch_autotune.apply import prepare_model

        return prepare_model(self, model)


# --- invariants ---------------------------------------------------------------------------------


def torch_release(version: str | None) -> tuple[int, int] | None:
    """'2.8.0+cu128' -> (2, 8); None when unknown or unparsable."""
    if not version:
        return None
    parts = version.split("+", 1)[0].split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return None


def target_accelerators(settings: Settings, snapshot: HardwareSnapshot) -> list[Accelerator]:
    """The accelerators a profile's device setting trains on."""
    if settings.device == "cuda":
        wanted = {Backend.CUDA, Backend.ROCM}
    elif settings.device == "mps":
        wanted = {Backend.MPS}
    else:
        return []
    return [a for a in snapshot.accelerators if a.backend in wanted]


def settings_paths() -> set[str]:
    """Every dotted leaf path of Settings, e.g. 'dataloader.num_workers'."""
    paths: set[str] = set()

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            annotation = info.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, f"{prefix}{name}.")
            else:
                paths.add(f"{prefix}{name}")

    walk(Settings, "")
    paths.update(f"environment.{name}" for name in ALLOWED_ENVIRONMENT)
    return paths


@dataclass(frozen=True)
class _Scope:
    """What the invariant checks look at."""

    settings: Settings
    targets: list[Accelerator]
    nvidia: list[Accelerator]
    torch_version: str | None

    @property
    def release(self) -> tuple[int, int] | None:
        return torch_release(self.torch_version)

    def nvidia_below(self, cc: tuple[int, int]) -> list[str]:
        return [
            a.name for a in self.nvidia if a.compute_capability is None or a.compute_capability < cc
        ]


def _dataloader_problems(scope: _Scope) -> list[str]:
    dl, device = scope.settings.dataloader, scope.settings.device
    problems = []
    if dl.num_workers == 0 and dl.persistent_workers:
        problems.append(
            "settings.dataloader.persistent_workers: needs num_workers > 0 "
            "(set persistent_workers: false)"
        )
    if dl.num_workers == 0 and dl.prefetch_factor is not None:
        problems.append(
            "settings.dataloader.prefetch_factor: needs num_workers > 0 (set prefetch_factor: null)"
        )
    if dl.pin_memory and device != "cuda":
        problems.append(
            f"settings.dataloader.pin_memory: pinning helps only CUDA/ROCm, device is "
            f"'{device}' (set pin_memory: false)"
        )
    return problems


def _precision_problems(scope: _Scope) -> list[str]:
    p, device = scope.settings.precision, scope.settings.device
    problems = []
    if p.grad_scaler and p.dtype == "bfloat16":
        problems.append(
            "settings.precision.grad_scaler: bf16 needs no loss scaling, and GradScaler fails "
            "on bf16 gradients (set grad_scaler: false)"
        )
    if p.grad_scaler and not p.autocast:
        problems.append("settings.precision.grad_scaler: only with autocast (set it false)")
    if p.autocast == (p.dtype == "float32"):
        problems.append(
            "settings.precision: autocast and dtype disagree (autocast true needs float16 or "
            "bfloat16; float32 needs autocast false)"
        )
    if p.dtype == "float16" and device == "cuda" and not p.grad_scaler:
        problems.append(
            "settings.precision.grad_scaler: fp16 on a GPU needs a GradScaler, or small "
            "gradients underflow to zero (set grad_scaler: true)"
        )
    if p.dtype == "bfloat16" and scope.nvidia_below((8, 0)):
        problems.append(
            "settings.precision.dtype: bfloat16 needs compute capability 8.0 or newer; "
            f"{', '.join(scope.nvidia_below((8, 0)))} would only emulate it (use float16)"
        )
    if scope.settings.memory_format == "channels_last" and not p.autocast:
        problems.append(
            "settings.memory_format: channels_last is slower without AMP (use contiguous_format)"
        )
    return problems


def _matmul_problems(scope: _Scope) -> list[str]:
    m, device = scope.settings.matmul, scope.settings.device
    problems = []
    all_nvidia = bool(scope.nvidia) and len(scope.nvidia) == len(scope.targets)
    if m.tf32 and (device != "cuda" or not all_nvidia or scope.nvidia_below((8, 0))):
        problems.append(
            "settings.matmul.tf32: TF32 exists only on NVIDIA Ampere (cc 8.0) and newer "
            "(set tf32: false)"
        )
    if m.api is not None and scope.release is not None:
        wanted = "fp32_precision" if scope.release >= (2, 9) else "allow_tf32"
        if m.api != wanted:
            problems.append(
                f"settings.matmul.api: torch {scope.torch_version} uses '{wanted}', not "
                f"'{m.api}' (mixing the two raises in torch)"
            )
    if m.tf32 and m.api is None:
        problems.append("settings.matmul.api: TF32 on needs the API to set it with")
    return problems


def _compile_problems(scope: _Scope) -> list[str]:
    c, b = scope.settings.compile, scope.settings.backends
    problems = []
    if c.enabled and scope.release is not None and scope.release < (2, 0):
        problems.append(
            f"settings.compile.enabled: torch.compile needs torch 2.0 or newer, this is "
            f"{scope.torch_version} (set enabled: false)"
        )
    if c.enabled != (c.mode is not None):
        problems.append("settings.compile.mode: set exactly when compile is enabled")
    small = [a.name for a in scope.targets if a.sm_count is not None and a.sm_count < 68]
    if c.mode in ("max-autotune", "max-autotune-no-cudagraphs") and small:
        problems.append(
            f"settings.compile.mode: max-autotune needs 68 or more SMs; {', '.join(small)} "
            "has fewer, so it only compiles longer (use 'default')"
        )
    if b.deterministic_algorithms and b.cudnn_benchmark:
        problems.append(
            "settings.backends.cudnn_benchmark: the autotuner picks algorithms by timing, "
            "which deterministic mode forbids (set cudnn_benchmark: false)"
        )
    return problems


def _evidence_problems(profile: Profile) -> list[str]:
    """A measured batch size must be one that ran: never hand out a size that did not."""
    batch = profile.settings.batch.batch_size
    if batch is None:
        return []
    evidence = profile.evidence
    ran = set() if evidence is None else {t.batch_size for t in evidence.search if t.fits}
    if evidence is not None:
        ran |= {t.batch_size for t in evidence.throughput}  # steady points ran for seconds
    if evidence is not None and evidence.bench is not None:
        ran |= evidence.bench.ran()  # the bench trains its baseline batch size too
    if batch not in ran:
        return [
            f"settings.batch.batch_size: {batch} is not a size the probe ran on this machine "
            "(run 'autotune' to measure, or set batch_size: null)"
        ]
    return []


def profile_problems(profile: Profile) -> list[str]:
    """Every broken invariant of a profile, as 'where: what is wrong (how to fix)'."""
    settings = profile.settings
    targets = target_accelerators(settings, profile.provenance.snapshot)
    scope = _Scope(
        settings=settings,
        targets=targets,
        nvidia=[a for a in targets if a.vendor is Vendor.NVIDIA],
        torch_version=profile.provenance.torch_version,
    )
    problems: list[str] = []
    if profile.mode is not profile.provenance.preferences.mode:
        problems.append("mode: differs from provenance.preferences.mode")
    if settings.device in ("cuda", "mps") and not targets:
        problems.append(
            f"settings.device: '{settings.device}' but the snapshot has no such accelerator"
        )
    for check in (_dataloader_problems, _precision_problems, _matmul_problems, _compile_problems):
        problems += check(scope)
    problems += _evidence_problems(profile)
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
