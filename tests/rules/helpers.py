"""Shared helpers for rule tests: fixture snapshots and contexts after chosen rules."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.rules.backend import choose_device
from torch_autotune.rules.context import Context, Finding, Preferences

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
