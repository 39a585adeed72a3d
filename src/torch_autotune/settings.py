"""What a training script applies: the typed settings of a profile, and what they mean.

The ground floor of the data model: pydantic and the standard library only. ``Settings`` is
what ``apply`` turns into torch calls, what the rules fill in and what the bench switches;
``Mode`` and ``Source`` say what a profile optimises for and where a value comes from.
"""

from __future__ import annotations

from enum import Enum
from functools import cache
from typing import Literal

from pydantic import BaseModel, Field

from torch_autotune.bounds import (
    STRICT,
    AccumSteps,
    BatchSize,
    CpuCount,
    PrefetchFactor,
    Seed,
    WorkerCount,
)


class StrictModel(BaseModel):
    """Frozen, refuses unknown fields (a typo in a hand-edited file is an error) and refuses
    inf and NaN (``bounds.STRICT``)."""

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


class Precision(StrictModel):
    """Mixed precision: torch.autocast(device, dtype) and a GradScaler for fp16."""

    autocast: bool
    dtype: Literal["float32", "float16", "bfloat16"]
    grad_scaler: bool


class MatmulPrecision(StrictModel):
    """TF32 for float32 matmuls and convolutions, in the one API the installed torch wants.

    ``api`` is ``allow_tf32`` (torch.backends.cuda.matmul/cudnn.allow_tf32, torch < 2.9) or
    ``fp32_precision`` (torch.backends.*.fp32_precision, torch >= 2.9); mixing them raises in
    torch (rules catalog B2, S5), so a profile holds exactly one. ``None``: set nothing.
    """

    tf32: bool
    api: Literal["allow_tf32", "fp32_precision"] | None


class Backends(StrictModel):
    """cuDNN autotuner and determinism switches."""

    cudnn_benchmark: bool
    cudnn_deterministic: bool
    deterministic_algorithms: bool


class Compile(StrictModel):
    """torch.compile."""

    enabled: bool
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None


class DataLoaderSettings(StrictModel):
    """Keyword arguments for torch.utils.data.DataLoader."""

    num_workers: WorkerCount
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: PrefetchFactor | None = Field(
        description="Batches each worker loads ahead; None keeps torch's default (2 with workers)."
    )
    seed_workers: bool = Field(description="Seed every worker from one generator (reproducible).")


class OptimizerSettings(StrictModel):
    """Keyword arguments for the optimizer (Adam/AdamW)."""

    fused: bool


class BatchSettings(StrictModel):
    """Filled by the probe: a batch size is only ever one that ran on this machine."""

    batch_size: BatchSize | None
    grad_accum_steps: AccumSteps


class Settings(StrictModel):
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


def torch_defaults(device: Literal["cuda", "mps", "cpu"] = "cpu") -> Settings:
    """Settings that change nothing: float32, eager, contiguous, no workers, torch's flags.

    What a search trial or a bench arm trains with when no profile says otherwise.
    """
    return Settings(
        device=device,
        precision=Precision(autocast=False, dtype="float32", grad_scaler=False),
        matmul=MatmulPrecision(tf32=False, api=None),
        backends=Backends(
            cudnn_benchmark=False, cudnn_deterministic=False, deterministic_algorithms=False
        ),
        compile=Compile(enabled=False, mode=None),
        memory_format="contiguous_format",
        dataloader=DataLoaderSettings(
            num_workers=0,
            pin_memory=False,
            persistent_workers=False,
            prefetch_factor=None,
            seed_workers=False,
        ),
        optimizer=OptimizerSettings(fused=False),
        cpu_threads=None,
        seed=None,
        environment={},
        batch=BatchSettings(batch_size=None, grad_accum_steps=1),
    )


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
