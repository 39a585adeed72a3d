"""Profiles to and from YAML and JSON, with one clear message for every way a file can be bad.

Text is read and parsed through ``input_files`` (size, nesting and value limits; JSON tried
before YAML). YAML is read with the safe loader only: a tag that would construct a Python object
is refused.
A key that is not in the schema gets "did you mean ...?". A file from a newer release asks for an
upgrade. ``dump(load(x)) == x`` for every file this module writes.

How profiles evolve. ``schema_version`` names the written form of a profile, and a release reads
every form up to its own:

- A key added with a default, or a value added to a choice, needs no new version: a file
  written before it lacks the key and gets the default. (``preferences.target_global_batch``,
  ``preferences.max_batch_size``, ``evidence.details``, ``evidence.batch_choice`` and
  ``evidence.fed`` came so, in schema 1.)
- A key renamed, moved or removed, or a value whose type, unit or meaning changes, bumps
  ``PROFILE_SCHEMA_VERSION`` to N+1 and adds the step ``MIGRATIONS[N]``: a pure function from a
  schema-N profile's data to schema N+1's (the version number is set by ``migrate``). The steps
  run in order before validation, so a file of any earlier schema loads. The golden file of
  every version stays in ``tests/fixtures/profiles/`` (``schema-N.yaml``, never edited), and
  each must load through the steps.
- A file of a newer schema is refused in one line that names both versions and the upgrade. A
  newer release's file of the same schema, with a key or a value this one does not know, is
  refused with that upgrade too, named from ``provenance.tool_version``: every model forbids
  unknown keys, so the added key that needs no new version is still an error here, never
  silently dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from torch_autotune.errors import ProfileFileError
from torch_autotune.hand_edits import with_hand_edits
from torch_autotune.input_files import Format, kind_of, parse_data, read_input
from torch_autotune.input_schema import union_errors, validate_exactly, wrong_type

if TYPE_CHECKING:
    from torch_autotune.bench import TrainConfig
from torch_autotune.profile import PROFILE_SCHEMA_VERSION, Profile
from torch_autotune.version import __version__

_REGENERATE = "regenerate it with 'autotune export'"
_BASELINE_HINT = "write a YAML mapping such as 'batch_size: 64'"
_UPGRADE = "upgrade with 'pip install -U torch-autotune'"
# Keys every hardware snapshot has at its top level and no profile has (``HardwareSnapshot``;
# a profile holds its snapshot under ``provenance``).
_SNAPSHOT_KEYS = {"accelerators", "host", "software"}

Migration = Callable[[dict[str, Any]], dict[str, Any]]


def _variants_named(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 to 2: the probe's records name the variant they ran with (``variant``, "eager"
    or "compiled") where schema 1 had ``compiled: true/false`` on the throughput points and the
    batch choice; the passes fed by the DataLoader ran as the choice did. Schema 1 did not
    record the settings each variant ran with, so ``evidence.variants`` stays empty."""
    evidence = data.get("evidence")
    if not isinstance(evidence, dict):
        return data

    def named(record: Any) -> Any:
        if not isinstance(record, dict) or "compiled" not in record:
            return record
        rest = {k: v for k, v in record.items() if k != "compiled"}
        return {**rest, "variant": "compiled" if record["compiled"] is True else "eager"}

    evidence = dict(evidence)
    choice = evidence.get("batch_choice")
    fed_variant = "compiled" if isinstance(choice, dict) and choice.get("compiled") else "eager"
    if isinstance(evidence.get("throughput"), list):
        evidence["throughput"] = [named(r) for r in evidence["throughput"]]
    if isinstance(choice, dict):
        evidence["batch_choice"] = named(choice)
    if isinstance(evidence.get("fed"), list):
        evidence["fed"] = [
            {**r, "variant": fed_variant} if isinstance(r, dict) else r for r in evidence["fed"]
        ]
    return {**data, "evidence": evidence}


MIGRATIONS: Mapping[int, Migration] = {1: _variants_named}
"""``MIGRATIONS[n]``: the data of a schema-n profile as schema n+1 writes it, a pure function
(its argument left as it was)."""


def dump_profile(profile: Profile, fmt: Format = "yaml") -> str:
    """The profile as YAML or JSON text (keys in schema order)."""
    data = profile.model_dump(mode="json")
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    import yaml

    return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100))


def _allowed_keys(location: tuple[str | int, ...], root: type[BaseModel] = Profile) -> list[str]:
    """Field names of the model at ``location`` inside ``root``."""
    model = root
    for part in location:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        annotation = field.annotation
        inner = getattr(annotation, "__args__", None)
        candidates = [annotation, *(inner or ())]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return []
        model = nested[0]
    return list(model.model_fields)


