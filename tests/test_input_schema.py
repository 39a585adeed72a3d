"""A value of the wrong type in an input file is refused, never turned into the value it looks
like: a number in quotes is a string, true is not a count, 1 is not a switch."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from torch_autotune.cli import cli
from torch_autotune.detect import parse_snapshot
from torch_autotune.errors import EXIT_BAD_INPUT, ProfileFileError, SnapshotFileError
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Profile
from torch_autotune.profile_io import dump_profile, parse_baseline, parse_profile
from torch_autotune.rules.engine import build_profile

SNAPSHOT = Path(__file__).parent / "fixtures" / "snapshots" / "tesla-t4.json"


@pytest.fixture(scope="module")
def profile() -> Profile:
    snapshot = HardwareSnapshot.model_validate_json(SNAPSHOT.read_text())
    return build_profile(snapshot, now=datetime(2026, 11, 1, tzinfo=timezone.utc), host_id="t")


@pytest.fixture(scope="module")
def good_yaml(profile: Profile) -> str:
    return dump_profile(profile, "yaml")


def _edited(text: str, old: str, new: str) -> str:
    assert text.count(old) >= 1, old
    return text.replace(old, new, 1)


WRONG_TYPES = [
    (
        "    batch_size: null\n",
        '    batch_size: "32"\n',
        "settings.batch.batch_size must be a whole number, not the string '32'; "
        "write 32 without quotes",
    ),
    (
        "    num_workers: 3\n",
        "    num_workers: true\n",
        "settings.dataloader.num_workers must be a whole number, not true",
    ),
    (
        "    num_workers: 3\n",
        "    num_workers: 3.0\n",
        "settings.dataloader.num_workers must be a whole number, not the number 3.0",
    ),
    (
        "    pin_memory: true\n",
        "    pin_memory: 1\n",
        "settings.dataloader.pin_memory must be true or false, not the number 1",
    ),
    (
        "    pin_memory: true\n",
        "    pin_memory: 'true'\n",
        "settings.dataloader.pin_memory must be true or false, not the string 'true'; "
        "write true without quotes",
    ),
    (
        "    memory_budget: null\n",
        "    memory_budget: false\n",
        "settings.compile.memory_budget must be a number, not false",
    ),
]


@pytest.mark.parametrize(("old", "new", "expected"), WRONG_TYPES)
def test_validate_refuses_a_value_of_the_wrong_type_in_one_line(
    tmp_path: Path, good_yaml: str, old: str, new: str, expected: str
) -> None:
    path = tmp_path / "profile.yaml"
    content = _edited(good_yaml, old, new)
    path.write_text(content)
    result = CliRunner().invoke(cli, ["validate", str(path)], prog_name="autotune")
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stderr.splitlines() == [f"autotune: error: {path}: {expected}"]
    assert path.read_text() == content


def test_a_stored_json_profile_is_held_to_the_same_types(profile: Profile) -> None:
    text = dump_profile(profile, "json").replace('"cpu_threads": null', '"cpu_threads": "4"')
    with pytest.raises(ProfileFileError, match="cpu_threads must be a whole number, not the st"):
        parse_profile(text, "p.json", fmt="json")


def test_a_whole_number_fills_a_number_and_an_unquoted_time_is_a_time(good_yaml: str) -> None:
    """Deliberate: JSON has one kind of number, so 1 is 1.0; YAML reads an unquoted
    timestamp as a time, which is what the field holds."""
    text = _edited(good_yaml, "    memory_budget: null\n", "    memory_budget: 1\n")
    text = _edited(text, "created_at: '2026-11-01T00:00:00Z'", "created_at: 2026-11-01T00:00:00Z")
    loaded = parse_profile(text, "p.yaml")
    assert loaded.settings.compile.memory_budget == 1.0
    assert loaded.provenance.created_at == datetime(2026, 11, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('"sm_count": 40', '"sm_count": "40"', "accelerators.0.sm_count must be a whole number"),
        ('"sm_count": 40', '"sm_count": true', "accelerators.0.sm_count must be a whole number"),
        ('"tensor_cores": true', '"tensor_cores": 1', "accelerators.0.tensor_cores must be true"),
    ],
)
def test_a_snapshot_is_held_to_its_types(old: str, new: str, expected: str) -> None:
    text = _edited(SNAPSHOT.read_text(), old, new)
    with pytest.raises(SnapshotFileError) as caught:
        parse_snapshot(text, "m.json")
    assert str(caught.value).startswith(f"m.json is not a valid hardware snapshot: {expected}")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('batch_size: "64"', "batch_size must be a whole number, not the string '64'"),
        ("pin_memory: 1", "pin_memory must be true or false, not the number 1"),
        (
            "settings: {compile.enabled: [1]}",
            "settings.compile.enabled must be true or false, a whole number, a number or a "
            "string, not a list",
        ),
        # a value of one of the mapping's types, but not of its setting's: a lax check made
        # the 1 a true when the bench ran
        (
            "settings: {compile.enabled: 1}",
            "settings compile.enabled: 1 is not of its type (input should be a valid boolean)",
        ),
        (
            'settings: {cpu_threads: "8"}',
            'settings cpu_threads: "8" is not of its type (input should be a valid integer)',
        ),
        ("settings: {cpu_threads: true}", "settings cpu_threads: true is not of its type"),
    ],
)
def test_a_baseline_is_held_to_its_types(text: str, expected: str) -> None:
    with pytest.raises(ProfileFileError) as caught:
        parse_baseline(text, "b.yaml")
    assert str(caught.value).startswith(f"b.yaml: {expected}")
    assert "more problem" not in str(caught.value)


def test_a_baseline_setting_of_its_own_type_loads() -> None:
    config = parse_baseline("settings: {compile.enabled: true, cpu_threads: 4}", "b.yaml")
    assert config.settings == {"compile.enabled": True, "cpu_threads": 4}


def test_a_value_no_input_file_holds_is_one_line() -> None:
    with pytest.raises(ProfileFileError, match=r"b\.yaml holds a value no input file holds"):
        parse_baseline("batch_size: !!binary aGVsbG8=", "b.yaml")
