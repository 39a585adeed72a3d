"""Profiles from the engine: valid for every machine, strict on load, and stable on disk."""

from __future__ import annotations

import copy
import importlib.util
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Mode, Preferences, Profile, settings_paths
from torch_autotune.profile_io import dump_profile, parse_profile
from torch_autotune.rules.engine import RULES, build_profile

SNAPSHOT_DIR = Path(__file__).parent / "fixtures" / "snapshots"
FIXTURES = sorted(p.stem for p in SNAPSHOT_DIR.glob("*.json"))
NOW = datetime(2026, 11, 1, tzinfo=timezone.utc)
PROFILES_DIR = Path(__file__).parent.parent / "profiles"


def snapshot(name: str) -> HardwareSnapshot:
    return HardwareSnapshot.model_validate_json((SNAPSHOT_DIR / f"{name}.json").read_text())


def profile_for(name: str, **preferences: Any) -> Profile:
    return build_profile(
        snapshot(name), preferences=Preferences(**preferences), now=NOW, host_id="test"
    )


@pytest.mark.parametrize("mode", list(Mode), ids=[m.value for m in Mode])
@pytest.mark.parametrize("name", FIXTURES)
def test_every_machine_gets_a_valid_explained_profile(name: str, mode: Mode) -> None:
    profile = profile_for(name, mode=mode)
    decided = {d.setting for d in profile.decisions}
    required = {p for p in settings_paths() if not p.startswith("environment")}
    assert required <= decided
    assert all(d.reason.strip() and d.rule for d in profile.decisions)
    for fmt in ("yaml", "json"):
        text = dump_profile(profile, fmt)  # type: ignore[arg-type]
        assert parse_profile(text, fmt=fmt) == profile  # type: ignore[arg-type]
        assert dump_profile(parse_profile(text), fmt) == text  # type: ignore[arg-type]


def test_rules_run_in_the_catalog_order() -> None:
    names = [rule.__name__ for rule in RULES]
    assert names[0] == "choose_device"  # the wheel gate comes before any GPU setting
    assert names.index("precision") < names.index("tf32") < names.index("compile_settings")
    assert names.index("precision") < names.index("memory_format")
    assert names.index("dataloader") < names.index("cpu_threads")


def test_two_different_gpus_get_what_the_weaker_runs_and_say_so() -> None:
    mixed = profile_for("rtx-4090-plus-rtx-3060")
    weaker = profile_for("rtx-3090")  # same architecture class as the 3060 (cc 8.6)
    assert mixed.settings.precision == weaker.settings.precision
    assert any("weakest" in note for note in mixed.notes)
    device = mixed.decision("device")
    assert device is not None
    assert "weakest" in device.reason


def test_gpu_the_wheel_cannot_run_gets_no_gpu_profile_and_the_fix() -> None:
    profile = profile_for("rtx-5090-old-wheel")
    assert profile.settings.device == "cpu"
    device = profile.decision("device")
    assert device is not None
    assert device.rule == "E1"
    assert "sm_120" in device.reason
    assert "cu128" in device.reason


def test_rules_only_profile_says_it_was_not_measured() -> None:
    profile = profile_for("h100-80gb-hbm3")
    assert profile.measured is False
    assert profile.settings.batch.batch_size is None
    assert any(
        "not measured" in note.lower() or "nothing measured" in note for note in profile.notes
    )


# --- invariants on load --------------------------------------------------------------------------


def _broken(name: str, edit: Any) -> dict[str, Any]:
    data = copy.deepcopy(profile_for(name).model_dump(mode="json"))
    edit(data["settings"], data)
    return data


