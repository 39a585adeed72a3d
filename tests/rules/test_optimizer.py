"""Fused optimizers, batch settings and the seed on recorded machines (catalog I, K, L, C4)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Mode, Source, settings_paths
from torch_autotune.rules.context import Finding, Measurements, Preferences
from torch_autotune.rules.optimizer import batch, optimizer

from .helpers import ALL_FIXTURES, context_with, run, snapshot, with_software

SNAPSHOTS = {name: snapshot(name) for name in ALL_FIXTURES}

BATCH_SETTINGS = {"batch.batch_size", "batch.grad_accum_steps", "seed"}


_ctx = context_with


def _findings(
    machine: str | HardwareSnapshot, measurements: Measurements | None = None, **prefs: Any
) -> dict[str, Finding]:
    return run(_ctx(machine, measurements, **prefs), optimizer, batch)


# --- one finding per owned setting, every time --------------------------------------------------


@pytest.mark.parametrize("machine", ALL_FIXTURES)
@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
def test_every_owned_setting_gets_exactly_one_reasoned_finding(machine: str, mode: Mode) -> None:
    ctx = _ctx(machine, mode=mode)
    for rule, owned in ((optimizer, {"optimizer.fused"}), (batch, BATCH_SETTINGS)):
        findings = list(rule(ctx))
        assert sorted(f.setting for f in findings) == sorted(owned)
        for finding in findings:
            assert finding.setting in settings_paths()
            assert finding.reason.strip()
            assert finding.rule


# --- fused optimizers (I1-I5) -------------------------------------------------------------------

FUSED_CASES = [
    pytest.param("cpu-container-quota-4", False, "I3", "CPU", id="cpu-container-quota-4"),
    pytest.param("cpu-laptop-linux", False, "I3", "beta", id="cpu-laptop-linux"),
    pytest.param("rtx-3060-windows", True, "I2", "torch 2.7.1", id="rtx-3060-windows"),
    pytest.param("a100-sxm4-80gb-8x", True, "I2", "torch 2.8.0", id="a100-sxm4-80gb-8x"),
    pytest.param("h100-80gb-hbm3", True, "I2", "adamw", id="h100"),
    pytest.param("tesla-t4", True, "I2", "CUDA/ROCm GPU", id="tesla-t4"),
    pytest.param("gtx-1660-ti", True, "I2", "CUDA/ROCm GPU", id="gtx-1660-ti"),
    pytest.param("jetson-agx-orin-32gb", True, "I2", "nv24.08", id="jetson-agx-orin-32gb"),
    pytest.param("mi300x-rocm", True, "I2", "rocm6.4", id="mi300x-rocm"),
    pytest.param("apple-m2-pro-mps", False, "I4", "MPS", id="apple-m2-pro-mps"),
    pytest.param("tesla-v100-sxm2-16gb", True, "I2", "CUDA/ROCm GPU", id="tesla-v100"),
    pytest.param("rtx-4090-plus-rtx-3060", True, "I2", "CUDA/ROCm GPU", id="4090+3060"),
    pytest.param("gtx-1080-ti-driver-460", False, "I2", "1.12.1", id="torch-1.12"),
]


@pytest.mark.parametrize(("machine", "fused", "rule", "fact"), FUSED_CASES)
def test_fused_adamw_on_cuda_and_rocm_gpus(machine: str, fused: bool, rule: str, fact: str) -> None:
    found = _findings(machine)["optimizer.fused"]
    assert found.value is fused
    assert found.rule == rule
    assert fact in found.reason


@pytest.mark.parametrize(
    ("name", "fused", "rule", "fact"),
    [
        pytest.param("adam", True, "I2", "adam", id="adam"),
        pytest.param("adamw", True, "I2", "adamw", id="adamw"),
        pytest.param("sgd", False, "I5", "beta", id="sgd"),
        pytest.param("other", False, "I1", "not Adam/AdamW", id="other"),
    ],
)
def test_fused_only_for_adam_and_adamw(name: str, fused: bool, rule: str, fact: str) -> None:
    found = _findings("h100-80gb-hbm3", optimizer=name)["optimizer.fused"]
    assert found.value is fused
    assert found.rule == rule
    assert fact in found.reason


@pytest.mark.parametrize("machine", ["cpu-laptop-linux", "apple-m2-pro-mps", "h100-80gb-hbm3"])
def test_a_workload_whose_optimizer_is_built_fused_keeps_it_with_why(machine: str) -> None:
    """A Trainer's optim='adamw_torch_fused' trained fused on the CPU while the profile said
    off (I3): the probe passes no fused where the rules keep torch's default. The rules now
    take the kernel the workload fixes as a fact (I6); where they fuse anyway, I2 stands."""
    fixed = "your Trainer's optim='adamw_torch_fused'"
    found = _findings(machine, optimizer_fused_by=fixed)["optimizer.fused"]
    assert found.value is True
    if machine == "h100-80gb-hbm3":
        assert found.rule == "I2"
        return
    assert found.rule == "I6"
    assert found.reason.startswith(f"fixed by {fixed}: the workload's optimizer is built fused")
    assert _findings(machine)["optimizer.fused"].value is False


def test_fused_needs_torch_2_0() -> None:
    assert (
        _findings(with_software("tesla-t4", torch_version="1.13.1+cu117"))["optimizer.fused"].value
        is False
    )
    assert (
        _findings(with_software("tesla-t4", torch_version="2.0.0+cu118"))["optimizer.fused"].value
        is True
    )


# --- batch size, accumulation, seed (K, L, C4) --------------------------------------------------


@pytest.mark.parametrize("machine", ["h100-80gb-hbm3", "cpu-container-quota-4", "apple-m2-pro-mps"])
def test_unmeasured_batch_size_is_never_invented(machine: str) -> None:
    found = _findings(machine)["batch.batch_size"]
    assert found.value is None
    assert found.rule == "K1"
    assert found.source is Source.INFERRED
    assert "not measured" in found.reason
    assert "never hands out a batch size it did not run" in found.reason
    assert "run autotune to probe" in found.reason


def test_measured_batch_size_flows_through() -> None:
    found = _findings("h100-80gb-hbm3", Measurements(batch_size=96))["batch.batch_size"]
    assert found.value == 96
    assert found.rule == "K2"
    assert found.source is Source.MEASURED
    assert "96" in found.reason


def test_a_batch_chosen_from_training_fed_by_the_dataloader_says_so() -> None:
    how = "64: training fed by the DataLoader runs below the step alone (at best 410 ...)"
    found = _findings("cpu-container-quota-4", Measurements(batch_size=64, batch_reason=how))
    assert found["batch.batch_size"].value == 64
    assert found["batch.batch_size"].reason == how
    assert found["batch.batch_size"].source is Source.MEASURED


def test_measurements_without_a_batch_size_leave_it_unset() -> None:
    found = _findings("h100-80gb-hbm3", Measurements(num_workers=4))["batch.batch_size"]
    assert found.value is None
    assert found.source is Source.INFERRED


def test_no_accumulation_without_a_target_batch() -> None:
    found = _findings("a100-sxm4-80gb-8x")["batch.grad_accum_steps"]
    assert found.value == 1
    assert found.rule == "L1"
    assert "target" in found.reason


@pytest.mark.parametrize(
    ("mode", "seed"),
    [(Mode.REPRODUCIBLE, 1234), (Mode.SPEED, None), (Mode.BALANCED, None)],
    ids=lambda v: v.value if isinstance(v, Mode) else str(v),
)
def test_seed_only_in_reproducible_mode(mode: Mode, seed: int | None) -> None:
    found = _findings("tesla-t4", mode=mode, seed=1234)["seed"]
    assert found.value == seed
    assert found.rule == "C4"
    assert (str(seed) if seed is not None else "not set") in found.reason


# --- properties ---------------------------------------------------------------------------------


PREFERENCES = st.builds(
    Preferences,
    mode=st.sampled_from(list(Mode)),
    model_kind=st.sampled_from(["conv", "transformer", "mlp", "other"]),
    fixed_shapes=st.booleans(),
    optimizer=st.sampled_from(["adam", "adamw", "sgd", "other"]),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)


@settings(max_examples=300, deadline=None)
@given(
    machine=st.sampled_from(ALL_FIXTURES),
    prefs=PREFERENCES,
    measured_batch=st.one_of(st.none(), st.integers(min_value=1, max_value=4096)),
)
def test_findings_keep_the_profile_invariants(
    machine: str, prefs: Preferences, measured_batch: int | None
) -> None:
    measurements = None if measured_batch is None else Measurements(batch_size=measured_batch)
    ctx = _ctx(machine, measurements, **prefs.model_dump())
    found = run(ctx, optimizer, batch)
    if found["optimizer.fused"].value:
        assert ctx.device == "cuda"
        assert prefs.optimizer in ("adam", "adamw")
        assert ctx.torch_at_least(2, 0)
    assert found["batch.batch_size"].value == measured_batch
    assert (found["batch.batch_size"].source is Source.MEASURED) == (measured_batch is not None)
    assert found["batch.grad_accum_steps"].value == 1
    assert found["seed"].value == (prefs.seed if prefs.mode is Mode.REPRODUCIBLE else None)
