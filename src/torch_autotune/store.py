"""The profile store: this user's profiles, per machine fingerprint and per workload.

Location, first match wins: an explicit directory (``--store``), the ``TORCH_AUTOTUNE_HOME``
environment variable, then the per-user config directory (platformdirs: ~/.config/torch-autotune
on Linux). Profiles are JSON (``recommend()`` reads them without importing a YAML parser) and
written atomically: a temporary file in the same directory, flushed and renamed over the old
one, so a crash never leaves half a profile. Under ``profiles/``:

    <fingerprint>.json               the machine's profile: the last one saved for it, measured
                                     or rules-only; what ``recommend()`` returns
    <fingerprint>/<workload>.json    the profile measured last on each workload
                                     (``evidence.workload``; ``workload_key`` makes the name a
                                     file name); what ``recommend(workload=...)`` returns
    <fingerprint>/<mode>/<workload>.json  ... in each mode, for ``recommend(mode, ...)``

A job's profile (several ranks under torchrun, ``topology.world_size`` N above 1) goes beside
them, never over the profile of one process:

    <fingerprint>/world-<N>.json             the last job profile of N ranks saved
    <fingerprint>/world-<N>/<workload>.json  the job profile of N ranks measured on each workload

A measured profile is written to both, so measuring a second workload no longer replaces the
first one's profile (before, ``autotune bench -m transformer`` silently replaced the conv
profile), nor measuring it in a second mode the first mode's (a speed run replaced the
reproducible one). Stores written by earlier versions hold only ``<fingerprint>.json``, or no
mode folders: they are read as they are, ``<fingerprint>.json`` serves
``recommend(workload=W)`` when it was measured on ``W``, and a workload's profile of another
mode is copied to its mode's file before a save replaces it. Earlier versions read a store
written by this one the same way.

A profile whose fingerprint differs from this machine's but that this machine wrote (same
``machine_id``) is *stale*: the GPU, driver, torch or CUDA changed since. It is reported, never
used.

The store trusts nothing it reads. A file that is not UTF-8, not JSON or not a valid profile,
and a profile made for another machine than its file name says (a V100 profile copied under
this machine's fingerprint would have given a CPU-only machine ``device: cuda``), is a
``StoredProfileError`` naming the file and the fix; reading never deletes it. The profile's own
fingerprint must equal the one in its file name, and the fingerprint of the machine it records.
Only a regular file is read, and no more of it than a profile can hold: a FIFO in its place is
refused rather than waited on, a link to ``/dev/zero`` rather than read until memory runs out.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from torch_autotune.errors import (
    MeasuredProfileExistsError,
    ProfileFileError,
    StoredProfileError,
    StoreError,
)
from torch_autotune.files import check_writable, refuse_non_files, write_all_atomically
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Profile, fingerprint
from torch_autotune.remeasure import changes_since, from_objects, measure_again

ENV_HOME = "TORCH_AUTOTUNE_HOME"
_ELSEWHERE = f"choose another place with --store DIR or {ENV_HOME}"


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


_PLAIN_KEY = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
# Names Windows keeps for devices, with or without an extension ("con.json" cannot be made).
_RESERVED = {
    "con",
    "prn",
    "aux",
    "nul",
    *(f"{port}{n}" for port in ("com", "lpt") for n in range(10)),
}


def workload_key(workload: str) -> str:
    """The file name (less ``.json``) of the profile measured on ``workload``.

    A plain name (lower-case letters, digits, ``.``, ``_``, ``-``, as every built-in) is kept.
    Anything else (``mypkg.models:make_workload`` has a colon, which Windows refuses; capitals
    would meet on a case-insensitive disk) becomes a readable slug plus 10 hex digits of the
    name's SHA-256, so that two names do not share a file.
    """
    if (
        _PLAIN_KEY.fullmatch(workload)
        and not workload.endswith(".")
        and workload.partition(".")[0] not in _RESERVED
    ):
        return workload
    slug = re.sub(r"[^a-z0-9._-]+", "_", workload.lower()).strip("._-")[:40] or "workload"
    return f"{slug}-{hashlib.sha256(workload.encode()).hexdigest()[:10]}"


def measured_on(profile: Profile) -> str | None:
    """The workload a profile was measured on; None for a rules-only profile."""
    return None if profile.evidence is None else profile.evidence.workload


@dataclass(frozen=True)
class Lookup:
    """What the store holds for a machine (and a workload, when one was asked for)."""

    profile: Profile | None  # the fresh profile, when there is one
    stale: Profile | None  # the newest profile this machine wrote for another fingerprint
    stale_reason: str | None


class ProfileStore:
    """Profiles of the machines this user ran torch-autotune on, per workload."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = store_dir(directory)

    @property
    def profiles_dir(self) -> Path:
        return self.directory / "profiles"

    def path_for(self, fingerprint_hex: str, workload: str | None = None, world: int = 1) -> Path:
        """The machine's profile, or with ``workload`` the one measured on it; of a job of
        ``world`` ranks where that is above 1."""
        if world > 1:
            job = self.profiles_dir / fingerprint_hex / f"world-{world}"
            return job / f"{workload_key(workload)}.json" if workload else job.with_suffix(".json")
        if workload is None:
            return self.profiles_dir / f"{fingerprint_hex}.json"
        return self.profiles_dir / fingerprint_hex / f"{workload_key(workload)}.json"

    def path_of_mode(self, fingerprint_hex: str, workload: str, mode: str, world: int = 1) -> Path:
        """The profile measured on ``workload`` in ``mode``, kept beside the workload's last
        one so that measuring in another mode does not replace it."""
        workload_path = self.path_for(fingerprint_hex, workload, world)
        return workload_path.parent / mode / workload_path.name

    def save(self, profile: Profile, *, force: bool = False) -> Path:
        """Store ``profile`` as its machine's profile and, when measured, as its workload's.

        Written atomically (a crash never leaves half a profile). Returns the workload's file
        for a measured profile, else the machine's. A rules-only profile does not replace a
        measured one unless ``force``: MeasuredProfileExistsError says so (the measured
        profile of each workload stays in its own file either way).
        """
        from torch_autotune.profile_io import dump_profile

        text = dump_profile(profile, "json")
        world = profile.topology.world_size
        machine = self.path_for(profile.provenance.fingerprint, world=world)
        if not profile.measured and not force:
            self._check_replaceable(machine)
        workload, fp = measured_on(profile), profile.provenance.fingerprint
        writes = [(machine, text)]
        if workload is not None:  # the workload's last profile, and its profile of this mode
            last = self.path_for(fp, workload, world)
            mode = self.path_of_mode(fp, workload, profile.mode.value, world)
            writes[:0] = [*self._kept_beside(last, fp, workload), (last, text), (mode, text)]
        try:
            write_all_atomically(writes, make_parents=True)
        except StoreError as exc:
            raise StoreError(f"{exc}; {_ELSEWHERE}") from None
        return last if workload is not None else machine

    def _kept_beside(self, last: Path, fp: str, workload: str) -> list[tuple[Path, str]]:
        """The profile of another mode that the workload's file ``last`` holds, to write to
        its mode's file before ``last`` is replaced, where that file is missing (a store from
        an earlier version kept one profile a workload): measuring in speed mode replaced the
        reproducible one."""
        previous = self._read_or_skip(last)
        if previous is None or measured_on(previous) != workload:
            return []
        world = previous.topology.world_size
        keep = self.path_of_mode(fp, workload, previous.mode.value, world)
        return [] if os.path.lexists(keep) else [(keep, last.read_text(encoding="utf-8"))]

    def check_writable(self, fingerprint_hex: str | None = None) -> None:
        """StoreError now, before a probe, when the store cannot be written (its profiles'
        directory: ``files.check_writable``) or a file of ``fingerprint_hex``'s is a directory."""
        try:
            check_writable(self.profiles_dir)
            if fingerprint_hex is not None:
                folder = self.profiles_dir / fingerprint_hex
                refuse_non_files([self.path_for(fingerprint_hex), *sorted(folder.rglob("*.json"))])
        except StoreError as exc:
            raise StoreError(f"{exc}; {_ELSEWHERE}") from None

    def _check_replaceable(self, machine: Path) -> None:
        """MeasuredProfileExistsError when a rules-only profile would replace a measured one in
        ``machine``, or a file this version cannot read: a profile from a newer release (that
        may be measured), a corrupt one, one this user may not read. Whatever it holds, only
        ``--force`` throws it away."""
        try:
            current = self._read(machine)
        except StoreError as exc:
            if not os.path.lexists(machine):
                return  # nothing there to lose (the store is a file): the write says why
            raise MeasuredProfileExistsError(
                f"{machine} cannot be read as a profile here ('autotune show' says why) and may "
                "hold a measured one, such as one from a newer release; saving the rules-only "
                "profile would replace it: add --force to replace it, or leave out --save"
            ) from exc
        if current is not None and current.measured:
            raise MeasuredProfileExistsError(
                f"{machine} holds a profile measured on {measured_on(current) or 'a workload'}"
                "; saving the rules-only profile would replace it: add --force to replace "
                "it, or leave out --save"
            )

    def load(
        self, fingerprint_hex: str, workload: str | None = None, world: int = 1, mode: str = ""
    ) -> Profile | None:
        """The machine's profile, or the one measured on ``workload``, of a job of ``world``
        ranks; None when there is none. With ``mode``, where that profile is of another mode,
        the one measured in ``mode`` on its workload when one is stored.

        A workload without a file of its own gets the machine's profile when that was measured
        on it (a store written by an earlier version).
        """
        found = self._last(fingerprint_hex, workload, world)
        measured = workload or (None if found is None else measured_on(found))
        if not mode or measured is None or (found is not None and found.mode.value == mode):
            return found
        path = self.path_of_mode(fingerprint_hex, measured, mode, world)
        of_mode = self._of_world(self._read_for(fingerprint_hex, path, measured), world)
        if of_mode is not None and measured_on(of_mode) == measured and of_mode.mode.value == mode:
            return of_mode
        return found

    def _last(self, fingerprint_hex: str, workload: str | None, world: int) -> Profile | None:
        """The machine's profile saved last, or the one measured on ``workload`` (``load``)."""
        machine_path = self.path_for(fingerprint_hex, world=world)
        if workload is None:
            return self._of_world(self._read_for(fingerprint_hex, machine_path, workload), world)
        own_path = self.path_for(fingerprint_hex, workload, world)
        own = self._of_world(self._read_for(fingerprint_hex, own_path, workload), world)
        if own is not None and measured_on(own) == workload:
            return own
        machine = self._of_world(self._read_for(fingerprint_hex, machine_path, workload), world)
        return machine if machine is not None and measured_on(machine) == workload else None

    @staticmethod
    def _of_world(profile: Profile | None, world: int) -> Profile | None:
        """``profile`` where it is for a job of ``world`` ranks (a file moved by hand is not)."""
        return profile if profile is not None and profile.topology.world_size == world else None

    def measured_workloads(self, fingerprint_hex: str) -> list[str]:
        """The workloads with a measured profile of one process for this fingerprint, sorted by
        name (a job's machine file, ``world-2.json``, lies beside them and is not one)."""
        mine = self._profiles_in(self.profiles_dir / fingerprint_hex)
        found = {measured_on(p) for p in mine if p.topology.world_size == 1}
        machine = self._read_or_skip(self.path_for(fingerprint_hex))
        if machine is not None:
            found.add(measured_on(machine))
        return sorted(name for name in found if name is not None)

    def measured_from_objects(self, workload: str) -> bool:
        """Whether a profile measured on ``workload`` from objects given to ``tune()`` is
        stored, for any machine fingerprint (this machine's may have changed since)."""
        key = workload_key(workload)
        paths = [*self.profiles_dir.glob(f"*/{key}.json"), *self.profiles_dir.glob("*.json")]
        found = (self._read_or_skip(path) for path in paths if not path.name.startswith("."))
        return any(
            p is not None and measured_on(p) == workload and from_objects(workload, p)
            for p in found
        )

    def measured_by_jobs(self, fingerprint_hex: str, workload: str) -> list[tuple[int, Path]]:
        """Where ``workload`` was measured by a job of several ranks for this fingerprint:
        (its ranks, its file), fewest ranks first."""
        key = workload_key(workload)
        found = []
        for path in (self.profiles_dir / fingerprint_hex).glob(f"world-*/{key}.json"):
            profile = self._read_or_skip(path)
            world = 1 if profile is None else profile.topology.world_size
            if profile is not None and measured_on(profile) == workload and world > 1:
                found.append((world, path))
        return sorted(found)

    def lookup(
        self,
        snapshot: HardwareSnapshot,
        machine: str | None,
        workload: str | None = None,
        world: int = 1,
        *,
        mode: str = "",
    ) -> Lookup:
        """The fresh profile for this snapshot (measured on ``workload`` when one is named, for
        a job of ``world`` ranks, in ``mode`` where one is stored), or the stale one ``machine``
        left behind; with ``machine``
        None (a recorded snapshot of some machine, whose history this store cannot know), or
        for a job, no stale one."""
        wanted = fingerprint(snapshot)
        fresh = self.load(wanted, workload, world, mode)
        if fresh is not None:
            return Lookup(fresh, None, None)
        if machine is None or world > 1:
            return Lookup(None, None, None)
        stale = self._newest_other(wanted, machine, workload)
        return Lookup(None, stale, None if stale is None else changes_since(stale, snapshot))

    def _read(self, path: Path, workload: str | None = None) -> Profile | None:
        """The profile in ``path``; None when there is none. StoredProfileError when it is
        corrupt, StoreError when it cannot be read."""
        from torch_autotune.profile_io import parse_profile

        text = _read_stored_text(path, workload)
        if text is None:
            return None
        fix = _fix(workload)  # not the user's file's 'regenerate it with autotune export':
        try:  # export reads this very file
            return parse_profile(text, source=str(path), fmt="json", remedy=fix)
        except ProfileFileError as exc:
            said = str(exc)
            raise StoredProfileError(said if said.endswith(fix) else f"{said}; {fix}") from None

    def _read_for(self, wanted: str, path: Path, workload: str | None) -> Profile | None:
        """The profile in ``path``, checked to be the one made for fingerprint ``wanted``."""
        profile = self._read(path, workload)
        if profile is None:
            return None
        claimed = profile.provenance.fingerprint
        recorded = fingerprint(profile.provenance.snapshot)
        if claimed != wanted or recorded != wanted:
            gpus = sorted({a.name for a in profile.provenance.snapshot.accelerators})
            made_on = ", ".join(gpus) if gpus else "no GPU"
            what = (
                f"was made for another machine (fingerprint {claimed}, {made_on})"
                if claimed != wanted
                else f"records another machine than its fingerprint says ({made_on})"
            )
            raise StoredProfileError(
                f"{path} {what}, not the one its name says ({wanted}); {_fix(workload)}"
            )
        return profile

    def _read_or_skip(self, path: Path) -> Profile | None:
        """The profile in ``path``; None when it is missing or unreadable."""
        try:
            return self._read(path)
        except StoreError:
            return None  # an unreadable old profile is no evidence of anything

    def _profiles_in(self, directory: Path) -> list[Profile]:
        """Every readable profile directly in ``directory`` (temporary files left out)."""
        if not directory.is_dir():
            return []
        paths = (p for p in directory.glob("*.json") if not p.name.startswith("."))
        return [p for p in map(self._read_or_skip, paths) if p is not None]

    def _newest_other(self, wanted: str, machine: str, workload: str | None) -> Profile | None:
        """The newest profile this machine wrote for another fingerprint (for ``workload``)."""
        candidates = self._profiles_in(self.profiles_dir)
        if workload is not None:
            key = workload_key(workload)
            candidates = [p for p in candidates if measured_on(p) == workload]
            for own_path in self.profiles_dir.glob(f"*/{key}.json"):
                own = self._read_or_skip(own_path)
                if own is not None and measured_on(own) == workload:
                    candidates.append(own)
        others = [
            p
            for p in candidates
            if p.provenance.fingerprint != wanted and p.provenance.machine_id == machine
        ]
        return max(others, key=lambda p: p.provenance.created_at, default=None)


