"""NVIDIA GPUs through NVML: the only module that talks to the NVML binding.

NVML answers in milliseconds without creating a CUDA context, so it is the fast path for every
NVIDIA fact the rules need. Each query goes through ``_Session.query``, which turns the binding's
own ``NVMLError`` into ``None`` plus a ``DetectionWarning``: a field a driver does not support
costs that field, a lost GPU costs that GPU, and nothing costs the snapshot.

The binding is injected (``read_nvidia_gpus(binding=...)``); by default it is the ``pynvml``
module of the ``nvidia-ml-py`` distribution, imported on first use only.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from torch_autotune.bounds import MAX_SMALL_COUNT
from torch_autotune.detect.visible import (
    Device,
    cuda_visible,
    one_mig_device,
    renumber_warnings,
)
from torch_autotune.hardware import (
    Accelerator,
    Architecture,
    Backend,
    ComputeCapability,
    DetectionWarning,
    MigSlice,
    Vendor,
    cuda_cores_per_sm,
    nvidia_architecture,
    nvidia_has_tensor_cores,
    nvidia_unified_memory,
)

_MIG_PROFILE = re.compile(r"\bMIG\s+(\S+)\s*$")


@dataclass
class NvidiaReading:
    """What NVML told us: the GPUs this process can see and the driver stack."""

    accelerators: list[Accelerator] = field(default_factory=list)
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    warnings: list[DetectionWarning] = field(default_factory=list)
    nvml_available: bool = False


class _Unanswered(Exception):
    """A query failed; the warning is already recorded."""


class _Session:
    """One NVML session: every call to the binding passes through ``query``."""

    def __init__(self, binding: Any, warnings: list[DetectionWarning]) -> None:
        self.binding = binding
        self.warnings = warnings

    def query(self, field_path: str, fn_names: tuple[str, ...], *args: Any) -> Any:
        """Call the first of ``fn_names`` the binding has; on failure warn and raise _Unanswered.

        Several names cover drivers of different ages (``..._v2`` first, then the original).
        """
        error: str | None = None
        for name in fn_names:
            fn: Callable[..., Any] | None = getattr(self.binding, name, None)
            if fn is None:
                error = f"this nvidia-ml-py has no {name}"
                continue
            try:
                return fn(*args)
            except self.binding.NVMLError as exc:
                if exc.value == self.binding.NVML_ERROR_FUNCTION_NOT_FOUND:
                    error = f"NVML: {exc} ({name}: the driver is too old for it)"
                    continue
                error = f"NVML: {exc}"
                if exc.value == self.binding.NVML_ERROR_GPU_IS_LOST:
                    raise _GpuLost(error) from exc
                break
        self.warnings.append(DetectionWarning(field=field_path, reason=error or "NVML: no answer"))
        raise _Unanswered(field_path)

    def optional(self, field_path: str, fn_names: tuple[str, ...], *args: Any) -> Any | None:
        try:
            return self.query(field_path, fn_names, *args)
        except _Unanswered:
            return None


class _GpuLost(Exception):
    """NVML reports the GPU as lost (fallen off the bus, Xid 79)."""


def _text(value: Any) -> str:
    """NVML strings are bytes in old bindings and str in new ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _version_from_int(cuda_version: int) -> str:
    """12080 -> '12.8' (NVML encodes CUDA versions as 1000*major + 10*minor)."""
    return f"{cuda_version // 1000}.{cuda_version % 1000 // 10}"


def nvidia_driver_present(root: Path = Path("/"), platform: str = sys.platform) -> bool:
    """Whether an NVIDIA driver could answer, judged from files alone.

    On Linux the kernel driver exposes /proc/driver/nvidia and /dev/nvidiactl (containers get
    both from the NVIDIA container toolkit), and WSL2 exposes /dev/dxg. macOS has no NVIDIA
    driver for any torch that runs there. On Windows NVML is simply asked.
    """
    if platform == "darwin":
        return False
    if not platform.startswith("linux"):
        return True
    markers = ("proc/driver/nvidia/version", "dev/nvidiactl", "dev/dxg")
    return any((root / marker).exists() for marker in markers)


def read_nvidia_gpus(
    binding: Any = None,
    *,
    env: Mapping[str, str] | None = None,
) -> NvidiaReading:
    """Read the NVIDIA GPUs this process may use, without creating a CUDA context.

    ``env`` supplies ``CUDA_VISIBLE_DEVICES`` (and ``CUDA_DEVICE_ORDER``); GPUs hidden by it are
    left out and the rest are numbered as torch will number them.
    """
    reading = NvidiaReading()
    if binding is None:
        if not nvidia_driver_present():
            return reading  # no NVIDIA driver: skip importing the binding (~15 ms)
        try:
            import pynvml
        except ImportError:
            reading.warnings.append(
                DetectionWarning(
                    field="accelerators",
                    reason="nvidia-ml-py is not installed, so NVIDIA GPUs cannot be read "
                    "(pip install nvidia-ml-py)",
                )
            )
            return reading
        binding = pynvml
    try:
        binding.nvmlInit()
    except binding.NVMLError as exc:
        if exc.value == binding.NVML_ERROR_LIBRARY_NOT_FOUND:
            return reading  # no NVIDIA driver on this machine: nothing to report
        reading.warnings.append(
            DetectionWarning(field="accelerators", reason=f"NVML could not start: {exc}")
        )
        return reading
    reading.nvml_available = True
    session = _Session(binding, reading.warnings)
    try:
        _read_with(session, reading, env or {})
    finally:
        # The readings are complete; a failed shutdown changes none of them.
        with contextlib.suppress(binding.NVMLError):
            binding.nvmlShutdown()
    return reading


