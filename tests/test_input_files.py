"""Hostile and broken input files: refused with one line and exit code 3, in bounded time and
memory, before a parser can crash (issue 11). Profiles, snapshots and baselines share the limits.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

import torch_autotune
from tests.conftest import env_importing_from
from torch_autotune.cli import cli
from torch_autotune.detect import load_snapshot, parse_snapshot
from torch_autotune.errors import (
    EXIT_BAD_INPUT,
    EXIT_USAGE,
    InputFileError,
    ProfileFileError,
    SnapshotFileError,
)
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.input_files import (
    MAX_INPUT_BYTES,
    MAX_NESTING,
    MAX_VALUES,
    Format,
    parse_json,
    parse_yaml,
    read_input,
    read_stream,
)
from torch_autotune.profile import Profile
from torch_autotune.profile_io import (
    dump_profile,
    load_baseline,
    load_profile,
    parse_baseline,
    parse_profile,
)
from torch_autotune.rules.engine import build_profile

SNAPSHOT_DIR = Path(__file__).parent / "fixtures" / "snapshots"
REFERENCE_PROFILES = sorted((Path(__file__).parents[1] / "profiles").glob("*.yaml"))

# Every loader of text, with the error class it must raise and nothing else.
Loader = Callable[[str], object]
LOADERS: dict[str, tuple[Loader, type[InputFileError]]] = {
    "profile": (parse_profile, ProfileFileError),
    "profile-json": (lambda text: parse_profile(text, fmt="json"), ProfileFileError),
    "profile-yaml": (lambda text: parse_profile(text, fmt="yaml"), ProfileFileError),
    "snapshot": (parse_snapshot, SnapshotFileError),
    "baseline": (parse_baseline, ProfileFileError),
}
JSON_ONLY = {"profile-json", "snapshot"}
FILE_LOADERS: dict[str, tuple[Callable[[Path], object], type[InputFileError]]] = {
    "profile": (load_profile, ProfileFileError),
    "snapshot": (load_snapshot, SnapshotFileError),
    "baseline": (load_baseline, ProfileFileError),
}


def run(*args: str, stdin: str | bytes | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=stdin, prog_name="autotune")


def one_error_line(result: Result) -> str:
    """The one line a refused input gives: exit 3, nothing on stdout, no traceback."""
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("autotune: error: ")
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def snapshot_text() -> str:
    return (SNAPSHOT_DIR / "tesla-t4.json").read_text()


@pytest.fixture(scope="module")
def profile() -> Profile:
    snapshot = HardwareSnapshot.model_validate_json((SNAPSHOT_DIR / "tesla-t4.json").read_text())
    return build_profile(snapshot, now=datetime(2026, 11, 1, tzinfo=timezone.utc), host_id="t")


# --- nesting --------------------------------------------------------------------------------

DEEP = {
    "yaml-flow-sequences": "[" * 100_000,
    "yaml-flow-mappings": "{a: " * 100_000,
    "yaml-block-sequences": "- " * 100_000 + "x\n",
    "yaml-block-mappings": "".join(" " * i + "a:\n" for i in range(1_000)),
    "json-arrays": "[" * 100_000 + "]" * 100_000,
    "json-objects": '{"a": ' * 100_000 + "1" + "}" * 100_000,
}


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("case", DEEP)
def test_deep_nesting_is_refused_before_the_parser_recurses(loader: str, case: str) -> None:
    load, error = LOADERS[loader]
    reads_it = loader not in JSON_ONLY or case.startswith("json") or case == "yaml-flow-sequences"
    started = time.process_time()
    with pytest.raises(error) as caught:
        load(DEEP[case])
    assert time.process_time() - started < 1.0
    if reads_it:  # a JSON-only loader refuses YAML text as not JSON, before any nesting
        assert f"nested more than {MAX_NESTING} levels deep" in str(caught.value)


def _json_arrays(depth: int) -> str:
    return "[" * depth + "]" * depth


def _yaml_block(depth: int) -> str:
    return "- " * depth + "x\n"


@pytest.mark.parametrize("depth", [1, 6, MAX_NESTING - 1, MAX_NESTING, MAX_NESTING + 1, 500])
@pytest.mark.parametrize(
    ("parse", "nested"),
    [(parse_json, _json_arrays), (parse_yaml, _json_arrays), (parse_yaml, _yaml_block)],
    ids=["json", "yaml-flow", "yaml-block"],
)
def test_the_nesting_limit_is_exact(
    parse: Callable[..., object], nested: Callable[[int], str], depth: int
) -> None:
    text = nested(depth)
    if depth <= MAX_NESTING:
        parse(text, "f", ProfileFileError, "fix it")
    else:
        with pytest.raises(ProfileFileError, match="nested more than"):
            parse(text, "f", ProfileFileError, "fix it")


@pytest.mark.parametrize(
    "text",
    [
        '{"reason": "' + "[" * 1_000 + '"}',
        '{"reason": "\\"' + "{" * 1_000 + '"}',
        '{"reason": "\\\\", "b": "' + "[" * 1_000 + '"}',
    ],
    ids=["brackets", "after-an-escaped-quote", "after-an-escaped-backslash"],
)
def test_brackets_inside_json_strings_do_not_count_as_nesting(text: str) -> None:
    assert isinstance(parse_json(text, "f", ProfileFileError, "fix it"), dict)


def test_an_escaped_bracket_run_cannot_hide_real_nesting() -> None:
    text = '["\\\\", ' + "[" * 100 + "]" * 100 + "]"
    with pytest.raises(ProfileFileError, match="nested more than"):
        parse_json(text, "f", ProfileFileError, "fix it")


# --- YAML aliases ---------------------------------------------------------------------------


def _alias_bomb(levels: int) -> str:
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("loader", ["profile", "profile-yaml", "baseline"])
def test_an_alias_bomb_is_refused_quickly_in_little_memory(loader: str) -> None:
    load, error = LOADERS[loader]
    tracemalloc.start()
    started = time.process_time()
    try:
        with pytest.raises(error, match=f"more than {MAX_VALUES:,} keys and values"):
            load(_alias_bomb(9))  # 10**9 values written out
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.process_time() - started < 1.0
    assert peak < 16 * 2**20


def test_a_chain_of_aliases_cannot_nest_past_the_limit() -> None:
    # Each line nests the previous one a level deeper: 2 levels of text, 100 of data.
    lines = ["a0: &a0 [x]"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, 100)]
    with pytest.raises(ProfileFileError, match="nested more than"):
        parse_profile("\n".join(lines))


@pytest.mark.parametrize("text", ["a: &a [*a]\n", "&a {b: *a}\n", "- &a [1, [2, *a]]\n"])
def test_a_recursive_alias_is_refused(text: str) -> None:
    with pytest.raises(ProfileFileError, match="contains itself"):
        parse_profile(text)


def test_shared_aliases_are_counted_as_written_out() -> None:
    shared = "a: &a [1, 2, 3]\nb: [*a, *a]\n"
    assert parse_yaml(shared, "f", ProfileFileError, "fix it") == {
        "a": [1, 2, 3],
        "b": [[1, 2, 3], [1, 2, 3]],
    }


@pytest.mark.parametrize("command", ["detect", "recommend"])
def test_a_snapshot_whose_names_hold_terminal_escapes_is_refused(
    command: str, tmp_path: Path, snapshot_text: str
) -> None:
    """A CPU name with an escape sequence set the terminal's title when shown, and a GPU name
    with one coloured and forged lines: a file's text has no use for control characters."""
    data = json.loads(snapshot_text)
    data["host"]["cpu_model"] = "\x1b]0;pwned\x07AMD EPYC"
    path = tmp_path / "escapes.json"
    path.write_text(json.dumps(data))  # JSON writes the escape as \u001b
    line = one_error_line(run(command, "--snapshot", str(path)))
    assert "holds a control character (0x1b" in line
    assert "\x1b" not in line  # said by its code, never sent to the terminal raw


