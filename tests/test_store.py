"""The profile store: location, atomic writes, fresh vs stale, recommend() on top of it."""

from __future__ import annotations

import subprocess
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.test_bench import measured
from torch_autotune.api import recommend
from torch_autotune.detect import RecordedMachine
from torch_autotune.errors import (
    EXIT_STORE,
    MeasuredProfileExistsError,
    RulesOnlyWarning,
    StaleProfileWarning,
    StoredProfileWarning,
    StoreError,
    UnusableGpuWarning,
)
from torch_autotune.evidence import WorkloadDetails
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Mode, Preferences, Profile, fingerprint
from torch_autotune.profile_io import dump_profile
from torch_autotune.rules.engine import build_profile
from torch_autotune.store import ENV_HOME, ProfileStore, machine_id, store_dir, workload_key

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
    old = build_profile(
        snapshot(), preferences=Preferences(model_kind="conv"), now=NOW, host_id=machine_id()
    )  # written by this machine
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
    with pytest.warns(RulesOnlyWarning, match="is for speed mode, not reproducible"):
        profile = recommend("reproducible", store=tmp_path, machine=RecordedMachine(snapshot()))
    assert profile.mode is Mode.REPRODUCIBLE
    assert profile.settings.backends.deterministic_algorithms is True


# --- per workload ---------------------------------------------------------------------------------

H100 = "h100-80gb-hbm3"


def measured_on(workload: str, batch: int = 256) -> Profile:
    """A profile the probe measured on ``workload`` (on the recorded H100)."""
    return measured(H100, batch=batch, workload=workload)


def on_the_h100(store: Path, mode: str | None = None, **options: str) -> Profile:
    return recommend(mode, store=store, machine=RecordedMachine(snapshot()), **options)


def test_each_workload_keeps_its_profile_and_recommend_returns_the_last_saved(
    tmp_path: Path,
) -> None:
    resnet, gpt = measured_on("resnet50", batch=1536), measured_on("gpt2", batch=96)
    store = ProfileStore(tmp_path)
    store.save(resnet)
    store.save(gpt)  # before, this replaced the resnet50 profile
    assert on_the_h100(tmp_path, workload="resnet50") == resnet
    assert on_the_h100(tmp_path, workload="gpt2") == gpt
    assert on_the_h100(tmp_path) == gpt
    store.save(resnet)  # measured again (or benched): the machine's profile again
    assert on_the_h100(tmp_path) == resnet
    assert store.measured_workloads(fingerprint(snapshot())) == ["gpt2", "resnet50"]


def test_the_layout_is_the_machines_profile_and_one_file_per_workload(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path)
    path = store.save(measured_on("resnet50"))
    fp = fingerprint(snapshot())
    assert path == tmp_path / "profiles" / fp / "resnet50.json"
    files = {p.relative_to(store.profiles_dir).as_posix() for p in store.profiles_dir.rglob("*")}
    assert files == {
        fp,
        f"{fp}.json",
        f"{fp}/resnet50.json",
        f"{fp}/speed",
        f"{fp}/speed/resnet50.json",
    }
    # no workload: the machine's file only (replacing a measured one needs force)
    rules_only = store.save(build_profile(snapshot(), now=NOW), force=True)
    assert rules_only == tmp_path / "profiles" / f"{fp}.json"
    assert sorted(p.name for p in (store.profiles_dir / fp).iterdir()) == ["resnet50.json", "speed"]


def test_a_store_from_an_earlier_version_is_read_as_it_is(tmp_path: Path) -> None:
    """Earlier versions kept one profile per machine, in profiles/<fingerprint>.json."""
    old = measured_on("conv")
    legacy = tmp_path / "profiles" / f"{fingerprint(snapshot())}.json"
    legacy.parent.mkdir(parents=True)
    legacy.write_text(dump_profile(old, "json"))
    assert on_the_h100(tmp_path) == old
    assert on_the_h100(tmp_path, workload="conv") == old
    with pytest.warns(RulesOnlyWarning, match=r"measured here: conv\)"):
        assert on_the_h100(tmp_path, workload="gpt2").measured is False
    assert ProfileStore(tmp_path).measured_workloads(fingerprint(snapshot())) == ["conv"]


