"""A profile file whose settings a person changed by hand: each such setting's decision says so.

A profile is YAML a person may edit: ``num_workers: 0`` made ``2``. The decision behind the
setting still held the probe's 0, its numbers and "measured", and every command that showed
the profile (``export``, ``report``, ``show``) gave the 2 the 0's reason: "every setting
carries its reason" no longer held. ``with_hand_edits`` compares each setting with the value
of its decision (the last one for it: a later rule may override an earlier) and, where they
differ, decides that setting by the user, keeping what the profile had said in the reason.
The profile's other decisions, and its evidence, stay as they were measured.

The invariants still hold the edited values to the machine and to what the probe ran (a batch
that did not run, bf16 on a GPU without it): an edit they refuse is refused before this runs.
"""

from __future__ import annotations

from torch_autotune.profile import Decision, Profile
from torch_autotune.records import on_off
from torch_autotune.settings import Source, setting_value

__all__ = ["with_hand_edits"]


def with_hand_edits(profile: Profile) -> Profile:
    """``profile`` with each setting whose value is not its decision's decided by the user
    (module docstring); the same profile where none was changed."""
    decisions = list(profile.decisions)
    last = {d.setting: i for i, d in enumerate(decisions)}
    edited: list[str] = []
    for setting, i in last.items():
        was = decisions[i]
        try:
            now = setting_value(profile.settings, setting)
        except KeyError:  # a decision of no single leaf (none is written so today)
            continue
        if _same(now, was.value):
            continue
        decisions[i] = Decision(
            setting=setting,
            value=now,
            rule=was.rule,
            reason=(
                f"{_shown(now)}: set by hand in the profile file; the profile had "
                f"{_shown(was.value)} ({was.source.value}: {was.reason})"
            ),
            source=Source.USER,
        )
        edited.append(f"{setting} ({_shown(was.value)} -> {_shown(now)})")
    if not edited:
        return profile
    note = f"changed by hand in the file, not as measured or inferred: {', '.join(edited)}"
    return profile.model_copy(
        update={"decisions": tuple(decisions), "notes": (*profile.notes, note)}
    )


def _same(now: object, was: object) -> bool:
    """Equal as a file holds them: a switch is never a number (``True == 1`` in Python)."""
    if isinstance(now, bool) or isinstance(was, bool):
        return now is was
    return now == was


def _shown(value: object) -> str:
    """A value as the reports show it: a switch by ``records.on_off``, others as written."""
    return on_off(value) if value is None or isinstance(value, bool) else str(value)