def _set(path: str, value: Any) -> Any:
    def edit(settings: dict[str, Any], _data: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = settings
        for part in parents:
            node = node[part]
        node[leaf] = value

    return edit


@pytest.mark.parametrize(
    ("machine", "path", "value", "message"),
    [
        pytest.param(
            "rtx-3060-windows",
            "dataloader.persistent_workers",
            True,
            "persistent_workers: needs num_workers > 0",
            id="persistent-without-workers",
        ),
        pytest.param(
            "rtx-3060-windows",
            "dataloader.prefetch_factor",
            4,
            "prefetch_factor: needs num_workers > 0",
            id="prefetch-without-workers",
        ),
        pytest.param(
            "h100-80gb-hbm3",
            "precision.grad_scaler",
            True,
            "bf16 needs no loss scaling",
            id="gradscaler-with-bf16",
        ),
        pytest.param(
            "tesla-v100-sxm2-16gb",
            "matmul.tf32",
            True,
            "TF32 exists only on NVIDIA Ampere",
            id="tf32-on-volta",
        ),
        pytest.param(
            "tesla-v100-sxm2-16gb",
            "precision.dtype",
            "bfloat16",
            "bfloat16 needs compute capability 8.0",
            id="bf16-on-volta",
        ),
        pytest.param(
            "h100-80gb-hbm3",
            "matmul.api",
            "fp32_precision",  # the fixture's torch is 2.8: the legacy API is the one
            "mixing the two raises",
            id="wrong-tf32-api-for-the-torch",
        ),
    ],
)
def test_broken_invariant_is_refused_with_the_fix(
    machine: str, path: str, value: Any, message: str
) -> None:
    data = _broken(machine, _set(path, value))
    with pytest.raises(ValidationError, match=re.escape(message)):
        Profile.model_validate(data)


@pytest.mark.parametrize(
    ("machine", "path", "value"),
    [
        pytest.param("cpu-laptop-linux", "dataloader.pin_memory", True, id="pin-memory-on-cpu"),
        pytest.param("l4", "compile.mode", "max-autotune", id="max-autotune-on-58-sms"),
        pytest.param("h100-80gb-hbm3", "memory_format", "channels_last", id="channels-last"),
    ],
)
def test_advice_is_the_rules_and_a_hand_edited_profile_that_ignores_it_loads(
    machine: str, path: str, value: Any
) -> None:
    """What runs but is slower is no invariant: the rules decide it with a reason (H1 keeps
    channels_last to AMP; the DataLoader's rule pins only for CUDA; compile's keeps max-autotune
    to GPUs with 68 SMs or more), and a user who edits the file to ask for it gets it."""

    def edit(settings: dict[str, Any], data: dict[str, Any]) -> None:
        _set(path, value)(settings, data)
        if path == "memory_format":  # channels_last without AMP: slower, never impossible
            settings["precision"] = {"autocast": False, "dtype": "float32", "grad_scaler": False}

    profile = Profile.model_validate(_broken(machine, edit))
    node: Any = profile.settings
    for part in path.split("."):
        node = getattr(node, part)
    assert node == value


def test_compile_on_torch_before_2_is_refused() -> None:
    def old_torch(settings: dict[str, Any], data: dict[str, Any]) -> None:
        settings["compile"] = {"enabled": True, "mode": "default"}
        data["provenance"]["torch_version"] = "1.13.1+cu117"
        settings["matmul"]["api"] = "allow_tf32"

    with pytest.raises(ValidationError, match=r"torch\.compile needs torch 2\.0"):
        Profile.model_validate(_broken("h100-80gb-hbm3", old_torch))


def test_environment_outside_the_allow_list_is_refused() -> None:
    data = _broken("h100-80gb-hbm3", _set("environment.LD_PRELOAD", "/tmp/evil.so"))
    with pytest.raises(ValidationError, match="LD_PRELOAD"):
        Profile.model_validate(data)


# --- any snapshot the model accepts --------------------------------------------------------------

_TORCH = ["1.13.1+cu117", "2.0.1+cu118", "2.4.1+cu124", "2.7.1+cu128", "2.8.0+cu128",
          "2.9.1+cu130", "2.13.0+cpu", "2.8.0+rocm6.4", "2.8.0"]  # fmt: skip
_PYTHON = ["3.10.14", "3.11.9", "3.12.7", "3.13.1", "3.14.0"]


@st.composite
def snapshots(draw: st.DrawFn) -> HardwareSnapshot:
    """A fixture with its accelerators, torch, Python, OS and CPUs mixed from other fixtures."""
    base = snapshot(draw(st.sampled_from(FIXTURES)))
    donors = [snapshot(n) for n in draw(st.lists(st.sampled_from(FIXTURES), max_size=2))]
    accelerators = list(base.accelerators)
    for donor in donors:
        accelerators += donor.accelerators
    accelerators = [a.model_copy(update={"index": i}) for i, a in enumerate(accelerators)]
    torch = draw(st.sampled_from(_TORCH))
    cuda = torch.split("+cu")[1] if "+cu" in torch else None
    software = base.software.model_copy(
        update={
            "torch_version": torch,
            "torch_cuda_version": None if cuda is None else f"{cuda[:-1]}.{cuda[-1]}",
            "torch_hip_version": "6.4" if "rocm" in torch else None,
            "python_version": draw(st.sampled_from(_PYTHON)),
            "python_gil_enabled": draw(st.booleans()),
            "triton_available": draw(st.booleans()),
            "multiprocessing_start_method": draw(st.sampled_from(["fork", "spawn", "forkserver"])),
            "torch_cuda_arch_list": draw(
                st.sampled_from(
                    [
                        None,
                        (),
                        ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"),
                        ("sm_75", "sm_80", "sm_90", "sm_120"),
                    ]
                )
            ),
        }
    )
    usable = draw(st.integers(1, 256))
    affinity = max(base.host.cpu_affinity_count or usable, usable)  # as detection relates them
    host = base.host.model_copy(
        update={
            "os_name": draw(st.sampled_from(["linux", "windows", "darwin"])),
            "cpus_usable": usable,
            "cpu_affinity_count": affinity,
            "cpu_cores_logical": max(base.host.cpu_cores_logical or affinity, affinity),
        }
    )
    return base.model_copy(
        update={"accelerators": tuple(accelerators), "software": software, "host": host}
    )


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snapshots(),
    st.builds(
        Preferences,
        mode=st.sampled_from(list(Mode)),
        model_kind=st.sampled_from(["conv", "transformer", "mlp", "other"]),
        fixed_shapes=st.booleans(),
        optimizer=st.sampled_from(["adam", "adamw", "sgd", "other"]),
        allow_p100_fp16=st.booleans(),
    ),
)
def test_any_snapshot_gives_a_profile_that_holds_its_invariants(
    machine: HardwareSnapshot, preferences: Preferences
) -> None:
    snapshot_ok = HardwareSnapshot.model_validate(machine.model_dump())  # the model accepts it
    profile = build_profile(snapshot_ok, preferences=preferences, now=NOW, host_id="test")
    assert Profile.model_validate(profile.model_dump()) == profile  # invariants re-checked
    assert profile.settings.dataloader.num_workers <= snapshot_ok.host.cpus_usable


