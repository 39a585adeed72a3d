"""Python and the installed torch stack, read without importing torch.

Importing torch costs seconds; its version, the CUDA/HIP version it was built for, and the cuDNN
and Triton packages it depends on are all readable from installed-package metadata and from
``torch/version.py`` (a plain file of assignments, parsed here, never executed). The GPU
architectures the wheel ships kernels for are compiled into the binary; the fast path infers them
from PyTorch's published build matrix (``wheel_arch_list``) and says so, and a deep detection
reads them from torch itself.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import platform
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch_autotune.hardware import DetectionWarning


@dataclass(frozen=True)
class TorchBuild:
    """What ``torch/version.py`` says about the installed build."""

    version: str
    cuda: str | None
    hip: str | None


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def read_torch_build(
    find_package_dir: Callable[[str], Path | None] | None = None,
) -> TorchBuild | None:
    """Parse torch/version.py of the installed torch without importing torch; None if absent."""
    find = find_package_dir or _package_dir
    directory = find("torch")
    if directory is None:
        return None
    try:
        tree = ast.parse((directory / "version.py").read_text())
    except (OSError, SyntaxError, ValueError):
        version = _distribution_version("torch")
        return None if version is None else TorchBuild(version, None, None)
    values: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    values[target.id] = node.value.value
    declared = values.get("__version__")
    version = declared if isinstance(declared, str) else _distribution_version("torch")

    def text(key: str) -> str | None:
        value = values.get(key)
        return value if isinstance(value, str) and value else None

    return TorchBuild(version=version or "unknown", cuda=text("cuda"), hip=text("hip"))


def _package_dir(name: str) -> Path | None:
    """Directory of an installed top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


# --- the GPU architectures a wheel ships kernels for ------------------------------------------
# PyTorch's published build matrix (RELEASE.md "CUDA architectures", rules catalog E1-E4, Q) and,
# before it, the builder's manywheel/build_cuda.sh (TORCH_CUDA_ARCH_LIST by CUDA version):
#   CUDA 10.x wheels: sm_37 sm_50 sm_60 sm_70 (Kepler to Volta; some added sm_75, which
#   Volta's cubins run on anyway); CUDA 11.0: sm_37 ... sm_80;
#   CUDA 11.1-11.7 wheels: sm_37 ... sm_86 (Kepler to Ampere);
#   CUDA 11.8 and 12.0-12.6 wheels: sm_50 ... sm_90 (Maxwell to Hopper);
#   CUDA 12.8/12.9 wheels of 2.7: sm_50 ... sm_120; of 2.8-2.10: Maxwell and Pascal dropped
#   (sm_70 ... sm_120); from 2.11: Volta dropped too (sm_75 ... sm_120);
#   CUDA 13.x wheels: sm_75 ... sm_120 (CUDA 13 cannot target anything older than Turing);
#   the aarch64 ones sm_110 (Jetson Thor) too.
_UP_TO_HOPPER = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")
_BLACKWELL = ("sm_100", "sm_120")


def wheel_arch_list(
    torch_version: str, cuda_version: str, cpu_architecture: str | None = None
) -> tuple[str, ...] | None:
    """Architectures an official torch wheel for this CUDA version carries; None when unknown:
    a build the table does not describe (NVIDIA's containers and JetPack, ``a0+git`` source
    builds: a pre-release with a local label other than ``+cuXYZ``) or a CUDA before 10."""
    from packaging.version import InvalidVersion, Version

    try:
        torch = Version(torch_version)
        cuda = Version(cuda_version).release[:2]
    except InvalidVersion:
        return None
    torch_release = torch.release[:2]
    official_label = torch.local is None or re.fullmatch(r"cu\d+", torch.local) is not None
    if not official_label or (torch.pre is not None and torch.local is not None):
        return None  # 2.9.0a0+145a3a7.nv25.10, 2.5.0a0+git1c2d3e4: built for other targets
    if cuda < (10, 0):
        return None
    if cuda < (11, 0):
        return ("sm_37", *_UP_TO_HOPPER[:3])
    if cuda < (11, 1):
        return ("sm_37", *_UP_TO_HOPPER[:3], "sm_75", "sm_80")
    if cuda < (11, 8):
        return ("sm_37", *_UP_TO_HOPPER[:-1])
    if cuda < (12, 8):
        return _UP_TO_HOPPER
    if cuda >= (13, 0):
        arm = (cpu_architecture or platform.machine()).lower() in {"aarch64", "arm64"}
        return (*_UP_TO_HOPPER[3:], "sm_100", *(("sm_110",) if arm else ()), "sm_120")
    if cuda <= (12, 9):
        if torch_release < (2, 7):
            return None  # no official 12.8 wheels before 2.7: a custom build
        if torch_release == (2, 7):
            return (*_UP_TO_HOPPER, *_BLACKWELL)
        if torch_release < (2, 11):
            return (*_UP_TO_HOPPER[2:], *_BLACKWELL)
        return (*_UP_TO_HOPPER[3:], *_BLACKWELL)
    return None


