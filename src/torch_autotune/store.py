"""The profile store: one profile per machine fingerprint, in the user's config directory.

Location, first match wins: an explicit directory (``--store``), the ``TORCH_AUTOTUNE_HOME``
environment variable, then the per-user config directory (platformdirs: ~/.config/torch-autotune
on Linux). Profiles are stored as ``profiles/<fingerprint>.json`` (JSON: ``recommend()`` reads it
without importing a YAML parser) and written atomically: a temporary file in the same directory,
flushed and renamed over the old one, so a crash never leaves half a profile.

A profile whose fingerprint differs from this machine's but that this machine wrote (same
``machine_id``) is *stale*: the GPU, driver, torch or CUDA changed since. It is reported, never
used.
"""

from __future__ import annotations

import hashlib
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from torch_autotune.errors import ProfileFileError, StoreError
from torch_autotune.files import write_atomically
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Profile, fingerprint

ENV_HOME = "TORCH_AUTOTUNE_HOME"


def machine_id() -> str:
    """A hash of this host's name: which machine wrote a profile, without saying its name."""
    return hashlib.sha256(platform.node().encode()).hexdigest()[:12]


def store_dir(explicit: str | Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The store directory (it may not exist yet)."""
    if explicit is not None:
        return Path(explicit)
    env = os.environ if env is None else env
    if env.get(ENV_HOME):
        return Path(env[ENV_HOME])
    import platformdirs

    return Path(platformdirs.user_config_dir("torch-autotune", appauthor=False))


@dataclass(frozen=True)
class Lookup:
    """What the store holds for a machine."""

    profile: Profile | None  # the fresh profile, when there is one
    stale: Profile | None  # the newest profile this machine wrote for another fingerprint
    stale_reason: str | None


class ProfileStore:
    """Profiles of the machines this user ran torch-autotune on."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = store_dir(directory)

    @property
    def profiles_dir(self) -> Path:
        return self.directory / "profiles"

    def path_for(self, fingerprint_hex: str) -> Path:
        return self.profiles_dir / f"{fingerprint_hex}.json"

    def save(self, profile: Profile) -> Path:
        """Write atomically (a crash never leaves half a profile); return the path."""
        from torch_autotune.profile_io import dump_profile

        target = self.path_for(profile.provenance.fingerprint)
        try:
            write_atomically(target, dump_profile(profile, "json"))
        except StoreError as exc:
            raise StoreError(
                f"{exc}; choose another place with --store DIR or {ENV_HOME}"
            ) from None
        return target

    def load(self, fingerprint_hex: str) -> Profile | None:
        """The stored profile for a fingerprint, None when there is none."""
        from torch_autotune.profile_io import parse_profile

        path = self.path_for(fingerprint_hex)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None
        return parse_profile(text, source=str(path), fmt="json")

    def lookup(self, snapshot: HardwareSnapshot, machine: str) -> Lookup:
        """The fresh profile for this snapshot, or the stale one this machine left behind."""
        wanted = fingerprint(snapshot)
        fresh = self.load(wanted)
        if fresh is not None:
            return Lookup(fresh, None, None)
        stale = self._newest_other(wanted, machine)
        return Lookup(None, stale, None if stale is None else changes_since(stale, snapshot))

    def _newest_other(self, wanted: str, machine: str) -> Profile | None:
        from torch_autotune.profile_io import parse_profile

        if not self.profiles_dir.is_dir():
            return None
        newest: Profile | None = None
        for path in self.profiles_dir.glob("*.json"):
            if path.stem == wanted or path.name.startswith("."):
                continue
            try:
                profile = parse_profile(path.read_text(encoding="utf-8"), str(path), "json")
            except (OSError, ProfileFileError):
                continue  # an unreadable old profile is no evidence of anything
            if profile.provenance.machine_id != machine:
                continue
            if newest is None or profile.provenance.created_at > newest.provenance.created_at:
                newest = profile
        return newest


def changes_since(stored: Profile, now: HardwareSnapshot) -> str:
    """What changed between the machine a profile was made on and ``now``, in words."""
    before = stored.provenance.snapshot
    changes: list[str] = []

    def compare(label: str, old: object, new: object) -> None:
        if old != new:
            changes.append(f"{label} {old} -> {new}")

    compare("GPUs", [a.name for a in before.accelerators], [a.name for a in now.accelerators])
    compare("driver", before.software.nvidia_driver_version, now.software.nvidia_driver_version)
    compare("torch", before.software.torch_version, now.software.torch_version)
    compare("CUDA", before.software.torch_cuda_version, now.software.torch_cuda_version)
    compare("Python", before.software.python_version, now.software.python_version)
    compare("usable CPUs", before.host.cpus_usable, now.host.cpus_usable)
    return ", ".join(changes) or "the hardware or software fingerprint"