def test_tabs_and_line_ends_are_text() -> None:
    assert parse_yaml('a: "one\\ttwo\\nthree"\n', "f", ProfileFileError, "fix it") == {
        "a": "one\ttwo\nthree"
    }


# --- size -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", FILE_LOADERS)
def test_a_huge_file_is_refused_from_its_size_without_reading_it(tmp_path: Path, kind: str) -> None:
    load, error = FILE_LOADERS[kind]
    path = tmp_path / "huge.yaml"
    with path.open("wb") as file:
        file.truncate(200 * 2**20)  # sparse: 200 MiB that take no disk space
    tracemalloc.start()
    started = time.process_time()
    try:
        with pytest.raises(error, match=r"huge.yaml is 200.0 MiB, larger than 1 MiB, the limit"):
            load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.process_time() - started < 0.5
    assert peak < 2**20


class _Endless(io.RawIOBase):
    """A stream that never ends, like /dev/zero or a runaway pipe."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        buffer[:] = b"a" * len(buffer)
        return len(buffer)


def test_a_stream_is_read_no_further_than_the_limit() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(SnapshotFileError, match="standard input is larger than 1 MiB"):
            read_stream(io.BufferedReader(_Endless()), "standard input", SnapshotFileError)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * MAX_INPUT_BYTES


def test_a_file_at_the_limit_is_read_and_one_byte_more_is_not(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes(b"a: 1\n" + b" " * (MAX_INPUT_BYTES - 5))
    assert len(read_input(path, ProfileFileError, "fix it")) == MAX_INPUT_BYTES
    path.write_bytes(path.read_bytes() + b" ")
    with pytest.raises(ProfileFileError, match="larger than 1 MiB"):
        read_input(path, ProfileFileError, "fix it")
    stream = io.BytesIO(path.read_bytes())
    with pytest.raises(ProfileFileError, match="larger than 1 MiB"):
        read_stream(stream, "pipe", ProfileFileError)


@pytest.mark.parametrize("loader", LOADERS)
def test_text_over_the_limit_is_refused_by_the_parsers_too(loader: str) -> None:
    load, error = LOADERS[loader]
    with pytest.raises(error, match="larger than 1 MiB"):
        load("a: 1\n" + "#" * MAX_INPUT_BYTES)


@pytest.mark.slow  # parses 1 MiB inputs
@pytest.mark.parametrize(
    "text",
    [
        "".join(f"k{i}: {i}\n" for i in range(90_000))[:MAX_INPUT_BYTES],
        "- a\n" * (MAX_INPUT_BYTES // 4),
        "[" + "0," * (MAX_INPUT_BYTES // 2 - 2) + "0]",
        '"\\' * (MAX_INPUT_BYTES // 2),
        "[]" * (MAX_INPUT_BYTES // 2),
        "a: &a [1, 2, 3]\nb: [" + "*a, " * (MAX_INPUT_BYTES // 4 - 10) + "*a]\n",
    ],
    ids=["flat-mapping", "block-list", "json-list", "quotes", "brackets", "aliases"],
)
@pytest.mark.parametrize("loader", ["profile", "baseline", "snapshot"])
def test_the_worst_input_within_the_limit_costs_bounded_time_and_memory(
    loader: str, text: str
) -> None:
    load, error = LOADERS[loader]
    tracemalloc.start()
    started = time.process_time()
    try:
        with pytest.raises(error):
            load(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # CPU time, not wall time, so that other work on the machine does not count: at most
    # 0.8 s here on a 2-core CPU, with tracemalloc slowing every allocation.
    assert time.process_time() - started < 5.0
    assert peak < 64 * 2**20


# --- encoding and odd files -----------------------------------------------------------------


@pytest.mark.parametrize("kind", FILE_LOADERS)
def test_invalid_utf8_names_the_byte(tmp_path: Path, kind: str) -> None:
    load, error = FILE_LOADERS[kind]
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"batch_size: 64\n# caf\xe9\n")
    with pytest.raises(error, match=r"latin1.yaml is not UTF-8 text \(byte 20"):
        load(path)


def test_a_byte_order_mark_is_accepted(tmp_path: Path, snapshot_text: str) -> None:
    path = tmp_path / "machine.json"
    path.write_bytes(b"\xef\xbb\xbf" + snapshot_text.encode())
    assert load_snapshot(path) == parse_snapshot(snapshot_text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: 2026-13-45\n", "holds a value YAML cannot read (month must be in 1..12)"),
        ("a: " + "1" * 5_000 + "\n", "holds a value YAML cannot read"),
        ("? [a]\n: b\n", "is not valid YAML (line 1, column 3): found unhashable key"),
        ("a: 1\n---\nb: 2\n", "is not valid YAML"),
    ],
    ids=["impossible-date", "huge-integer", "unhashable-key", "two-documents"],
)
def test_values_yaml_cannot_construct_are_one_error(text: str, message: str) -> None:
    with pytest.raises(ProfileFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_profile(text)


def test_a_json_integer_python_will_not_convert_is_one_error() -> None:
    with pytest.raises(SnapshotFileError, match="is not valid JSON"):
        parse_snapshot('{"schema_version": ' + "1" * 5_000 + "}")


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_a_profile_given_as_a_snapshot_is_named_a_profile(
    tmp_path: Path, profile: Profile, fmt: Format
) -> None:
    """Its schema_version (2, the profile's) read as a snapshot's from a newer release: 'upgrade
    with pip install -U', which changes nothing. Exported as YAML (export's default), it was
    'not valid JSON', as if the file were broken."""
    path = tmp_path / f"profile.{fmt}"
    path.write_text(dump_profile(profile, fmt))
    line = one_error_line(run("recommend", "--snapshot", str(path)))
    assert f"{path} is a profile, not a hardware snapshot; --snapshot takes a machine " in line
    assert "autotune detect --json > FILE" in line
    assert "upgrade" not in line


def test_a_yaml_profile_on_standard_input_as_a_snapshot_is_named_a_profile(
    profile: Profile,
) -> None:
    result = run("recommend", "--snapshot", "-", stdin=dump_profile(profile, "yaml"))
    line = one_error_line(result)
    assert "standard input is a profile, not a hardware snapshot; --snapshot takes" in line


@pytest.mark.parametrize(
    "command",
    [("validate", "{}"), ("show", "--profile", "{}"), ("diff", "{}", "{}")],
    ids=["validate", "show", "diff"],
)
def test_a_snapshot_given_as_a_profile_is_named_a_snapshot(command: tuple[str, ...]) -> None:
    """Its keys read as a profile's: "unknown key 'tool_version'; did you mean
    'schema_version'? (and 13 more problems)", which never said the file is a snapshot."""
    path = SNAPSHOT_DIR / "tesla-t4.json"
    line = one_error_line(run(*(part.format(path) for part in command)))
    assert f"{path} is a hardware snapshot, not a profile; make a profile from it" in line
    assert f"'autotune recommend --snapshot {path} --json > profile.json'" in line
    assert "unknown key" not in line


