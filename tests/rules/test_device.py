"""Which GPUs the installed torch can drive (rules catalog D1, E1): the driver against torch's
CUDA, the wheel's kernels against each GPU, and only the GPUs of the build's own vendor."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tests.rules.helpers import snapshot, with_software
from torch_autotune.hardware import NO_GPU_FOR_TORCH, DetectionWarning, HardwareSnapshot
from torch_autotune.profile import Profile
from torch_autotune.rules.backend import _covered
from torch_autotune.rules.engine import build_profile


def _profile(machine: HardwareSnapshot) -> Profile:
    return build_profile(machine, now=datetime(2026, 11, 1, tzinfo=timezone.utc), host_id="t")


@pytest.mark.parametrize(
    ("torch_version", "torch_cuda", "driver_cuda", "device"),
    [
        ("2.13.0+cu130", "13.0", "12.4", "cpu"),  # cu130 needs a CUDA 13 driver (580)
        ("2.13.0+cu130", "13.0", "13.0", "cuda"),
        ("2.8.0+cu128", "12.8", "12.2", "cuda"),  # minor version compatibility within 12.x
        ("2.8.0+cu128", "12.8", "11.8", "cpu"),
        ("1.12.1+cu102", "10.2", "10.1", "cpu"),  # before CUDA 11: the driver's CUDA or newer
        ("2.8.0+cu128", "12.8", None, "cuda"),  # the driver's CUDA unknown: nothing to refuse on
    ],
)
def test_a_driver_older_than_torchs_cuda_gets_no_gpu_profile_and_the_fix(
    torch_version: str, torch_cuda: str, driver_cuda: str | None, device: str
) -> None:
    machine = with_software(
        "h100-80gb-hbm3",
        torch_version=torch_version,
        torch_cuda_version=torch_cuda,
        cuda_driver_version=driver_cuda,
        torch_cuda_arch_list=("sm_70", "sm_75", "sm_80", "sm_86", "sm_90"),
    )
    profile = _profile(machine)
    decision = profile.decision("device")
    assert decision is not None
    assert profile.settings.device == device, decision.reason
    if device == "cpu":
        assert decision.rule == "E1"
        assert f"built for CUDA {torch_cuda}" in decision.reason
        assert f"runs CUDA up to {driver_cuda}" in decision.reason
        assert "Install a driver for CUDA" in decision.reason


def test_a_deep_detection_where_torch_itself_was_asked_is_not_second_guessed() -> None:
    """A container's CUDA forward compatibility runs cu130 on a CUDA 12 driver: where torch
    itself answered (a deep detection), the driver's version refuses nothing."""
    machine = with_software(
        "h100-80gb-hbm3",
        torch_version="2.13.0+cu130",
        torch_cuda_version="13.0",
        cuda_driver_version="12.4",
        torch_cuda_arch_list=("sm_90",),
    ).model_copy(update={"detection_depth": "deep"})
    assert _profile(machine).settings.device == "cuda"
    torch_saw_none = machine.model_copy(
        update={"warnings": (DetectionWarning(field="accelerators", reason=NO_GPU_FOR_TORCH),)}
    )
    assert _profile(torch_saw_none).settings.device == "cpu"  # and the driver is why


@pytest.mark.parametrize(
    ("cc", "arch_list", "covered"),
    [
        ((8, 6), ("sm_80",), True),  # a cubin runs on its major's later minors
        ((9, 0), ("sm_86",), False),
        ((9, 0), ("sm_90a",), True),  # arch-specific: that cc alone
        ((10, 3), ("sm_100a",), False),
        ((10, 3), ("sm_100f",), True),  # family: the major's later minors
        ((12, 1), ("compute_120",), True),  # PTX: any newer GPU
        ((10, 3), ("compute_90a",), False),  # arch-specific PTX: that cc alone
        ((10, 3), ("compute_100f",), True),  # family PTX: the major's later minors
        ((12, 0), ("compute_100f",), False),
        ((9, 0), ("sm_80", "sm_9"), False),  # a malformed entry counts for nothing
        ((9, 0), ("", "sm_", "gfx942", "SM_90"), True),
    ],
)
def test_the_kernels_a_wheel_lists_cover_the_gpus_nvidia_says_they_run_on(
    cc: tuple[int, int], arch_list: tuple[str, ...], covered: bool
) -> None:
    assert _covered(cc, arch_list) is covered


def test_a_malformed_arch_list_gives_a_profile_not_a_crash() -> None:
    machine = with_software("h100-80gb-hbm3", torch_cuda_arch_list=("sm_80", "sm_9"))
    decision = _profile(machine).decision("device")
    assert decision is not None
    assert (decision.value, decision.rule) == ("cpu", "E1")
    assert "ships kernels for sm_80 sm_9" in decision.reason


def _nvidia_and_amd(build: str) -> HardwareSnapshot:
    """An H100 and an MI300X in one box, with a CUDA or a ROCm build of torch."""
    nvidia, amd = snapshot("h100-80gb-hbm3"), snapshot("mi300x-rocm")
    gpus = (nvidia.accelerators[0], amd.accelerators[0].model_copy(update={"index": 1}))
    software = nvidia.software if build == "cuda" else amd.software
    return nvidia.model_copy(update={"accelerators": gpus, "software": software})


def test_a_cuda_build_in_a_box_with_an_amd_gpu_too_trains_on_the_nvidia_gpu_alone() -> None:
    profile = _profile(_nvidia_and_amd("cuda"))
    nvidia_alone = _profile(snapshot("h100-80gb-hbm3"))
    assert profile.settings.device == "cuda"
    assert profile.settings.precision == nvidia_alone.settings.precision
    assert profile.settings.matmul.tf32 is True
    assert profile.settings.compile.enabled == nvidia_alone.settings.compile.enabled
    assert profile.topology.processes_per_node == 1
    device = profile.decision("device")
    assert device is not None
    assert "1 NVIDIA GPU(s)" in device.reason


def test_a_rocm_build_in_a_box_with_an_nvidia_gpu_too_trains_on_the_amd_gpu_alone() -> None:
    profile = _profile(_nvidia_and_amd("rocm"))
    amd_alone = _profile(snapshot("mi300x-rocm"))
    assert profile.settings.device == "cuda"
    assert profile.settings.precision == amd_alone.settings.precision
    assert profile.settings.matmul.tf32 == amd_alone.settings.matmul.tf32
    assert profile.topology.processes_per_node == 1


@pytest.mark.parametrize(
    ("cc", "advice"),
    [
        ((3, 7), "No CUDA build of current torch runs it: the cu126 wheels start at Maxwell"),
        ((6, 1), "Install the cu126 build of torch"),
    ],
)
def test_a_gpu_the_wheel_has_no_kernels_for_gets_a_build_that_has_them(
    cc: tuple[int, int], advice: str
) -> None:
    """A Tesla K80 (sm_37) under a cu128 wheel was told to install the cu126 build, which
    starts at sm_50 and cannot run it either."""
    t4 = with_software(
        "tesla-t4",
        torch_version="2.8.0+cu128",
        torch_cuda_version="12.8",
        torch_cuda_arch_list=("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"),
    )
    gpu = t4.accelerators[0].model_copy(update={"compute_capability": cc})
    profile = _profile(t4.model_copy(update={"accelerators": (gpu,)}))
    decision = profile.decision("device")
    assert decision is not None
    assert profile.settings.device == "cpu"
    assert f"is sm_{cc[0]}{cc[1]}, but torch 2.8.0+cu128 ships kernels for" in decision.reason
    assert advice in decision.reason
