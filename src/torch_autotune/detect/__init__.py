"""Detection: the only package that reads hardware.

``detect()`` asks a *machine* back end for a ``HardwareSnapshot``. ``LiveMachine`` reads this
computer from its sources (NVML, the OS, installed-package metadata, and torch only for a deep
detection, or in a child process where nothing else can see the accelerators: a ROCm build's
GPUs); ``RecordedMachine`` returns a snapshot
from a file. Each source of ``LiveMachine`` is injectable, so tests run every path with recorded
answers and never touch real hardware.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from torch_autotune.detect.host import HostSystem, read_host
from torch_autotune.detect.nvml import read_nvidia_gpus
from torch_autotune.detect.recorded import RecordedMachine, load_snapshot, parse_snapshot
from torch_autotune.detect.software import SoftwareReading, read_software
from torch_autotune.version import __version__

if TYPE_CHECKING:
    from torch_autotune.detect.torch_env import TorchReading

from torch_autotune.hardware import (
    Accelerator,
    Architecture,
    Backend,
    DetectionWarning,
    HardwareSnapshot,
    Host,
    Software,
    Vendor,
)

__all__ = [
    "LiveMachine",
    "Machine",
    "RecordedMachine",
    "detect",
    "load_snapshot",
    "parse_snapshot",
]


class Machine(Protocol):
    """A back end that can describe a machine."""

    def snapshot(self, *, deep: bool = False) -> HardwareSnapshot: ...


def _import_torch() -> Any:
    from torch_autotune.detect.torch_env import import_torch

    return import_torch()


def _read_torch_elsewhere(env: Mapping[str, str]) -> TorchReading:
    from torch_autotune.detect.torch_env import read_torch_elsewhere

    return read_torch_elsewhere(env)


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class LiveMachine:
    """This computer, read through injectable sources.

    Attributes:
        env: environment variables (``CUDA_VISIBLE_DEVICES``); defaults to ``os.environ``.
        nvml_binding: an object with the ``pynvml`` API; defaults to the real module.
        host_system: the OS calls host detection makes.
        find_package_dir: locates an installed package's directory without importing it.
        torch_loader: returns the torch module (or None) for deep detection.
        torch_elsewhere: torch's reading from a child process with these variables, for the
            GPUs of a ROCm build, which NVML does not see, in a fast detection.
    """

    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    nvml_binding: Any = None
    host_system: HostSystem | None = None
    find_package_dir: Callable[[str], Path | None] | None = None
    torch_loader: Callable[[], Any] = _import_torch
    torch_elsewhere: Callable[[Mapping[str, str]], TorchReading] = _read_torch_elsewhere
    clock: Callable[[], float] = time.perf_counter
    now: Callable[[], datetime] = _utc_now

    def snapshot(self, *, deep: bool = False) -> HardwareSnapshot:
        """Read the machine; ``deep`` also imports torch (seconds) to fill what NVML cannot."""
        started = self.clock()
        host, warnings = read_host(self.host_system)
        nvidia = read_nvidia_gpus(self.nvml_binding, env=self.env)
        warnings += nvidia.warnings
        software, software_warnings = read_software(self.find_package_dir)
        warnings += software_warnings
        accelerators = list(nvidia.accelerators)

        torch_build = software.torch
        is_rocm = torch_build is not None and torch_build.hip is not None
        apple = host.os_name == "darwin" and host.cpu_architecture in ("arm64", "aarch64")
        if apple and torch_build is not None and not deep:
            accelerators.append(_apple_gpu(host))

        deep_reading: TorchReading | None = None
        if is_rocm and not accelerators and not deep:
            deep_reading = self.torch_elsewhere(self.env)  # NVML sees no AMD GPU
            accelerators = _merge(accelerators, deep_reading, host)
            warnings += deep_reading.warnings
        elif deep:
            torch = self.torch_loader() if torch_build is not None else None
            if torch is None:
                warnings.append(
                    DetectionWarning(
                        field="detection_depth",
                        reason="torch could not be imported, so only NVML and the OS were read",
                    )
                )
            else:
                from torch_autotune.detect.torch_env import read_torch

                deep_reading = read_torch(torch)
                accelerators = _merge(accelerators, deep_reading, host)
                warnings += deep_reading.warnings

        snapshot_software = _software(
            software, nvidia.driver_version, nvidia.cuda_driver_version, deep_reading
        )
        return HardwareSnapshot(
            tool_version=__version__,
            captured_at=self.now(),
            detection_depth="deep" if deep and deep_reading is not None else "fast",
            detection_seconds=round(max(0.0, self.clock() - started), 4),
            accelerators=tuple(accelerators),
            host=host,
            software=snapshot_software,
            warnings=tuple(_still_open(warnings, accelerators, snapshot_software)),
        )


def _apple_gpu(host: Host) -> Accelerator:
    """The Apple-silicon GPU MPS drives, described from the host without importing torch."""
    return Accelerator(
        index=0,
        vendor=Vendor.APPLE,
        backend=Backend.MPS,
        name=host.cpu_model or "Apple silicon GPU",
        architecture=Architecture.APPLE,
        compute_capability=None,
        tensor_cores=None,
        memory_total_bytes=host.memory_total_bytes,
        memory_free_bytes=host.memory_available_bytes,
        sm_count=None,
        unified_memory=True,
    )


def _merge(nvml: list[Accelerator], deep: TorchReading, host: Host) -> list[Accelerator]:
    """Combine NVML's view with torch's: NVML's values win, torch fills what NVML left empty."""
    from_torch = [_apple_gpu(host) if a.backend is Backend.MPS else a for a in deep.accelerators]
    if not nvml:
        return from_torch
    by_uuid = {a.uuid: a for a in from_torch if a.uuid}
    merged: list[Accelerator] = []
    for position, accelerator in enumerate(nvml):
        twin = by_uuid.get(accelerator.uuid or "")
        if twin is None and position < len(from_torch):
            candidate = from_torch[position]
            twin = candidate if candidate.name == accelerator.name else None
        if twin is None:
            merged.append(accelerator)
            continue
        missing = {
            name: getattr(twin, name)
            for name in (
                "compute_capability",
                "tensor_cores",
                "memory_total_bytes",
                "memory_free_bytes",
                "sm_count",
            )
            if getattr(accelerator, name) is None
        }
        if missing.get("compute_capability") is not None:
            missing["architecture"] = twin.architecture
        merged.append(accelerator.model_copy(update=missing))
    return merged


