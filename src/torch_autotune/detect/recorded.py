"""Snapshots from files: reason about a machine you are not on.

``RecordedMachine`` is the back end ``detect()`` uses when given a snapshot file
(``autotune detect --snapshot m.json``); tests use it to stand in for real hardware.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from torch_autotune.errors import SnapshotFileError
from torch_autotune.hardware import SNAPSHOT_SCHEMA_VERSION, HardwareSnapshot
from torch_autotune.input_files import kind_of, parse_json, parse_yaml, read_input
from torch_autotune.input_schema import union_errors, validate_exactly, wrong_type

_REMEDY = "write a new one with 'autotune detect --json > FILE'"
# Keys every profile has at its top level and no snapshot has (``profile.Profile``).
_PROFILE_KEYS = {"settings", "decisions", "provenance"}


def _describe(error: ValidationError) -> str:
    errors = union_errors(error.errors())
    first = errors[0]
    location = ".".join(str(part) for part in first["loc"]) or "(top level)"
    more = len(errors) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return (wrong_type(first) or f"{location}: {first['msg']}") + tail


def parse_snapshot(text: str, source: str = "snapshot") -> HardwareSnapshot:
    """Validate snapshot JSON; every failure is one SnapshotFileError naming the problem.

    The text is held to the size and nesting limits of ``input_files`` before it is parsed."""
    try:
        raw = parse_json(text, source, SnapshotFileError, _REMEDY)
    except SnapshotFileError:
        if _is_profile(_as_yaml(text, source)):  # a profile exported as YAML, the default
            raise SnapshotFileError(_a_profile(source)) from None
        raise
    if not isinstance(raw, dict):
        raise SnapshotFileError(f"{source} is {kind_of(raw)}, not a snapshot; {_REMEDY}")
    if _is_profile(raw):  # its schema_version is the profile's, not a snapshot's
        raise SnapshotFileError(_a_profile(source))
    version = raw.get("schema_version")
    if isinstance(version, int) and version > SNAPSHOT_SCHEMA_VERSION:
        raise SnapshotFileError(
            f"{source} uses snapshot schema {version}, newer than this torch-autotune reads "
            f"({SNAPSHOT_SCHEMA_VERSION}); upgrade with 'pip install -U torch-autotune'"
        )
    try:
        return validate_exactly(HardwareSnapshot, raw, source, SnapshotFileError, _REMEDY)
    except ValidationError as exc:
        raise SnapshotFileError(
            f"{source} is not a valid hardware snapshot: {_describe(exc)}"
        ) from None


def _is_profile(data: object) -> bool:
    return isinstance(data, dict) and data.keys() >= _PROFILE_KEYS


def _as_yaml(text: str, source: str) -> object:
    """The data in ``text`` read as YAML (within the same limits), or None where it is not:
    asked only of a snapshot that is not JSON, to tell a profile from a broken file."""
    try:
        return parse_yaml(text, source, SnapshotFileError, _REMEDY)
    except SnapshotFileError:
        return None


def _a_profile(source: str) -> str:
    return (
        f"{source} is a profile, not a hardware snapshot; --snapshot takes a machine "
        f"recorded with 'autotune detect --json > FILE' (a profile goes to --profile of "
        "export, bench and report, or to validate)"
    )


def load_snapshot(path: str | Path) -> HardwareSnapshot:
    """Read a snapshot file written by ``autotune detect --json`` (at most 1 MiB)."""
    path = Path(path)
    remedy = f"write one with 'autotune detect --json > {path}'"
    return parse_snapshot(read_input(path, SnapshotFileError, remedy), source=str(path))


class RecordedMachine:
    """A machine known only from its snapshot."""

    def __init__(self, snapshot: HardwareSnapshot) -> None:
        self._snapshot = snapshot

    @classmethod
    def from_file(cls, path: str | Path) -> RecordedMachine:
        return cls(load_snapshot(path))

    def snapshot(self, *, deep: bool = False) -> HardwareSnapshot:
        """The recorded snapshot; ``deep`` changes nothing, the machine is not here to ask."""
        return self._snapshot
