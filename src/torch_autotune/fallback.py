"""Why ``recommend()`` returned the rules-only profile, in one line: the mode or the workload
asked for is not in the store, and what the store holds instead ("perhaps you meant ...").

``recommend()`` warns with it (``RulesOnlyWarning``) where the caller asked for something the
store does not hold: a workload, or a mode the stored profile is not of. A mistyped workload
(``'bnnet'`` where ``'BNNet'`` was measured) or a mode never measured came back as the
rules-only profile without a word. ``show``, ``export`` and ``report`` print the same line as
a note, for a recorded machine too (``machine`` and ``where`` name it). A plain
``recommend()`` on a machine where nothing was measured yet is the documented first run, and
says nothing.
"""

from __future__ import annotations

import difflib
import warnings
from pathlib import Path

from torch_autotune.errors import RulesOnlyWarning, StoreError
from torch_autotune.profile import Mode, Profile
from torch_autotune.remeasure import measure_again
from torch_autotune.store import ProfileStore

THIS_MACHINE = "this machine"


def mode_asked(mode: Mode | str | None) -> Mode | None:
    """``mode`` as a ``Mode``; a ValueError that lists the modes for any other value (the
    enum's own said only "'fast' is not a valid Mode")."""
    if mode is None:
        return None
    try:
        return Mode(mode)
    except ValueError:
        modes = ", ".join(repr(m.value) for m in Mode)
        raise ValueError(f"{mode!r} is not a mode: choose one of {modes}") from None


def warn_if_asked_for(
    store: str | Path | None, profile: Profile, workload: str | None, mode: Mode | None
) -> None:
    """A ``RulesOnlyWarning`` that says why the rules-only ``profile`` came back, where
    ``workload`` or ``mode`` asked for a profile the store does not hold (``why_rules_only``);
    nothing for a plain ``recommend()`` with nothing stored."""
    stored = stored_for(store, profile, workload)
    if workload is None and (stored is None or mode is None or stored == profile):
        return
    text = why_rules_only(store, profile, workload, stored=stored)
    warnings.warn(RulesOnlyWarning(text), stacklevel=4)


def stored_for(store: str | Path | None, profile: Profile, workload: str | None) -> Profile | None:
    """The profile the store holds for ``profile``'s machine (measured on ``workload`` where
    one is named), whatever its mode; None when there is none or it cannot be read (that was
    said already)."""
    try:
        return ProfileStore(store).load(profile.provenance.fingerprint, workload)
    except StoreError:
        return None


def why_rules_only(
    store: str | Path | None,
    profile: Profile,
    workload: str | None,
    *,
    stored: Profile | None,
    machine: str = THIS_MACHINE,
    where: str = "",
) -> str:
    """Why the rules-only ``profile`` is used for ``machine`` (``where``: "on that machine"
    for a recorded one), with the remedy, in one line. ``stored``: what the store holds for
    the machine (and ``workload``), whatever its mode (``stored_for``)."""
    if stored is None:
        return _nothing_stored(store, profile, workload, machine, where)
    what = f"the profile stored for {machine}"
    if workload is not None:
        what = f"the profile measured on {workload} for {machine}"
    if stored == profile:
        again = measure_again(None, where=where, purpose="to measure")
        return (
            f"{what} is rules-only (saved by 'autotune recommend --save'), not measured ({again})"
        )
    mode = profile.mode.value
    again = measure_again(workload, stored, mode=mode, where=where, purpose="to measure")
    return (
        f"{what} is for {stored.mode.value} mode, not {mode}; using the rules-only {mode} "
        f"profile ({again})"
    )


def _nothing_stored(
    store: str | Path | None, profile: Profile, workload: str | None, machine: str, where: str
) -> str:
    """Why the rules-only profile is used where the store holds none for the machine (or the
    workload), and what it holds instead."""
    if workload is None:
        again = measure_again(None, where=where, purpose="to measure")
        return f"no profile stored for {machine}; using the rules-only profile ({again})"
    found = ProfileStore(store)
    measured = found.measured_workloads(profile.provenance.fingerprint)
    text = f"no profile measured on {workload} for {machine}"
    jobs = found.measured_by_jobs(profile.provenance.fingerprint, workload)
    if jobs:
        world, path = jobs[0]
        return (
            f"{text} in one process; one for a job of {world} ranks is stored ({path}):"
            " recommend() returns it in each rank under torchrun, and 'autotune export"
            " --profile' that file exports it; using the rules-only profile of one process"
        )
    others = [w for w in measured if w != workload]
    close = difflib.get_close_matches(workload, others, n=1)
    if not close:  # a name typed in another case: 'bnnet' for 'BNNet'
        close = [w for w in others if w.lower() == workload.lower()][:1]
    if close:  # the name is what to fix: 'autotune -m resnet5' would exit 5
        return f"{text}; using the rules-only profile: perhaps you meant '{close[0]}'?"
    if measured:
        text += f" (measured here: {', '.join(measured)})"
    again = measure_again(workload, where=where, purpose="to measure")
    return f"{text}; using the rules-only profile ({again})"