def test_a_snapshot_given_to_load_profile_is_named_a_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "machine.json"
    path.write_text((SNAPSHOT_DIR / "tesla-t4.json").read_text())
    with pytest.raises(ProfileFileError, match="is a hardware snapshot, not a profile") as info:
        torch_autotune.load_profile(path)
    assert str(info.value).startswith(f"{path} is a hardware snapshot")
    assert "\n" not in str(info.value)


def test_a_snapshot_on_standard_input_as_a_profile_is_named_a_snapshot(
    snapshot_text: str,
) -> None:
    line = one_error_line(run("validate", "-", stdin=snapshot_text))
    assert "standard input is a hardware snapshot, not a profile" in line
    assert "--snapshot FILE --json" in line


def test_broken_yaml_as_a_snapshot_is_still_not_json() -> None:
    with pytest.raises(SnapshotFileError, match=r"^m\.yaml is not valid JSON \(line 1, col"):
        parse_snapshot("settings: [\ndecisions: 1\nprovenance: 2\n", "m.yaml")


# --- JSON or YAML ---------------------------------------------------------------------------


def test_a_profile_in_yaml_flow_style_is_read(profile: Profile) -> None:
    flow = yaml.safe_dump(profile.model_dump(mode="json"), default_flow_style=True, sort_keys=False)
    assert flow.startswith("{schema_version: 2, ")
    assert parse_profile(flow) == profile


