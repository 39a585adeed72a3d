"""The rules engine: snapshot (+ measurements, + preferences) in, validated profile out.

Rules are plain functions over a ``Context`` that yield ``Finding``s. They run in the explicit
order of ``RULES`` (the evaluation order of the rules catalog: back end and wheel gate first,
then precision, TF32, compile, cuDNN, memory format, optimizer, DataLoader, threads, allocator,
batch). A later finding for a setting an earlier rule decided replaces it, and the decision
says which rule it overrode, so a conflict is visible in the profile, never silent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any

from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import (
    Decision,
    Evidence,
    Profile,
    Provenance,
    Settings,
    fingerprint,
    settings_paths,
)
from torch_autotune.rules.backend import choose_device
from torch_autotune.rules.compile import compile_settings
from torch_autotune.rules.context import Context, Finding, Measurements, Preferences
from torch_autotune.rules.dataloader import cpu_threads, dataloader
from torch_autotune.rules.distributed import ddp
from torch_autotune.rules.memory import allocator, checkpointing, cudnn, memory_format
from torch_autotune.rules.optimizer import batch, optimizer
from torch_autotune.rules.precision import precision, tf32
from torch_autotune.version import __version__

Rule = Callable[[Context], Iterable[Finding]]

UNKNOWN_HOST = "unknown"
"""The machine id of a profile built without one: the engine reads no host name."""

RULES: tuple[Rule, ...] = (
    choose_device,
    precision,
    tf32,
    compile_settings,
    cudnn,
    memory_format,
    optimizer,
    dataloader,
    cpu_threads,
    allocator,
    checkpointing,
    ddp,
    batch,
)
"""Every rule, in the order it runs."""


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """{'a.b': 1, 'environment.X': 'v'} -> {'a': {'b': 1}, 'environment': {'X': 'v'}}."""
    nested: dict[str, Any] = {"environment": {}}
    for path, value in flat.items():
        *parents, leaf = path.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        if parents == ["environment"] and value is None:
            continue  # an unset variable
        node[leaf] = value
    return nested


def run_rules(ctx: Context, rules: Iterable[Rule] = RULES) -> list[Decision]:
    """Run the rules in order; return every decision (later ones override earlier ones)."""
    decisions: list[Decision] = []
    decided_by: dict[str, str] = {}
    for rule in rules:
        for finding in rule(ctx):
            reason = finding.reason
            earlier = decided_by.get(finding.setting)
            if earlier is not None and ctx.decided[finding.setting] != finding.value:
                reason += f" (overrides {earlier}: {ctx.decided[finding.setting]!r})"
            ctx.decided[finding.setting] = finding.value
            decided_by[finding.setting] = finding.rule
            decisions.append(
                Decision(
                    setting=finding.setting,
                    value=finding.value,
                    rule=finding.rule,
                    reason=reason,
                    source=finding.source,
                )
            )
    return decisions


def build_profile(
    snapshot: HardwareSnapshot,
    measurements: Measurements | None = None,
    preferences: Preferences | None = None,
    *,
    now: datetime | None = None,
    host_id: str = UNKNOWN_HOST,
    evidence: Evidence | None = None,
) -> Profile:
    """The profile the rules give for a machine. Pure: no hardware, no I/O, no torch.

    ``host_id`` is the provenance's machine id (``store.machine_id()``, a hash of the host
    name, which the caller reads: ``torch_autotune.api`` does); without it the profile says
    ``UNKNOWN_HOST``. ``now`` is the creation time (default: the current time in UTC).
    """
    ctx = Context(
        snapshot=snapshot, preferences=preferences or Preferences(), measurements=measurements
    )
    decisions = run_rules(ctx)
    missing = sorted(
        p for p in settings_paths() if p not in ctx.decided and not p.startswith("environment")
    )
    if missing:
        raise RuntimeError(f"rules engine bug: no rule decided {', '.join(missing)}")
    settings = Settings.model_validate(_nest(ctx.decided))
    return Profile(
        mode=ctx.mode,
        measured=any(d.source.value == "measured" for d in decisions),
        settings=settings,
        decisions=tuple(decisions),
        notes=tuple(_notes(ctx)),
        provenance=Provenance(
            fingerprint=fingerprint(snapshot),
            machine_id=host_id,
            tool_version=__version__,
            torch_version=snapshot.software.torch_version,
            created_at=now or datetime.now(timezone.utc),
            preferences=ctx.preferences,
            snapshot=snapshot,
        ),
        topology=ctx.topology,  # read by the rules above, stored for the probe and exporters
        evidence=evidence,
    )


def _notes(ctx: Context) -> list[str]:
    notes = []
    if len({a.name for a in ctx.gpus}) > 1:
        notes.append(
            "The GPUs differ: this profile holds on the weakest of them "
            f"({', '.join(sorted({a.name for a in ctx.gpus}))})."
        )
    if ctx.measurements is None:
        notes.append(
            "Rules only, nothing measured: run 'autotune' on this machine to probe the batch "
            "size and DataLoader workers."
        )
    return notes
