"""One record per setting: every leaf of ``Settings`` has exactly one, and what reads the
records (the bench's knobs, couplings, the notes of what it leaves alone) follows them."""

from __future__ import annotations

import io
import re
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from tests.batchnorm import with_batch_one_raising
from torch_autotune.bench_record import TrainConfig
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.integrations import EXPORTS, render_accelerate, tool_notes
from torch_autotune.knobs import (
    KNOB_BY_NAME,
    KNOBS,
    _generic,
    couples,
    knob_value,
    not_ablated,
    settings_config,
    settings_with,
    show_value,
    train_settings,
    with_knob,
)
from torch_autotune.profile import Mode, Preferences, Profile
from torch_autotune.records import DERIVED, TOOLS, SettingRecord, Tool, on_off
from torch_autotune.render.results import render_run
from torch_autotune.rules.engine import build_profile
from torch_autotune.settings import (
    RECORD_BY_NAME,
    RECORDS,
    DataLoaderSettings,
    Settings,
    setting_value,
    settings_paths,
    torch_defaults,
)

H100 = Path(__file__).parent / "fixtures" / "snapshots" / "h100-80gb-hbm3.json"


def test_every_leaf_of_settings_belongs_to_exactly_one_record() -> None:
    owners = Counter(path for record in RECORDS for path in record.paths)
    assert set(owners) == settings_paths()
    assert [path for path, count in owners.items() if count > 1] == []


def test_record_names_are_unique_and_what_they_name_exists() -> None:
    assert len(RECORD_BY_NAME) == len(RECORDS)
    for record in RECORDS:
        assert set(record.couples) <= set(RECORD_BY_NAME), record.name
        assert record.bench is None or record.bench in KNOB_BY_NAME, record.name
        # a setting the bench leaves alone says why, one it switches needs no such line
        assert record.bench is None or record.not_ablated is None, record.name
        # the bench's arms share one process: what is read when it starts cannot be switched
        assert not (record.fresh_process and record.bench), record.name


def test_every_setting_the_bench_switches_is_a_knob_in_the_records_order() -> None:
    switched = [record.bench for record in RECORDS if record.bench is not None]
    assert [knob.name for knob in KNOBS] == switched


def test_a_record_shows_torchs_default_and_a_changed_value() -> None:
    defaults = torch_defaults("cuda")
    for record in RECORDS:
        assert isinstance(record.show(defaults), str), record.name
        if record.changed is not None:
            assert not record.changed(defaults), f"{record.name} reads torch's default as changed"


def test_the_bench_says_why_it_leaves_alone_only_the_settings_a_profile_changes() -> None:
    assert not_ablated(torch_defaults()) == ()
    changed = torch_defaults().model_copy(
        update={
            "seed": 7,
            "dataloader": DataLoaderSettings(num_workers=2, persistent_workers=True),
        }
    )
    reasons = not_ablated(changed)
    assert len(reasons) == 2
    assert reasons[0].startswith("persistent_workers")
    assert reasons[1].startswith("the seed")


def test_dropping_precision_brings_back_the_memory_format_it_couples_with() -> None:
    (pair,) = couples(KNOB_BY_NAME["precision"])
    knob, why = pair
    assert knob.name == "channels_last"
    assert "H1" in why
    assert couples(KNOB_BY_NAME["batch_size"]) == ()


# A setting the bench switches by its path alone: what a new measured setting gets by
# declaring ``bench`` in its record, with no code in the knobs.
PERSISTENT = SettingRecord(
    "persistent_workers",
    ("dataloader.persistent_workers",),
    "persistent workers",
    lambda s: on_off(s.dataloader.persistent_workers),
    applied_by="dataloader_kwargs",
    bench="persistent_workers",
    changed=lambda s: s.dataloader.persistent_workers,
)


def test_a_setting_switched_by_its_path_round_trips_between_settings_and_an_arm() -> None:
    knob = _generic(PERSISTENT)
    on = TrainConfig(num_workers=2, settings={"dataloader.persistent_workers": True})
    off = TrainConfig(num_workers=2)
    base = torch_defaults()

    assert knob.put(base, on).dataloader.persistent_workers is True
    assert knob.put(base, off).dataloader.persistent_workers is False  # absent: torch's
    assert knob_value(on, knob) is True
    assert knob_value(off, knob) is None
    assert show_value(on, knob) == "on"
    assert show_value(off, knob) == "default"
    assert with_knob(on, knob, off).settings == {}
    assert with_knob(off, knob, on).settings == {"dataloader.persistent_workers": True}
    assert knob.paths(on) == ("dataloader.persistent_workers",)
    assert "persistent workers on" in on.describe()


def test_an_arm_names_only_settings_a_profile_holds() -> None:
    with pytest.raises(ValueError, match="names no setting"):
        TrainConfig(settings={"dataloader.turbo": True})


def test_arms_that_differ_only_in_a_setting_by_path_are_told_apart() -> None:
    on = TrainConfig(settings={"seed": 3})
    assert {on, TrainConfig(), TrainConfig(settings={"seed": 3})} == {on, TrainConfig()}


