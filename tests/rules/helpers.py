"""Shared helpers for rule tests: fixture snapshots and contexts after chosen rules."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import (
    Decision,
    Profile,
    Provenance,
    Settings,
    fingerprint,
    profile_problems,
)
from torch_autotune.rules.backend import choose_device
from torch_autotune.rules.context import Context, Finding, Measurements, Preferences

SNAPSHOT_DIR = Path(__file__).parent.parent / "fixtures" / "snapshots"
ALL_FIXTURES = sorted(p.stem for p in SNAPSHOT_DIR.glob("*.json"))

Rule = Callable[[Context], Iterable[Finding]]


def snapshot(name: str) -> HardwareSnapshot:
    """A recorded machine from tests/fixtures/snapshots by file stem, e.g. 'tesla-t4'."""
    return HardwareSnapshot.model_validate_json((SNAPSHOT_DIR / f"{name}.json").read_text())


def run(ctx: Context, *rules: Rule) -> dict[str, Finding]:
    """Run rules in order on ``ctx`` like the engine does; return the last finding per setting."""
    last: dict[str, Finding] = {}
    for rule in rules:
        for finding in rule(ctx):
            ctx.decided[finding.setting] = finding.value
            last[finding.setting] = finding
    return last


def context(machine: str | HardwareSnapshot, *earlier: Rule, **preferences: Any) -> Context:
    """A Context for a fixture after choose_device and the given earlier rules have run."""
    snap = snapshot(machine) if isinstance(machine, str) else machine
    ctx = Context(snapshot=snap, preferences=Preferences(**preferences))
    run(ctx, choose_device, *earlier)
    return ctx


def context_with(
    machine: str | HardwareSnapshot, measurements: Measurements | None = None, **preferences: Any
) -> Context:
    """A Context after choose_device, with the probe's measurements (None: rules only)."""
    ctx = context(machine, **preferences)
    ctx.measurements = measurements
    return ctx


def with_software(machine: str, **update: Any) -> HardwareSnapshot:
    """A fixture with some software fields replaced, e.g. torch_version='2.9.0+cu128'."""
    snap = snapshot(machine)
    return snap.model_copy(update={"software": snap.software.model_copy(update=update)})


def with_host(machine: str, **update: Any) -> HardwareSnapshot:
    snap = snapshot(machine)
    return snap.model_copy(update={"host": snap.host.model_copy(update=update)})


def two_cpus() -> HardwareSnapshot:
    """The Linux laptop held to 2 usable CPUs, 2 cores: the shape of the 2-core VMs the
    recorded CPU runs came from."""
    return with_host(
        "cpu-laptop-linux",
        cpus_usable=2,
        cpu_cores_physical=2,
        cpu_cores_logical=2,
        cpu_affinity_count=2,
    )


def only_gpu(machine: str, index: int) -> HardwareSnapshot:
    """The same box with only one of its GPUs."""
    snap = snapshot(machine)
    gpu = snap.accelerators[index].model_copy(update={"index": 0})
    return snap.model_copy(update={"accelerators": (gpu,)})


def values(findings: dict[str, Finding]) -> dict[str, Any]:
    return {setting: finding.value for setting, finding in findings.items()}


def neutral_settings(decided: dict[str, Any]) -> Settings:
    """Settings with the rules' values where decided and invariant-neutral values elsewhere."""
    return Settings.model_validate(
        {
            "device": decided["device"],
            "precision": {
                "autocast": decided.get("precision.autocast", False),
                "dtype": decided.get("precision.dtype", "float32"),
                "grad_scaler": decided.get("precision.grad_scaler", False),
            },
            "matmul": {
                "tf32": decided.get("matmul.tf32", False),
                "api": decided.get("matmul.api"),
            },
            "backends": {
                "cudnn_benchmark": False,
                "cudnn_deterministic": False,
                "deterministic_algorithms": False,
            },
            "compile": {
                "enabled": decided.get("compile.enabled", False),
                "mode": decided.get("compile.mode"),
            },
            "memory_format": "contiguous_format",
            "dataloader": {
                "num_workers": 0,
                "pin_memory": False,
                "persistent_workers": False,
                "prefetch_factor": None,
                "seed_workers": False,
            },
            "optimizer": {"fused": False},
            "cpu_threads": None,
            "seed": None,
            "environment": {},
            "batch": {"batch_size": None, "grad_accum_steps": 1},
        }
    )


def invariant_problems(ctx: Context, findings: dict[str, Finding]) -> list[str]:
    """profile.py's own invariant checks, run on the decided settings (other settings neutral)."""
    snap = ctx.snapshot
    profile = Profile.model_construct(
        mode=ctx.mode,
        measured=False,
        settings=neutral_settings(ctx.decided),
        decisions=tuple(
            Decision(
                setting=f.setting, value=f.value, rule=f.rule, reason=f.reason, source=f.source
            )
            for f in findings.values()
        ),
        notes=(),
        provenance=Provenance.model_construct(
            fingerprint=fingerprint(snap),
            machine_id="test",
            tool_version="0",
            torch_version=snap.software.torch_version,
            created_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
            preferences=ctx.preferences,
            snapshot=snap,
        ),
    )
    return profile_problems(profile)
