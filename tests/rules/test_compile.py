"""torch.compile rule (catalog §D, D.1 gates and D.2 mode) over the recorded machines."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Mode, Preferences, torch_release
from torch_autotune.rules.backend import choose_device
from torch_autotune.rules.compile import compile_settings
from torch_autotune.rules.context import Context, Finding
from torch_autotune.rules.precision import precision

from .helpers import (
    ALL_FIXTURES,
    context,
    invariant_problems,
    only_gpu,
    run,
    snapshot,
    values,
    with_host,
    with_software,
)

COMPILE_SETTINGS = {"compile.enabled", "compile.mode", "compile.memory_budget"}


def compile_of(machine: str | HardwareSnapshot, **preferences: Any) -> dict[str, Finding]:
    """compile_settings after the rules it follows (backend, precision)."""
    return run(context(machine, precision, **preferences), compile_settings)


# --- the fixture table ----------------------------------------------------------------------------

# fixture, enabled, catalog id of compile.enabled, a fact its reason must mention
COMPILE_TABLE = [
    pytest.param("tesla-p100-pcie-16gb", False, "D7", "cc 6.0", id="p100"),
    pytest.param("gtx-1080-ti", False, "D7", "cc 6.1", id="gtx-1080-ti"),
    pytest.param("gtx-1080-ti-driver-460", False, "D1", "torch 1.12.1", id="gtx-1080-ti-old"),
    pytest.param("tesla-p40", False, "D7", "cc 6.1", id="tesla-p40"),
    pytest.param("tesla-v100-sxm2-16gb", True, "D8", "cc 7.0", id="tesla-v100-sxm2-16gb"),
    pytest.param("tesla-t4", True, "D8", "cc 7.5", id="tesla-t4"),
    pytest.param("gtx-1660-ti", False, "D8", "cc 7.5", id="gtx-1660-ti"),
    pytest.param("rtx-2080-ti", True, "D8", "cc 7.5", id="rtx-2080-ti"),
    pytest.param("a100-sxm4-80gb-8x", True, "D12", "cc 8.0", id="a100"),
    pytest.param("a100-sxm4-40gb-mig-1g5gb", True, "D12", "cc 8.0", id="a100-mig"),
    pytest.param("rtx-3090", True, "D12", "cc 8.6", id="rtx-3090"),
    pytest.param("rtx-3060-windows", False, "D6", "Triton", id="rtx-3060-windows"),
    pytest.param("l4", True, "D12", "cc 8.9", id="l4"),
    pytest.param("h100-80gb-hbm3", True, "D12", "cc 9.0", id="h100"),
    pytest.param("b200", True, "D12", "cc 10.0", id="b200"),
    pytest.param("rtx-5090", True, "D12", "cc 12.0", id="rtx-5090"),
    pytest.param("jetson-agx-orin-32gb", False, "D6", "Triton", id="jetson"),
    pytest.param("rtx-4090-plus-rtx-3060", True, "D12", "RTX 3060", id="rtx-4090-plus-rtx-3060"),
    pytest.param("mi300x-rocm", True, "D11", "MI300X", id="mi300x-rocm"),
    pytest.param("apple-m2-pro-mps", False, "D9", "opt-in", id="apple-m2-pro-mps"),
    pytest.param("cpu-container-quota-4", False, "D10", "C++ compiler", id="cpu-container-quota-4"),
]

# fixture -> (catalog id of compile.mode, a fact its reason must mention) when compile is on
MODE_REASONS = {
    "tesla-v100-sxm2-16gb": ("D12", "max-autotune"),
    "tesla-t4": ("D13", "40 SMs"),
    "rtx-2080-ti": ("D12", "max-autotune"),  # exactly 68 SMs: passes is_big_gpu()
    "a100-sxm4-80gb-8x": ("D12", "compiles much longer"),
    "a100-sxm4-40gb-mig-1g5gb": ("D13", "14 SMs"),
    "rtx-3090": ("D12", "compiles much longer"),
    "l4": ("D13", "58 SMs"),
    "h100-80gb-hbm3": ("D12", "compiles much longer"),
    "b200": ("D12", "compiles much longer"),
    "rtx-5090": ("D12", "compiles much longer"),
    "rtx-4090-plus-rtx-3060": ("D13", "28 SMs"),
    "mi300x-rocm": ("D12", "compiles much longer"),
}


@pytest.mark.parametrize(("machine", "enabled", "rule", "fact"), COMPILE_TABLE)
def test_compile_table(machine: str, enabled: bool, rule: str, fact: str) -> None:
    found = compile_of(machine)
    assert set(found) == COMPILE_SETTINGS
    assert found["compile.enabled"].value is enabled
    assert found["compile.enabled"].rule == rule
    assert fact in found["compile.enabled"].reason, found["compile.enabled"].reason
    mode = found["compile.mode"]
    if not enabled:
        assert mode.value is None
        assert fact in mode.reason
        return
    assert mode.value == "default"
    mode_rule, mode_fact = MODE_REASONS[machine]
    assert mode.rule == mode_rule
    assert mode_fact in mode.reason, mode.reason
    if mode_rule == "D13":
        assert "max-autotune is never used" in mode.reason


def test_every_enabled_fixture_has_a_mode_expectation() -> None:
    on = {p.values[0] for p in COMPILE_TABLE if p.values[1]}
    assert on == set(MODE_REASONS)


def test_mixed_box_gets_what_the_rtx_3060_gets() -> None:
    mixed = compile_of("rtx-4090-plus-rtx-3060")
    alone = compile_of(only_gpu("rtx-4090-plus-rtx-3060", 1))
    assert values(mixed) == values(alone)
    assert mixed["compile.mode"].rule == alone["compile.mode"].rule == "D13"


def test_cc_7x_without_fp16_does_not_compile() -> None:
    """D8: the GTX 1660 Ti trains in fp32 (no Tensor Cores), so compile stays off."""
    reason = compile_of("gtx-1660-ti")["compile.enabled"].reason
    assert "float32" in reason
    assert "fp16" in reason


def test_cc_7x_compiles_only_with_fp16() -> None:
    """D8: should precision ever pick bf16 below cc 8.0, compile stays off."""
    ctx = context("tesla-v100-sxm2-16gb", precision)
    ctx.decided["precision.dtype"] = "bfloat16"
    found = run(ctx, compile_settings)
    assert found["compile.enabled"].value is False
    assert found["compile.enabled"].rule == "D8"
    assert "bfloat16" in found["compile.enabled"].reason


# --- D.1 gates ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("torch_version", "python_version", "enabled", "rule"),
    [
        pytest.param("1.13.1", "3.10.14", False, "D1", id="torch-1.13"),
        pytest.param("2.0.1", "3.10.14", True, "D12", id="torch-2.0-py3.10"),
        pytest.param("2.0.1", "3.11.9", False, "D2", id="torch-2.0-py3.11"),
        pytest.param("2.1.2", "3.11.9", True, "D12", id="torch-2.1-py3.11"),
        pytest.param("2.3.1", "3.12.3", False, "D2", id="torch-2.3-py3.12"),
        pytest.param("2.4.1", "3.12.3", True, "D12", id="torch-2.4-py3.12"),
        pytest.param("2.5.1", "3.13.1", False, "D2", id="torch-2.5-py3.13"),
        pytest.param("2.6.0", "3.13.1", True, "D12", id="torch-2.6-py3.13"),
        pytest.param("2.9.0", "3.13.5", True, "D12", id="torch-2.9-py3.13"),
        pytest.param("2.9.0", "3.14.0", False, "D2", id="torch-2.9-py3.14"),
        pytest.param("2.10.0", "3.13.5", True, "D12", id="torch-2.10-py3.13"),
        pytest.param("2.10.0", "3.14.0", False, "D2", id="torch-2.10-py3.14-unverified"),
        pytest.param("2.13.0", "3.15.0", False, "D2", id="torch-2.13-py3.15"),
    ],
)
def test_python_gate(torch_version: str, python_version: str, enabled: bool, rule: str) -> None:
    snap = with_software(
        "h100-80gb-hbm3", torch_version=f"{torch_version}+cu128", python_version=python_version
    )
    found = compile_of(snap)
    assert found["compile.enabled"].value is enabled
    assert found["compile.enabled"].rule == rule
    if not enabled:
        assert found["compile.mode"].value is None
        assert f"torch {torch_version}" in found["compile.enabled"].reason


def test_python_gate_names_the_ceiling() -> None:
    snap = with_software("h100-80gb-hbm3", torch_version="2.5.1+cu124", python_version="3.13.1")
    reason = compile_of(snap)["compile.enabled"].reason
    assert "up to Python 3.12" in reason
    assert "Python 3.13" in reason


def test_python_3_14_on_torch_2_10_is_off_and_says_it_is_unverified() -> None:
    snap = with_software("h100-80gb-hbm3", torch_version="2.10.0+cu128", python_version="3.14.0")
    reason = compile_of(snap)["compile.enabled"].reason
    assert "not confirmed" in reason
    assert "U1" in reason


def test_free_threaded_python_is_off() -> None:
    snap = with_software("h100-80gb-hbm3", python_version="3.13.3", python_gil_enabled=False)
    found = compile_of(snap)
    assert found["compile.enabled"].value is False
    assert found["compile.enabled"].rule == "D3"
    assert "free-threaded" in found["compile.enabled"].reason


def test_only_cpython_compiles() -> None:
    snap = with_software("h100-80gb-hbm3", python_implementation="PyPy")
    found = compile_of(snap)
    assert found["compile.enabled"].value is False
    assert "PyPy" in found["compile.enabled"].reason


def test_unreadable_torch_version_is_off() -> None:
    found = compile_of(with_software("h100-80gb-hbm3", torch_version="nightly"))
    assert found["compile.enabled"].value is False
    assert found["compile.enabled"].rule == "D1"


def test_windows_before_torch_2_5_is_off() -> None:
    snap = with_software("rtx-3060-windows", torch_version="2.4.1+cu124", triton_available=True)
    found = compile_of(snap)
    assert found["compile.enabled"].value is False
    assert found["compile.enabled"].rule == "D4"
    assert "Windows" in found["compile.enabled"].reason


def test_windows_cuda_without_triton_is_off() -> None:
    found = compile_of("rtx-3060-windows")
    assert found["compile.enabled"].value is False
    assert found["compile.enabled"].rule == "D6"
    assert "triton-windows" in found["compile.enabled"].reason


def test_windows_cuda_with_triton_windows_compiles() -> None:
    snap = with_software("rtx-3060-windows", triton_available=True, triton_version="3.3.1")
    found = compile_of(snap)
    assert found["compile.enabled"].value is True
    assert "MSVC" in found["compile.enabled"].reason
    assert found["compile.mode"].rule == "D13"  # 28 SMs


def test_windows_cuda_torch_2_5_has_no_matching_triton() -> None:
    snap = with_software("rtx-3060-windows", torch_version="2.5.1+cu124", triton_available=True)
    found = compile_of(snap)
    assert found["compile.enabled"].value is False
    assert found["compile.enabled"].rule == "D6"
    assert "torch 2.6" in found["compile.enabled"].reason


def test_linux_cuda_without_triton_is_off() -> None:
    found = compile_of(with_software("h100-80gb-hbm3", triton_available=False))
    assert found["compile.enabled"].value is False
    assert found["compile.enabled"].rule == "D6"
    assert "Triton" in found["compile.enabled"].reason


def test_rocm_without_triton_is_off() -> None:
    found = compile_of(with_software("mi300x-rocm", triton_available=False))
    assert found["compile.enabled"].value is False


@pytest.mark.parametrize(
    ("torch_version", "fact"),
    [
        pytest.param("2.7.1", "arrived in torch 2.8", id="torch-2.7"),
        pytest.param("2.8.0", "opt-in", id="torch-2.8"),
    ],
)
def test_mps_compile_is_off_by_default(torch_version: str, fact: str) -> None:
    found = compile_of(with_software("apple-m2-pro-mps", torch_version=torch_version))
    assert found["compile.enabled"].value is False
    assert found["compile.enabled"].rule == "D9"
    assert fact in found["compile.enabled"].reason


@pytest.mark.parametrize(
    ("os_name", "compiler"),
    [pytest.param("linux", "g++", id="linux"), pytest.param("windows", "MSVC", id="windows")],
)
def test_cpu_compile_needs_a_compiler_detection_cannot_see(os_name: str, compiler: str) -> None:
    found = compile_of(with_host("cpu-laptop-linux", os_name=os_name))
    assert found["compile.enabled"].value is False
    assert found["compile.enabled"].rule == "D10"
    assert compiler in found["compile.enabled"].reason


# --- profile modes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "fact"),
    [
        pytest.param(Mode.BALANCED, "balanced: no compile start-up cost", id="balanced"),
        pytest.param(Mode.REPRODUCIBLE, "reproducible", id="reproducible"),
    ],
)
@pytest.mark.parametrize("machine", ["h100-80gb-hbm3", "tesla-t4", "mi300x-rocm"])
def test_only_the_speed_mode_compiles(machine: str, mode: Mode, fact: str) -> None:
    found = compile_of(machine, mode=mode)
    assert found["compile.enabled"].value is False
    assert found["compile.mode"].value is None
    assert fact in found["compile.enabled"].reason


def test_a_hardware_gate_wins_over_the_mode_reason() -> None:
    """The reason names what blocks compile on this machine, whatever the mode."""
    found = compile_of("tesla-p100-pcie-16gb", mode=Mode.BALANCED)
    assert found["compile.enabled"].rule == "D7"


# --- property: the findings never break the profile invariants ------------------------------------


@cache
def cached_snapshot(name: str) -> HardwareSnapshot:
    return snapshot(name)


PYTHON_CEILING = {(2, 0): (3, 10), (2, 1): (3, 11), (2, 4): (3, 12), (2, 6): (3, 13)}


def verified_ceiling(release: tuple[int, int]) -> tuple[int, int]:
    return max(v for k, v in PYTHON_CEILING.items() if release >= k)


@settings(max_examples=400, deadline=None)
@given(
    machine=st.sampled_from(ALL_FIXTURES),
    mode=st.sampled_from(Mode),
    model_kind=st.sampled_from(["conv", "transformer", "mlp", "other"]),
    software=st.fixed_dictionaries(
        {},
        optional={
            "torch_version": st.sampled_from(
                ["1.12.1", "1.13.1", "2.0.1", "2.3.1", "2.4.1", "2.5.1", "2.6.0", "2.9.0", "2.10.0"]
            ),
            "python_version": st.sampled_from(["3.10.14", "3.11.9", "3.12.3", "3.13.5", "3.14.0"]),
            "python_gil_enabled": st.booleans(),
            "triton_available": st.booleans(),
        },
    ),
)
def test_compile_never_breaks_the_invariants(
    machine: str, mode: Mode, model_kind: str, software: dict[str, Any]
) -> None:
    snap = cached_snapshot(machine)
    snap = snap.model_copy(update={"software": snap.software.model_copy(update=software)})
    preferences = Preferences(mode=mode, model_kind=model_kind)  # type: ignore[arg-type]
    ctx = Context(snapshot=snap, preferences=preferences)
    found = run(ctx, choose_device, precision, compile_settings)
    enabled, compile_mode = found["compile.enabled"].value, found["compile.mode"].value
    assert enabled is (compile_mode is not None)
    assert compile_mode in (None, "default")  # never max-autotune, on small GPUs or elsewhere
    if enabled:
        release = torch_release(snap.software.torch_version)
        python = tuple(int(x) for x in snap.software.python_version.split(".")[:2])
        assert release is not None
        assert release >= (2, 0)
        assert python <= verified_ceiling(release)
        assert snap.software.python_gil_enabled
        assert snap.software.triton_available
        assert mode is Mode.SPEED
        assert ctx.device == "cuda"
        if ctx.nvidia:
            assert ctx.weakest_cc is not None
            assert ctx.weakest_cc >= (7, 0)
            if ctx.weakest_cc < (8, 0):
                assert ctx.get("precision.dtype") == "float16"
        if (ctx.fewest_sms or 68) < 68:
            assert found["compile.mode"].rule == "D13"
    assert invariant_problems(ctx, found) == []
