"""Reading the files a user hands torch-autotune: profiles, snapshots and bench baselines.

Every input passes through here, so every one gets the same limits, checked before the parser
sees the text: a parser given a hostile file can take the process down (100,000 levels of ``[``
overflow the C stack inside libyaml's composer, a SIGSEGV; JSON raises RecursionError) or grow
it by gigabytes (a 200 MB YAML file grew it to 15 GB). Each failure is one ``InputFileError``
of the caller's class (exit code 3), naming the file, the problem and the fix.

The limits, and why:

- ``MAX_INPUT_BYTES`` (1 MiB): a profile is 10-20 kB (the largest measured one, ResNet-50 on an
  H100 with its evidence, is 19 kB; the 8-GPU A100 reference profile 13 kB), a snapshot 1-6 kB.
  A regular file is refused from its size before it is read; a pipe or standard input is read
  up to the limit and no further.
- ``MAX_NESTING`` (64 levels): the schema nests 6 deep. Checked on the text before parsing: a
  scan of JSON's brackets, and YAML's event stream (libyaml's parser keeps its own stack; only
  the composer recurses). The messages stay ours whichever PyYAML reads the events: libyaml
  0.2.6, inside PyYAML 6.0.4's wheels, refuses nesting past 1,000 levels itself, and its
  scanner reads up to 1,024 characters ahead of the event it hands over (a simple key may be
  that long), so ``[`` repeated stops it before the 65th level reaches us. Where the C parser
  stops at that limit of its own, the events are walked once more by PyYAML's pure-Python
  parser, which checks nothing of the kind in any release from 6.0 to 6.0.4 and reaches our
  65th level after a few hundred characters; any other error of the C parser stands as it is
  (walking a broken file of 1 MiB again in pure Python would cost seconds).
- ``MAX_VALUES`` (20,000 keys and values, YAML aliases expanded): the largest measured profile
  holds 962. An alias bomb (each level repeating the last ten times) is small text and a huge tree;
  a flat mapping of 50,000 unknown keys costs seconds of validation errors.

A mapping that holds a key twice is refused as well (``input_keys``): JSON's parser and PyYAML's
both keep the last value and never say so.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from itertools import accumulate
from pathlib import Path
from typing import IO, Any, Literal

from torch_autotune.errors import InputFileError
from torch_autotune.input_keys import KEEP_ONE, KeyTwice, check_json_keys, load_json, unique_keys

MAX_INPUT_BYTES = 1024 * 1024
MAX_NESTING = 64
MAX_VALUES = 20_000

Format = Literal["yaml", "json"]

_ErrorClass = type[InputFileError]
_LIBYAML_NESTING = "exceeded maximum nesting depth"  # libyaml 0.2.6's problem, past 1,000 levels
_LIMIT_TEXT = "1 MiB"


def read_input(path: str | Path, error: _ErrorClass, remedy: str) -> str:
    """The text of the file at ``path`` (UTF-8, a byte-order mark dropped), within the size limit.

    ``remedy`` says how to make a good one; it ends the message when the file does not exist.
    """
    path = Path(path)
    try:
        with path.open("rb") as stream:
            return read_stream(stream, str(path), error)
    except FileNotFoundError:
        raise error(f"{path} does not exist; {remedy}") from None
    except IsADirectoryError:
        raise error(f"{path} is a directory, not a file; name the file inside it") from None
    except OSError as exc:
        raise error(f"{path} cannot be read: {exc.strerror or exc}") from None


def read_stream(stream: IO[bytes], source: str, error: _ErrorClass) -> str:
    """The text of an open binary stream (a file, a pipe, standard input), read up to the limit.

    A regular file larger than the limit is refused from its size without reading it; anything
    else is read to one byte past the limit at most.
    """
    try:
        status = os.fstat(stream.fileno())
    except (OSError, AttributeError, ValueError):  # io.UnsupportedOperation is both of the last
        status = None
    if status is not None and stat.S_ISREG(status.st_mode) and status.st_size > MAX_INPUT_BYTES:
        raise error(_too_large(source, f"is {status.st_size / 1024**2:.1f} MiB, larger than"))
    data = bytearray()
    while len(data) <= MAX_INPUT_BYTES:
        chunk = stream.read(MAX_INPUT_BYTES + 1 - len(data))
        if not chunk:
            break
        data += chunk
    if len(data) > MAX_INPUT_BYTES:
        raise error(_too_large(source, "is larger than"))
    try:
        return bytes(data).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(
            f"{source} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8, "
            "or check that it is the file you meant"
        ) from None


def parse_json(text: str, source: str, error: _ErrorClass, remedy: str) -> Any:
    """The data in JSON ``text``, within the size, nesting and value limits."""
    _check_length(text, source, error)
    _check_json_nesting(text, source, error, remedy)
    try:
        data, twice = load_json(text)
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4,300 digits
        raise error(_not_json(exc, source, remedy)) from None
    _check_structure(data, source, error, remedy)
    check_json_keys(data, twice, source, error)
    return data


def parse_yaml(text: str, source: str, error: _ErrorClass, remedy: str) -> Any:
    """The data in YAML ``text``, read with the safe loader, within the limits."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    _check_length(text, source, error)
    try:
        _check_yaml_limits(text, loader, source, error, remedy)
        data = yaml.load(text, Loader=unique_keys(loader))  # safe: a safe loader's subclass
    except KeyTwice as twice:
        raise error(
            f"{source} holds the key {twice.key!r} twice{twice.where}; {KEEP_ONE}"
        ) from None
    except yaml.constructor.ConstructorError as exc:
        if "could not determine a constructor" in str(exc.problem):
            raise error(
                f"{source}: refused a YAML tag that would construct an object "
                f"({exc.problem}); it must hold plain data only"
            ) from None
        raise error(f"{source} is not valid YAML{_where(exc)}: {exc.problem}; {remedy}") from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        raise error(f"{source} is not valid YAML{_where(exc)}: {problem}; {remedy}") from None
    except (ValueError, TypeError, OverflowError) as exc:
        # PyYAML's constructors raise these for values its resolver accepted: a date such as
        # 2026-13-45, an integer longer than Python converts.
        raise error(f"{source} holds a value YAML cannot read ({exc}); {remedy}") from None
    _check_structure(data, source, error, remedy)
    return data


