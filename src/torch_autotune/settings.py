"""What a training script applies: the typed settings of a profile, and what they mean.

The ground floor of the data model: pydantic and the standard library only. ``Settings`` is
what ``apply`` turns into torch calls, what the rules fill in and what the bench switches, made
of the parts in ``sections``; ``Mode`` and ``Source`` say what a profile optimises for and where
a value comes from; ``RECORDS`` what each setting is apart from its value.
"""

from __future__ import annotations

from enum import Enum
from functools import cache
from typing import Literal

from pydantic import BaseModel, Field

from torch_autotune.bounds import (
    BlockNames,
    CpuCount,
    Seed,
)
from torch_autotune.records import SettingRecord, on_off
from torch_autotune.sections import (
    Backends,
    BatchSettings,
    Compile,
    DataLoaderSettings,
    DdpSettings,
    FsdpSettings,
    MatmulPrecision,
    OptimizerSettings,
    Precision,
    StrictModel,
)

__all__ = [  # the parts of Settings are named here too: the old import paths still work
    "ALLOWED_ENVIRONMENT",
    "RECORDS",
    "RECORD_BY_NAME",
    "Backends",
    "BatchSettings",
    "Compile",
    "DataLoaderSettings",
    "DdpSettings",
    "EnvVar",
    "FsdpSettings",
    "MatmulPrecision",
    "Mode",
    "OptimizerSettings",
    "Precision",
    "Settings",
    "Source",
    "StrictModel",
    "memory_settings",
    "setting_value",
    "settings_paths",
    "torch_defaults",
]


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
THREAD_VARIABLES: tuple[EnvVar, ...] = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""The OpenMP/MKL pools' sizes: equal to ``cpu_threads`` where it is set, else unset (G1-G3)."""


class Settings(StrictModel):
    """Everything a training script applies.

    Every setting's default is torch's own behaviour, what a script that sets nothing gets
    (``torch_defaults``); so a setting added in a later release reads, in a profile written
    before it, as torch's default.
    """

    device: Literal["cuda", "mps", "cpu"] = Field(
        default="cpu", description="torch device type; ROCm GPUs are 'cuda' in torch."
    )
    precision: Precision = Precision()
    matmul: MatmulPrecision = MatmulPrecision()
    backends: Backends = Backends()
    compile: Compile = Compile()
    memory_format: Literal["contiguous_format", "channels_last"] = "contiguous_format"
    dataloader: DataLoaderSettings = DataLoaderSettings()
    optimizer: OptimizerSettings = OptimizerSettings()
    cpu_threads: CpuCount | None = Field(
        default=None, description="torch.set_num_threads; None: default."
    )
    seed: Seed | None = None
    environment: dict[EnvVar, str] = Field(
        default_factory=dict,
        description="Set before torch starts CUDA; only the allow-listed variables.",
    )
    batch: BatchSettings = BatchSettings()
    ddp: DdpSettings = DdpSettings()
    fsdp: FsdpSettings = FsdpSettings()
    blocks: BlockNames | None = Field(
        default=None,
        description="The classes of the model's repeated blocks, as its workload names them "
        "(pkg.model.Block, comma-separated): what activation checkpointing recomputes and FSDP2 "
        "shards. None: the repeated blocks found in its module tree.",
    )
    activation_checkpointing: bool = Field(
        default=False,
        description="Recompute each repeated block's forward in backward instead of keeping "
        "its activations (torch.utils.checkpoint, non-reentrant): less memory, more compute.",
    )


def _ddp(s: Settings) -> str:
    on = [name for name, value in s.ddp.model_dump().items() if value]
    return ", ".join(on) if on else "DDP's defaults"


def _workers(s: Settings) -> str:
    count = s.dataloader.num_workers
    text = f"{count} worker{'s' if count != 1 else ''}"
    if s.dataloader.prefetch_factor is not None:
        text += f", {s.dataloader.prefetch_factor} batches ahead each"
    return text


