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

    autocast: bool = False
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    grad_scaler: bool = False


class MatmulPrecision(StrictModel):
    """TF32 for float32 matmuls and convolutions, in the one API the installed torch wants.

    ``api`` is ``allow_tf32`` (torch.backends.cuda.matmul/cudnn.allow_tf32, torch < 2.9) or
    ``fp32_precision`` (torch.backends.*.fp32_precision, torch >= 2.9); mixing them raises in
    torch (rules catalog B2, S5), so a profile holds exactly one. ``None``: set nothing.
    """

    tf32: bool = False
    api: Literal["allow_tf32", "fp32_precision"] | None = None


class Backends(StrictModel):
    """cuDNN autotuner and determinism switches."""

    cudnn_benchmark: bool = False
    cudnn_deterministic: bool = False
    deterministic_algorithms: bool = False


class Compile(StrictModel):
    """torch.compile."""

    enabled: bool = False
    mode: (
        Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None
    ) = None


class DataLoaderSettings(StrictModel):
    """Keyword arguments for torch.utils.data.DataLoader."""

    num_workers: WorkerCount = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: PrefetchFactor | None = Field(
        default=None,
        description="Batches each worker loads ahead; None keeps torch's default (2 with workers).",
    )
    seed_workers: bool = Field(
        default=False, description="Seed every worker from one generator (reproducible)."
    )


class OptimizerSettings(StrictModel):
    """Keyword arguments for the optimizer (Adam/AdamW)."""

    fused: bool = False


class BatchSettings(StrictModel):
    """Filled by the probe: a batch size is only ever one that ran on this machine."""

    batch_size: BatchSize | None = None
    grad_accum_steps: AccumSteps = 1


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