def _read_stored_text(path: Path, workload: str | None) -> str | None:
    """The text of the stored file ``path``; None when there is none.

    Only a regular file is read, and no further than the input limit: a profile is a few tens
    of kB, and a FIFO in its place would block every read, a link to ``/dev/zero`` fill the
    memory. The file is opened without blocking, so that a FIFO is refused, not waited on.
    """
    from torch_autotune.input_files import MAX_INPUT_BYTES

    try:
        # O_BINARY: Windows would translate line ends; O_NONBLOCK: a FIFO opens at once
        descriptor = os.open(
            path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
        )
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _unreadable(path, exc) from None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            kind = "a directory" if stat.S_ISDIR(status.st_mode) else "not a regular file"
            fix = f"it cannot be used or replaced: delete it, then {measure_again(workload)}"
            raise StoredProfileError(f"{path} is {kind}, not a profile; {fix}")
        data = b""
        while status.st_size <= MAX_INPUT_BYTES and len(data) <= MAX_INPUT_BYTES:
            chunk = os.read(descriptor, MAX_INPUT_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise _unreadable(path, exc) from None
    finally:
        os.close(descriptor)
    size = max(status.st_size, len(data))
    if size > MAX_INPUT_BYTES:
        raise StoredProfileError(
            f"{path} is {size / 1024**2:.1f} MiB, larger than any profile (the limit is "
            f"{MAX_INPUT_BYTES // 1024**2} MiB); {_fix(workload)}"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StoredProfileError(
            f"{path} is not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x}); "
            f"{_fix(workload)}"
        ) from None


def _unreadable(path: Path, exc: OSError) -> StoreError:
    """The error for a stored file that exists but cannot be read."""
    if isinstance(exc, NotADirectoryError):
        why = "a part of its path is a file; the store must be a directory"
    else:
        why = f"{exc.strerror or exc}; check that this user may read it"
    return StoreError(
        f"cannot read {path}: {why}, or choose another place with --store DIR or {ENV_HOME}"
    )


def _fix(workload: str | None) -> str:
    """What to do about a stored profile that cannot be used."""
    return f"it cannot be used: delete it, or {measure_again(workload)}, which replaces it"
