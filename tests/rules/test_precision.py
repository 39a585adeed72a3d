"""Mixed precision and TF32 rules (catalog §A, §B, §M, §N) over the recorded machines."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_autotune.hardware import Architecture, HardwareSnapshot
from torch_autotune.profile import (
    Mode,
    Preferences,
    torch_release,
)
from torch_autotune.rules.backend import choose_device
from torch_autotune.rules.context import Context, Finding
from torch_autotune.rules.precision import precision, tf32

from .helpers import (
    ALL_FIXTURES,
    context,
    invariant_problems,
    only_gpu,
    run,
    snapshot,
    values,
    with_software,
)

PRECISION_SETTINGS = {"precision.autocast", "precision.dtype", "precision.grad_scaler"}
TF32_SETTINGS = {"matmul.tf32", "matmul.api"}


def precision_of(ctx: Context) -> dict[str, Finding]:
    return run(ctx, precision)


# --- precision ------------------------------------------------------------------------------------

# fixture, dtype, catalog id, a fact every reason must mention
PRECISION_TABLE = [
    pytest.param("tesla-p100-pcie-16gb", "float32", "A5", "cc 6.0", id="p100"),
    pytest.param("gtx-1080-ti", "float32", "A4", "cc 6.1", id="gtx-1080-ti"),
    pytest.param("gtx-1080-ti-driver-460", "float32", "A4", "cc 6.1", id="gtx-1080-ti-old-driver"),
    pytest.param("tesla-p40", "float32", "A4", "cc 6.1", id="tesla-p40"),
    pytest.param("tesla-v100-sxm2-16gb", "float16", "A2", "cc 7.0", id="tesla-v100-sxm2-16gb"),
    pytest.param("tesla-v100-pcie-16gb-2x", "float16", "A2", "cc 7.0", id="tesla-v100-pcie-2x"),
    pytest.param("tesla-t4", "float16", "A2", "cc 7.5", id="tesla-t4"),
    pytest.param("gtx-1660-ti", "float32", "A7", "cc 7.5", id="gtx-1660-ti"),
    pytest.param("rtx-2080-ti", "float16", "A2", "cc 7.5", id="rtx-2080-ti"),
    pytest.param("a100-sxm4-80gb-8x", "bfloat16", "A1", "cc 8.0", id="a100"),
    pytest.param("a100-sxm4-40gb-mig-1g5gb", "bfloat16", "A1", "cc 8.0", id="a100-mig"),
    pytest.param("rtx-3090", "bfloat16", "A1", "cc 8.6", id="rtx-3090"),
    pytest.param("rtx-3060-windows", "bfloat16", "A1", "cc 8.6", id="rtx-3060-windows"),
    pytest.param("a10g-aws-g5", "bfloat16", "A1", "cc 8.6", id="a10g"),
    pytest.param("l4", "bfloat16", "A1", "cc 8.9", id="l4"),
    pytest.param("rtx-4090", "bfloat16", "A1", "cc 8.9", id="rtx-4090"),
    pytest.param("h100-80gb-hbm3", "bfloat16", "A1", "cc 9.0", id="h100"),
    pytest.param("h200", "bfloat16", "A1", "cc 9.0", id="h200"),
    pytest.param("b200", "bfloat16", "A1", "cc 10.0", id="b200"),
    pytest.param("rtx-5090", "bfloat16", "A1", "cc 12.0", id="rtx-5090"),
    pytest.param("jetson-agx-orin-32gb", "bfloat16", "A1", "cc 8.7", id="jetson"),
    pytest.param(
        "rtx-4090-plus-rtx-3060",
        "bfloat16",
        "A1",
        "RTX 3060 (cc 8.6)",
        id="rtx-4090-plus-rtx-3060",
    ),
    pytest.param("mi300x-rocm", "bfloat16", "M2", "cdna3", id="mi300x-rocm"),
    pytest.param("apple-m2-pro-mps", "bfloat16", "N2", "macOS 14.5", id="apple-m2-pro-mps"),
    pytest.param("cpu-container-quota-4", "float32", "A12", "CPU", id="cpu-container-quota-4"),
    pytest.param("cpu-laptop-linux", "float32", "A12", "CPU", id="cpu-laptop"),
    # torch 2.5 cannot run sm_120: the backend rule falls back to the CPU (E1)
    pytest.param("rtx-5090-old-wheel", "float32", "A12", "CPU", id="rtx-5090-old-wheel"),
]


@pytest.mark.parametrize(("machine", "dtype", "rule", "fact"), PRECISION_TABLE)
def test_precision_table(machine: str, dtype: str, rule: str, fact: str) -> None:
    ctx = context(machine)
    found = precision_of(ctx)
    assert set(found) == PRECISION_SETTINGS
    assert found["precision.dtype"].value == dtype
    assert found["precision.autocast"].value is (dtype != "float32")
    assert found["precision.grad_scaler"].value is (dtype == "float16")
    for finding in found.values():
        assert finding.rule == rule
        assert fact in finding.reason, finding.reason


def test_each_setting_is_decided_exactly_once() -> None:
    settings_yielded = [f.setting for f in precision(context("tesla-t4"))]
    assert sorted(settings_yielded) == sorted(PRECISION_SETTINGS)


def test_reasons_give_the_trade_off() -> None:
    bf16 = precision_of(context("a100-sxm4-80gb-8x"))
    assert "exponent range" in bf16["precision.dtype"].reason
    assert "GradScaler fails on bf16" in bf16["precision.grad_scaler"].reason
    fp16 = precision_of(context("tesla-t4"))
    assert "emulated" in fp16["precision.dtype"].reason
    assert "underflow" in fp16["precision.grad_scaler"].reason
    pascal = precision_of(context("tesla-p40"))
    assert "1/64" in pascal["precision.dtype"].reason
    no_tensor_cores = precision_of(context("gtx-1660-ti"))
    assert "no Tensor Cores" in no_tensor_cores["precision.dtype"].reason


def test_p100_fp16_is_an_opt_in() -> None:
    found = precision_of(context("tesla-p100-pcie-16gb", allow_p100_fp16=True))
    assert found["precision.dtype"].value == "float16"
    assert found["precision.autocast"].value is True
    assert found["precision.grad_scaler"].value is True
    assert found["precision.dtype"].rule == "A5"
    assert "opted in" in found["precision.dtype"].reason


@pytest.mark.parametrize("machine", ["tesla-p40", "gtx-1080-ti", "gtx-1660-ti"])
def test_p100_opt_in_does_not_reach_other_gpus(machine: str) -> None:
    found = precision_of(context(machine, allow_p100_fp16=True))
    assert found["precision.dtype"].value == "float32"


def test_mixed_box_gets_what_its_weakest_gpu_gets() -> None:
    mixed = precision_of(context("rtx-4090-plus-rtx-3060"))
    alone = precision_of(context(only_gpu("rtx-4090-plus-rtx-3060", 1)))
    assert values(mixed) == values(alone)
    assert "weakest" in mixed["precision.dtype"].reason


def test_a_turing_box_with_one_gtx_16xx_stays_in_fp32() -> None:
    t4 = snapshot("tesla-t4")
    gtx = snapshot("gtx-1660-ti").accelerators[0].model_copy(update={"index": 1})
    box = t4.model_copy(update={"accelerators": (t4.accelerators[0], gtx)})
    found = precision_of(context(box))
    assert found["precision.dtype"].value == "float32"
    assert found["precision.dtype"].rule == "A7"
    assert "GTX 1660 Ti" in found["precision.dtype"].reason


def test_unknown_compute_capability_gives_fp32_and_says_so() -> None:
    snap = snapshot("h100-80gb-hbm3")
    gpu = snap.accelerators[0].model_copy(update={"compute_capability": None})
    ctx = context(snap.model_copy(update={"accelerators": (gpu,)}))
    found = run(ctx, precision, tf32)
    assert found["precision.dtype"].value == "float32"
    assert "could not be read" in found["precision.dtype"].reason
    assert found["matmul.tf32"].value is False
    assert "could not be read" in found["matmul.tf32"].reason


def test_rocm_without_bf16_matrix_units_uses_fp16_with_a_scaler() -> None:
    snap = snapshot("mi300x-rocm")
    gpu = snap.accelerators[0].model_copy(update={"architecture": Architecture.RDNA3})
    found = precision_of(context(snap.model_copy(update={"accelerators": (gpu,)})))
    assert found["precision.dtype"].value == "float16"
    assert found["precision.grad_scaler"].value is True
    assert found["precision.dtype"].rule == "M2"
    assert "rdna3" in found["precision.dtype"].reason


@pytest.mark.parametrize(
    ("torch_version", "os_version", "dtype", "rule"),
    [
        pytest.param("2.8.0", "14.5", "bfloat16", "N2", id="torch-2.8-macos-14"),
        pytest.param("2.6.0", "14.0", "bfloat16", "N2", id="torch-2.6-macos-14"),
        pytest.param("2.8.0", "13.6", "float32", "N3", id="macos-13"),
        pytest.param("2.5.1", "14.5", "float32", "N3", id="torch-2.5"),
        pytest.param("2.4.1", "14.5", "float32", "N1", id="torch-2.4-no-mps-autocast"),
        pytest.param("2.8.0", None, "float32", "N3", id="macos-unknown"),
    ],
)
def test_mps_autocast_gates(
    torch_version: str, os_version: str | None, dtype: str, rule: str
) -> None:
    snap = with_software("apple-m2-pro-mps", torch_version=torch_version)
    snap = snap.model_copy(update={"host": snap.host.model_copy(update={"os_version": os_version})})
    found = precision_of(context(snap))
    assert found["precision.dtype"].value == dtype
    assert found["precision.grad_scaler"].value is False
    assert found["precision.dtype"].rule == rule
    assert f"torch {torch_version}" in found["precision.dtype"].reason


# --- TF32 -----------------------------------------------------------------------------------------

# fixture, tf32, api, catalog id, a fact every reason must mention
TF32_TABLE = [
    pytest.param("tesla-p100-pcie-16gb", False, None, "B5", "cc 6.0", id="p100"),
    pytest.param("gtx-1080-ti", False, None, "B5", "cc 6.1", id="gtx-1080-ti"),
    pytest.param("tesla-p40", False, None, "B5", "cc 6.1", id="tesla-p40"),
    pytest.param("tesla-v100-sxm2-16gb", False, None, "B5", "cc 7.0", id="tesla-v100-sxm2-16gb"),
    pytest.param("tesla-t4", False, None, "B5", "cc 7.5", id="tesla-t4"),
    pytest.param("gtx-1660-ti", False, None, "B5", "cc 7.5", id="gtx-1660-ti"),
    pytest.param("rtx-2080-ti", False, None, "B5", "cc 7.5", id="rtx-2080-ti"),
    pytest.param("a100-sxm4-80gb-8x", True, "allow_tf32", "B1", "cc 8.0", id="a100"),
    pytest.param("rtx-3090", True, "allow_tf32", "B1", "cc 8.6", id="rtx-3090"),
    pytest.param("rtx-3060-windows", True, "allow_tf32", "B1", "cc 8.6", id="rtx-3060-windows"),
    pytest.param("l4", True, "allow_tf32", "B1", "cc 8.9", id="l4"),
    pytest.param("h100-80gb-hbm3", True, "allow_tf32", "B1", "cc 9.0", id="h100"),
    pytest.param("b200", True, "allow_tf32", "B1", "cc 10.0", id="b200"),
    pytest.param("rtx-5090", True, "allow_tf32", "B1", "cc 12.0", id="rtx-5090"),
    pytest.param("jetson-agx-orin-32gb", True, "allow_tf32", "B1", "cc 8.7", id="jetson"),
    pytest.param(
        "rtx-4090-plus-rtx-3060",
        True,
        "allow_tf32",
        "B1",
        "RTX 3060 (cc 8.6)",
        id="rtx-4090-plus-rtx-3060",
    ),
    pytest.param("mi300x-rocm", False, None, "B7", "ROCm", id="mi300x-rocm"),
    pytest.param("apple-m2-pro-mps", False, None, "B8", "MPS", id="apple-m2-pro-mps"),
    pytest.param("cpu-container-quota-4", False, None, "B8", "CPU", id="cpu-container-quota-4"),
]


@pytest.mark.parametrize(("machine", "on", "api", "rule", "fact"), TF32_TABLE)
def test_tf32_table(machine: str, on: bool, api: str | None, rule: str, fact: str) -> None:
    found = run(context(machine, precision), tf32)
    assert set(found) == TF32_SETTINGS
    assert found["matmul.tf32"].value is on
    assert found["matmul.api"].value == api
    for finding in found.values():
        assert finding.rule == rule
        assert fact in finding.reason, finding.reason
    if on:
        reason = found["matmul.tf32"].reason
        assert "7x faster" in reason
        assert "2e-3" in reason
        assert "4e-5" in reason


def test_reproducible_turns_tf32_off_but_still_sets_the_api_on_ampere() -> None:
    found = run(context("a100-sxm4-80gb-8x", precision, mode=Mode.REPRODUCIBLE), tf32)
    assert found["matmul.tf32"].value is False
    assert found["matmul.api"].value == "allow_tf32"
    assert found["matmul.tf32"].rule == "B6"
    assert "IEEE" in found["matmul.tf32"].reason
    assert "convolutions use TF32 by default" in found["matmul.tf32"].reason


def test_reproducible_sets_nothing_before_ampere() -> None:
    found = run(context("tesla-t4", precision, mode=Mode.REPRODUCIBLE), tf32)
    assert found["matmul.tf32"].value is False
    assert found["matmul.api"].value is None


def test_balanced_keeps_tf32_on() -> None:
    found = run(context("h100-80gb-hbm3", precision, mode=Mode.BALANCED), tf32)
    assert found["matmul.tf32"].value is True


@pytest.mark.parametrize(
    ("torch_version", "api", "rule"),
    [
        pytest.param("2.8.0+cu128", "allow_tf32", "B1", id="torch-2.8"),
        pytest.param("2.9.0+cu128", "fp32_precision", "B2", id="torch-2.9"),
        pytest.param("2.13.0+cu130", "fp32_precision", "B2", id="torch-2.13"),
    ],
)
@pytest.mark.parametrize("mode", [Mode.SPEED, Mode.REPRODUCIBLE], ids=lambda m: m.value)
def test_torch_release_picks_the_tf32_api(
    torch_version: str, api: str, rule: str, mode: Mode
) -> None:
    snap = with_software("h100-80gb-hbm3", torch_version=torch_version)
    found = run(context(snap, precision, mode=mode), tf32)
    assert found["matmul.api"].value == api
    assert found["matmul.tf32"].value is (mode is Mode.SPEED)
    assert found["matmul.api"].rule == (rule if mode is Mode.SPEED else "B6")
    assert api in found["matmul.api"].reason


def test_unreadable_torch_version_sets_no_tf32_api() -> None:
    snap = with_software("h100-80gb-hbm3", torch_version="nightly")
    found = run(context(snap, precision), tf32)
    assert found["matmul.tf32"].value is False
    assert found["matmul.api"].value is None
    assert "torch version could not be read" in found["matmul.api"].reason


def test_mixed_box_tf32_is_what_the_weakest_gpu_gets() -> None:
    mixed = run(context("rtx-4090-plus-rtx-3060", precision), tf32)
    alone = run(context(only_gpu("rtx-4090-plus-rtx-3060", 1), precision), tf32)
    assert values(mixed) == values(alone)


# --- property: the findings never break the profile invariants ------------------------------------


@cache
def cached_snapshot(name: str) -> HardwareSnapshot:
    return snapshot(name)


TORCH_VERSIONS = [None, "1.13.1", "2.0.1", "2.4.1", "2.5.1", "2.6.0", "2.8.0", "2.9.1", "2.10.0"]


@settings(max_examples=300, deadline=None)
@given(
    machine=st.sampled_from(ALL_FIXTURES),
    mode=st.sampled_from(Mode),
    model_kind=st.sampled_from(["conv", "transformer", "mlp", "other"]),
    allow_p100_fp16=st.booleans(),
    torch_version=st.sampled_from(TORCH_VERSIONS),
)
def test_precision_and_tf32_never_break_the_invariants(
    machine: str, mode: Mode, model_kind: str, allow_p100_fp16: bool, torch_version: str | None
) -> None:
    snap = cached_snapshot(machine)
    if torch_version is not None:  # None: keep the fixture's own torch
        snap = snap.model_copy(
            update={"software": snap.software.model_copy(update={"torch_version": torch_version})}
        )
    preferences = Preferences(
        mode=mode,
        model_kind=model_kind,  # type: ignore[arg-type]
        allow_p100_fp16=allow_p100_fp16,
    )
    ctx = Context(snapshot=snap, preferences=preferences)
    found = run(ctx, choose_device, precision, tf32)
    assert set(found) >= PRECISION_SETTINGS | TF32_SETTINGS
    dtype = found["precision.dtype"].value
    scaler = found["precision.grad_scaler"].value
    assert not (scaler and dtype == "bfloat16")
    assert found["precision.autocast"].value is (dtype != "float32")
    assert scaler is (dtype == "float16")
    weakest = ctx.weakest_cc
    if ctx.nvidia and (weakest is None or weakest < (8, 0)):
        assert dtype != "bfloat16"
    tf32_on = found["matmul.tf32"].value
    if tf32_on:
        assert ctx.nvidia
        assert weakest is not None
        assert weakest >= (8, 0)
        assert mode is not Mode.REPRODUCIBLE
    api = found["matmul.api"].value
    release = torch_release(snap.software.torch_version)
    if api is not None:
        assert release is not None
        assert api == ("fp32_precision" if release >= (2, 9) else "allow_tf32")
    assert invariant_problems(ctx, found) == []


def test_the_invariant_check_catches_a_broken_finding() -> None:
    """The property above is not vacuous: bf16 with a GradScaler on a T4 is refused."""
    ctx = context("tesla-t4")
    ctx.decided.update(
        {"precision.autocast": True, "precision.dtype": "bfloat16", "precision.grad_scaler": True}
    )
    problems = invariant_problems(ctx, {})
    assert any("grad_scaler" in p for p in problems)
    assert any("bfloat16 needs compute capability 8.0" in p for p in problems)