# --- the shipped reference profiles --------------------------------------------------------------


def _regenerate_module() -> Any:
    spec = importlib.util.spec_from_file_location("regenerate", PROFILES_DIR / "regenerate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_profiles_cover_at_least_12_machines() -> None:
    assert len(list(PROFILES_DIR.glob("*.yaml"))) >= 12


@pytest.mark.parametrize("path", sorted(PROFILES_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_reference_profile_loads_and_round_trips_byte_for_byte(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert dump_profile(parse_profile(text, source=path.name)) == text


def test_reference_profiles_match_the_engine() -> None:
    regenerate = _regenerate_module()
    drifted = [
        machine
        for machine in regenerate.MACHINES
        if (PROFILES_DIR / f"{machine}.yaml").read_text(encoding="utf-8")
        != regenerate.expected(machine)
    ]
    assert drifted == [], "run: python profiles/regenerate.py"


@pytest.mark.parametrize("path", sorted(settings_paths() - {"device", "environment"}))
def test_a_profile_written_before_a_setting_existed_reads_torchs_default_for_it(path: str) -> None:
    """Every setting has torch's own behaviour as its default, so a profile that lacks one (a
    profile of an earlier release, before the setting was added) still loads, with torch's
    default there."""
    import json

    from torch_autotune.settings import setting_value, torch_defaults

    profile = build_profile(snapshot("cpu-laptop-linux"))
    data = json.loads(dump_profile(profile, "json"))
    *parents, leaf = path.split(".")
    node = data["settings"]
    for part in parents:
        node = node[part]
    node.pop(leaf, None)
    older = parse_profile(json.dumps(data))
    assert setting_value(older.settings, path) == setting_value(torch_defaults("cpu"), path)