def _read_with(session: _Session, reading: NvidiaReading, env: Mapping[str, str]) -> None:
    driver = session.optional("software.nvidia_driver_version", ("nvmlSystemGetDriverVersion",))
    reading.driver_version = None if driver is None else _text(driver)
    cuda = session.optional(
        "software.cuda_driver_version",
        ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"),
    )
    reading.cuda_driver_version = None if cuda is None else _version_from_int(int(cuda))

    count = session.optional("accelerators", ("nvmlDeviceGetCount",))
    if not count:
        return
    devices: list[Device] = []
    for nvml_index in range(int(count)):
        try:
            devices.extend(_read_device(session, nvml_index))
        except (_GpuLost, _Unanswered) as exc:
            reading.warnings.append(
                DetectionWarning(
                    field=f"accelerators (NVML GPU {nvml_index})",
                    reason=f"left out: {exc}",
                )
            )
    visible = one_mig_device(cuda_visible(devices, env, reading.warnings), reading.warnings)
    reading.accelerators = [
        device.accelerator.model_copy(update={"index": position})
        for position, device in enumerate(visible)
    ]
    renumber_warnings(reading.warnings, {d.field_prefix: i for i, d in enumerate(visible)})


def _read_device(session: _Session, nvml_index: int) -> list[Device]:
    """One physical GPU: the GPU itself, or its MIG slices when MIG mode is on."""
    prefix = f"accelerators[nvml:{nvml_index}]"
    handle = session.query(prefix, ("nvmlDeviceGetHandleByIndex",), nvml_index)
    name = _text(session.query(f"{prefix}.name", ("nvmlDeviceGetName",), handle))
    cc_raw = session.optional(
        f"{prefix}.compute_capability", ("nvmlDeviceGetCudaComputeCapability",), handle
    )
    cc: ComputeCapability | None = None if cc_raw is None else (int(cc_raw[0]), int(cc_raw[1]))

    mig_slices = _read_mig_slices(session, handle, nvml_index, name, cc)
    if mig_slices:
        return mig_slices

    memory = session.optional(f"{prefix}.memory_total_bytes", ("nvmlDeviceGetMemoryInfo",), handle)
    if memory is None:
        session.warnings.append(
            DetectionWarning(field=f"{prefix}.memory_free_bytes", reason="no memory information")
        )
    accelerator = _accelerator(
        session,
        prefix,
        name=name,
        cc=cc,
        memory=memory,
        sm_count=_sm_count(session, prefix, handle, cc),
        uuid=_optional_text(session, f"{prefix}.uuid", "nvmlDeviceGetUUID", handle),
        pci_bus_id=_pci_bus_id(session, prefix, handle),
        mig=None,
    )
    return [Device(accelerator, nvml_index, prefix)]


def _read_mig_slices(
    session: _Session, handle: Any, nvml_index: int, name: str, cc: ComputeCapability | None
) -> list[Device]:
    prefix = f"accelerators[nvml:{nvml_index}]"
    if cc is None or cc < (8, 0):
        return []  # MIG exists from Ampere on; older drivers/GPUs do not even answer the query
    try:
        mode = session.binding.nvmlDeviceGetMigMode(handle)
    except (session.binding.NVMLError, AttributeError):
        return []  # not MIG-capable: the usual case, not worth a warning
    if not mode or int(mode[0]) != getattr(session.binding, "NVML_DEVICE_MIG_ENABLE", 1):
        return []
    slots = session.optional(f"{prefix}.mig", ("nvmlDeviceGetMaxMigDeviceCount",), handle) or 0
    devices: list[Device] = []
    for slot in range(int(slots)):
        try:
            mig_handle = session.binding.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except session.binding.NVMLError:
            continue  # an empty slot: NVML answers NOT_FOUND for slots with no instance
        mig_prefix = f"accelerators[nvml:{nvml_index}/mig:{slot}]"
        mig_name = _text(session.query(f"{mig_prefix}.name", ("nvmlDeviceGetName",), mig_handle))
        profile_match = _MIG_PROFILE.search(mig_name)
        attributes = session.optional(
            f"{mig_prefix}.sm_count",
            ("nvmlDeviceGetAttributes_v2", "nvmlDeviceGetAttributes"),
            mig_handle,
        )
        ids = {
            f"{kind}_instance_id": _small(
                session,
                f"{mig_prefix}.mig.{kind}_instance_id",
                session.optional(f"{mig_prefix}.mig.{kind}_instance_id", (function,), mig_handle),
            )
            for kind, function in (
                ("gpu", "nvmlDeviceGetGpuInstanceId"),
                ("compute", "nvmlDeviceGetComputeInstanceId"),
            )
        }
        profile = profile_match.group(1) if profile_match else "unknown"
        mig = MigSlice(profile=profile, parent_name=name, **ids)
        memory = session.optional(
            f"{mig_prefix}.memory_total_bytes", ("nvmlDeviceGetMemoryInfo",), mig_handle
        )
        accelerator = _accelerator(
            session,
            mig_prefix,
            name=mig_name,
            cc=cc,
            memory=memory,
            sm_count=None if attributes is None else int(attributes.multiprocessorCount) or None,
            uuid=_optional_text(session, f"{mig_prefix}.uuid", "nvmlDeviceGetUUID", mig_handle),
            pci_bus_id=_pci_bus_id(session, prefix, handle),
            mig=mig,
        )
        devices.append(Device(accelerator, nvml_index, mig_prefix))
    return devices


