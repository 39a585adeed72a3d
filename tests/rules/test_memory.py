"""cuDNN switches, memory format and allocator variables on recorded machines (catalog C, H, J)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import ALLOWED_ENVIRONMENT, Mode, settings_paths
from torch_autotune.rules.context import Context, Finding
from torch_autotune.rules.memory import allocator, cudnn, memory_format

from .helpers import ALL_FIXTURES, context, run, snapshot, with_software

SNAPSHOTS = {name: snapshot(name) for name in ALL_FIXTURES}

CUDNN_SETTINGS = {
    "backends.cudnn_benchmark",
    "backends.cudnn_deterministic",
    "backends.deterministic_algorithms",
}
ALLOCATOR_SETTINGS = {
    "environment.PYTORCH_CUDA_ALLOC_CONF",
    "environment.CUBLAS_WORKSPACE_CONFIG",
    "environment.HIPBLAS_WORKSPACE_CONFIG",
}


def _ctx(machine: str | HardwareSnapshot, *, autocast: bool = True, **prefs: Any) -> Context:
    """A context after choose_device, with the precision rule's autocast seeded by hand."""
    snap = SNAPSHOTS[machine] if isinstance(machine, str) else machine
    ctx = context(snap, **prefs)
    ctx.decided["precision.autocast"] = autocast
    return ctx


def _findings(
    machine: str | HardwareSnapshot, *, autocast: bool = True, **prefs: Any
) -> dict[str, Finding]:
    return run(_ctx(machine, autocast=autocast, **prefs), cudnn, memory_format, allocator)


# --- one finding per owned setting, every time --------------------------------------------------


@pytest.mark.parametrize("machine", ALL_FIXTURES)
@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
def test_every_owned_setting_gets_exactly_one_reasoned_finding(machine: str, mode: Mode) -> None:
    ctx = _ctx(machine, mode=mode, model_kind="conv")
    for rule, owned in (
        (cudnn, CUDNN_SETTINGS),
        (memory_format, {"memory_format"}),
        (allocator, ALLOCATOR_SETTINGS),
    ):
        findings = list(rule(ctx))
        assert sorted(f.setting for f in findings) == sorted(owned)
        for finding in findings:
            assert finding.setting in settings_paths()
            assert finding.reason.strip()
            assert finding.rule


# --- cuDNN (C1-C4) ------------------------------------------------------------------------------

# Fixed-shape conv net in the speed mode: the autotuner runs on every GPU the profile uses.
BENCHMARK_CASES = [
    pytest.param("cpu-container-quota-4", False, "'cpu'", id="cpu-container-quota-4"),
    pytest.param("cpu-laptop-linux", False, "'cpu'", id="cpu-laptop-linux"),
    pytest.param("apple-m2-pro-mps", False, "'mps'", id="apple-m2-pro-mps"),
    pytest.param("rtx-3060-windows", True, "fixed input shapes", id="rtx-3060-windows"),
    pytest.param("a100-sxm4-80gb-8x", True, "fixed input shapes", id="a100-sxm4-80gb-8x"),
    pytest.param("h100-80gb-hbm3", True, "fixed input shapes", id="h100"),
    pytest.param("tesla-t4", True, "fixed input shapes", id="tesla-t4"),
    pytest.param("gtx-1660-ti", True, "fixed input shapes", id="gtx-1660-ti"),
    pytest.param("jetson-agx-orin-32gb", True, "fixed input shapes", id="jetson-agx-orin-32gb"),
    pytest.param("mi300x-rocm", True, "fixed input shapes", id="mi300x-rocm"),
    pytest.param("tesla-v100-sxm2-16gb", True, "fixed input shapes", id="tesla-v100"),
    pytest.param("rtx-4090-plus-rtx-3060", True, "fixed input shapes", id="rtx-4090-plus-rtx-3060"),
]


@pytest.mark.parametrize(("machine", "expected", "fact"), BENCHMARK_CASES)
def test_cudnn_benchmark_for_fixed_shape_conv_nets_on_gpus(
    machine: str, expected: bool, fact: str
) -> None:
    found = _findings(machine, model_kind="conv", fixed_shapes=True)
    assert found["backends.cudnn_benchmark"].value is expected
    assert fact in found["backends.cudnn_benchmark"].reason
    assert found["backends.cudnn_benchmark"].rule == "C1"
    assert found["backends.cudnn_deterministic"].value is False
    assert found["backends.deterministic_algorithms"].value is False


