"""Fuzzing the loaders (issue 11): random bytes, random YAML and JSON structures (deep ones too),
and random mutations of a valid profile and snapshot. Nothing but the documented
``InputFileError`` family escapes, nothing crashes, and each example stays within a time bound
(hypothesis' ``deadline``) and a memory bound (``feed``); size limits are tested in
``test_input_files``.
"""

from __future__ import annotations

import contextlib
import io
import json
import tracemalloc
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch_autotune.detect import parse_snapshot
from torch_autotune.errors import InputFileError, ProfileFileError, SnapshotFileError
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.input_files import MAX_INPUT_BYTES, read_stream
from torch_autotune.profile_io import dump_profile, parse_baseline, parse_profile
from torch_autotune.rules.engine import build_profile

pytestmark = pytest.mark.slow  # fuzzing the loaders takes seconds: CI runs it, the quick loop not

SNAPSHOT_TEXT = (Path(__file__).parent / "fixtures" / "snapshots" / "l4.json").read_text()
PROFILE = build_profile(
    HardwareSnapshot.model_validate_json(SNAPSHOT_TEXT),
    now=datetime(2026, 11, 1, tzinfo=timezone.utc),
    host_id="fuzz",
)
PROFILE_DATA = PROFILE.model_dump(mode="json")
SNAPSHOT_DATA = json.loads(SNAPSHOT_TEXT)

LOADERS: list[tuple[Callable[[str], object], type[InputFileError]]] = [
    (parse_profile, ProfileFileError),
    (lambda text: parse_profile(text, fmt="json"), ProfileFileError),
    (lambda text: parse_profile(text, fmt="yaml"), ProfileFileError),
    (parse_snapshot, SnapshotFileError),
    (parse_baseline, ProfileFileError),
]

# A generous bound per example: the worst 1 MiB input within the limits takes about 1 s on a
# 2-core CPU; the 200 MB file of the issue took 209 s before the limits. 75 examples a test:
# every CI run draws new ones (150 took 78 s of the first pass's test time).
FUZZ = settings(
    max_examples=75,
    deadline=timedelta(seconds=3),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# What one example may allocate: the inputs here are at most a few kB (the worst 1 MiB input
# takes under 64 MiB, test_input_files), so an example that needs more has found a way to
# grow a small text into a large tree (an alias bomb the limits missed).
MAX_EXAMPLE_BYTES = 32 * 2**20


def feed(text: str) -> None:
    """Every loader takes ``text``: a value, or its own error class; anything else fails.

    The Python memory the loaders allocate is bounded too (tracemalloc: libyaml's C parser
    keeps a few buffers of the text's size outside it)."""
    tracemalloc.start()
    try:
        for load, error in LOADERS:
            with contextlib.suppress(error):
                load(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MAX_EXAMPLE_BYTES, f"{peak / 2**20:.0f} MiB for {len(text)} characters"


scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and infinities included: the loaders must not crash on them
    | st.text(max_size=20)
)
structures = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=60,
)


def _nest(value: Any, depth: int, as_dict: bool) -> Any:
    for _ in range(depth):
        value = {"k": value} if as_dict else [value]
    return value


deep_structures = st.builds(_nest, structures, st.integers(0, 200), st.booleans())

# Characters that mean something to YAML or JSON, so random text reaches the parsers' corners:
# anchors, aliases, tags, flow and block collections, quoting, escapes, comments, documents.
YAML_SOUP = "[]{}:,-?&*!|>'\"#%@`\\\n\t abcxyz019.eE+_<=~"


@FUZZ
@given(st.binary(max_size=2_000))
def test_random_bytes(data: bytes) -> None:
    try:
        text = read_stream(io.BytesIO(data), "fuzz", ProfileFileError)
    except ProfileFileError:
        return
    feed(text)


@FUZZ
@given(st.text(alphabet=YAML_SOUP, max_size=400))
def test_random_yaml_and_json_punctuation(text: str) -> None:
    feed(text)


@FUZZ
@given(deep_structures, st.sampled_from(["json", "yaml-block", "yaml-flow"]))
def test_random_structures_deep_and_shallow(value: Any, style: str) -> None:
    if style == "json":
        text = json.dumps(value)  # NaN and Infinity as Python writes them
    else:
        text = yaml.safe_dump(value, default_flow_style=style == "yaml-flow", width=80)
    feed(text)