def _cudnn_version(cuda_version: str) -> str | None:
    """cuDNN from the nvidia-cudnn-cu<major> wheel that torch's CUDA major depends on.

    Only the wheel of torch's own CUDA major counts: pip leaves a cu13 cuDNN behind when a cu13
    torch is replaced by a cu12 one, and that stale wheel is not what torch loads.
    """
    major = cuda_version.split(".", 1)[0]
    version = _distribution_version(f"nvidia-cudnn-cu{major}")
    return None if version is None else ".".join(version.split(".")[:3])


def _triton_version() -> str | None:
    for name in ("triton", "pytorch-triton", "pytorch-triton-rocm", "triton-windows", "triton-xpu"):
        version = _distribution_version(name)
        if version is not None:
            return version
    return None


def default_start_method() -> str:
    """The multiprocessing start method DataLoader workers will get, without fixing it.

    ``multiprocessing.get_start_method()`` would set the context as a side effect, after which
    the user's own ``set_start_method`` raises. A process that set a method has imported
    multiprocessing, so it is asked only then; otherwise the platform default is the answer
    (what ``get_all_start_methods()[0]`` says, without the ~5 ms import).
    """
    loaded = sys.modules.get("multiprocessing")
    chosen = None if loaded is None else loaded.get_start_method(allow_none=True)
    if chosen:
        return str(chosen)
    if sys.platform in ("win32", "darwin"):
        return "spawn"  # macOS since Python 3.8
    return "forkserver" if sys.version_info >= (3, 14) else "fork"


@dataclass(frozen=True)
class SoftwareReading:
    python_version: str
    python_implementation: str
    python_gil_enabled: bool
    multiprocessing_start_method: str
    torch: TorchBuild | None
    torch_cuda_arch_list: tuple[str, ...] | None
    torch_cuda_arch_list_source: str | None
    cudnn_version: str | None
    triton_available: bool
    triton_version: str | None


def read_software(
    find_package_dir: Callable[[str], Path | None] | None = None,
) -> tuple[SoftwareReading, list[DetectionWarning]]:
    """Python and torch facts from metadata; nothing here imports torch."""
    warnings: list[DetectionWarning] = []
    torch = read_torch_build(find_package_dir)
    arch_list, arch_source, cudnn = _gpu_kernels(torch, warnings)
    triton_spec_found = _package_dir("triton") is not None
    gil_check = getattr(sys, "_is_gil_enabled", None)
    reading = SoftwareReading(
        python_version=platform.python_version(),
        python_implementation=platform.python_implementation(),
        python_gil_enabled=True if gil_check is None else bool(gil_check()),
        multiprocessing_start_method=default_start_method(),
        torch=torch,
        torch_cuda_arch_list=arch_list,
        torch_cuda_arch_list_source=arch_source,
        cudnn_version=cudnn,
        triton_available=triton_spec_found,
        triton_version=_triton_version() if triton_spec_found else None,
    )
    return reading, warnings


def _gpu_kernels(
    torch: TorchBuild | None, warnings: list[DetectionWarning]
) -> tuple[tuple[str, ...] | None, str | None, str | None]:
    """(the wheel's CUDA architectures, where that list came from, the cuDNN version) as far
    as metadata tells; what it cannot tell is a warning naming 'detect --deep'."""
    if torch is None:
        warnings.append(
            DetectionWarning(
                field="software.torch_version",
                reason="torch is not installed; install the build for this machine "
                "(https://pytorch.org/get-started/locally/)",
            )
        )
        return None, None, None
    if torch.hip is not None:
        warnings.append(
            DetectionWarning(
                field="software.torch_cuda_arch_list",
                reason="the gfx targets of a ROCm build are read by 'autotune detect --deep'",
            )
        )
        return None, None, None
    if torch.cuda is None:
        return (), "release-table", None  # a CPU build ships no GPU kernels
    arch_list = wheel_arch_list(torch.version, torch.cuda)
    if arch_list is None:
        warnings.append(
            DetectionWarning(
                field="software.torch_cuda_arch_list",
                reason=f"torch {torch.version} is not an official build PyTorch publishes "
                "an architecture list for; 'autotune detect --deep' reads it from torch",
            )
        )
    cudnn = _cudnn_version(torch.cuda)
    if cudnn is None:
        warnings.append(
            DetectionWarning(
                field="software.cudnn_version",
                reason="no nvidia-cudnn wheel installed (cuDNN bundled with torch or from "
                "the system); 'autotune detect --deep' asks torch",
            )
        )
    return arch_list, None if arch_list is None else "release-table", cudnn