RECORDS: tuple[SettingRecord, ...] = (
    SettingRecord(
        "device",
        ("device",),
        "device",
        lambda s: s.device,
        applied_by=None,
        summary=False,  # the summary's first rows say it, with the machine
    ),
    SettingRecord(
        "precision",
        ("precision.autocast", "precision.dtype", "precision.grad_scaler"),
        "precision",
        lambda s: s.precision.dtype + (" + GradScaler" if s.precision.grad_scaler else ""),
        applied_by="autocast",
        bench="precision",
        couples={"memory_format": "goes with AMP (rule H1)"},
        memory=True,
        changed=lambda s: s.precision.autocast,
    ),
    SettingRecord(
        "batch_size",
        ("batch.batch_size",),
        "batch size",
        lambda s: "not measured" if s.batch.batch_size is None else str(s.batch.batch_size),
        applied_by=None,  # the script's own DataLoader(batch_size=profile.batch_size)
        summary=False,  # the summary's "recommended" row says it, with how it was chosen
        bench="batch_size",
    ),
    SettingRecord(
        "compile",
        ("compile.enabled", "compile.mode"),
        "compile",
        lambda s: str(s.compile.mode or "default") if s.compile.enabled else "off",
        applied_by="prepare_model",
        bench="compile",
        couples={"compile_memory_budget": "only compiled graphs read it"},
        memory=True,
        changed=lambda s: s.compile.enabled,
    ),
    SettingRecord(
        "compile_memory_budget",
        ("compile.memory_budget",),
        "activation memory budget",
        lambda s: "default" if s.compile.memory_budget is None else f"{s.compile.memory_budget:g}",
        applied_by="prepare_model",
        summary_reason=True,
        bench="compile_memory_budget",  # off: at the batch that ran without it (bench.Plan)
        only_with="compile",
        memory=True,
        changed=lambda s: s.compile.memory_budget is not None,
    ),
    SettingRecord(
        "memory_format",
        ("memory_format",),
        "memory format",
        lambda s: s.memory_format,
        applied_by="prepare_model",
        bench="channels_last",
        memory=True,
        changed=lambda s: s.memory_format == "channels_last",
    ),
    SettingRecord(
        "tf32",
        ("matmul.tf32", "matmul.api"),
        "TF32",
        lambda s: on_off(s.matmul.tf32),
        applied_by="apply",
        bench="tf32",
        changed=lambda s: s.matmul.api is not None,
    ),
    SettingRecord(
        "cudnn_benchmark",
        ("backends.cudnn_benchmark",),
        "cuDNN autotuner",
        lambda s: on_off(s.backends.cudnn_benchmark),
        applied_by="apply",
        bench="cudnn_benchmark",
        memory=True,
        changed=lambda s: s.backends.cudnn_benchmark,
    ),
    SettingRecord(
        "fused_optimizer",
        ("optimizer.fused",),
        "fused optimizer",
        lambda s: on_off(s.optimizer.fused),
        applied_by="optimizer_kwargs",
        bench="fused_optimizer",
        memory=True,
        changed=lambda s: s.optimizer.fused,
    ),
    SettingRecord(
        "num_workers",
        ("dataloader.num_workers", "dataloader.prefetch_factor"),
        "DataLoader workers",
        _workers,
        applied_by="dataloader_kwargs",
        bench="num_workers",
        changed=lambda s: s.dataloader.num_workers > 0,
    ),
    SettingRecord(
        "pin_memory",
        ("dataloader.pin_memory",),
        "pin_memory",
        lambda s: on_off(s.dataloader.pin_memory),
        applied_by="dataloader_kwargs",
        bench="pin_memory",
        changed=lambda s: s.dataloader.pin_memory,
    ),
    SettingRecord(
        "cpu_threads",
        ("cpu_threads",),
        "CPU threads",
        lambda s: "default" if s.cpu_threads is None else str(s.cpu_threads),
        applied_by="apply",
        bench="cpu_threads",
        changed=lambda s: s.cpu_threads is not None,
    ),
    SettingRecord(
        "grad_accum_steps",
        ("batch.grad_accum_steps",),
        "gradient accumulation",
        lambda s: str(s.batch.grad_accum_steps),
        applied_by=None,  # the script's own loop (profile.grad_accum_steps)
        summary=False,
    ),
    SettingRecord(
        "persistent_workers",
        ("dataloader.persistent_workers",),
        "persistent workers",
        lambda s: on_off(s.dataloader.persistent_workers),
        applied_by="dataloader_kwargs",
        summary=False,
        not_ablated="persistent_workers: saves worker start-up between epochs, which a"
        " steady-state measurement does not include",
        changed=lambda s: s.dataloader.persistent_workers,
    ),
    SettingRecord(
        "seed_workers",
        ("dataloader.seed_workers",),
        "seeded workers",
        lambda s: on_off(s.dataloader.seed_workers),
        applied_by="dataloader_kwargs",
        summary=False,
        not_ablated="seeded workers: what the reproducible mode asks for, not a speed setting",
        changed=lambda s: s.dataloader.seed_workers,
    ),
    SettingRecord(
        "determinism",
        ("backends.cudnn_deterministic", "backends.deterministic_algorithms"),
        "deterministic algorithms",
        lambda s: on_off(s.backends.deterministic_algorithms),
        applied_by="apply",
        summary=False,
        not_ablated="determinism: what the reproducible mode asks for, not a speed setting",
        changed=lambda s: s.backends.deterministic_algorithms or s.backends.cudnn_deterministic,
    ),
    SettingRecord(
        "seed",
        ("seed",),
        "seed",
        lambda s: "not set" if s.seed is None else str(s.seed),
        applied_by="apply",
        summary=False,
        not_ablated="the seed: what the reproducible mode asks for, not a speed setting",
        changed=lambda s: s.seed is not None,
    ),
    SettingRecord(
        "ddp",
        ("ddp.gradient_as_bucket_view", "ddp.static_graph", "ddp.find_unused_parameters"),
        "DDP",
        _ddp,
        applied_by="parallelize",
        summary=False,  # the summary's ranks row says it, where several processes train
        not_ablated="DDP's options: one process trains in the bench, so there is nothing to wrap",
        changed=lambda s: s.ddp != DdpSettings(),
    ),
    SettingRecord(
        "fsdp",
        ("fsdp.enabled",),
        "FSDP2",
        lambda s: "fully_shard (in place of DDP)" if s.fsdp.enabled else "off",
        applied_by="parallelize",
        summary=False,  # the summary's ranks row says it, where several processes train
        memory=True,
        not_ablated="FSDP2: one process trains in the bench, so there is nothing to shard",
        changed=lambda s: s.fsdp.enabled,
    ),
    SettingRecord(
        "blocks",
        ("blocks",),
        "blocks",
        lambda s: s.blocks or "found in the model",
        applied_by="prepare_model",
        summary=False,  # the checkpointing row's reason names them, where it is on
        not_ablated="the model's blocks: what the workload names, not a speed setting",
        changed=lambda s: s.blocks is not None,
    ),
    SettingRecord(
        "activation_checkpointing",
        ("activation_checkpointing",),
        "activation checkpointing",
        lambda s: on_off(s.activation_checkpointing),
        applied_by="prepare_model",
        summary_reason=True,
        bench="activation_checkpointing",  # off: at the batch that ran without it (bench.Plan)
        memory=True,
        changed=lambda s: s.activation_checkpointing,
    ),
    SettingRecord(
        "environment",
        ("environment", *(f"environment.{name}" for name in ALLOWED_ENVIRONMENT)),
        "environment variables",
        lambda s: ", ".join(f"{k}={v}" for k, v in sorted(s.environment.items())) or "none",
        applied_by="environment",
        summary=False,
        not_ablated="environment (PYTORCH_CUDA_ALLOC_CONF, CUBLAS_WORKSPACE_CONFIG,"
        " OMP_NUM_THREADS...): read once when CUDA or OpenMP starts, so it cannot change"
        " inside one process",
        fresh_process=True,
        changed=lambda s: bool(s.environment),
    ),
)
"""Every setting's record (``records.SettingRecord``), in the order reports list them."""

