"""A profile file whose settings a person changed by hand: the edited setting's decision is the
user's and keeps what the profile had said; nothing else changes (``hand_edits``)."""

from __future__ import annotations

import pytest
from rich.console import Console

from tests.probe.fake_trials import cpu_machine, recorded, tune_on
from tests.probe.test_workers_phase import TWO_CPUS
from tests.test_bench import measured
from torch_autotune.plot.text import render_charts
from torch_autotune.probe import workers_phase
from torch_autotune.profile import Profile, Source
from torch_autotune.profile_io import dump_profile, parse_profile
from torch_autotune.rules.engine import build_profile

LAPTOP = recorded("cpu-laptop-linux")


def test_an_untouched_file_loads_as_it_was_written() -> None:
    profile = build_profile(LAPTOP)
    again = parse_profile(dump_profile(profile))
    assert again.decisions == profile.decisions
    assert again.notes == profile.notes


def test_a_setting_changed_by_hand_is_the_users_with_what_the_profile_had_said() -> None:
    profile = build_profile(LAPTOP)
    before = profile.decision("dataloader.pin_memory")
    assert before is not None
    assert before.value is False
    text = dump_profile(profile).replace("pin_memory: false", "pin_memory: true", 1)
    edited = parse_profile(text, "p.yaml")
    assert edited.settings.dataloader.pin_memory is True
    after = edited.decision("dataloader.pin_memory")
    assert after is not None
    assert (after.value, after.source, after.rule) == (True, Source.USER, before.rule)
    assert after.reason.startswith("on: set by hand in the profile file; the profile had off (")
    assert before.reason in after.reason
    assert edited.notes[-1].endswith("dataloader.pin_memory (off -> on)")
    others = [d for d in edited.decisions if d.setting != "dataloader.pin_memory"]
    assert others == [d for d in profile.decisions if d.setting != "dataloader.pin_memory"]


def test_a_measured_worker_count_edited_is_not_marked_chosen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trial: num_workers 0, measured, made 2; export kept the 0's numbers as the 2's
    reason, and the report marked 2 workers 'chosen'."""
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    machine = cpu_machine(first_s=0.3, autotune_s=0.0, load_s=0.004, shares_cpus=True, host_cpus=2)
    profile = tune_on(machine, "conv", TWO_CPUS, budget_s=120)
    measured = profile.decision("dataloader.num_workers")
    assert measured is not None
    assert measured.source is Source.MEASURED
    count = profile.settings.dataloader.num_workers
    assert profile.evidence is not None
    assert profile.evidence.loader
    other = next(r.num_workers for r in profile.evidence.loader if r.num_workers != count)
    text = dump_profile(profile).replace(f"num_workers: {count}\n", f"num_workers: {other}\n", 1)
    edited = parse_profile(text, "p.yaml")
    decision = edited.decision("dataloader.num_workers")
    assert decision is not None
    assert decision.source is Source.USER
    assert f"the profile had {count} (measured: " in decision.reason
    console = Console(record=True, width=120)
    render_charts(edited, console)
    chart = console.export_text()
    assert "◀ set by hand" in chart
    assert "◀ chosen" not in chart


def _workers_made(machine: str, count: int) -> Profile:
    """A profile measured with no workers, its num_workers made ``count`` by hand."""
    text = dump_profile(measured(machine, workers=0))
    assert "num_workers: 0\n" in text
    return parse_profile(text.replace("num_workers: 0\n", f"num_workers: {count}\n", 1), "p.yaml")


def test_what_follows_from_an_edited_worker_count_is_reasoned_for_it() -> None:
    """num_workers 0 made 2: persistent_workers still said "no workers to keep", and
    prefetch_factor "without workers nothing is prefetched"."""
    edited = _workers_made("cpu-laptop-linux", 2)  # workers start with fork there
    persistent = edited.decision("dataloader.persistent_workers")
    prefetch = edited.decision("dataloader.prefetch_factor")
    assert persistent is not None
    assert prefetch is not None
    assert edited.settings.dataloader.persistent_workers is False  # the file's values stay
    assert "no workers" not in persistent.reason
    assert persistent.reason.startswith("workers start with 'fork'")
    assert "2 batches ahead per worker, 4 in all" in prefetch.reason
    assert "nothing is prefetched" not in prefetch.reason
    assert "persistent_workers" in edited.notes[-1]


def test_a_setting_whose_rule_now_differs_from_the_file_says_both() -> None:
    """With workers started by spawn, the rules keep them between epochs: the file's off is
    the profile's for 0 workers, and the reason says so and what the rules give for 2."""
    edited = _workers_made("rtx-3060-windows", 2)
    persistent = edited.decision("dataloader.persistent_workers")
    assert persistent is not None
    assert persistent.value is False
    assert persistent.reason.startswith(
        "off: as the profile had it with dataloader.num_workers 0 (no workers to keep"
    )
    assert "with 2, set by hand, the rules give on (F4: workers start with 'spawn'" in (
        persistent.reason
    )


def test_a_decision_value_no_setting_could_hold_leaves_the_derived_reasons_alone() -> None:
    """A file whose num_workers decision says -1 (its setting 2): the rules cannot take -1 as
    a worker count, so the reasons that follow from it stay as written, with no traceback."""
    text = dump_profile(measured("cpu-laptop-linux", workers=0))
    text = text.replace("num_workers: 0\n", "num_workers: 2\n", 1)
    at = text.index("setting: dataloader.num_workers")
    value = text.index("value: 0", at)
    edited = parse_profile(text[:value] + "value: -1" + text[value + len("value: 0") :], "p.yaml")
    assert edited.settings.dataloader.num_workers == 2
    persistent = edited.decision("dataloader.persistent_workers")
    assert persistent is not None
    assert "no workers to keep" in persistent.reason
