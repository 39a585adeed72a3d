"""A key held twice in one mapping of an input file is refused with one line that names the key
and where it is, whichever reader parses it: PyYAML's C loader, its pure-Python one (where
PyYAML was built without libyaml), and JSON's."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from torch_autotune.cli import cli
from torch_autotune.detect import parse_snapshot
from torch_autotune.errors import EXIT_BAD_INPUT, ProfileFileError, SnapshotFileError
from torch_autotune.input_files import parse_yaml
from torch_autotune.profile_io import parse_baseline, parse_profile

PROFILE = Path(__file__).parents[1] / "profiles" / "l4.yaml"
SNAPSHOT = Path(__file__).parent / "fixtures" / "snapshots" / "tesla-t4.json"
KEEP_ONE = "keep the one you mean and delete the other"


@pytest.fixture(params=["installed", "pure-python"])
def pyyaml(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """PyYAML as installed (its C loader where it has one), then without libyaml."""
    if request.param == "pure-python":
        monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    return str(request.param)


def _line_of(text: str, line: str) -> int:
    return text.splitlines().index(line) + 1


@pytest.mark.usefixtures("pyyaml")
def test_validate_refuses_a_yaml_key_held_twice_with_its_lines(tmp_path: Path) -> None:
    good = PROFILE.read_text()
    first = _line_of(good, "    num_workers: 7")
    content = good.replace("    num_workers: 7\n", "    num_workers: 7\n    num_workers: 2\n", 1)
    path = tmp_path / "profile.yaml"
    path.write_text(content)
    result = CliRunner().invoke(cli, ["validate", str(path)], prog_name="autotune")
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stderr.splitlines() == [
        f"autotune: error: {path} holds the key 'num_workers' twice (lines {first} and "
        f"{first + 1}); {KEEP_ONE}"
    ]
    assert path.read_text() == content


@pytest.mark.usefixtures("pyyaml")
@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("a: 1\nb: 2\na: 3\n", "'a' twice (lines 1 and 3)"),
        ("b:\n  x: 1\n  x: 2\n", "'x' twice (lines 2 and 3)"),
        ("- {k: 1, k: 2}\n", "'k' twice (line 1, columns 4 and 10)"),
        ('{"a": 1, "a": 2}', "'a' twice (line 1, columns 2 and 10)"),
        ("1: a\n0x1: b\n", "'0x1' twice (lines 1 and 2)"),  # both the integer 1
        ("base: &b {k: 1, k: 2}\nuse: *b\n", "'k' twice (line 1, columns 11 and 17)"),
    ],
)
def test_every_yaml_reader_refuses_a_key_held_twice(text: str, where: str) -> None:
    with pytest.raises(ProfileFileError) as caught:
        parse_yaml(text, "f.yaml", ProfileFileError, "fix it")
    assert str(caught.value) == f"f.yaml holds the key {where}; {KEEP_ONE}"


@pytest.mark.usefixtures("pyyaml")
def test_a_merge_may_still_set_a_key_again() -> None:
    """YAML's merge (``<<``) brings keys in that the mapping may set again: not a key twice."""
    text = "b: &b {k: 0, j: 0}\na: &a\n  <<: *b\n  k: 1\nc:\n  <<: *a\n  k: 3\n"
    data = parse_yaml(text, "f.yaml", ProfileFileError, "fix it")
    assert data == {"b": {"k": 0, "j": 0}, "a": {"k": 1, "j": 0}, "c": {"k": 3, "j": 0}}


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"a": 1, "a": 2}', "'a' twice, at its top level"),
        ('{"s": {"d": [{"a": 1}, {"k": 1, "k": 2}]}}', "'k' twice, in s.d.1"),
    ],
)
def test_a_stored_json_profile_with_a_key_held_twice_is_refused(text: str, where: str) -> None:
    with pytest.raises(ProfileFileError) as caught:
        parse_profile(text, "p.json", fmt="json")
    assert str(caught.value) == f"p.json holds the key {where}; {KEEP_ONE}"


def test_a_snapshot_with_a_key_held_twice_is_refused() -> None:
    text = SNAPSHOT.read_text().replace('"sm_count": 40,', '"sm_count": 40,\n"sm_count": 80,', 1)
    with pytest.raises(SnapshotFileError) as caught:
        parse_snapshot(text, "m.json")
    assert (
        str(caught.value) == f"m.json holds the key 'sm_count' twice, in accelerators.0; {KEEP_ONE}"
    )


@pytest.mark.usefixtures("pyyaml")
def test_a_baseline_with_a_key_held_twice_is_refused() -> None:
    with pytest.raises(ProfileFileError, match=r"^b\.yaml holds the key 'batch_size' twice"):
        parse_baseline("batch_size: 64\nnum_workers: 2\nbatch_size: 128\n", "b.yaml")