RECORD_BY_NAME = {record.name: record for record in RECORDS}


def torch_defaults(device: Literal["cuda", "mps", "cpu"] = "cpu") -> Settings:
    """Settings that change nothing: float32, eager, contiguous, no workers, torch's flags.

    What a search trial or a bench arm trains with when no profile says otherwise: every
    setting at its default, on ``device``.
    """
    return Settings(device=device)


def settings_paths() -> set[str]:
    """Every dotted leaf path of Settings, e.g. 'dataloader.num_workers'."""
    return set(_leaf_paths())


@cache
def _leaf_paths() -> frozenset[str]:
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
    return frozenset(paths)


def setting_value(settings: Settings, path: str) -> str | int | float | bool | None:
    """The value at a dotted leaf path ('precision.dtype' -> 'bfloat16'), as a decision holds it.

    Raises ``KeyError`` for a path that is not a leaf of ``Settings``.
    """
    if path not in _leaf_paths():
        raise KeyError(path)
    *parents, leaf = path.split(".")
    node: object = settings
    for part in parents:
        node = getattr(node, part)
    if isinstance(node, dict):
        value: object = node.get(leaf)
    else:
        value = getattr(node, leaf)
    if isinstance(value, Enum):
        value = value.value
    if value is not None and not isinstance(value, str | int | float | bool):
        raise KeyError(path)
    return value


def memory_settings(settings: Settings) -> dict[str, str]:
    """The settings that change how much memory a batch needs (records with ``memory``), by
    record name, each as its record shows it ('compile': 'off' whatever mode an eager profile
    keeps): a batch that ran under one of these maps may not fit under another."""
    return {record.name: record.show(settings) for record in RECORDS if record.memory}
