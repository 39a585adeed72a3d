"""What only torch can answer: the deep detection path.

Importing torch costs seconds and ``torch.cuda`` queries create a CUDA context, so this module
runs only when asked (``autotune detect --deep``) or when nothing else can see the accelerators
(a ROCm build, Apple MPS). The torch module is injected so tests pass a fake one.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from torch_autotune.hardware import (
    Accelerator,
    Architecture,
    Backend,
    DetectionWarning,
    Vendor,
    amd_architecture,
    nvidia_architecture,
    nvidia_has_tensor_cores,
    nvidia_unified_memory,
)

# AMD families with matrix cores that AMP uses (MFMA on CDNA, WMMA on RDNA3 and later).
_AMD_MATRIX_CORES = frozenset(
    {
        Architecture.CDNA,
        Architecture.CDNA2,
        Architecture.CDNA3,
        Architecture.CDNA4,
        Architecture.RDNA3,
        Architecture.RDNA4,
    }
)


@dataclass
class TorchReading:
    accelerators: list[Accelerator] = field(default_factory=list)
    cudnn_version: str | None = None
    arch_list: tuple[str, ...] | None = None
    num_threads: int | None = None
    warnings: list[DetectionWarning] = field(default_factory=list)


def import_torch() -> Any:
    """Import torch on demand; None when it is not installed or fails to import."""
    try:
        import torch
    except Exception:  # a broken torch install raises anything; detection goes on
        return None
    return torch


def cudnn_version_text(number: int) -> str:
    """torch.backends.cudnn.version() -> 'major.minor.patch' (8902 -> 8.9.2, 91002 -> 9.10.2)."""
    if number >= 90000:
        return f"{number // 10000}.{number % 10000 // 100}.{number % 100}"
    return f"{number // 1000}.{number % 1000 // 100}.{number % 100}"


def read_torch(torch: Any) -> TorchReading:
    """Accelerators and build facts from an imported torch module."""
    reading = TorchReading()
    with contextlib.suppress(AttributeError, RuntimeError):
        reading.num_threads = int(torch.get_num_threads())
    hip = getattr(torch.version, "hip", None)
    if getattr(torch.version, "cuda", None) is not None or hip is not None:
        _read_cuda_devices(torch, reading, rocm=hip is not None)
    elif _mps_available(torch):
        reading.accelerators.append(
            Accelerator(
                index=0,
                vendor=Vendor.APPLE,
                backend=Backend.MPS,
                name="Apple MPS",  # the chip name comes from the host (sysctl); merged later
                architecture=Architecture.APPLE,
                compute_capability=None,
                tensor_cores=None,
                memory_total_bytes=None,
                memory_free_bytes=None,
                sm_count=None,
                unified_memory=True,
            )
        )
        reading.arch_list = ()
    else:
        reading.arch_list = ()
    return reading


def _mps_available(torch: Any) -> bool:
    mps = getattr(getattr(torch, "backends", None), "mps", None)
    try:
        return bool(mps is not None and mps.is_available())
    except RuntimeError:
        return False


def _read_cuda_devices(torch: Any, reading: TorchReading, *, rocm: bool) -> None:
    try:
        available = bool(torch.cuda.is_available())
        reading.arch_list = tuple(torch.cuda.get_arch_list())
    except RuntimeError as exc:
        reading.warnings.append(DetectionWarning(field="accelerators", reason=f"torch: {exc}"))
        return
    if not rocm:
        try:
            number = torch.backends.cudnn.version()
        except RuntimeError:
            number = None
        reading.cudnn_version = None if not number else cudnn_version_text(int(number))
    if not available:
        return
    for index in range(int(torch.cuda.device_count())):
        try:
            props = torch.cuda.get_device_properties(index)
            free, _total = torch.cuda.mem_get_info(index)
        except RuntimeError as exc:
            reading.warnings.append(
                DetectionWarning(field=f"accelerators[{index}]", reason=f"left out: torch: {exc}")
            )
            continue
        reading.accelerators.append(_accelerator(index, props, int(free), rocm=rocm))


def _accelerator(index: int, props: Any, free: int, *, rocm: bool) -> Accelerator:
    cc = (int(props.major), int(props.minor))
    uuid = getattr(props, "uuid", None)
    if rocm:
        architecture = amd_architecture(str(getattr(props, "gcnArchName", "")))
        return Accelerator(
            index=index,
            vendor=Vendor.AMD,
            backend=Backend.ROCM,
            name=str(props.name),
            architecture=architecture,
            compute_capability=cc,
            tensor_cores=architecture in _AMD_MATRIX_CORES,
            memory_total_bytes=int(props.total_memory) or None,
            memory_free_bytes=free,
            sm_count=int(props.multi_processor_count) or None,
            unified_memory=bool(getattr(props, "is_integrated", False)),
            uuid=None if uuid is None else str(uuid),
        )
    return Accelerator(
        index=index,
        vendor=Vendor.NVIDIA,
        backend=Backend.CUDA,
        name=str(props.name),
        architecture=nvidia_architecture(cc),
        compute_capability=cc,
        tensor_cores=nvidia_has_tensor_cores(cc, str(props.name)),
        memory_total_bytes=int(props.total_memory) or None,
        memory_free_bytes=free,
        sm_count=int(props.multi_processor_count) or None,
        unified_memory=bool(getattr(props, "is_integrated", False))
        or nvidia_unified_memory(cc, str(props.name)),
        uuid=None if uuid is None else f"GPU-{uuid}",
    )