def _aliases(fanout: int, levels: int, flat: bool, field: str) -> str:
    """YAML in which each level repeats the last ``fanout`` times through aliases: a few
    hundred characters, and ``fanout ** levels`` values once the aliases are written out.
    The last level is the value of ``field``: a list the models iterate item by item (a
    profile's ``notes``) makes a validator walk every value written out."""
    lines = ["l0: &l0 [a, b]"]
    for level in range(1, levels + 1):
        items = ", ".join([f"*l{level - 1}"] * fanout)
        lines.append(f"l{level}: &l{level} " + (f"[{items}]" if flat else f"{{k: [{items}]}}"))
    lines.append(f"{field}: *l{levels}")
    return "\n".join(lines) + "\n"


@FUZZ
@given(
    st.integers(1, 12),
    st.integers(1, 14),
    st.booleans(),
    st.sampled_from(["notes", "settings", "decisions", "batch_size"]),
)
def test_aliases_that_multiply_stay_small(fanout: int, levels: int, flat: bool, field: str) -> None:
    """Within the limits or refused, in bounded time and memory (an alias bomb is small text)."""
    feed(_aliases(fanout, levels, flat, field))


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location in nested dicts and lists."""
    found = [prefix]
    if isinstance(data, dict):
        for key, value in data.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found += _paths(value, (*prefix, index))
    return found


PROFILE_PATHS = _paths(PROFILE_DATA)[1:]
SNAPSHOT_PATHS = _paths(SNAPSHOT_DATA)[1:]


def _mutate(data: Any, path: tuple[Any, ...], action: str, value: Any) -> Any:
    copy = json.loads(json.dumps(data))
    parent = copy
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if action == "delete":
        del parent[last]
    elif action == "replace":
        parent[last] = value
    elif isinstance(parent, dict):
        parent[f"{last}_extra"] = value
    else:
        parent.append(value)
    return copy


def _text_mutations(text: str) -> st.SearchStrategy[str]:
    """Random cuts, insertions and duplications of ``text``."""
    position = st.integers(0, len(text))

    def cut(a: int, b: int) -> str:
        return text[: min(a, b)] + text[max(a, b) :]

    def insert(a: int, chunk: str) -> str:
        return text[:a] + chunk + text[a:]

    def duplicate(a: int, b: int) -> str:
        low, high = min(a, b), max(a, b)
        return text[:high] + text[low:high] * 3 + text[high:]

    return (
        st.builds(cut, position, position)
        | st.builds(insert, position, st.text(alphabet=YAML_SOUP, min_size=1, max_size=8))
        | st.builds(duplicate, position, position)
    )


@FUZZ
@given(
    st.sampled_from(PROFILE_PATHS),
    st.sampled_from(["delete", "replace", "add"]),
    structures,
    st.sampled_from(["json", "yaml"]),
)
def test_mutated_profile_structure(
    path: tuple[Any, ...], action: str, value: Any, fmt: str
) -> None:
    data = _mutate(PROFILE_DATA, path, action, value)
    text = json.dumps(data) if fmt == "json" else yaml.safe_dump(data, sort_keys=False)
    feed(text)


@FUZZ
@given(
    st.sampled_from(SNAPSHOT_PATHS),
    st.sampled_from(["delete", "replace", "add"]),
    structures,
)
def test_mutated_snapshot_structure(path: tuple[Any, ...], action: str, value: Any) -> None:
    feed(json.dumps(_mutate(SNAPSHOT_DATA, path, action, value)))


@FUZZ
@given(st.data(), st.sampled_from(["yaml", "json", "snapshot"]))
def test_mutated_profile_and_snapshot_text(data: st.DataObject, which: str) -> None:
    text = {
        "yaml": dump_profile(PROFILE, "yaml"),
        "json": dump_profile(PROFILE, "json"),
        "snapshot": SNAPSHOT_TEXT,
    }[which]
    for _ in range(data.draw(st.integers(1, 4))):
        text = data.draw(_text_mutations(text))
    feed(text[:MAX_INPUT_BYTES])


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_the_unmutated_inputs_load(fmt: str) -> None:
    """The fuzz starts from valid files: without a mutation they load unchanged."""
    assert parse_profile(dump_profile(PROFILE, fmt)) == PROFILE  # type: ignore[arg-type]
    assert parse_snapshot(SNAPSHOT_TEXT) == HardwareSnapshot.model_validate_json(SNAPSHOT_TEXT)