def test_a_workload_never_measured_here_gets_the_rules_only_profile(tmp_path: Path) -> None:
    ProfileStore(tmp_path).save(measured_on("resnet50"))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")  # a StaleProfileWarning would be among them
        profile = on_the_h100(tmp_path, workload="gpt2")
    assert [type(w.message) for w in said] == [RulesOnlyWarning]
    assert str(said[0].message) == (
        "no profile measured on gpt2 for this machine (measured here: resnet50); using the "
        "rules-only profile (run 'autotune -m gpt2' to measure)"
    )
    assert profile.measured is False
    assert profile.provenance.fingerprint == fingerprint(snapshot())


def test_a_stale_profile_of_the_workload_is_reported_with_the_command_that_measures_it(
    tmp_path: Path,
) -> None:
    ProfileStore(tmp_path).save(measured_on("gpt2"))
    changed = RecordedMachine(upgraded_driver(snapshot()))
    with pytest.warns(StaleProfileWarning, match="stored for gpt2.*'autotune -m gpt2'"):
        profile = recommend(workload="gpt2", store=tmp_path, machine=changed)
    assert profile.measured is False


def test_the_mode_asked_for_holds_for_a_workload_too(tmp_path: Path) -> None:
    ProfileStore(tmp_path).save(measured_on("resnet50"))
    with pytest.warns(RulesOnlyWarning, match="measured on resnet50 .* for speed mode"):
        profile = on_the_h100(tmp_path, "reproducible", workload="resnet50")
    assert profile.mode is Mode.REPRODUCIBLE


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("resnet50", "resnet50"),
        ("gpt2", "gpt2"),
        ("my-model_v2.1", "my-model_v2.1"),
        ("mypkg.models:make_workload", "mypkg.models_make_workload-"),
        ("Conv", "conv-"),  # would meet 'conv' on a case-insensitive disk
        ("con", "con-"),  # a device name on Windows
        ("nul.big", "nul.big-"),
        ("../../etc", "etc-"),
        ("", "workload-"),
    ],
)
def test_a_workload_key_is_a_file_name_on_every_os(name: str, key: str) -> None:
    made = workload_key(name)
    assert made.startswith(key)
    assert made == key or len(made) == len(key) + 10
    assert set(made) <= set("abcdefghijklmnopqrstuvwxyz0123456789._-")
    assert not made.startswith(".")


def test_a_factory_workload_round_trips_through_the_store(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path)
    mine, other = measured_on("mypkg.models:make_workload"), measured_on("mypkg.models:Make")
    store.save(mine)
    store.save(other)
    assert store.load(fingerprint(snapshot()), "mypkg.models:make_workload") == mine
    assert store.load(fingerprint(snapshot()), "mypkg.models:Make") == other


def test_machine_id_hides_the_host_name() -> None:
    import platform

    assert platform.node() not in machine_id()
    assert len(machine_id()) == 12


@pytest.mark.child_process
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


# --- a GPU the installed torch cannot run (issue 11) -----------------------------------------

ALL_SNAPSHOTS = sorted(p.stem for p in SNAPSHOT_DIR.glob("*.json"))


def gpu_left_idle(machine: HardwareSnapshot) -> bool:
    """Whether the machine has a CUDA or ROCm GPU and its rules-only profile trains on the CPU."""
    gpus = [a for a in machine.accelerators if a.backend.value in ("cuda", "rocm")]
    return bool(gpus) and build_profile(machine, now=NOW).device == "cpu"


