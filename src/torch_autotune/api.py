"""recommend(): this machine's profile, cheaply, for use inside a training script.

The path is: a fast detection (NVML and the OS, no torch, no CUDA context), the machine's
fingerprint, and one JSON file from the store. Only when no fresh profile is stored does the
rules engine run, and the profile it returns says it was not measured.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from torch_autotune.detect import Machine, detect
from torch_autotune.errors import (
    StaleProfileWarning,
    StoredProfileError,
    StoredProfileWarning,
    UnusableGpuWarning,
)
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Mode, Profile
from torch_autotune.store import Lookup, ProfileStore, machine_id


def recommend(
    mode: Mode | str | None = None,
    *,
    workload: str | None = None,
    store: str | Path | None = None,
    machine: Machine | None = None,
) -> Profile:
    """This machine's profile: the stored one when it is fresh, else a rules-only profile.

    ``workload`` names the workload the profile was measured on (``"resnet50"``,
    ``"mypkg.models:make_workload"``, as given to ``autotune -m``). Without it, the profile
    saved last on this machine comes back: the one measured on the last workload ``autotune``
    or ``autotune bench`` ran, as earlier versions did, which is the right one for a user who
    measures their own model. With several workloads measured, name the one you train.

    ``mode`` asks for a mode; a stored profile of another mode is not returned. A stored
    profile whose machine changed since is never used: a ``StaleProfileWarning`` says what
    changed, and the rules-only profile comes back instead (``profile.measured`` is False), as
    it does when nothing was measured on ``workload`` here. A stored profile that is corrupt
    or was made for another machine is never used either: a ``StoredProfileWarning`` names
    the file and the fix, and the rules-only profile comes back, so a training script goes on.
    A GPU the installed torch cannot run (no kernels for its architecture) gives a CPU profile
    and an ``UnusableGpuWarning`` that names the torch build that would run it. Importing
    torch and starting CUDA are left to the caller.
    """
    return profile_for(detect(machine), mode, workload=workload, store=store, writer=machine_id())


def profile_for(
    snapshot: HardwareSnapshot,
    mode: Mode | str | None = None,
    *,
    workload: str | None = None,
    store: str | Path | None = None,
    writer: str | None = None,
) -> Profile:
    """``recommend()`` for a detected ``snapshot``: stored if fresh, else rules only.

    ``writer`` is the machine id whose stale profiles are reported (``machine_id()`` for this
    machine); None for a recorded snapshot of another machine, whose history this store
    cannot know, so nothing is called stale.
    """
    wanted = None if mode is None else Mode(mode)
    try:
        lookup = ProfileStore(store).lookup(snapshot, writer, workload)
    except StoredProfileError as error:
        warnings.warn(StoredProfileWarning(error), stacklevel=3)
        lookup = Lookup(None, None, None)
    if lookup.profile is not None and wanted in (None, lookup.profile.mode):
        _warn_if_gpu_unused(lookup.profile)
        return lookup.profile
    if lookup.stale is not None:
        what = "the stored profile" if workload is None else f"the profile stored for {workload}"
        again = "autotune" if workload is None else f"autotune -m {workload}"
        warnings.warn(
            StaleProfileWarning(
                f"{what} was made before this machine changed ({lookup.stale_reason}); using"
                f" rules only: run '{again}' to measure again"
            ),
            stacklevel=3,
        )
    from torch_autotune.rules.context import Preferences
    from torch_autotune.rules.engine import build_profile

    profile = build_profile(snapshot, preferences=Preferences(mode=wanted or Mode.SPEED))
    _warn_if_gpu_unused(profile)
    return profile


def unused_gpu_reason(profile: Profile) -> str | None:
    """Why ``profile`` trains on the CPU although its machine has a GPU (rules catalog E1:
    torch ships no kernels for the GPU, or is a CPU build), in one line; None otherwise."""
    decision = profile.decision("device")
    if decision is None or decision.rule != "E1":
        return None
    reason = decision.reason.removeprefix("No GPU profile: ").rstrip(".")
    return f"training on the CPU although this machine has a GPU: {reason}"


def _warn_if_gpu_unused(profile: Profile) -> None:
    reason = unused_gpu_reason(profile)
    if reason is not None:
        warnings.warn(UnusableGpuWarning(reason), stacklevel=4)
