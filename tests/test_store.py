"""The profile store: location, atomic writes, fresh vs stale, recommend() on top of it."""

from __future__ import annotations

import subprocess
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path

import pytest

from torch_autotune.api import recommend
from torch_autotune.detect import RecordedMachine
from torch_autotune.errors import EXIT_STORE, StaleProfileWarning, StoreError
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Mode, Preferences, fingerprint
from torch_autotune.rules.engine import build_profile
from torch_autotune.store import ENV_HOME, ProfileStore, machine_id, store_dir

SNAPSHOT_DIR = Path(__file__).parent / "fixtures" / "snapshots"
NOW = datetime(2026, 11, 1, tzinfo=timezone.utc)


def snapshot(name: str = "h100-80gb-hbm3") -> HardwareSnapshot:
    return HardwareSnapshot.model_validate_json((SNAPSHOT_DIR / f"{name}.json").read_text())


def upgraded_driver(machine: HardwareSnapshot) -> HardwareSnapshot:
    software = machine.software.model_copy(update={"nvidia_driver_version": "580.65.06"})
    return machine.model_copy(update={"software": software})


def test_location_flag_then_environment_then_user_config(tmp_path: Path) -> None:
    assert store_dir(tmp_path / "flag", env={ENV_HOME: str(tmp_path / "env")}) == tmp_path / "flag"
    assert store_dir(None, env={ENV_HOME: str(tmp_path / "env")}) == tmp_path / "env"
    assert store_dir(None, env={}).name == "torch-autotune"


def test_save_writes_one_file_per_fingerprint_and_no_leftovers(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path)
    profile = build_profile(snapshot(), now=NOW)
    path = store.save(profile)
    store.save(profile)  # saving again replaces, never duplicates
    assert path.name == f"{fingerprint(snapshot())}.json"
    assert [p.name for p in store.profiles_dir.iterdir()] == [path.name]
    assert store.load(profile.provenance.fingerprint) == profile


def test_unwritable_store_is_a_store_error_with_the_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the store should be")
    with pytest.raises(StoreError, match="TORCH_AUTOTUNE_HOME") as caught:
        ProfileStore(blocker).save(build_profile(snapshot(), now=NOW))
    assert caught.value.exit_code == EXIT_STORE
    assert blocker.read_text() == "a file where the store should be"


def test_fingerprint_changes_with_driver_torch_and_gpus_but_not_free_memory() -> None:
    base = snapshot()
    assert fingerprint(upgraded_driver(base)) != fingerprint(base)
    newer_torch = base.software.model_copy(update={"torch_version": "2.9.0+cu128"})
    assert fingerprint(base.model_copy(update={"software": newer_torch})) != fingerprint(base)
    fewer_gpus = base.model_copy(update={"accelerators": ()})
    assert fingerprint(fewer_gpus) != fingerprint(base)
    busier = base.accelerators[0].model_copy(update={"memory_free_bytes": 1 << 30})
    assert fingerprint(base.model_copy(update={"accelerators": (busier,)})) == fingerprint(base)


def test_recommend_returns_the_stored_fresh_profile(tmp_path: Path) -> None:
    stored = build_profile(snapshot(), preferences=Preferences(model_kind="conv"), now=NOW)
    ProfileStore(tmp_path).save(stored)
    assert recommend(store=tmp_path, machine=RecordedMachine(snapshot())) == stored


def test_recommend_without_a_stored_profile_gives_rules_only(tmp_path: Path) -> None:
    profile = recommend(store=tmp_path, machine=RecordedMachine(snapshot()))
    assert profile.measured is False
    assert profile.provenance.fingerprint == fingerprint(snapshot())


def test_stale_profile_is_reported_and_never_used(tmp_path: Path) -> None:
    old = build_profile(snapshot(), preferences=Preferences(model_kind="conv"), now=NOW)
    ProfileStore(tmp_path).save(old)
    changed = upgraded_driver(snapshot())
    with pytest.warns(StaleProfileWarning, match="driver 570.133.20 -> 580.65.06"):
        profile = recommend(store=tmp_path, machine=RecordedMachine(changed))
    assert profile != old
    assert profile.provenance.fingerprint == fingerprint(changed)


def test_profile_of_another_machine_is_not_called_stale(tmp_path: Path) -> None:
    other = build_profile(snapshot(), now=NOW, host_id="someone-else")
    ProfileStore(tmp_path).save(other)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleProfileWarning)
        recommend(store=tmp_path, machine=RecordedMachine(upgraded_driver(snapshot())))


def test_recommend_honours_the_mode_asked_for(tmp_path: Path) -> None:
    ProfileStore(tmp_path).save(build_profile(snapshot(), now=NOW))
    profile = recommend("reproducible", store=tmp_path, machine=RecordedMachine(snapshot()))
    assert profile.mode is Mode.REPRODUCIBLE
    assert profile.settings.backends.deterministic_algorithms is True


def test_machine_id_hides_the_host_name() -> None:
    import platform

    assert platform.node() not in machine_id()
    assert len(machine_id()) == 12


@pytest.mark.system
def test_recommend_with_a_stored_profile_does_not_import_torch(tmp_path: Path) -> None:
    code = (
        "import sys, torch_autotune\n"
        "from torch_autotune.rules.engine import build_profile\n"
        "from torch_autotune.store import ProfileStore\n"
        "ProfileStore(sys.argv[1]).save(build_profile(torch_autotune.detect()))\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=120)
    check = (
        "import sys, torch_autotune\n"
        "p = torch_autotune.recommend(store=sys.argv[1])\n"
        "print('torch' in sys.modules, 'yaml' in sys.modules, p.measured)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check, str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.split() == ["False", "False", "False"]