def _accelerator(
    session: _Session,
    prefix: str,
    *,
    name: str,
    cc: ComputeCapability | None,
    memory: Any,
    sm_count: int | None,
    uuid: str | None,
    pci_bus_id: str | None,
    mig: MigSlice | None,
) -> Accelerator:
    """The GPU as NVML describes it; a number no GPU can have (a driver's or a vGPU's odd
    answer: 0 bytes, 2 EiB, 10,000 SMs) is left out with a warning, never the whole GPU."""
    total = None if memory is None else int(memory.total)
    if total == 0:
        session.warnings.append(
            DetectionWarning(field=f"{prefix}.memory_total_bytes", reason="NVML answered 0 bytes")
        )
    values: dict[str, Any] = {
        "index": 0,  # renumbered once CUDA_VISIBLE_DEVICES has been applied
        "vendor": Vendor.NVIDIA,
        "backend": Backend.CUDA,
        "name": name,
        "architecture": Architecture.UNKNOWN if cc is None else nvidia_architecture(cc),
        "compute_capability": cc,
        "tensor_cores": None if cc is None else nvidia_has_tensor_cores(cc, name),
        "memory_total_bytes": total or None,
        "memory_free_bytes": None if memory is None else int(memory.free),
        "sm_count": sm_count,
        "unified_memory": nvidia_unified_memory(cc, name),
        "mig": mig,
        "uuid": uuid,
        "pci_bus_id": pci_bus_id,
    }
    try:
        return Accelerator(**values)
    except ValidationError as error:
        odd = {str(problem["loc"][0]): problem for problem in error.errors()}
        if not odd.keys() <= _LEFT_OUT_WHEN_ODD:
            raise
        for key, problem in odd.items():
            values[key] = None
            session.warnings.append(
                DetectionWarning(
                    field=f"{prefix}.{key}",
                    reason=f"NVML answered {problem['input']!r}, which no GPU has "
                    f"({problem['msg']}); left out",
                )
            )
    return Accelerator(**values)


_LEFT_OUT_WHEN_ODD = frozenset(
    {"memory_total_bytes", "memory_free_bytes", "sm_count", "compute_capability"}
)


def _small(session: _Session, field_path: str, value: Any) -> int | None:
    """A MIG instance id as NVML gave it, or None with a warning where no id is that."""
    if value is None or 0 <= int(value) <= MAX_SMALL_COUNT:
        return None if value is None else int(value)
    session.warnings.append(
        DetectionWarning(field=field_path, reason=f"NVML answered {value!r}; left out")
    )
    return None


def _sm_count(
    session: _Session, prefix: str, handle: Any, cc: ComputeCapability | None
) -> int | None:
    """SM count from NVML's CUDA-core count and the cores per SM of the architecture.

    NVML has no direct SM count for a whole GPU (nvmlDeviceGetAttributes answers for MIG
    handles only), but ``nvmlDeviceGetNumGpuCores`` (drivers >= 520) gives the FP32 cores.
    """
    field_path = f"{prefix}.sm_count"
    per_sm = None if cc is None else cuda_cores_per_sm(cc)
    if per_sm is None:
        session.warnings.append(
            DetectionWarning(
                field=field_path,
                reason="cores per SM unknown for this compute capability; "
                "run 'autotune detect --deep' to read it through torch",
            )
        )
        return None
    cores = session.optional(field_path, ("nvmlDeviceGetNumGpuCores",), handle)
    if cores is None or int(cores) % per_sm:
        if cores is not None:
            session.warnings.append(
                DetectionWarning(
                    field=field_path,
                    reason=f"{cores} CUDA cores is not a multiple of {per_sm} per SM",
                )
            )
        return None
    return int(cores) // per_sm or None


def _optional_text(session: _Session, field_path: str, fn_name: str, handle: Any) -> str | None:
    value = session.optional(field_path, (fn_name,), handle)
    return None if value is None else _text(value)


def _pci_bus_id(session: _Session, prefix: str, handle: Any) -> str | None:
    info = session.optional(f"{prefix}.pci_bus_id", ("nvmlDeviceGetPciInfo",), handle)
    return None if info is None else _text(info.busId)
