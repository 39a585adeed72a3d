"""recommend(): this machine's profile, cheaply, for use inside a training script.

The path is: a fast detection (NVML and the OS, no torch, no CUDA context), the machine's
fingerprint, and one JSON file from the store. Only when no fresh profile is stored does the
rules engine run, and the profile it returns says it was not measured.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from torch_autotune.detect import Machine, detect
from torch_autotune.errors import StaleProfileWarning
from torch_autotune.profile import Mode, Profile
from torch_autotune.store import ProfileStore, machine_id


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
    it does when nothing was measured on ``workload`` here. Importing torch and starting CUDA
    are left to the caller.
    """
    wanted = None if mode is None else Mode(mode)
    snapshot = detect(machine)
    lookup = ProfileStore(store).lookup(snapshot, machine_id(), workload)
    if lookup.profile is not None and wanted in (None, lookup.profile.mode):
        return lookup.profile
    if lookup.stale is not None:
        what = "the stored profile" if workload is None else f"the profile stored for {workload}"
        again = "autotune" if workload is None else f"autotune -m {workload}"
        warnings.warn(
            StaleProfileWarning(
                f"{what} was made before this machine changed ({lookup.stale_reason}); using"
                f" rules only: run '{again}' to measure again"
            ),
            stacklevel=2,
        )
    from torch_autotune.rules.context import Preferences
    from torch_autotune.rules.engine import build_profile

    return build_profile(snapshot, preferences=Preferences(mode=wanted or Mode.SPEED))