def test_a_profiles_settings_read_back_through_the_knobs_unchanged() -> None:
    settings = Settings(
        device="cuda",
        precision={"autocast": True, "dtype": "bfloat16", "grad_scaler": False},
        memory_format="channels_last",
        dataloader={"num_workers": 4, "prefetch_factor": 2, "pin_memory": True},
        batch={"batch_size": 256},
    )
    assert train_settings(settings_config(settings), settings) == settings


# --- the exporters read the records -------------------------------------------------------------


def _every_setting_changed() -> Profile:
    """A profile whose settings all differ from torch's default (built unvalidated: no rule
    would pair determinism with the cuDNN autotuner, but each exporter line stands alone)."""
    snapshot = HardwareSnapshot.model_validate_json(H100.read_text())
    profile = build_profile(snapshot, preferences=Preferences(mode=Mode.SPEED))
    s = profile.settings
    settings = s.model_copy(
        update={
            "memory_format": "channels_last",
            "cpu_threads": 4,
            "seed": 11,
            "environment": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
            "matmul": s.matmul.model_copy(update={"api": "fp32_precision", "tf32": False}),
            "backends": s.backends.model_copy(
                update={"cudnn_benchmark": True, "deterministic_algorithms": True}
            ),
            "optimizer": s.optimizer.model_copy(update={"fused": True}),
            "dataloader": s.dataloader.model_copy(
                update={
                    "num_workers": 4,
                    "pin_memory": True,
                    "persistent_workers": True,
                    "seed_workers": True,
                }
            ),
            "batch": s.batch.model_copy(update={"batch_size": 256, "grad_accum_steps": 4}),
            "compile": s.compile.model_copy(update={"memory_budget": 0.5}),
            "blocks": "mypackage.model.DecoderLayer",
        }
    )
    for record in RECORDS:  # a switch added since: flipped, so no test lists them by hand
        if record.changed is not None and not record.changed(settings):
            for path in record.paths:
                value = setting_value(settings, path)
                if isinstance(value, bool):
                    settings = settings_with(settings, path, not value)
    assert all(r.changed(settings) for r in RECORDS if r.changed is not None)
    changed = with_batch_one_raising(profile.model_copy(update={"settings": settings}), 256)
    evidence = changed.evidence
    assert evidence is not None
    assert evidence.details is not None
    own = evidence.details.model_copy(update={"batch_sampler": "BucketSampler"})  # its loader's
    changed = changed.model_copy(update={"evidence": evidence.model_copy(update={"details": own})})
    assert all(derived.note(changed) is not None for derived in DERIVED)  # drop_last: on
    return changed


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_writes_or_says_every_setting_a_profile_changes(tool: Tool) -> None:
    """Every setting of ``Settings`` (its record) and every one a helper applies beyond them
    (``DERIVED``: drop_last, which the accelerate export once left out)."""
    profile = _every_setting_changed()
    table = EXPORTS[tool]
    generated = {record.name: record.note(profile.settings) for record in RECORDS}
    generated.update({derived.name: derived.note(profile) for derived in DERIVED})
    assert set(table) <= set(generated)
    notes = tool_notes(profile, tool)
    for name, own in generated.items():
        entry = table.get(name)
        if entry is None:
            assert own is not None, (tool, name)
            assert own in notes, (tool, name)
            continue
        said = (
            entry.itself is not None
            or (entry.args is not None and entry.args(profile))
            or (entry.note is not None and entry.note(profile) in notes)
        )
        if entry.covered_by is not None:
            carrier = table[entry.covered_by]
            said = bool(carrier.note and carrier.note(profile)) or bool(
                carrier.args and carrier.args(profile)
            )
        assert said, f"{tool} neither writes nor says {name}"


def test_accelerate_says_what_its_config_cannot_hold() -> None:
    """The accelerate header once forgot channels_last, the threads and the seed."""
    text = render_accelerate(_every_setting_changed())
    for said in (
        "memory format: channels_last",
        "CPU threads: 4",
        "seed: 11",
        "batch_size=256",
        "gradient_accumulation_steps=4",
        "pin_memory: on",
    ):
        assert said in text, said


def test_a_setting_a_tool_has_no_entry_for_gets_its_records_line() -> None:
    settings = torch_defaults().model_copy(update={"cpu_threads": 3})
    assert RECORD_BY_NAME["cpu_threads"].note(settings) == "CPU threads: 3 (call profile.apply())"
    assert RECORD_BY_NAME["cpu_threads"].note(torch_defaults()) is None


def test_the_summary_has_a_row_for_every_record_that_asks_for_one() -> None:
    profile = _every_setting_changed()
    out = io.StringIO()
    render_run(profile, Console(file=out, width=400, color_system=None), saved=None)
    text = out.getvalue()
    for record in (r for r in RECORDS if r.summary):
        rows = re.findall(rf"^{re.escape(record.label)} +(.*)$", text, re.MULTILINE)
        assert [row.strip() for row in rows] == [record.show(profile.settings)], record.name
