"""A file's parsed data held to a model with exact types, and the line that names a wrong one.

A profile, a snapshot or a baseline is data a person may edit by hand, so its types are held
as written: ``batch_size: "32"`` is a string, ``cpu_threads: true`` is not a count, and
``pin_memory: 1`` is not a switch. pydantic's lax mode turned each into the value it looked
like, and the file loaded as if it were right. Its strict mode for Python data refuses an
enum's value and a list for a tuple, which a file can only hold as text and lists; its strict
mode for JSON refuses only what JSON itself tells apart. So the data goes to the model as JSON
text: YAML's dates become ISO text first, and a whole number still fills a field of floats
(``1`` for ``1.0``), as JSON has one kind of number.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import date
from typing import Any, TypeVar

from pydantic import BaseModel

from torch_autotune.errors import InputFileError

M = TypeVar("M", bound=BaseModel)

# What each of pydantic's type errors asks for, in a user's words.
_EXPECTED = {
    "int_type": "a whole number",
    "bool_type": "true or false",
    "float_type": "a number",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
}


def validate_exactly(
    model: type[M], data: Any, source: str, error: type[InputFileError], remedy: str
) -> M:
    """``model`` from a file's parsed ``data``, every value of the type its field declares.

    Raises pydantic's ``ValidationError`` as ``model_validate`` does (the caller words it,
    with ``wrong_type`` for a value of the wrong type), and ``error`` for a value no file
    of ours holds (YAML's ``!!binary``).
    """
    try:
        text = json.dumps(data, default=_iso_date, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise error(f"{source} holds a value no input file holds ({exc}); {remedy}") from None
    return model.model_validate_json(text, strict=True)


def wrong_type(detail: Mapping[str, Any]) -> str | None:
    """'PATH must be WHAT, not VALUE' for one of pydantic's errors of a value's type (or of
    ``union_errors``' merged one), with the fix where the value is a number or a switch in
    quotes; None for any other error."""
    expected = detail.get("expected") or _EXPECTED.get(str(detail.get("type")))
    if expected is None:
        return None
    path = ".".join(str(part) for part in detail.get("loc", ())) or "(top level)"
    value = detail.get("input")
    line = f"{path} must be {expected}, not {_shown(value)}"
    if isinstance(value, str) and _unquoted_fits(value.strip(), expected):
        line += f"; write {value.strip()} without quotes"
    return line


def union_errors(errors: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``errors`` with the type errors of one value that may be of several types merged into
    one, at the value's own path: pydantic gives one a type, each ending its path with the
    type's tag (``settings.compile.enabled.bool``, ``...constrained-int``)."""
    merged: list[Mapping[str, Any]] = []
    for detail in errors:
        loc = tuple(detail.get("loc", ()))
        kind = _EXPECTED.get(str(detail.get("type")))
        if kind is None or not loc or not _is_union_tag(loc[-1]):
            merged.append(detail)
            continue
        last = merged[-1] if merged else None
        if last is not None and last.get("union") and tuple(last["loc"]) == loc[:-1]:
            if kind not in last["kinds"]:
                last["kinds"].append(kind)
            continue
        merged.append({**detail, "loc": loc[:-1], "union": True, "kinds": [kind]})
    return [_with_expected(d) for d in merged]


def _is_union_tag(part: object) -> bool:
    return isinstance(part, str) and (
        part in ("bool", "int", "float", "str") or part.startswith("constrained-")
    )


def _with_expected(detail: Mapping[str, Any]) -> Mapping[str, Any]:
    if not detail.get("union"):
        return detail
    kinds = detail["kinds"]
    either = ", ".join(kinds[:-1]) + f" or {kinds[-1]}" if len(kinds) > 1 else kinds[0]
    return {**detail, "expected": either}


def _iso_date(value: Any) -> str:
    if isinstance(value, date):  # a datetime too: YAML reads an unquoted time as one
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not plain data")


def _shown(value: Any) -> str:
    """A value as the file spells it, with its kind where the spelling hides it."""
    if value is None:
        return "null (empty)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("..." if len(value) > 40 else "")
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def _unquoted_fits(text: str, expected: str) -> bool:
    """Whether ``text``, written without quotes, is what a field of ``expected`` holds."""
    if expected == "true or false":
        return text in ("true", "false")
    if expected == "a whole number":
        return text.lstrip("-").isdigit()
    if expected == "a number":
        try:
            float(text)
        except ValueError:
            return False
        return text.lower().lstrip("+-") not in ("nan", "inf", "infinity")
    return False
