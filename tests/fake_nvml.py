"""A fake NVML binding with the API shape of nvidia-ml-py's ``pynvml`` module.

It raises the real binding's error classes (``pynvml.NVMLError(code)`` builds the same subclass
and message a driver would), so the adapter's error handling is exercised exactly as on a real
machine; only the answers are recorded. Failures are set per GPU and per function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

MIB = 1 << 20


@dataclass
class FakeMig:
    """One MIG slice: a compute instance inside a GPU instance."""

    profile: str
    memory_mib: int
    sm_count: int
    slot: int
    gpu_instance_id: int = 1
    compute_instance_id: int = 0


@dataclass
class FakeGpu:
    """One physical GPU as NVML describes it."""

    name: str
    cc: tuple[int, int] | None
    memory_mib: int | None
    cuda_cores: int | None
    used_mib: int = 512
    uuid: str = ""
    bus_id: str = ""
    failures: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code
    lost: bool = False
    mig: list[FakeMig] | None = None  # None: MIG not enabled


class FakeNvml:
    """Stands in for the ``pynvml`` module. ``absent`` names functions this binding lacks."""

    NVMLError = pynvml.NVMLError

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        driver: str | bytes = "570.133.20",
        cuda_version: int = 12080,
        init_error: int | None = None,
        system_failures: dict[str, int] | None = None,
        absent: frozenset[str] = frozenset(),
    ) -> None:
        self.gpus = gpus
        for i, gpu in enumerate(gpus):
            gpu.uuid = gpu.uuid or f"GPU-{i:08x}-0000-0000-0000-00000000000{i}"
            gpu.bus_id = gpu.bus_id or f"00000000:{0x10 + i:02X}:00.0"
        self.driver = driver
        self.cuda_version = cuda_version
        self.init_error = init_error
        self.system_failures = system_failures or {}
        self.absent = absent
        self.initialised = False
        self.shut_down = False

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "absent"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("NVML_"):
            return getattr(pynvml, name)  # the real constants
        raise AttributeError(name)

    # --- library and system ---------------------------------------------------------------
    def _system(self, fn: str) -> None:
        if fn in self.system_failures:
            raise pynvml.NVMLError(self.system_failures[fn])

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._system("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._system("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._system("nvmlSystemGetCudaDriverVersion")
        return self.cuda_version

    def nvmlDeviceGetCount(self) -> int:
        self._system("nvmlDeviceGetCount")
        return len(self.gpus)

    # --- devices: handles are ("gpu", i) or ("mig", i, slot) ------------------------------
    def _gpu(self, handle: tuple[Any, ...], fn: str) -> FakeGpu:
        gpu = self.gpus[handle[1]]
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.failures:
            raise pynvml.NVMLError(gpu.failures[fn])
        return gpu

    def _mig(self, handle: tuple[Any, ...], fn: str) -> FakeMig:
        gpu = self._gpu(handle, fn)
        assert gpu.mig is not None
        return next(m for m in gpu.mig if m.slot == handle[2])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[Any, ...]:
        self._gpu(("gpu", index), "nvmlDeviceGetHandleByIndex")
        return ("gpu", index)

    def nvmlDeviceGetName(self, handle: tuple[Any, ...]) -> str:
        gpu = self._gpu(handle, "nvmlDeviceGetName")
        if handle[0] == "mig":
            return f"{gpu.name} MIG {self._mig(handle, 'nvmlDeviceGetName').profile}"
        return gpu.name

    def nvmlDeviceGetCudaComputeCapability(self, handle: tuple[Any, ...]) -> tuple[int, int]:
        gpu = self._gpu(handle, "nvmlDeviceGetCudaComputeCapability")
        if gpu.cc is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.cc

    def nvmlDeviceGetMemoryInfo(self, handle: tuple[Any, ...]) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        total = self._mig(handle, "").memory_mib if handle[0] == "mig" else gpu.memory_mib
        if total is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        used = min(gpu.used_mib, total)
        return SimpleNamespace(total=total * MIB, free=(total - used) * MIB, used=used * MIB)

    def nvmlDeviceGetNumGpuCores(self, handle: tuple[Any, ...]) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetNumGpuCores")
        if gpu.cuda_cores is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.cuda_cores

    def nvmlDeviceGetUUID(self, handle: tuple[Any, ...]) -> str:
        gpu = self._gpu(handle, "nvmlDeviceGetUUID")
        if handle[0] == "mig":
            return f"MIG-{handle[1]:04x}{handle[2]:04x}-aaaa-bbbb-cccc-000000000000"
        return gpu.uuid

    def nvmlDeviceGetPciInfo(self, handle: tuple[Any, ...]) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=gpu.bus_id.encode())  # old bindings return bytes

    def nvmlDeviceGetMigMode(self, handle: tuple[Any, ...]) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetMigMode")
        enabled = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig is not None else 0
        return [enabled, enabled]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: tuple[Any, ...]) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return 7 if gpu.mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(
        self, handle: tuple[Any, ...], slot: int
    ) -> tuple[Any, ...]:
        gpu = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if gpu.mig is None or all(m.slot != slot for m in gpu.mig):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", handle[1], slot)

    def nvmlDeviceGetAttributes_v2(self, handle: tuple[Any, ...]) -> SimpleNamespace:
        if handle[0] != "mig":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mig = self._mig(handle, "nvmlDeviceGetAttributes_v2")
        return SimpleNamespace(multiprocessorCount=mig.sm_count, memorySizeMB=mig.memory_mib)

    def nvmlDeviceGetGpuInstanceId(self, handle: tuple[Any, ...]) -> int:
        return self._mig(handle, "nvmlDeviceGetGpuInstanceId").gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: tuple[Any, ...]) -> int:
        return self._mig(handle, "nvmlDeviceGetComputeInstanceId").compute_instance_id


# Recorded devices (names, cc, memory and cores from the rules catalog §R and T.7).
def h100() -> FakeGpu:
    return FakeGpu("NVIDIA H100 80GB HBM3", (9, 0), 81559, 16896)


def a100_40gb() -> FakeGpu:
    return FakeGpu("NVIDIA A100-SXM4-40GB", (8, 0), 40960, 6912)


def rtx_4090() -> FakeGpu:
    return FakeGpu("NVIDIA GeForce RTX 4090", (8, 9), 24564, 16384)


def rtx_3060() -> FakeGpu:
    return FakeGpu("NVIDIA GeForce RTX 3060", (8, 6), 12288, 3584)


def gtx_1660_ti() -> FakeGpu:
    return FakeGpu("NVIDIA GeForce GTX 1660 Ti", (7, 5), 6144, 1536)


def gtx_1080_ti_old_driver() -> FakeGpu:
    return FakeGpu("GeForce GTX 1080 Ti", (6, 1), 11264, 3584)


def tesla_t4() -> FakeGpu:
    return FakeGpu("Tesla T4", (7, 5), 15360, 2560)


def jetson_orin() -> FakeGpu:
    # NVML on Jetson: name "Orin (nvgpu)", memory queries NOT_SUPPORTED (catalog D7).
    return FakeGpu("Orin (nvgpu)", (8, 7), None, 1792)
