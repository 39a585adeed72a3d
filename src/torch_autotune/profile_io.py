"""Profiles to and from YAML and JSON, with one clear message for every way a file can be bad.

YAML is read with the safe loader only: a tag that would construct a Python object is refused.
A key that is not in the schema gets "did you mean ...?". A file from a newer release asks for an
upgrade. ``dump(load(x)) == x`` for every file this module writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ValidationError

from torch_autotune.errors import ProfileFileError

if TYPE_CHECKING:
    from torch_autotune.bench import TrainConfig
from torch_autotune.profile import PROFILE_SCHEMA_VERSION, Profile

Format = Literal["yaml", "json"]


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
    first = min(error.errors(), key=lambda e: e["type"] != "extra_forbidden")
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
        message = f"{path}: {first['msg']}"
    more = error.error_count() - 1
    return message + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else "")


def _parse_yaml(text: str, source: str) -> Any:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=loader)  # a safe loader (C or Python), chosen above
    except yaml.constructor.ConstructorError as exc:
        raise ProfileFileError(
            f"{source}: refused a YAML tag that would construct an object "
            f"({exc.problem}); profiles hold plain data only"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        raise ProfileFileError(
            f"{source} is not valid YAML{where}: {problem}; regenerate it with 'autotune export'"
        ) from None


def parse_profile(text: str, source: str = "profile", fmt: Format | None = None) -> Profile:
    """Validate profile text; every failure is one ProfileFileError naming the problem."""
    fmt = fmt or ("json" if text.lstrip().startswith("{") else "yaml")
    if fmt == "json":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProfileFileError(
                f"{source} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
            ) from None
    else:
        raw = _parse_yaml(text, source)
    if not isinstance(raw, dict):
        kind = "empty" if raw is None else f"a {type(raw).__name__}"
        raise ProfileFileError(f"{source} is {kind}, not a profile; regenerate it")
    version = raw.get("schema_version")
    if isinstance(version, int) and version > PROFILE_SCHEMA_VERSION:
        raise ProfileFileError(
            f"{source} uses profile schema {version}, newer than this torch-autotune reads "
            f"({PROFILE_SCHEMA_VERSION}); upgrade with 'pip install -U torch-autotune'"
        )
    try:
        return Profile.model_validate(raw)
    except ValidationError as exc:
        raise ProfileFileError(f"{source}: {_explain(exc)}") from None


def load_profile(path: str | Path) -> Profile:
    """Read a profile file (YAML or JSON, told apart by its content)."""
    path = Path(path)
    return parse_profile(_read(path), source=str(path))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileFileError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileFileError(f"{path} cannot be read: {exc}") from None


def load_baseline(path: str | Path) -> TrainConfig:
    """Read the user's own baseline for ``autotune bench``: a YAML (or JSON) mapping of
    ``TrainConfig`` fields, e.g. ``{batch_size: 64, num_workers: 4}``; the rest default."""
    from torch_autotune.bench import TrainConfig

    path = Path(path)
    raw = _parse_yaml(_read(path), str(path))  # JSON is YAML too
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ProfileFileError(
            f"{path} is a {type(raw).__name__}, not a baseline; write a mapping such as "
            "'batch_size: 64' (fields: " + ", ".join(TrainConfig.model_fields) + ")"
        )
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as exc:
        raise ProfileFileError(f"{path}: {_explain(exc, TrainConfig)}") from None