def test_yaml_that_is_also_json_reads_the_same(profile: Profile) -> None:
    text = dump_profile(profile, "json")
    assert parse_profile(text) == parse_profile(text, fmt="yaml") == profile


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"schema_version": 1,', "is not valid JSON (line 1, column 22"),
        ('[{"a": 1}', "is not valid JSON"),
        ("{schema_version: 1,", "is not valid YAML"),
        ("[a, b", "is not valid YAML"),
    ],
)
def test_broken_text_gets_the_error_of_the_format_it_was_written_in(
    text: str, message: str
) -> None:
    with pytest.raises(ProfileFileError) as caught:
        parse_profile(text, source="p.yaml")
    assert message in str(caught.value)


# --- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["detect", "--json", "--snapshot", "-"],
        ["recommend", "--json", "--snapshot", "-"],
        ["show", "--json", "--snapshot", "-"],
        ["export", "--format", "json", "--snapshot", "-"],
    ],
    ids=["detect", "recommend", "show", "export"],
)
def test_snapshot_dash_reads_standard_input(
    args: list[str], tmp_path: Path, snapshot_text: str
) -> None:
    store = ["--store", str(tmp_path)] if args[0] in ("show", "export") else []
    from_file = run(*args[:-1], str(SNAPSHOT_DIR / "tesla-t4.json"), *store)
    from_stdin = run(*args, *store, stdin=snapshot_text)
    assert from_stdin.exit_code == 0, from_stdin.output
    made_at = re.compile(r'"created_at": "[^"]*"')  # the one field that differs between runs
    assert made_at.sub("", from_stdin.stdout) == made_at.sub("", from_file.stdout)
    assert "T4" in from_stdin.stdout


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        ("[" * 100_000, "standard input is nested more than 64 levels deep"),
        ("a" * (MAX_INPUT_BYTES + 1), "standard input is larger than 1 MiB"),
        (b"\xff\xfe{}", "standard input is not UTF-8 text"),
        ("", "standard input is not valid JSON"),
    ],
    ids=["deep", "large", "binary", "empty"],
)
def test_a_bad_snapshot_on_standard_input_is_one_line_and_exit_3(
    stdin: str | bytes, message: str
) -> None:
    assert message in one_error_line(run("recommend", "--snapshot", "-", stdin=stdin))