def parse_data(
    text: str, source: str, error: _ErrorClass, remedy: str, fmt: Format | None = None
) -> Any:
    """The data in JSON or YAML ``text``; ``fmt=None`` tells them apart by their content.

    Text that starts with ``{`` or ``[`` is tried as JSON first, then as YAML (flow style such as
    ``{schema_version: 1, ...}`` is YAML, not JSON). When it is neither, the error shown is the
    JSON one if the text starts as JSON does (``{"``, ``[1``, ``[{`` ...), else the YAML one.
    """
    if fmt == "json":
        return parse_json(text, source, error, remedy)
    if fmt == "yaml" or not text.lstrip().startswith(("{", "[")):
        return parse_yaml(text, source, error, remedy)
    _check_length(text, source, error)
    _check_json_nesting(text, source, error, remedy)
    try:
        data, twice = load_json(text)
    except ValueError as json_problem:
        try:
            return parse_yaml(text, source, error, remedy)
        except InputFileError:
            if not _JSON_START.match(text):
                raise  # flow-style YAML such as '{schema_version: 1': the YAML error helps
            raise error(_not_json(json_problem, source, remedy)) from None
    _check_structure(data, source, error, remedy)
    check_json_keys(data, twice, source, error)
    return data


def kind_of(data: Any) -> str:
    """What parsed data is, in a user's words, for "FILE is ..., not a profile": 'empty', 'a
    list', 'a number', 'a string', 'true or false', 'a mapping'."""
    if data is None:
        return "empty"
    if isinstance(data, bool):
        return "true or false"
    if isinstance(data, int | float):
        return "a number"
    if isinstance(data, str):
        return "a string"
    if isinstance(data, list):
        return "a list"
    if isinstance(data, dict):
        return "a mapping"
    return f"a {type(data).__name__}"  # a date or bytes, which YAML can hold


# How JSON text starts: a bracket, then a string, a number, a literal or another bracket. YAML
# flow style starts with a bracket and a plain word ('{schema_version: 1').
_JSON_START = re.compile(r'\s*[\[{]\s*(?:["\[\]{}]|-?[0-9]|true\b|false\b|null\b)')


def _check_length(text: str, source: str, error: _ErrorClass) -> None:
    # A character is at least one byte: text longer than the limit in characters is too large.
    if len(text) > MAX_INPUT_BYTES:
        raise error(_too_large(source, "is larger than"))


_JSON_ESCAPED_QUOTE = re.compile(r'\\"')
_JSON_STRING = re.compile(r'"[^"]*"?')  # after escapes are gone; an unterminated one to the end
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _check_json_nesting(text: str, source: str, error: _ErrorClass, remedy: str) -> None:
    """Refuse JSON nested deeper than MAX_NESTING, from its brackets outside strings.

    Escapes go first (an escaped backslash, then an escaped quote), then strings, then all but
    the brackets: a few passes of ``re`` over the text, linear in its length, with no Python
    loop over its characters. Where the text is not JSON the count may be off after the first
    error, which the decoder stops at anyway.
    """
    plain = _JSON_ESCAPED_QUOTE.sub("", text.replace("\\\\", ""))
    brackets = _NOT_A_BRACKET.sub("", _JSON_STRING.sub("", plain))
    if (
        len(brackets) > MAX_NESTING
        and max(accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0) > MAX_NESTING
    ):
        raise error(_too_deep(source, remedy))