@pytest.mark.parametrize("name", ALL_SNAPSHOTS)
def test_recommend_warns_exactly_when_a_gpu_is_left_idle(tmp_path: Path, name: str) -> None:
    machine = snapshot(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profile = recommend(store=tmp_path, machine=RecordedMachine(machine))
    warned = [w for w in caught if issubclass(w.category, UnusableGpuWarning)]
    assert bool(warned) is gpu_left_idle(machine)
    assert all(profile.device == "cpu" for _ in warned)


def test_the_rtx_5090_with_an_old_wheel_warns_with_the_wheel_that_runs_it(tmp_path: Path) -> None:
    """sm_120 with torch 2.5.1+cu124 fell back to the CPU silently."""
    old_wheel = RecordedMachine(snapshot("rtx-5090-old-wheel"))
    with pytest.warns(UnusableGpuWarning, match=r"RTX 5090 is sm_120.*CUDA 12\.8") as caught:
        profile = recommend(store=tmp_path, machine=old_wheel)
    assert profile.device == "cpu"
    assert caught[0].filename == __file__  # points at the caller's line, not ours
    ProfileStore(tmp_path).save(profile)
    with pytest.warns(UnusableGpuWarning):  # the stored profile idles the GPU just the same
        assert recommend(store=tmp_path, machine=old_wheel) == profile


def test_the_rtx_5090_with_a_wheel_that_runs_it_does_not_warn(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        profile = recommend(store=tmp_path, machine=RecordedMachine(snapshot("rtx-5090")))
    assert profile.device == "cuda"


# --- a rules-only profile never silently replaces a measured one ------------------------------


def test_saving_rules_only_over_a_measured_profile_is_refused(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path)
    path = store.save(measured_on("resnet50"))
    machine_file = store.path_for(fingerprint(snapshot()))
    before = machine_file.read_bytes()
    with pytest.raises(MeasuredProfileExistsError, match=r"measured on resnet50.*--force"):
        store.save(build_profile(snapshot(), now=NOW))
    assert machine_file.read_bytes() == before
    assert path.exists()


def test_force_replaces_the_machines_profile_and_keeps_the_workloads(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path)
    resnet = measured_on("resnet50")
    store.save(resnet)
    rules_only = build_profile(snapshot(), now=NOW)
    store.save(rules_only, force=True)
    assert store.load(fingerprint(snapshot())) == rules_only
    assert store.load(fingerprint(snapshot()), "resnet50") == resnet


def test_rules_only_replaces_rules_only_and_measured_replaces_anything(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path)
    store.save(build_profile(snapshot(), now=NOW))
    store.save(build_profile(snapshot(), preferences=Preferences(model_kind="conv"), now=NOW))
    store.save(measured_on("gpt2"))
    store.save(measured_on("resnet50"))
    assert measured_on_name(store.load(fingerprint(snapshot()))) == "resnet50"


def measured_on_name(profile: Profile | None) -> str | None:
    assert profile is not None
    return None if profile.evidence is None else profile.evidence.workload


# --- what recommend() says where it cannot return what was asked for ------------------------------


def from_objects(name: str) -> Profile:
    """A profile tune() measured on objects in hand, stored under the model's class."""
    profile = measured_on(name)
    assert profile.evidence is not None
    details = WorkloadDetails(source="objects", batch="{'features': float32[32]}")
    evidence = profile.evidence.model_copy(update={"details": details})
    return profile.model_copy(update={"evidence": evidence})


@pytest.mark.parametrize("workload", ["BNNet", None])
def test_a_stale_profile_measured_on_objects_says_to_call_tune_again(
    tmp_path: Path, workload: str | None
) -> None:
    """It said "run 'autotune -m BNNet' to measure again", which exits 5: no name builds the
    objects given to tune()."""
    ProfileStore(tmp_path).save(from_objects("BNNet"))
    changed = RecordedMachine(upgraded_driver(snapshot()))
    with pytest.warns(StaleProfileWarning) as said:
        recommend(workload=workload, store=tmp_path, machine=changed)
    (message,) = [str(w.message) for w in said]
    assert "call torch_autotune.tune() with the objects of 'BNNet' (name='BNNet')" in message
    assert "autotune -m" not in message


def test_a_corrupt_profile_measured_on_objects_says_to_call_tune_again(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path)
    store.save(from_objects("BNNet"))
    store.path_for(fingerprint(snapshot()), "BNNet").write_text("{")
    with pytest.warns(StoredProfileWarning) as said:
        on_the_h100(tmp_path, workload="BNNet")
    (message,) = [str(w.message) for w in said]
    assert "delete it, or call torch_autotune.tune() with the objects of 'BNNet'" in message
    assert "autotune -m" not in message


@pytest.mark.parametrize("asked", ["bnnet", "BNNett"])
def test_a_mistyped_workload_is_said_with_the_one_meant(tmp_path: Path, asked: str) -> None:
    """recommend(workload='bnnet'), where 'BNNet' was measured, gave the rules-only profile
    without a word."""
    ProfileStore(tmp_path).save(from_objects("BNNet"))
    with pytest.warns(RulesOnlyWarning, match=f"no profile measured on {asked} for this") as said:
        profile = on_the_h100(tmp_path, workload=asked)
    assert profile.measured is False
    assert len(said) == 1
    assert "perhaps you meant 'BNNet'?" in str(said[0].message)


def test_a_mode_never_measured_is_said_and_plain_recommend_of_nothing_is_not(
    tmp_path: Path,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the first run, nothing measured yet: documented
        assert on_the_h100(tmp_path).measured is False
    ProfileStore(tmp_path).save(measured_on("resnet50"))
    with pytest.warns(RulesOnlyWarning) as said:
        profile = on_the_h100(tmp_path, "balanced")
    assert profile.measured is False
    assert str(said[0].message) == (
        "the profile stored for this machine is for speed mode, not balanced; using the "
        "rules-only balanced profile (run 'autotune --mode balanced' to measure)"
    )


def test_a_mode_that_does_not_exist_lists_the_modes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^'fast' is not a mode: choose one of 'speed', 'bal"):
        on_the_h100(tmp_path, "fast")


# --- one profile per workload and mode -----------------------------------------------------------


def test_measuring_in_another_mode_keeps_the_first_modes_profile(tmp_path: Path) -> None:
    """A speed run replaced the reproducible profile of the same workload: afterwards
    recommend('reproducible', workload=...) returned the rules-only profile."""
    careful = measured(H100, batch=128, workload="conv", mode=Mode.REPRODUCIBLE)
    fast = measured(H100, batch=512, workload="conv")
    store = ProfileStore(tmp_path)
    store.save(careful)
    store.save(fast)
    assert on_the_h100(tmp_path, "reproducible", workload="conv") == careful
    assert on_the_h100(tmp_path, "reproducible") == careful
    assert on_the_h100(tmp_path, workload="conv") == fast  # the one saved last
    assert on_the_h100(tmp_path) == fast
    assert on_the_h100(tmp_path, "speed", workload="conv") == fast


def test_a_store_with_one_profile_a_workload_keeps_it_when_another_mode_is_saved(
    tmp_path: Path,
) -> None:
    """A store from an earlier version holds no mode folders: its reproducible profile is
    kept in its mode's file before the speed one replaces the workload's file."""
    careful = measured(H100, batch=128, workload="conv", mode=Mode.REPRODUCIBLE)
    store = ProfileStore(tmp_path)
    own = store.path_for(fingerprint(snapshot()), "conv")
    own.parent.mkdir(parents=True)
    own.write_text(dump_profile(careful, "json"))
    store.save(measured(H100, batch=512, workload="conv"))
    assert on_the_h100(tmp_path, "reproducible", workload="conv") == careful
