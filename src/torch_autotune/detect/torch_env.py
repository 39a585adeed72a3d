"""What only torch can answer: the deep detection path.

Importing torch costs seconds and ``torch.cuda`` queries create a CUDA context, so this module
runs only when asked (``autotune detect --deep``) or when nothing else can see the accelerators:
a ROCm build, whose GPUs NVML does not see, is read in a child process
(``read_torch_elsewhere``), so that a fast detection still imports no torch and starts no GPU
runtime in the caller's process. The torch module is injected so tests pass a fake one.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch_autotune.hardware import (
    NO_GPU_FOR_TORCH,
    Accelerator,
    Architecture,
    Backend,
    DetectionWarning,
    HardwareSnapshot,
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


def with_threads_here(machine: HardwareSnapshot) -> HardwareSnapshot:
    """``machine`` with this process's torch.get_num_threads() (not in the fingerprint), torch
    already imported; as it was where torch cannot say."""
    import torch

    with contextlib.suppress(AttributeError, RuntimeError):
        threads = int(torch.get_num_threads())
        software = machine.software.model_copy(update={"torch_num_threads": threads})
        return machine.model_copy(update={"software": software})
    return machine


def cudnn_version_text(number: int) -> str:
    """torch.backends.cudnn.version() -> 'major.minor.patch' (8902 -> 8.9.2, 91002 -> 9.10.2)."""
    if number >= 90000:
        return f"{number // 10000}.{number % 10000 // 100}.{number % 100}"
    return f"{number // 1000}.{number % 1000 // 100}.{number % 100}"


_MARK = "torch_autotune reading: "


def read_torch_elsewhere(env: Mapping[str, str], *, timeout_s: float = 60.0) -> TorchReading:
    """``read_torch`` in a child Python with ``env``: torch is imported and the GPU runtime
    started there, never here; free memory is not asked (it would start a context on every
    GPU). Asked once per process and variables (``_ANSWERED``). Where the child fails, says
    nothing, or cannot be started, a reading with no accelerators and a warning that says
    why."""
    key = tuple(sorted(env.items()))
    if key not in _ANSWERED:  # a failure is kept too: a child that timed out is not waited on again
        answer, why = _asked(env, timeout_s)
        if answer is None:
            answer = TorchReading()
            answer.warnings.append(
                DetectionWarning(
                    field="accelerators",
                    reason=f"torch, asked in a child process for the GPUs NVML does not see, did"
                    f" not answer ({why}); 'autotune detect --deep' asks it in this process",
                )
            )
        _ANSWERED[key] = answer
    return _ANSWERED[key]


def _asked(env: Mapping[str, str], timeout_s: float) -> tuple[TorchReading | None, str]:
    """The child's reading, or None and why. It imports as this process would, this package
    found after everything else on its path, and nothing from the current directory (its
    empty entry is dropped: a ``torch.py`` there); a frozen application has no Python to run
    it (its interpreter is the application itself)."""
    if getattr(sys, "frozen", False):
        return None, "a frozen application has no Python interpreter to run it"
    here = str(Path(__file__).resolve().parents[2])  # the directory torch_autotune is in
    child = (
        f"import sys; sys.path[:] = [p for p in sys.path if p] + [{here!r}]; "
        "from torch_autotune.detect.torch_env import _answer; _answer()"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", child],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        said = [line for line in done.stdout.splitlines() if line.startswith(_MARK)]
        if said:
            return _reading_from(json.loads(said[-1].removeprefix(_MARK))), ""
        return None, (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout_s:g} s"
    except (OSError, ValueError) as exc:  # ValueError: an answer that is not its JSON
        return None, f"{type(exc).__name__}: {exc}"


_ANSWERED: dict[tuple[tuple[str, str], ...], TorchReading] = {}
"""The child's answers in this process, by the variables it ran with: asked once each."""


def _answer() -> None:
    """The child of ``read_torch_elsewhere``: torch's reading, as one marked line of JSON."""
    torch = import_torch()
    reading = TorchReading() if torch is None else read_torch(torch, free_memory=False)
    if torch is None:
        reading.warnings.append(
            DetectionWarning(field="accelerators", reason="torch could not be imported")
        )
    answer = {
        "accelerators": [a.model_dump(mode="json") for a in reading.accelerators],
        "cudnn_version": reading.cudnn_version,
        "arch_list": None if reading.arch_list is None else list(reading.arch_list),
        "warnings": [w.model_dump(mode="json") for w in reading.warnings],
    }
    sys.stdout.write(f"{_MARK}{json.dumps(answer)}\n")
    sys.stdout.flush()


def _reading_from(answer: dict[str, Any]) -> TorchReading:
    arch_list = answer.get("arch_list")
    return TorchReading(
        accelerators=[Accelerator.model_validate(a) for a in answer.get("accelerators", [])],
        cudnn_version=answer.get("cudnn_version"),
        arch_list=None if arch_list is None else tuple(arch_list),
        warnings=[DetectionWarning.model_validate(w) for w in answer.get("warnings", [])],
    )


def read_torch(torch: Any, *, free_memory: bool = True) -> TorchReading:
    """Accelerators and build facts from an imported torch module (``free_memory``: also ask
    each GPU's free memory, which starts a context on it)."""
    reading = TorchReading()
    with contextlib.suppress(AttributeError, RuntimeError):
        reading.num_threads = int(torch.get_num_threads())
    hip = getattr(torch.version, "hip", None)
    if getattr(torch.version, "cuda", None) is not None or hip is not None:
        _read_cuda_devices(torch, reading, rocm=hip is not None, free_memory=free_memory)
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


def _read_cuda_devices(
    torch: Any, reading: TorchReading, *, rocm: bool, free_memory: bool = True
) -> None:
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
        reading.warnings.append(DetectionWarning(field="accelerators", reason=NO_GPU_FOR_TORCH))
        return
    for index in range(int(torch.cuda.device_count())):
        try:
            props = torch.cuda.get_device_properties(index)
            free = torch.cuda.mem_get_info(index)[0] if free_memory else None
        except RuntimeError as exc:
            reading.warnings.append(
                DetectionWarning(field=f"accelerators[{index}]", reason=f"left out: torch: {exc}")
            )
            continue
        reading.accelerators.append(
            _accelerator(index, props, None if free is None else int(free), rocm=rocm)
        )


def _accelerator(index: int, props: Any, free: int | None, *, rocm: bool) -> Accelerator:
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