def _check_yaml_limits(
    text: str, loader: Any, source: str, error: _ErrorClass, remedy: str
) -> None:
    """Refuse YAML over the nesting or value limits with our message, whichever PyYAML parses.

    The C parser walks the events first (fast). Where it stops at libyaml's own nesting limit,
    which its look-ahead reaches before our count does, the pure-Python parser walks them again
    and stops at ours; the C parser's other errors (bad syntax) are reported as they are.
    """
    import yaml

    try:
        _check_yaml_events(text, loader, source, error, remedy)
    except yaml.YAMLError as exc:
        if loader is yaml.SafeLoader or _LIBYAML_NESTING not in str(getattr(exc, "problem", "")):
            raise
        with contextlib.suppress(yaml.YAMLError):  # never expected: the C parser's report then
            _check_yaml_events(text, yaml.SafeLoader, source, error, remedy)
        raise


def _check_yaml_events(
    text: str, loader: Any, source: str, error: _ErrorClass, remedy: str
) -> None:
    """Refuse YAML nested deeper than MAX_NESTING (block or flow) or holding more than
    MAX_VALUES keys and values (an alias counted once), from the parser's events, before a
    node is built."""
    import yaml

    depth = values = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
            values += 1
        elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            values += 1
            depth += 1
            if depth > MAX_NESTING:
                raise error(_too_deep(source, remedy))
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        if values > MAX_VALUES:
            raise error(_too_many(source, remedy))


def _check_structure(data: Any, source: str, error: _ErrorClass, remedy: str) -> None:
    """Refuse parsed data that is nested too deep, too large, or contains itself.

    YAML aliases make a small text into a deep or huge tree, or a cycle (``&a [*a]``); the
    walk measures the tree as if every alias were written out, visiting each shared part once.
    """
    done: dict[int, tuple[int, int]] = {}  # id -> (depth, values) of a finished container
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        children = [c for c in _children(node) if isinstance(c, (dict, list))]
        if children_done:
            on_path.discard(key)
            depth = 1 + max((done[id(c)][0] for c in children), default=0)
            keys = len(node) if isinstance(node, dict) else 0
            values = 1 + keys + len(node) + sum(done[id(c)][1] - 1 for c in children)
            if depth > MAX_NESTING:
                raise error(_too_deep(source, remedy))
            if values > MAX_VALUES:
                raise error(_too_many(source, remedy))
            done[key] = (depth, values)
        elif key in on_path:
            raise error(f"{source} contains itself (a recursive YAML alias); {remedy}")
        elif key not in done and isinstance(node, (dict, list)):
            on_path.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in children)
    _check_text(data, source, error, remedy)


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
"""Control characters a file's text has no use for (tab and line ends aside): printed, an
escape sequence in a snapshot's CPU or GPU name set the terminal's title or colours."""


def _check_text(data: Any, source: str, error: _ErrorClass, remedy: str) -> None:
    """Refuse a key or a string value that holds a control character (``_CONTROL``); the
    tree is bounded already (``_check_structure``), each shared part visited once."""
    seen: set[int] = set()
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            found = _CONTROL.search(node)
            if found is not None:
                raise error(
                    f"{source} holds a control character ({ord(found.group()):#04x}, such as"
                    f" a terminal's escape sequences start with) in {node[:40]!r}; {remedy}"
                )
        elif isinstance(node, (dict, list)) and id(node) not in seen:
            seen.add(id(node))
            stack.extend(node.keys() if isinstance(node, dict) else ())
            stack.extend(_children(node))


def _children(node: Any) -> list[Any]:
    if isinstance(node, dict):
        return list(node.values())
    if isinstance(node, list):
        return node
    return []


def _where(exc: Any) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""


def _not_json(exc: ValueError, source: str, remedy: str) -> str:
    if isinstance(exc, json.JSONDecodeError):
        where = f"line {exc.lineno}, column {exc.colno}: {exc.msg}"
        return f"{source} is not valid JSON ({where}); {remedy}"
    return f"{source} is not valid JSON ({exc}); {remedy}"


def _too_large(source: str, how_large: str) -> str:
    return (
        f"{source} {how_large} {_LIMIT_TEXT}, the limit for an input file (a profile or "
        "snapshot is a few tens of kB); check that it is the file you meant"
    )


def _too_many(source: str, remedy: str) -> str:
    return (
        f"{source} holds more than {MAX_VALUES:,} keys and values, YAML aliases expanded "
        f"(a profile holds about 1,000); {remedy}"
    )


def _too_deep(source: str, remedy: str) -> str:
    return (
        f"{source} is nested more than {MAX_NESTING} levels deep (a profile or snapshot nests "
        f"6); {remedy}"
    )
