"""A profile file whose settings a person changed by hand: each such setting's decision says so.

A profile is YAML a person may edit: ``num_workers: 0`` made ``2``. The decision behind the
setting still held the probe's 0, its numbers and "measured", and every command that showed
the profile (``export``, ``report``, ``show``) gave the 2 the 0's reason: "every setting
carries its reason" no longer held. ``with_hand_edits`` compares each setting with the value
of its decision (the last one for it: a later rule may override an earlier) and, where they
differ, decides that setting by the user, keeping what the profile had said in the reason.
The profile's other decisions, and its evidence, stay as they were measured.

A setting the rules derive from an edited one keeps its value but not a stale reason: with
``num_workers: 0`` made ``4``, ``persistent_workers`` still said "no workers to keep". Where the
rules take the edited setting as the user's (``num_workers``, as ``tune(num_workers=)`` gives
it), they run again with the old and the new value; each other setting whose decision differs
between the two is given the rules' decision for the new value where the file holds that
value, else a reason that says what the profile had it for and what the rules give now.

The invariants still hold the edited values to the machine and to what the probe ran (a batch
that did not run, bf16 on a GPU without it): an edit they refuse is refused before this runs.
"""

from __future__ import annotations

from pydantic import ValidationError

from torch_autotune.profile import Decision, Profile
from torch_autotune.records import on_off
from torch_autotune.settings import Source, setting_value

__all__ = ["with_hand_edits"]


_AS_PREFERENCE = {"dataloader.num_workers": "num_workers"}
"""Settings the rules take as the user's, by the ``Preferences`` field that gives them."""


def with_hand_edits(profile: Profile) -> Profile:
    """``profile`` with each setting whose value is not its decision's decided by the user,
    and the settings the rules derive from it reasoned for its new value (module docstring);
    the same profile where none was changed."""
    decisions = list(profile.decisions)
    last = {d.setting: i for i, d in enumerate(decisions)}
    edited: dict[str, tuple[object, object]] = {}  # setting: (the profile's value, the file's)
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
        edited[setting] = (was.value, now)
    if not edited:
        return profile
    changes = [f"{s} ({_shown(old)} -> {_shown(new)})" for s, (old, new) in edited.items()]
    note = f"changed by hand in the file, not as measured or inferred: {', '.join(changes)}"
    derived: list[str] = []
    for setting, (old, new) in edited.items():
        for decision in _derived(profile, setting, old, new, skip=set(edited)):
            decisions[last[decision.setting]] = decision
            derived.append(decision.setting)
    if derived:
        note += (
            f"; the reasons of {', '.join(derived)}, which follow from it, are for the new value"
        )
    return profile.model_copy(
        update={"decisions": tuple(decisions), "notes": (*profile.notes, note)}
    )


def _derived(
    profile: Profile, setting: str, was: object, now: object, *, skip: set[str]
) -> list[Decision]:
    """The decisions of the settings (but those in ``skip``) the rules derive from ``setting``,
    for its value ``now`` where it was ``was``: those whose decision differs when the rules run
    with each as the user's (``_AS_PREFERENCE``); none where the rules cannot take it so."""
    field = _AS_PREFERENCE.get(setting)
    if field is None:
        return []
    from torch_autotune.rules.engine import build_profile

    provenance = profile.provenance

    def decided(value: object) -> dict[str, Decision]:
        raw = {**provenance.preferences.model_dump(), field: value}
        preferences = type(provenance.preferences).model_validate(raw)  # a value it can take
        return {
            d.setting: d for d in build_profile(provenance.snapshot, None, preferences).decisions
        }

    try:
        before, after = decided(was), decided(now)
    except ValidationError:  # a decision's value no setting could hold (a file edited so)
        return []
    given = {d.setting: d for d in profile.decisions}
    found: list[Decision] = []
    for name, rules in after.items():
        if name == setting or name in skip or name not in given or rules == before.get(name):
            continue
        value, had = setting_value(profile.settings, name), given[name]
        if _same(value, rules.value) and had == before.get(name):
            found.append(
                rules.model_copy(update={"reason": f"{rules.reason} (for {setting} {now})"})
            )
            continue
        found.append(
            had.model_copy(
                update={
                    "reason": f"{_shown(value)}: as the profile had it with {setting} {was}"
                    f" ({had.reason}); with {now}, set by hand, the rules give"
                    f" {_shown(rules.value)} ({rules.rule}: {rules.reason})"
                }
            )
        )
    return found


def _same(now: object, was: object) -> bool:
    """Equal as a file holds them: a switch is never a number (``True == 1`` in Python)."""
    if isinstance(now, bool) or isinstance(was, bool):
        return now is was
    return now == was


def _shown(value: object) -> str:
    """A value as the reports show it: a switch by ``records.on_off``, others as written."""
    return on_off(value) if value is None or isinstance(value, bool) else str(value)
