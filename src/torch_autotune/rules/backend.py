"""Which device the profile trains on: the back end and the wheel/architecture gate.

Rules catalog D1 (back end), E1-E7 (a GPU whose architecture the installed torch ships no
kernels for, or whose driver is older than torch's CUDA, gets no GPU profile; the reason names
the torch build or the driver that would run it; only the GPUs of the build's own vendor
count: a CUDA build drives no AMD GPU, a ROCm build no NVIDIA one) and the
mixed-GPU rule (a box with different GPUs gets a profile that holds on the weakest).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from torch_autotune.hardware import (
    NO_GPU_FOR_TORCH,
    Accelerator,
    Backend,
    HardwareSnapshot,
    Vendor,
)
from torch_autotune.rules.context import Context, Finding


def _covered(cc: tuple[int, int], arch_list: tuple[str, ...]) -> bool:
    """Whether a wheel's kernels run on compute capability ``cc``.

    A cubin for sm_XY runs on every GPU of major X with minor >= Y (NVIDIA's binary
    compatibility within a major version, torch's ``_check_cubins``), one for sm_XYa (features
    of that one architecture) on cc X.Y alone, one for sm_XYf on the family (major X, minor
    >= Y); PTX (compute_XY) is compiled by the driver for any newer GPU, arch-specific and
    family PTX (compute_XYa, compute_XYf) as their cubins. An entry in none of these forms is
    not counted.
    """
    for entry in arch_list:
        form = _ARCH.fullmatch(entry.strip().lower())
        if form is None:
            continue
        kind, number, suffix = form.groups()
        built = (int(number[:-1]), int(number[-1]))
        if suffix == "a":
            runs = built == cc
        elif suffix == "f" or kind == "sm":
            runs = built[0] == cc[0] and built[1] <= cc[1]
        else:  # plain PTX: compiled by the driver for any newer GPU
            runs = built <= cc
        if runs:
            return True
    return False


_ARCH = re.compile(r"(sm|compute)_(\d{2,})([af]?)")


def _wheel_advice(cc: tuple[int, int], torch_version: str | None) -> str:
    """Which torch build runs a GPU of this compute capability (catalog E2-E5)."""
    if cc[0] == 11:  # Jetson Thor, sm_110: CUDA 13 on aarch64
        return "install torch built for CUDA 13 on aarch64 (the cu130 wheels, or JetPack's)"
    if cc >= (10, 0):
        return "install torch 2.7 or newer built for CUDA 12.8 or newer (the cu128 wheels)"
    if cc < (5, 0):  # Kepler: CUDA 11.1-11.7 wheels were the last with sm_37 (catalog E4)
        return (
            "no CUDA build of current torch runs it: the cu126 wheels start at Maxwell "
            "(sm_50), and the last wheels with Kepler's sm_37 were built for CUDA 11.7 "
            "(torch 2.0 and older, cu117); install one of those, build torch from source, or "
            "train on the CPU"
        )
    if cc < (7, 0):
        return (
            "install the cu126 build of torch "
            "(pip install torch --index-url https://download.pytorch.org/whl/cu126)"
        )
    if cc < (7, 5):
        return "install the cu126 build of torch: newer CUDA builds dropped Volta"
    return f"install an official CUDA build of torch (this is {torch_version})"


def _driver_gate(ctx: Context) -> str | None:
    """Why the NVIDIA driver cannot run the installed torch's CUDA, or None where it can (or
    either version is unknown). From CUDA 11 on, a build runs on any driver of its CUDA major
    or newer (minor version compatibility: CUDA 11.x needs driver 450.80.02 or newer, 12.x
    525, 13.x 580); before it, on a driver of that CUDA version or newer. NVIDIA's CUDA
    compatibility guide."""
    software = ctx.snapshot.software
    built = _major_minor(software.torch_cuda_version)
    driver = _major_minor(software.cuda_driver_version)
    if built is None or driver is None or _torch_saw_a_gpu(ctx.snapshot):
        return None  # torch itself drove one: a container's CUDA forward compatibility
    needed = built if built < (11, 0) else (built[0], 0)
    if driver >= needed:
        return None
    named = " ".join(filter(None, ("the NVIDIA driver", software.nvidia_driver_version)))
    return (
        f"torch {software.torch_version} is built for CUDA {built[0]}.{built[1]}, but {named} "
        f"runs CUDA up to {driver[0]}.{driver[1]}: torch would find no usable GPU "
        f"(torch.cuda.is_available() False), unless a CUDA forward-compatibility package is "
        f"installed ('autotune detect --deep' asks torch). Install a driver for CUDA "
        f"{needed[0]}.{needed[1]} or newer, or the torch build for your driver's CUDA "
        f"({driver[0]}.x)"
    )


def _torch_saw_a_gpu(snapshot: HardwareSnapshot) -> bool:
    """A deep detection in which torch was asked and did not say it sees no GPU."""
    said = {w.reason for w in snapshot.warnings}
    return snapshot.detection_depth == "deep" and NO_GPU_FOR_TORCH not in said


def _major_minor(version: str | None) -> tuple[int, int] | None:
    form = re.match(r"(\d+)\.(\d+)", version or "")
    return None if form is None else (int(form.group(1)), int(form.group(2)))


def _nvidia_gate(ctx: Context, gpus: list[Accelerator]) -> str | None:
    """Why the installed torch cannot run these NVIDIA GPUs, or None when it can."""
    driver = _driver_gate(ctx)
    if driver is not None:
        return driver
    software = ctx.snapshot.software
    arch_list = software.torch_cuda_arch_list
    if arch_list is None:
        return None  # unknown: nothing to refuse on; detect --deep reads the real list
    for gpu in gpus:
        cc = gpu.compute_capability
        if cc is None or _covered(cc, arch_list):
            continue
        shipped = " ".join(arch_list) or "none"
        advice = _wheel_advice(cc, software.torch_version)
        return (
            f"{gpu.name} is sm_{cc[0]}{cc[1]}, but torch {software.torch_version} ships kernels "
            f"for {shipped}: every GPU kernel would fail with 'no kernel image is available'. "
            f"{advice[0].upper()}{advice[1:]}"  # str.capitalize() made CUDA 'cuda'
        )
    return None


def choose_device(ctx: Context) -> Iterator[Finding]:
    """D1, E1-E7: train on the GPUs the installed torch can drive, else on the CPU."""
    snapshot = ctx.snapshot
    build = snapshot.software.torch_build
    cuda_gpus = [a for a in snapshot.accelerators if a.backend is Backend.CUDA]
    rocm_gpus = [a for a in snapshot.accelerators if a.backend is Backend.ROCM]
    mps_gpus = [a for a in snapshot.accelerators if a.backend is Backend.MPS]

    if build == "absent":
        yield Finding("device", "cpu", "D1", "torch is not installed: install it before training")
        return
    if cuda_gpus and build == "cuda":
        refusal = _nvidia_gate(ctx, cuda_gpus)
        if refusal is not None:
            yield Finding("device", "cpu", "E1", f"No GPU profile: {refusal}.")
            return
        names = sorted({a.name for a in cuda_gpus})
        reason = f"{len(cuda_gpus)} NVIDIA GPU(s) ({', '.join(names)}) and a CUDA build of torch"
        if len(names) > 1:
            reason += (
                "; the GPUs differ, so every setting below is chosen to hold on the weakest of them"
            )
        yield Finding("device", "cuda", "D1", reason)
        return
    if rocm_gpus and build == "rocm":
        names = sorted({a.name for a in rocm_gpus})
        yield Finding(
            "device",
            "cuda",
            "D1",
            f"{len(rocm_gpus)} AMD GPU(s) ({', '.join(names)}) and a ROCm build of torch, which "
            "drives them through the 'cuda' device; NVIDIA compute-capability rules do not apply",
        )
        return
    if mps_gpus and snapshot.host.os_name == "darwin":
        yield Finding("device", "mps", "D1", f"{mps_gpus[0].name}: Apple GPU through MPS")
        return
    gpus = cuda_gpus or rocm_gpus
    if gpus:
        vendor = "NVIDIA" if gpus[0].vendor is Vendor.NVIDIA else "AMD"
        wanted = "CUDA" if vendor == "NVIDIA" else "ROCm"
        yield Finding(
            "device",
            "cpu",
            "E1",
            f"No GPU profile: this machine has {vendor} GPUs but torch "
            f"{snapshot.software.torch_version} is a {build.upper()} build; install the "
            f"{wanted} build of torch to use them",
        )
        return
    yield Finding("device", "cpu", "D1", "no GPU this process can use: training on the CPU")
