"""The hardware snapshot: everything the rules and the probe need to know about a machine.

Pure data. Detection (``torch_autotune.detect``) is the only code that reads hardware; it fills
these models, and everything downstream (rules, profiles, reports) consumes them. A snapshot
serialises to JSON with ``model_dump_json()`` and loads back with ``model_validate_json()``, so a
machine you are not on can be reasoned about from its file.

Conventions:
- units are in field names (``memory_total_bytes``, ``detection_seconds``);
- a field that could not be read is ``None`` and the snapshot carries a ``DetectionWarning``
  naming the field and why; a ``None`` that means "does not apply" (no cgroup CPU quota, no
  ``/dev/shm`` on Windows) is documented on the field and carries no warning.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import Enum
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from torch_autotune.bounds import (
    MAX_CPUS,
    STRICT,
    AcceleratorIndex,
    Bytes,
    ComputeUnits,
    CpuCount,
    PositiveBytes,
    SmallCount,
)

SNAPSHOT_SCHEMA_VERSION: Literal[1] = 1
"""Version of the snapshot schema written by this release. Bumped on any incompatible change."""


NO_GPU_FOR_TORCH = "torch.cuda.is_available() is False: torch itself sees no GPU"
"""A deep detection's word that torch was asked and saw no GPU (the rules' driver gate reads
it: where torch saw one, an old driver is no reason to refuse it)."""


class _Frozen(BaseModel):
    model_config = STRICT


class Vendor(str, Enum):
    NVIDIA = "nvidia"
    AMD = "amd"
    APPLE = "apple"


class Backend(str, Enum):
    """The torch device back end that drives an accelerator."""

    CUDA = "cuda"
    ROCM = "rocm"  # torch still calls the device "cuda" on ROCm builds
    MPS = "mps"


class Architecture(str, Enum):
    """GPU architecture family.

    NVIDIA families follow the compute capability (``architecture_for``); AMD families come
    from the gfx target; Apple GPUs are one family for our purposes.
    """

    KEPLER = "kepler"
    MAXWELL = "maxwell"
    PASCAL = "pascal"
    VOLTA = "volta"
    TURING = "turing"
    AMPERE = "ampere"
    ADA = "ada"
    HOPPER = "hopper"
    BLACKWELL = "blackwell"
    CDNA = "cdna"
    CDNA2 = "cdna2"
    CDNA3 = "cdna3"
    CDNA4 = "cdna4"
    RDNA2 = "rdna2"
    RDNA3 = "rdna3"
    RDNA4 = "rdna4"
    APPLE = "apple"
    UNKNOWN = "unknown"


ComputeCapability = tuple[SmallCount, SmallCount]


class MigSlice(_Frozen):
    """A Multi-Instance GPU slice: what the process sees is a fraction of the parent GPU."""

    profile: str = Field(description="MIG profile as nvidia-smi names it, e.g. '1g.10gb'.")
    parent_name: str = Field(description="Name of the physical GPU the slice is cut from.")
    gpu_instance_id: SmallCount | None = None
    compute_instance_id: SmallCount | None = None


class Accelerator(_Frozen):
    """One GPU (or MIG slice) that this process can use."""

    index: AcceleratorIndex = Field(description="Index among the accelerators this process sees.")
    vendor: Vendor
    backend: Backend
    name: str = Field(description="Name exactly as the driver reports it (nvidia-smi -L).")
    architecture: Architecture
    compute_capability: ComputeCapability | None = Field(
        description="(major, minor). NVIDIA: CUDA compute capability. ROCm: the gfx-derived pair "
        "torch reports, which must never be compared with NVIDIA thresholds. None on MPS."
    )
    tensor_cores: bool | None = Field(
        description="Has matrix units that AMP can use (NVIDIA Tensor Cores, AMD matrix cores). "
        "False on cc 7.5 GTX 16xx/MX/T-series (TU116/TU117)."
    )
    memory_total_bytes: PositiveBytes | None = Field(
        description="Total device memory as the driver reports it: NVML memory.total on a fast "
        "detection, torch's total_memory on a deep one (they differ by a few MiB). For a MIG "
        "slice, the slice. None on integrated GPUs whose driver does not report it (Jetson)."
    )
    memory_free_bytes: Bytes | None = Field(
        description="Free memory at detection time, other processes included (memory.free)."
    )
    sm_count: ComputeUnits | None = Field(
        description="Streaming multiprocessors (NVIDIA) or compute units (AMD)."
    )
    unified_memory: bool = Field(
        description="Memory is shared with the CPU (Jetson, Apple silicon, GB10)."
    )
    mig: MigSlice | None = Field(default=None, description="Set when this is a MIG slice.")
    uuid: str | None = Field(default=None, description="Driver UUID (GPU-... or MIG-...).")
    pci_bus_id: str | None = Field(default=None, description="PCI bus id, e.g. 00000000:3B:00.0.")


class Host(_Frozen):
    """The machine around the accelerators, as this process may use it."""

    os_name: Literal["linux", "windows", "darwin", "other"]
    os_version: str | None = Field(description="Kernel release, Windows build or macOS version.")
    wsl: bool = Field(description="Running under Windows Subsystem for Linux.")
    libc: str | None = Field(description="C library and version, e.g. 'glibc 2.36' (Linux only).")
    cpu_architecture: str = Field(description="Machine type, e.g. x86_64, aarch64, arm64.")
    cpu_model: str | None
    cpu_cores_physical: CpuCount | None
    cpu_cores_logical: CpuCount | None = Field(description="os.cpu_count(): the host's CPUs.")
    cpu_affinity_count: CpuCount | None = Field(
        description="CPUs in this process's affinity mask (taskset, cpuset, --cpuset-cpus)."
    )
    cpu_quota_cores: float | None = Field(
        description="Container CPU quota in CPUs (cgroup cpu.max or cfs_quota_us/cfs_period_us); "
        "None when no quota applies.",
        gt=0,
        le=MAX_CPUS,
    )
    cpus_usable: CpuCount = Field(
        description="CPUs this process can really keep busy: min(affinity, floor(quota)), at "
        "least 1. DataLoader workers and thread counts start from this."
    )
    memory_total_bytes: PositiveBytes | None = Field(description="Physical RAM of the host.")
    memory_available_bytes: Bytes | None = Field(
        description="RAM available to new work at detection time (psutil 'available')."
    )
    memory_limit_bytes: PositiveBytes | None = Field(
        description="Container memory limit (cgroup memory.max / memory.limit_in_bytes); None "
        "when no limit applies."
    )
    shm_total_bytes: Bytes | None = Field(
        description="Size of /dev/shm, where DataLoader workers pass batches; None where the OS "
        "has none (Windows, macOS)."
    )
    shm_free_bytes: Bytes | None = None

    @model_validator(mode="after")
    def _counts_agree(self) -> Host:
        """The CPU counts as detection relates them: the usable CPUs within the affinity
        mask, and both within the host's (a hand-edited snapshot of 4 usable CPUs in an
        affinity mask of 2 got reasons that said both)."""
        usable = ("cpus_usable", self.cpus_usable)
        affinity = ("cpu_affinity_count", self.cpu_affinity_count)
        logical = ("cpu_cores_logical", self.cpu_cores_logical)
        for (name, count), (limit, within) in (
            (usable, affinity),
            (usable, logical),
            (affinity, logical),
        ):
            if count is not None and within is not None and count > within:
                raise ValueError(
                    f"{name} {count} is more than {limit} {within}: usable CPUs are at most "
                    "the affinity mask's, which are at most the host's"
                )
        return self


class Software(_Frozen):
    """Python, torch and driver stack."""

    python_version: str = Field(description="e.g. '3.11.7'.")
    python_implementation: str = Field(description="e.g. 'CPython'.")
    python_gil_enabled: bool = Field(description="False on a free-threaded build with GIL off.")
    multiprocessing_start_method: str = Field(
        description="The start method DataLoader workers will use: the one set, else the "
        "platform default (fork before Python 3.14 on Linux, forkserver from 3.14, spawn on "
        "Windows and macOS)."
    )
    torch_version: str | None = Field(description="Installed torch, e.g. '2.13.0+cu128'.")
    torch_cuda_version: str | None = Field(
        description="CUDA version the installed torch was built for; None on CPU/ROCm builds."
    )
    torch_hip_version: str | None = Field(
        description="HIP (ROCm) version the installed torch was built for; None otherwise."
    )
    torch_cuda_arch_list: tuple[str, ...] | None = Field(
        description="GPU architectures the installed torch ships kernels for, e.g. "
        "('sm_75', 'sm_80', ...). Empty for a CPU build."
    )
    torch_cuda_arch_list_source: Literal["torch", "release-table"] | None = Field(
        default=None,
        description="'torch': read from torch.cuda.get_arch_list(); 'release-table': inferred "
        "from the torch and CUDA versions without importing torch.",
    )
    cudnn_version: str | None = Field(description="cuDNN torch uses, e.g. '9.10.2'.")
    nvidia_driver_version: str | None = Field(description="e.g. '570.133.20'.")
    cuda_driver_version: str | None = Field(
        description="Newest CUDA version the driver supports (nvidia-smi 'CUDA Version')."
    )
    triton_available: bool = Field(description="A Triton package is importable.")
    triton_version: str | None = None
    torch_num_threads: CpuCount | None = Field(
        default=None, description="torch.get_num_threads(); read only by a deep detection."
    )

    @property
    def torch_build(self) -> Literal["cuda", "rocm", "cpu", "absent"]:
        """Which kind of torch build is installed."""
        if self.torch_version is None:
            return "absent"
        if self.torch_hip_version is not None:
            return "rocm"
        if self.torch_cuda_version is not None:
            return "cuda"
        return "cpu"


class DetectionWarning(_Frozen):
    """A field that could not be read, or a fact that limits what detection could see."""

    field: str = Field(description="Dotted path of the field, e.g. 'accelerators[1].sm_count'.")
    reason: str


class HardwareSnapshot(_Frozen):
    """Everything detection learnt about one machine at one moment."""

    schema_version: Literal[1] = SNAPSHOT_SCHEMA_VERSION
    tool_version: str = Field(description="torch-autotune version that took the snapshot.")
    captured_at: datetime
    detection_depth: Literal["fast", "deep", "recorded"] = Field(
        description="'fast': NVML and the OS only; 'deep': torch was imported too; 'recorded': "
        "assembled from published facts, not read from a live machine."
    )
    detection_seconds: float = Field(ge=0)
    accelerators: tuple[Accelerator, ...]
    host: Host
    software: Software
    warnings: tuple[DetectionWarning, ...] = ()

    @property
    def gpu_count(self) -> int:
        return len(self.accelerators)


# --- facts about architectures, pure functions over detected values ---------------------------

_NVIDIA_FAMILY_BY_MAJOR: dict[int, Architecture] = {
    3: Architecture.KEPLER,
    5: Architecture.MAXWELL,
    6: Architecture.PASCAL,
    8: Architecture.AMPERE,
    9: Architecture.HOPPER,
    10: Architecture.BLACKWELL,
    11: Architecture.BLACKWELL,
    12: Architecture.BLACKWELL,
}


def nvidia_architecture(cc: ComputeCapability) -> Architecture:
    """NVIDIA architecture family for a compute capability (rules catalog §P)."""
    major, minor = cc
    if major == 7:
        return Architecture.TURING if minor >= 5 else Architecture.VOLTA
    if (major, minor) == (8, 9):
        return Architecture.ADA
    return _NVIDIA_FAMILY_BY_MAJOR.get(major, Architecture.UNKNOWN)


# TU116/TU117 boards: compute capability 7.5 but no Tensor Cores (rules catalog A7, S2, §R #15-16).
_NO_TENSOR_CORE_TURING = re.compile(
    r"GTX 16\d\d|\bMX ?[45]\d0\b|^T(400|500|550|600|1000|1200)\b|Quadro T\d{3,4}\b",
    re.IGNORECASE,
)


def normalized_gpu_name(name: str) -> str:
    """Driver name without the vendor prefix old and new drivers disagree on (catalog D3, S16)."""
    return re.sub(r"^(NVIDIA|Tesla|GeForce)\s+", "", name.strip(), flags=re.IGNORECASE)


def nvidia_has_tensor_cores(cc: ComputeCapability, name: str) -> bool:
    """Tensor Cores exist from Volta (cc 7.0) on, except on TU116/TU117 parts (catalog A7)."""
    if cc < (7, 0):
        return False
    if cc == (7, 5):
        # Match on the name with any vendor prefix stripped, repeatedly: "NVIDIA GeForce GTX 1660".
        bare = normalized_gpu_name(normalized_gpu_name(name))
        return _NO_TENSOR_CORE_TURING.search(bare) is None
    return True


# Integrated NVIDIA parts share memory with the CPU (catalog D7, §R #43-47).
_UNIFIED_MEMORY_CC: frozenset[tuple[int, int]] = frozenset(
    {(5, 3), (6, 2), (7, 2), (8, 7), (11, 0), (12, 1)}
)
_UNIFIED_MEMORY_NAME = re.compile(r"\b(Orin|Xavier|Jetson|Thor|GB10|Tegra)\b", re.IGNORECASE)


def nvidia_unified_memory(cc: ComputeCapability | None, name: str) -> bool:
    """Whether an NVIDIA GPU is an integrated part sharing system RAM."""
    if cc is not None and cc in _UNIFIED_MEMORY_CC:
        return True
    return _UNIFIED_MEMORY_NAME.search(name) is not None


# CUDA cores per SM, to turn NVML's core count into an SM count (CUDA C Programming Guide,
# "Arithmetic Instructions": FP32 results per clock per SM).
_CORES_PER_SM: dict[tuple[int, int], int] = {
    (5, 0): 128, (5, 2): 128, (5, 3): 128,
    (6, 0): 64, (6, 1): 128, (6, 2): 128,
    (7, 0): 64, (7, 2): 64, (7, 5): 64,
    (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128,
    (9, 0): 128,
    (10, 0): 128, (10, 3): 128, (11, 0): 128, (12, 0): 128, (12, 1): 128,
}  # fmt: skip


def cuda_cores_per_sm(cc: ComputeCapability) -> int | None:
    """FP32 CUDA cores per SM for a compute capability, or None when unknown."""
    return _CORES_PER_SM.get((cc[0], cc[1]))


# AMD gfx targets -> family. gfx90a reports cc (9, 0) through torch and collides with Hopper
# (catalog D2, S6), which is why the family comes from the gfx name and never from the pair.
_AMD_FAMILY_BY_GFX: dict[str, Architecture] = {
    "gfx908": Architecture.CDNA,
    "gfx90a": Architecture.CDNA2,
    "gfx940": Architecture.CDNA3,
    "gfx941": Architecture.CDNA3,
    "gfx942": Architecture.CDNA3,
    "gfx950": Architecture.CDNA4,
    "gfx1030": Architecture.RDNA2,
    "gfx1100": Architecture.RDNA3,
    "gfx1101": Architecture.RDNA3,
    "gfx1102": Architecture.RDNA3,
    "gfx1200": Architecture.RDNA4,
    "gfx1201": Architecture.RDNA4,
}


def amd_architecture(gfx_target: str) -> Architecture:
    """AMD family for a gfx target such as 'gfx942' or 'gfx90a:sramecc+:xnack-'."""
    return _AMD_FAMILY_BY_GFX.get(gfx_target.split(":", 1)[0].lower(), Architecture.UNKNOWN)