@pytest.mark.parametrize(
    ("model_kind", "fixed_shapes", "expected", "rule", "fact"),
    [
        pytest.param("conv", True, True, "C1", "fixed input shapes", id="conv-fixed"),
        pytest.param("conv", False, False, "C2", "shapes vary", id="conv-variable-shapes"),
        pytest.param("transformer", True, False, "C3", "'transformer'", id="transformer"),
        pytest.param("mlp", True, False, "C3", "not convolutional", id="mlp"),
        pytest.param("other", False, False, "C3", "'other'", id="other-variable"),
    ],
)
def test_cudnn_benchmark_depends_on_the_model(
    model_kind: str, fixed_shapes: bool, expected: bool, rule: str, fact: str
) -> None:
    found = _findings("h100-80gb-hbm3", model_kind=model_kind, fixed_shapes=fixed_shapes)
    assert found["backends.cudnn_benchmark"].value is expected
    assert found["backends.cudnn_benchmark"].rule == rule
    assert fact in found["backends.cudnn_benchmark"].reason


@pytest.mark.parametrize("machine", ["h100-80gb-hbm3", "mi300x-rocm", "cpu-laptop-linux"])
def test_reproducible_mode_is_deterministic_and_never_benchmarks(machine: str) -> None:
    found = _findings(machine, mode=Mode.REPRODUCIBLE, model_kind="conv", fixed_shapes=True)
    assert found["backends.cudnn_benchmark"].value is False
    assert found["backends.cudnn_deterministic"].value is True
    assert found["backends.deterministic_algorithms"].value is True
    assert all(found[s].rule == "C4" for s in CUDNN_SETTINGS)
    assert "reproducible" in found["backends.cudnn_benchmark"].reason


@pytest.mark.parametrize("mode", [Mode.SPEED, Mode.BALANCED], ids=lambda m: m.value)
def test_fast_modes_name_the_mode_when_leaving_determinism_off(mode: Mode) -> None:
    found = _findings("tesla-t4", mode=mode, model_kind="conv")
    assert found["backends.cudnn_benchmark"].value is True
    assert f"{mode.value} mode" in found["backends.deterministic_algorithms"].reason


# --- memory format (H1-H5) ----------------------------------------------------------------------

# Conv net with autocast on: channels_last only on NVIDIA GPUs that all have Tensor Cores.
MEMORY_FORMAT_CASES = [
    pytest.param("cpu-container-quota-4", "contiguous_format", "H5", "CPU", id="cpu-quota-4"),
    pytest.param("cpu-laptop-linux", "contiguous_format", "H5", "CPU", id="cpu-laptop-linux"),
    pytest.param("rtx-3060-windows", "channels_last", "H1", "RTX 3060", id="rtx-3060-windows"),
    pytest.param("a100-sxm4-80gb-8x", "channels_last", "H1", "A100", id="a100-sxm4-80gb-8x"),
    pytest.param("h100-80gb-hbm3", "channels_last", "H1", "H100", id="h100"),
    pytest.param("tesla-t4", "channels_last", "H1", "Tesla T4", id="tesla-t4"),
    pytest.param("gtx-1660-ti", "contiguous_format", "H2", "no Tensor Cores", id="gtx-1660-ti"),
    pytest.param("tesla-p100-pcie-16gb", "contiguous_format", "H2", "P100", id="tesla-p100"),
    pytest.param("jetson-agx-orin-32gb", "channels_last", "H1", "Orin", id="jetson-orin"),
    pytest.param("mi300x-rocm", "contiguous_format", "M1", "AMD", id="mi300x-rocm"),
    pytest.param("apple-m2-pro-mps", "contiguous_format", "H1", "NVIDIA", id="apple-m2-pro-mps"),
    pytest.param("tesla-v100-sxm2-16gb", "channels_last", "H1", "V100", id="tesla-v100"),
    pytest.param("rtx-4090-plus-rtx-3060", "channels_last", "H1", "RTX 3060", id="4090+3060"),
]