def _explain(error: ValidationError, root: type[BaseModel] = Profile) -> str:
    # An unknown key usually comes with a "field required" for the key it misspells: name the
    # typo first, it is the actual mistake.
    errors = union_errors(error.errors())
    first = min(errors, key=lambda e: e["type"] != "extra_forbidden")
    location = tuple(first["loc"])
    path = ".".join(str(p) for p in location) or "(top level)"
    if first["type"] == "extra_forbidden":
        key = str(location[-1])
        import difflib  # only on this error path

        close = difflib.get_close_matches(key, _allowed_keys(location[:-1], root), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        message = f"unknown key '{path}'{hint}"
    elif first["type"] == "value_error":
        message = str(first["ctx"]["error"]) if "ctx" in first else first["msg"]
    else:
        message = wrong_type(first) or f"{path}: {first['msg']}"
    more = len(errors) - 1
    return message + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else "")


def parse_profile(
    text: str, source: str = "profile", fmt: Format | None = None, *, remedy: str = _REGENERATE
) -> Profile:
    """Validate profile text; every failure is one ProfileFileError naming the problem.

    ``fmt=None`` tells JSON from YAML by the content (see ``input_files.parse_data``).
    ``remedy`` ends the message where the file is broken (not JSON or YAML, not a mapping, a
    migration that cannot read it): for a file of the user's, regenerate it with 'autotune
    export'; the store gives its own, since export reads the very file that is broken.
    """
    raw = parse_data(text, source, ProfileFileError, remedy, fmt)
    if not isinstance(raw, dict):
        raise ProfileFileError(f"{source} is {kind_of(raw)}, not a profile; {remedy}")
    if raw.keys() >= _SNAPSHOT_KEYS:  # its schema_version is the snapshot's, not a profile's
        raise ProfileFileError(_a_snapshot(source))
    data = migrate(raw, source, remedy=remedy)
    try:
        return with_hand_edits(validate_exactly(Profile, data, source, ProfileFileError, remedy))
    except ValidationError as exc:
        newer = _newer_release(data)
        if newer is not None:
            raise ProfileFileError(
                f"{source}: {_explain(exc)}; it was written by torch-autotune {newer}, newer "
                f"than this one ({__version__}): {_UPGRADE}"
            ) from None
        raise ProfileFileError(f"{source}: {_explain(exc)}") from None


def _a_snapshot(source: str) -> str:
    file = source if Path(source).is_file() else "FILE"
    return (
        f"{source} is a hardware snapshot, not a profile; make a profile from it with "
        f"'autotune recommend --snapshot {file} --json > profile.json'"
    )


def migrate(
    data: dict[str, Any],
    source: str = "profile",
    *,
    current: int = PROFILE_SCHEMA_VERSION,
    steps: Mapping[int, Migration] = MIGRATIONS,
    remedy: str = _REGENERATE,
) -> dict[str, Any]:
    """A profile's parsed data brought to schema ``current`` through ``steps``, one per version.

    Data of the current schema, or with no usable ``schema_version`` (validation names that),
    is returned as it is; a newer schema is one ProfileFileError, as is a step that cannot read
    the data it is given.
    """
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        return data
    if version > current:
        raise ProfileFileError(
            f"{source} uses profile schema {version}, newer than this torch-autotune reads "
            f"({current}); {_UPGRADE}"
        )
    for step in range(version, current):
        to_next = steps[step]  # a missing step is this release's bug, never the file's
        try:
            data = {**to_next(data), "schema_version": step + 1}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProfileFileError(
                f"{source}: a schema-{step} profile that cannot be brought to schema {step + 1} "
                f"({type(exc).__name__}: {exc}); {remedy}"
            ) from None
    return data


def _newer_release(data: dict[str, Any]) -> str | None:
    """The release that wrote ``data`` when it is newer than this one, else None."""
    provenance = data.get("provenance")
    written_by = provenance.get("tool_version") if isinstance(provenance, dict) else None
    if not isinstance(written_by, str):
        return None
    from packaging.version import InvalidVersion, Version  # only on this error path

    try:
        return written_by if Version(written_by) > Version(__version__) else None
    except InvalidVersion:
        return None


def load_profile(path: str | Path) -> Profile:
    """Read a profile file (YAML or JSON, told apart by its content), within the limits of
    ``input_files``."""
    path = Path(path)
    text = read_input(path, ProfileFileError, "write one with 'autotune export -o FILE'")
    return parse_profile(text, source=str(path))


def load_baseline(path: str | Path) -> TrainConfig:
    """Read the user's own baseline for ``autotune bench``: a YAML (or JSON) mapping of
    ``TrainConfig`` fields, e.g. ``{batch_size: 64, num_workers: 4}``; the rest default."""
    path = Path(path)
    return parse_baseline(read_input(path, ProfileFileError, _BASELINE_HINT), source=str(path))


def parse_baseline(text: str, source: str = "baseline") -> TrainConfig:
    """Validate baseline text (YAML or JSON); every failure is one ProfileFileError."""
    from torch_autotune.bench import TrainConfig

    raw = parse_data(text, source, ProfileFileError, _BASELINE_HINT)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ProfileFileError(
            f"{source} is {kind_of(raw)}, not a baseline; write a mapping such as "
            "'batch_size: 64' (fields: " + ", ".join(TrainConfig.model_fields) + ")"
        )
    try:
        return validate_exactly(TrainConfig, raw, source, ProfileFileError, _BASELINE_HINT)
    except ValidationError as exc:
        raise ProfileFileError(f"{source}: {_explain(exc, TrainConfig)}") from None
