"""How profiles evolve (``profile_io``'s docstring): every schema's golden file loads, a key
added with a default needs no new version, and a newer release's file is refused in one line
that names the upgrade. The migration steps are tested on a registry of this file's own, since
schema 1 is the only one yet: the mechanism is ready for the first real step."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from torch_autotune.cli import cli
from torch_autotune.errors import EXIT_BAD_INPUT, ProfileFileError
from torch_autotune.profile import PROFILE_SCHEMA_VERSION
from torch_autotune.profile_io import MIGRATIONS, dump_profile, load_profile, migrate, parse_profile
from torch_autotune.version import __version__

GOLDEN = Path(__file__).parent / "fixtures" / "profiles"


def golden(version: int) -> Path:
    return GOLDEN / f"schema-{version}.yaml"


def golden_data(version: int = PROFILE_SCHEMA_VERSION) -> dict[str, Any]:
    data = yaml.safe_load(golden(version).read_text())
    assert isinstance(data, dict)
    return data


# --- the golden files and the steps between them --------------------------------------------------


def test_every_schema_has_its_golden_file_and_every_step_its_migration() -> None:
    versions = range(1, PROFILE_SCHEMA_VERSION + 1)
    assert sorted(p.name for p in GOLDEN.glob("*.yaml")) == [f"schema-{v}.yaml" for v in versions]
    assert sorted(MIGRATIONS) == list(range(1, PROFILE_SCHEMA_VERSION))


@pytest.mark.parametrize("version", range(1, PROFILE_SCHEMA_VERSION + 1))
def test_each_schemas_golden_file_loads_as_this_release_writes_it(version: int) -> None:
    assert golden_data(version)["schema_version"] == version
    profile = load_profile(golden(version))
    assert profile.schema_version == PROFILE_SCHEMA_VERSION
    rewritten = dump_profile(profile)
    assert parse_profile(rewritten) == profile
    assert dump_profile(parse_profile(rewritten)) == rewritten


def test_the_golden_file_of_schema_1_is_a_measured_and_benched_profile() -> None:
    # The file holds what a profile can: the search, the points, compile, the DataLoader and fed
    # passes, the batch's facts and the bench, so a step that forgets one of them fails here.
    profile = load_profile(golden(1))
    evidence = profile.evidence
    assert profile.measured
    assert evidence is not None
    assert evidence.batch_choice is not None
    assert evidence.compile is not None
    assert evidence.loader
    assert evidence.fed
    assert evidence.bench is not None
    assert not evidence.bench.final_is_baseline  # written before the key: its default
    assert profile.provenance.snapshot.accelerators


def test_schema_1_to_2_names_the_variant_each_record_ran_with() -> None:
    # Schema 1 had ``compiled: true/false`` on the points and the batch choice; schema 2 names
    # the variant. The fed passes ran as the choice did. The settings each variant ran with
    # were not recorded, so no variants are invented: every run counts as before.
    data = golden_data(1)
    points = data["evidence"]["throughput"]
    profile = load_profile(golden(1))
    evidence = profile.evidence
    assert evidence is not None
    assert [r.variant for r in evidence.throughput] == [
        "compiled" if p["compiled"] else "eager" for p in points
    ]
    assert evidence.batch_choice is not None
    assert evidence.batch_choice.compiled is data["evidence"]["batch_choice"]["compiled"]
    fed = "compiled" if data["evidence"]["batch_choice"]["compiled"] else "eager"
    assert {r.variant for r in evidence.fed} == {fed}
    assert evidence.variants == ()
    probe = {t.batch_size for t in evidence.search if t.fits}
    probe |= {r.batch_size for r in evidence.throughput}
    probe |= {r.batch_size for r in evidence.fed if r.samples_per_s}
    assert evidence.ran({"compile": "off"}) == probe


def test_the_golden_file_of_schema_2_records_the_variants_and_their_settings() -> None:
    # A simulated H100 run whose compiled model fits fewer samples (1000) than eager (1850):
    # the compiled model had its own search, and the profile's batch ran compiled.
    profile = load_profile(golden(2))
    evidence = profile.evidence
    assert evidence is not None
    names = {v.name for v in evidence.variants}
    assert {"eager", "compiled", "eager, cuDNN autotuner off"} <= names
    assert {t.variant for t in evidence.search} >= {"eager, cuDNN autotuner off", "compiled"}
    assert profile.settings.compile.enabled
    memory = profile_memory(profile)
    assert profile.settings.batch.batch_size in evidence.ran(memory)
    compiled = [t for t in evidence.search if t.fits and t.variant.startswith("compiled")]
    assert max(t.batch_size for t in compiled) == 1000


def profile_memory(profile: Any) -> dict[str, str]:
    from torch_autotune.settings import memory_settings

    return memory_settings(profile.settings)


# --- a key added with a default: older files load, no new version ---------------------------------

# Keys added to schema 1 with a default: a schema-1 file written before them still loads.
ADDED_WITH_A_DEFAULT = [
    ("provenance", "preferences", "target_global_batch"),
    ("evidence", "details"),
    ("evidence", "batch_choice"),
    ("evidence", "fed"),
]


@pytest.mark.parametrize("path", ADDED_WITH_A_DEFAULT, ids=".".join)
def test_a_file_written_before_a_key_with_a_default_loads_with_the_default(
    path: tuple[str, ...],
) -> None:
    data = golden_data()
    *parents, key = path
    inner = data
    for part in parents:
        inner = inner[part]
    del inner[key]
    profile = parse_profile(json.dumps(data), fmt="json")
    model: Any = profile
    for part in parents:
        model = getattr(model, part)
    field = type(model).model_fields[key]
    assert getattr(model, key) == field.get_default(call_default_factory=True)


def test_the_measured_h100_profile_written_before_those_keys_still_loads() -> None:
    path = Path(__file__).parents[1] / "benchmarks/results/h100-2026-11-23/profile-gpt2-speed.json"
    assert "batch_choice" not in path.read_text()
    profile = load_profile(path)
    assert profile.evidence is not None
    assert profile.evidence.batch_choice is None


# --- a newer release ------------------------------------------------------------------------------


def test_a_newer_schema_is_one_line_naming_both_versions_and_the_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "newer.yaml"
    data = golden_data()
    data["schema_version"] = PROFILE_SCHEMA_VERSION + 1
    data["a_key_of_the_next_schema"] = {"anything": 1}
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(cli, ["validate", str(path)], prog_name="autotune")
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stderr.splitlines() == [
        f"autotune: error: {path} uses profile schema {PROFILE_SCHEMA_VERSION + 1}, newer than "
        f"this torch-autotune reads ({PROFILE_SCHEMA_VERSION}); upgrade with "
        "'pip install -U torch-autotune'"
    ]


def _from_a_newer_release(data: dict[str, Any]) -> None:
    data["provenance"]["tool_version"] = "99.0"


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda d: d["evidence"].update(a_key_added_later=1), "unknown key 'evidence.a_key_"),
        (lambda d: d.update(mode="a-mode-added-later"), "mode: Input should be"),
    ],
    ids=["added-key", "added-value"],
)
def test_a_newer_releases_file_of_the_same_schema_names_the_upgrade(
    edit: Any, problem: str
) -> None:
    data = golden_data()
    edit(data)
    with pytest.raises(ProfileFileError) as older:
        parse_profile(json.dumps(data), fmt="json")
    assert problem in str(older.value)
    assert "newer than this one" not in str(older.value)  # written by this very release

    _from_a_newer_release(data)
    with pytest.raises(ProfileFileError) as newer:
        parse_profile(json.dumps(data), fmt="json")
    message = str(newer.value)
    assert problem in message
    assert message.endswith(
        f"; it was written by torch-autotune 99.0, newer than this one ({__version__}): "
        "upgrade with 'pip install -U torch-autotune'"
    )
    assert "\n" not in message


# --- the migration steps (a registry of this file's own) -----------------------------------------


def _rename_mode_to_goal(data: dict[str, Any]) -> dict[str, Any]:
    return {("goal" if key == "mode" else key): value for key, value in data.items()}


def _goal_in_capitals(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "goal": data["goal"].upper()}


STEPS = {1: _rename_mode_to_goal, 2: _goal_in_capitals}


def test_the_steps_run_in_order_from_the_files_schema_and_leave_their_input_alone() -> None:
    data = {"schema_version": 1, "mode": "speed", "notes": ["a"]}
    before = copy.deepcopy(data)
    assert migrate(data, current=3, steps=STEPS) == {
        "schema_version": 3,
        "goal": "SPEED",
        "notes": ["a"],
    }
    assert data == before
    assert migrate({"schema_version": 2, "goal": "memory"}, current=3, steps=STEPS) == {
        "schema_version": 3,
        "goal": "MEMORY",
    }


@pytest.mark.parametrize("version", [3, None, "1", True, 0, -2])
def test_data_of_the_current_schema_or_none_usable_is_left_to_validation(version: object) -> None:
    data = {"schema_version": version, "mode": "speed"}
    assert migrate(data, current=3, steps=STEPS) is data


def test_a_newer_schema_than_the_steps_reach_is_refused() -> None:
    with pytest.raises(ProfileFileError, match=r"^f uses profile schema 4, newer than .* \(3\);"):
        migrate({"schema_version": 4}, "f", current=3, steps=STEPS)


def test_a_step_that_cannot_read_the_file_is_one_line_naming_the_schemas() -> None:
    with pytest.raises(ProfileFileError) as caught:
        migrate({"schema_version": 2, "mode": "speed"}, "f", current=3, steps=STEPS)
    assert re.fullmatch(
        r"f: a schema-2 profile that cannot be brought to schema 3 \(KeyError: 'goal'\); "
        r"regenerate it with 'autotune export'",
        str(caught.value),
    )


def test_a_missing_step_is_the_releases_bug_not_the_files() -> None:
    with pytest.raises(KeyError):
        migrate({"schema_version": 1, "mode": "speed"}, current=3, steps={2: _goal_in_capitals})