@pytest.mark.parametrize(("machine", "memory_format_", "rule", "fact"), MEMORY_FORMAT_CASES)
def test_channels_last_needs_nvidia_tensor_cores(
    machine: str, memory_format_: str, rule: str, fact: str
) -> None:
    found = _findings(machine, model_kind="conv")["memory_format"]
    assert found.value == memory_format_
    assert found.rule == rule
    assert fact in found.reason


@pytest.mark.parametrize("machine", ["h100-80gb-hbm3", "tesla-t4", "tesla-v100-sxm2-16gb"])
def test_channels_last_is_off_in_fp32(machine: str) -> None:
    found = _findings(machine, autocast=False, model_kind="conv")["memory_format"]
    assert found.value == "contiguous_format"
    assert found.rule == "H2"
    assert "fp32" in found.reason


@pytest.mark.parametrize("model_kind", ["transformer", "mlp", "other"])
def test_channels_last_only_for_conv_nets(model_kind: str) -> None:
    found = _findings("h100-80gb-hbm3", model_kind=model_kind)["memory_format"]
    assert found.value == "contiguous_format"
    assert found.rule == "H4"
    assert model_kind in found.reason


def test_channels_last_reason_warns_about_grouped_convs() -> None:
    found = _findings("h100-80gb-hbm3", model_kind="conv")["memory_format"]
    assert "H3" in found.reason


def test_memory_format_reads_the_precision_decision() -> None:
    ctx = context(SNAPSHOTS["h100-80gb-hbm3"], model_kind="conv")
    with pytest.raises(KeyError):
        list(memory_format(ctx))


# --- allocator environment (J1-J4, M4, C4, C7) --------------------------------------------------

ALLOC_CASES = [
    pytest.param("cpu-container-quota-4", None, "J1", "'cpu'", id="cpu-container-quota-4"),
    pytest.param("cpu-laptop-linux", None, "J1", "'cpu'", id="cpu-laptop-linux"),
    pytest.param("rtx-3060-windows", None, "J2", "Windows", id="rtx-3060-windows"),
    pytest.param("a100-sxm4-80gb-8x", "expandable_segments:True", "J1", "Linux", id="a100-8x"),
    pytest.param("h100-80gb-hbm3", "expandable_segments:True", "J1", "torch 2.8", id="h100"),
    pytest.param("tesla-t4", "expandable_segments:True", "J1", "NVIDIA", id="tesla-t4"),
    pytest.param("gtx-1660-ti", "expandable_segments:True", "J1", "NVIDIA", id="gtx-1660-ti"),
    pytest.param("jetson-agx-orin-32gb", None, "J4", "Orin", id="jetson-agx-orin-32gb"),
    pytest.param("mi300x-rocm", None, "J3", "2.11", id="mi300x-rocm"),
    pytest.param("apple-m2-pro-mps", None, "J1", "'mps'", id="apple-m2-pro-mps"),
    pytest.param("tesla-v100-sxm2-16gb", "expandable_segments:True", "J1", "Linux", id="v100"),
    pytest.param("rtx-4090-plus-rtx-3060", "expandable_segments:True", "J1", "Linux", id="mixed"),
    pytest.param("gtx-1080-ti-driver-460", None, "J1", "2.1 or newer", id="torch-1.12"),
]


@pytest.mark.parametrize(("machine", "value", "rule", "fact"), ALLOC_CASES)
def test_expandable_segments_only_where_it_works(
    machine: str, value: str | None, rule: str, fact: str
) -> None:
    found = _findings(machine)["environment.PYTORCH_CUDA_ALLOC_CONF"]
    assert found.value == value
    assert found.rule == rule
    assert fact in found.reason


def test_expandable_segments_on_rocm_from_torch_2_11() -> None:
    found = _findings(with_software("mi300x-rocm", torch_version="2.11.0+rocm7.1"))
    assert found["environment.PYTORCH_CUDA_ALLOC_CONF"].value == "expandable_segments:True"
    assert found["environment.PYTORCH_CUDA_ALLOC_CONF"].rule == "M4"