def _software(
    reading: SoftwareReading,
    driver: str | None,
    cuda_driver: str | None,
    deep: TorchReading | None,
) -> Software:
    torch = reading.torch
    arch_list, arch_source = reading.torch_cuda_arch_list, reading.torch_cuda_arch_list_source
    cudnn = reading.cudnn_version
    if deep is not None:
        if deep.arch_list is not None:
            arch_list, arch_source = deep.arch_list, "torch"
        cudnn = deep.cudnn_version or cudnn
    return Software(
        python_version=reading.python_version,
        python_implementation=reading.python_implementation,
        python_gil_enabled=reading.python_gil_enabled,
        multiprocessing_start_method=reading.multiprocessing_start_method,
        torch_version=None if torch is None else torch.version,
        torch_cuda_version=None if torch is None else torch.cuda,
        torch_hip_version=None if torch is None else torch.hip,
        torch_cuda_arch_list=arch_list,
        torch_cuda_arch_list_source=arch_source,  # type: ignore[arg-type]
        cudnn_version=cudnn,
        nvidia_driver_version=driver,
        cuda_driver_version=cuda_driver,
        triton_available=reading.triton_available,
        triton_version=reading.triton_version,
        torch_num_threads=None if deep is None else deep.num_threads,
    )


def _still_open(
    warnings: list[DetectionWarning], accelerators: list[Accelerator], software: Software
) -> list[DetectionWarning]:
    """Drop warnings about fields that a later source managed to fill."""
    kept: list[DetectionWarning] = []
    for warning in warnings:
        path = warning.field
        if path.startswith("software."):
            if getattr(software, path.removeprefix("software."), None) is not None:
                continue
        elif path.startswith("accelerators[") and "]." in path:
            index_text, _, attribute = path.removeprefix("accelerators[").partition("].")
            if index_text.isdigit() and int(index_text) < len(accelerators):
                value = getattr(accelerators[int(index_text)], attribute.split(".")[0], None)
                if value is not None:
                    continue
        kept.append(warning)
    return kept


def detect(machine: Machine | None = None, *, deep: bool = False) -> HardwareSnapshot:
    """Describe a machine: this one by default, or the one ``machine`` stands for.

    Fast by default (NVML, the OS and package metadata; torch is not imported and no CUDA
    context is created). ``deep=True`` imports torch to fill what those sources cannot answer.
    Never raises for odd hardware: unreadable fields are None with a warning in the snapshot.
    """
    return (machine or LiveMachine()).snapshot(deep=deep)