def test_validate_reads_standard_input(profile: Profile) -> None:
    result = run("validate", "-", stdin=dump_profile(profile))
    assert result.exit_code == 0
    assert result.stdout.startswith("standard input: valid profile")


@pytest.mark.parametrize("args", [["validate", "-", "-"], ["diff", "-", "-"]])
def test_standard_input_named_twice_is_a_usage_error(args: list[str], profile: Profile) -> None:
    """The second '-' would read an empty file: refused, not reported as invalid."""
    result = run(*args, stdin=dump_profile(profile))
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.stderr.splitlines()[-1].startswith(
        "autotune: error: '-' is named twice; standard input can be read only once"
    )


def test_validate_takes_every_reference_profile_at_once() -> None:
    result = run("validate", *map(str, REFERENCE_PROFILES))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == len(REFERENCE_PROFILES) == 19
    for path, line in zip(REFERENCE_PROFILES, lines, strict=True):
        assert line.startswith(f"{path}: valid profile (schema 2")


def test_validate_reports_each_file_and_exits_3_when_any_is_invalid(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("[" * 100_000)
    missing = tmp_path / "missing.yaml"
    first, last = REFERENCE_PROFILES[0], REFERENCE_PROFILES[-1]
    result = run("validate", str(first), str(broken), str(missing), str(tmp_path), str(last))
    assert result.exit_code == EXIT_BAD_INPUT
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == [str(first), str(last)]
    errors = result.stderr.splitlines()
    assert len(errors) == 3
    assert errors[0].startswith(f"autotune: error: {broken} is nested more than")
    assert errors[1].startswith(f"autotune: error: {missing} does not exist")
    assert errors[2].startswith(f"autotune: error: {tmp_path} is a directory")
    assert broken.read_text() == "[" * 100_000  # nothing on disk changed


@pytest.mark.parametrize(
    "args",
    [
        ["detect", "--snapshot"],
        ["recommend", "--snapshot"],
        ["validate"],
        ["bench", "--baseline"],
        ["bench", "--profile"],
        ["report", "--profile"],
    ],
)
def test_a_directory_or_unreadable_input_is_exit_3_not_a_usage_error(
    tmp_path: Path, args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "is a directory, not a file" in one_error_line(run(*args, str(tmp_path)))
    unreadable = tmp_path / "secret.yaml"
    unreadable.write_text("batch_size: 64\n")

    def refuse(*_args: object, **_kwargs: object) -> object:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "open", refuse)  # root reads any file: refuse it here instead
    line = one_error_line(run(*args, str(unreadable)))
    assert f"{unreadable} cannot be read: Permission denied" in line


@pytest.mark.parametrize("case", ["yaml", "json"])
def test_the_installed_command_survives_deep_nesting(tmp_path: Path, case: str) -> None:
    """In a real process: a SIGSEGV in the parser cannot be caught by the click runner."""
    path = tmp_path / f"deep.{case}"
    path.write_text("[" * 100_000)
    command = ["validate", str(path)] if case == "yaml" else ["recommend", "--snapshot", str(path)]
    src = str(Path(torch_autotune.__file__).parents[1])
    done = subprocess.run(
        [sys.executable, "-m", "torch_autotune", *command],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_importing_from(src),
        check=False,
    )
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"autotune: error: {path} is nested more than 64 levels deep (a profile or snapshot "
        + (
            "nests 6); regenerate it with 'autotune export'"
            if case == "yaml"
            else "nests 6); write a new one with 'autotune detect --json > FILE'"
        )
    ]


def test_a_profile_file_never_reaches_the_parser_when_it_is_too_large(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"pad": "x" * MAX_INPUT_BYTES}))
    assert "larger than 1 MiB" in one_error_line(run("validate", str(path)))