def test_expandable_segments_off_under_wsl() -> None:
    snap = SNAPSHOTS["rtx-4090"]
    wsl = snap.model_copy(update={"host": snap.host.model_copy(update={"wsl": True})})
    found = _findings(wsl)["environment.PYTORCH_CUDA_ALLOC_CONF"]
    assert found.value is None
    assert "WSL2" in found.reason


def test_expandable_segments_needs_torch_2_1() -> None:
    assert (
        _findings(with_software("h100-80gb-hbm3", torch_version="2.0.1+cu118"))[
            "environment.PYTORCH_CUDA_ALLOC_CONF"
        ].value
        is None
    )
    assert (
        _findings(with_software("h100-80gb-hbm3", torch_version="2.1.0+cu121"))[
            "environment.PYTORCH_CUDA_ALLOC_CONF"
        ].value
        == "expandable_segments:True"
    )


@pytest.mark.parametrize(
    ("machine", "cublas", "hipblas"),
    [
        pytest.param("h100-80gb-hbm3", ":4096:8", None, id="h100"),
        pytest.param("tesla-t4", ":4096:8", None, id="tesla-t4"),
        pytest.param("rtx-3060-windows", ":4096:8", None, id="rtx-3060-windows"),
        pytest.param("mi300x-rocm", None, ":4096:8", id="mi300x-rocm"),
        pytest.param("apple-m2-pro-mps", None, None, id="apple-m2-pro-mps"),
        pytest.param("cpu-container-quota-4", None, None, id="cpu-container-quota-4"),
    ],
)
def test_reproducible_mode_sets_the_blas_workspace(
    machine: str, cublas: str | None, hipblas: str | None
) -> None:
    found = _findings(machine, mode=Mode.REPRODUCIBLE)
    assert found["environment.CUBLAS_WORKSPACE_CONFIG"].value == cublas
    assert found["environment.HIPBLAS_WORKSPACE_CONFIG"].value == hipblas
    assert found["environment.CUBLAS_WORKSPACE_CONFIG"].rule == "C4"
    assert found["environment.HIPBLAS_WORKSPACE_CONFIG"].rule == "C7"


@pytest.mark.parametrize("mode", [Mode.SPEED, Mode.BALANCED], ids=lambda m: m.value)
def test_fast_modes_leave_the_blas_workspace_unset(mode: Mode) -> None:
    found = _findings("h100-80gb-hbm3", mode=mode)
    assert found["environment.CUBLAS_WORKSPACE_CONFIG"].value is None
    assert f"{mode.value} mode" in found["environment.CUBLAS_WORKSPACE_CONFIG"].reason


# --- properties ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    machine=st.sampled_from(ALL_FIXTURES),
    mode=st.sampled_from(list(Mode)),
    model_kind=st.sampled_from(["conv", "transformer", "mlp", "other"]),
    fixed_shapes=st.booleans(),
    autocast=st.booleans(),
)
def test_findings_keep_the_profile_invariants(
    machine: str, mode: Mode, model_kind: str, fixed_shapes: bool, autocast: bool
) -> None:
    ctx = _ctx(
        machine, autocast=autocast, mode=mode, model_kind=model_kind, fixed_shapes=fixed_shapes
    )
    found = run(ctx, cudnn, memory_format, allocator)
    benchmark = found["backends.cudnn_benchmark"].value
    assert not (found["backends.deterministic_algorithms"].value and benchmark)
    assert not benchmark or ctx.device == "cuda"
    if found["memory_format"].value == "channels_last":
        assert autocast
        assert ctx.nvidia
        assert ctx.all_tensor_cores
        assert model_kind == "conv"
    assert found["memory_format"].value in ("contiguous_format", "channels_last")
    for setting, finding in found.items():
        if setting.startswith("environment."):
            assert setting.removeprefix("environment.") in ALLOWED_ENVIRONMENT
            assert finding.value is None or isinstance(finding.value, str)
    if found["environment.PYTORCH_CUDA_ALLOC_CONF"].value is not None:
        assert ctx.snapshot.host.os_name == "linux"
        assert not any(a.unified_memory for a in ctx.gpus)
    if mode is not Mode.REPRODUCIBLE:
        assert found["environment.CUBLAS_WORKSPACE_CONFIG"].value is None
        assert found["environment.HIPBLAS_WORKSPACE_CONFIG"].value is None
