"""The allocator's ``expandable_segments`` (rule J1), measured in a fresh process against this
one's where memory stopped the search (``probe.allocator_phase``, ``probe.fresh``): on the
simulated H100, where the fresh process's limit and speed are the machine's ``allocator``; and
the fresh process itself, for real, on this CPU."""

from __future__ import annotations

import dataclasses

import pytest

from tests.probe.fake_trials import recorded, tune_on
from tests.probe.test_checkpointing import _growing, _simulated_token_workload
from torch_autotune.evidence import SearchTrialRecord
from torch_autotune.probe.allocator_phase import ALLOC_CONF, _above
from torch_autotune.probe.fresh import FreshOutcome, request_for, run_fresh
from torch_autotune.probe.loop import FedRunner
from torch_autotune.probe.presets import preset
from torch_autotune.probe.simulated import SimulatedMachine, SimulatedTrials
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.workloads import resolve_workload
from torch_autotune.profile import Profile, Source
from torch_autotune.rules.memory import EXPANDABLE_SEGMENTS
from torch_autotune.settings import torch_defaults

H100 = recorded("h100-80gb-hbm3")
SETTING = f"environment.{ALLOC_CONF}"


def _decoder(allocator: tuple[int, float] | None) -> SimulatedMachine:
    """The decoder of the checkpointing tests, whose batch memory stops at 120 on the H100;
    with the allocator's setting it fits ``allocator[0]`` and steps ``allocator[1]`` times as
    long."""
    return dataclasses.replace(_growing(1.0, checkpointed=None), allocator=allocator)


def _tuned(machine: SimulatedMachine, **options: object) -> Profile:
    options = {"mode": "balanced", "budget_s": 180, **options}
    return tune_on(machine, _simulated_token_workload(), H100, **options)


def _gpt2(machine: SimulatedMachine, **options: object) -> Profile:
    """The GPT-2 preset in speed mode (compile measured), as its recorded run."""
    workload = dataclasses.replace(resolve_workload("conv"), dataset=None, name="gpt2")
    return tune_on(machine, workload, H100, mode="speed", **options)


def test_kept_where_it_raises_the_largest_batch() -> None:
    profile = _tuned(_decoder((132, 1.0)))
    record = profile.evidence.allocator if profile.evidence is not None else None
    assert record is not None
    assert record.measured
    assert record.kept
    assert record.fresh_has_it
    assert (record.largest_with, record.largest_without) == (132, 120)
    decision = profile.decision(SETTING)
    assert decision is not None
    assert decision.value == EXPANDABLE_SEGMENTS
    assert decision.source is Source.MEASURED
    assert (
        "measured, with it in a fresh process (it is read when CUDA starts; that process shares"
        " the GPU with this one's context): the largest batch that trained eager was"
    ) in decision.reason
    assert "at least 132 (every size tried trained) with it and 120 without" in decision.reason
    assert profile.evidence is not None
    assert "allocator" in [p.name for p in profile.evidence.phases]


def test_kept_where_it_changes_nothing() -> None:
    profile = _tuned(_decoder(None))
    record = profile.evidence.allocator if profile.evidence is not None else None
    assert record is not None
    assert record.kept
    assert record.samples_per_s_with == pytest.approx(record.samples_per_s_without or 0, 0.01)
    assert profile.settings.environment.get(ALLOC_CONF) == EXPANDABLE_SEGMENTS


@pytest.mark.parametrize(
    ("allocator", "why"),
    [
        ((110, 1.0), "that trained eager was below 120 (120 ran out of memory) with"),
        ((120, 1.25), "was 120 (121 ran out of memory) with it and 120 without"),
    ],
)
def test_dropped_where_it_lowers_the_largest_batch_or_is_slower(
    allocator: tuple[int, float], why: str
) -> None:
    profile = _tuned(_decoder(allocator))
    record = profile.evidence.allocator if profile.evidence is not None else None
    assert record is not None
    assert record.measured
    assert not record.kept
    assert ALLOC_CONF not in profile.settings.environment
    decision = profile.decision(SETTING)
    assert decision is not None
    assert decision.value is None
    assert decision.source is Source.MEASURED
    assert decision.reason.startswith("not set: measured, with it in a fresh process")
    assert why in decision.reason


def test_a_process_that_started_with_it_measures_the_fresh_one_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ALLOC_CONF, EXPANDABLE_SEGMENTS)
    profile = _tuned(_decoder((132, 1.0)))  # the fresh process, without it, fits 120
    record = profile.evidence.allocator if profile.evidence is not None else None
    assert record is not None
    assert not record.fresh_has_it
    assert (record.largest_with, record.largest_without) == (120, 120)
    assert record.kept
    assert "measured, without it in a fresh process" in record.reason


def _unmeasured(profile: Profile, why: str) -> None:
    """J1's setting kept without a measurement, the record and the decision saying why."""
    record = profile.evidence.allocator if profile.evidence is not None else None
    assert record is not None
    assert not record.measured
    assert record.kept
    assert record.reason.startswith(f"not measured: {why}")
    assert profile.settings.environment.get(ALLOC_CONF) == EXPANDABLE_SEGMENTS
    decision = profile.decision(SETTING)
    assert decision is not None
    assert decision.value == EXPANDABLE_SEGMENTS
    assert decision.source is Source.INFERRED
    assert decision.reason.startswith("Linux, NVIDIA, torch")  # J1's own, then why not measured
    assert f"; not measured: {why}" in decision.reason


def test_not_measured_without_the_time_or_where_memory_did_not_stop_the_search() -> None:
    short = _tuned(_decoder((132, 1.0)), budget_s=30)
    _unmeasured(short, "a fresh process was predicted to take about")
    assert short.evidence is not None
    assert "allocator" not in [p.name for p in short.evidence.phases]
    capped = _tuned(_decoder((132, 1.0)), max_batch_size=64)
    assert capped.evidence is not None
    assert capped.evidence.limited_by != "memory"
    _unmeasured(capped, f"the batch is not memory-bound (limited by {capped.evidence.limited_by})")


def test_not_measured_for_objects_in_hand_says_so() -> None:
    in_hand = dataclasses.replace(_simulated_token_workload(), rebuild=None)
    profile = tune_on(_decoder((132, 1.0)), in_hand, H100, mode="balanced", budget_s=180)
    _unmeasured(profile, "objects in hand cannot be rebuilt in a fresh process")


def test_not_measured_where_the_runner_cannot_start_a_fresh_process_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch_autotune.probe.allocator_phase import RANKS

    monkeypatch.setattr(SimulatedTrials, "fresh", lambda *_args, **_kwargs: None)  # a job's rank
    _unmeasured(_tuned(_decoder((132, 1.0))), RANKS)


def test_the_compiled_preset_says_why_it_is_not_measured_and_the_summary_says_it() -> None:
    """GPT-2 on the H100 keeps compile, memory-bound: in the default budget, a fresh process
    that compiles again does not fit what is left."""
    import io
    import re

    from rich.console import Console

    from torch_autotune.render import render_run

    profile = _gpt2(preset("h100-gpt2", allocator=(165, 1.0)))
    assert profile.settings.compile.enabled
    why = "a fresh process was predicted to take about"
    _unmeasured(profile, why)
    record = profile.evidence.allocator if profile.evidence is not None else None
    assert record is not None
    assert "(its start, its compile, a point and 5 trials)" in record.reason
    assert record.reason.endswith("give it more time with --budget")
    out = io.StringIO()
    render_run(profile, Console(file=out, width=400, color_system=None), saved=None)
    row = re.search(r"^allocator\s+(.*)$", out.getvalue(), re.MULTILINE)
    assert row is not None
    assert row.group(1).startswith(
        f"{EXPANDABLE_SEGMENTS} set as the rule recommends: not measured: {why}"
    )


def test_measured_compiled_where_compile_is_kept_at_its_own_search_sizes() -> None:
    """Compiled, GPT-2 fits 140 (141 ran out in compile's own search; eager fits 155); with
    the setting, 149: the fresh process compiles and tries compile's sizes, not eager's."""
    machine = preset("h100-gpt2", compiled_limit=140, allocator=(165, 1.0))
    profile = _gpt2(machine, budget_s=600)
    assert profile.settings.compile.enabled
    assert profile.evidence is not None
    assert profile.evidence.max_batch_size == 155  # the eager search's
    record = profile.evidence.allocator
    assert record is not None
    assert record.measured
    assert record.kept
    assert (record.largest_with, record.largest_without) == (147, 140)
    assert record.batch_size == profile.evidence.batch_size  # the compiled point's
    assert (
        "the largest batch that trained compiled was 147 (154 ran out of memory) with it and 140"
        " without"
    ) in record.reason
    decision = profile.decision(SETTING)
    assert decision is not None
    assert decision.source is Source.MEASURED


def test_not_measured_where_the_profile_compiles_without_compile_measured() -> None:
    """Compile too long for the budget stays on, unmeasured: no point of the profile's own
    settings ran, so an eager fresh process would be compared with eager, not what trains."""
    machine = preset("h100-gpt2", allocator=(165, 1.0))
    profile = _gpt2(machine, budget_s=60)  # too short for compile's predicted 46 s
    assert profile.settings.compile.enabled
    assert profile.evidence is not None
    assert profile.evidence.compile is not None
    assert not profile.evidence.compile.measured
    _unmeasured(profile, "the profile compiles without compile measured here")


def test_measured_checkpointed_at_the_checkpointed_limit() -> None:
    """Not even batch 1 trains without checkpointing, 32 with it; the allocator changes
    nothing, so the fresh process (checkpointed too) fits 32 and it is kept."""
    machine = SimulatedMachine(limit=0, checkpointed_limit=32, allocator=None, leaves=1)
    profile = _tuned(machine)
    assert profile.settings.activation_checkpointing
    record = profile.evidence.allocator if profile.evidence is not None else None
    assert record is not None
    assert record.measured
    assert record.kept
    assert (record.largest_with, record.largest_without) == (32, 32)
    assert "trained checkpointed was 32 (33 ran out of memory) with it and 32 without" in (
        record.reason
    )
    assert profile.settings.environment.get(ALLOC_CONF) == EXPANDABLE_SEGMENTS


def test_a_variant_lets_go_of_the_base_model_it_wraps_before_a_fresh_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A compiled variant's weights are its base's: both models go, or the fresh process
    shares the device with them."""
    from torch_autotune.probe import fresh
    from torch_autotune.probe.variants import Variant

    def ran(*_args: object, **_kwargs: object) -> FreshOutcome:
        assert (base._model, wrapped._model) == (None, None)
        return FreshOutcome({8: True}, 1.0)

    monkeypatch.setattr(fresh, "run_fresh", ran)
    base = FedRunner(resolve_workload("mlp"), StepSettings(torch_defaults("cpu")))
    wrapped = base.variant(Variant("wrapped"))  # on the base's model, as compile is
    assert wrapped.model is not None
    assert base._model is not None
    found = wrapped.fresh({ALLOC_CONF: "x"}, batch=8, above=[], seconds=1, timeout_s=60)
    assert found == FreshOutcome({8: True}, 1.0)
    assert base._model is None


def test_the_sizes_above_are_the_first_that_ran_out_and_a_few_percent_beyond() -> None:
    def trial(size: int, fits: bool, step: str = "bisect") -> SearchTrialRecord:
        seconds = None if "not run" in step else 1.0
        return SearchTrialRecord(
            batch_size=size, fits=fits, peak_memory_bytes=None, seconds=seconds, step=step
        )

    search = [trial(64, True), trial(200, False), trial(130, False), trial(120, True)]
    search.append(trial(125, False, "time-guard (not run)"))  # refused: never ran
    # sizes between 120 and 130 never ran here: only one that ran out here can show a gain
    assert _above(120, search) == [120, 130, 131, 132]
    assert _above(120, [trial(120, True)]) == [120, 121, 126, 132]


def test_objects_in_hand_cannot_go_to_a_fresh_process() -> None:
    workload = dataclasses.replace(resolve_workload("mlp"), rebuild=None)
    runner = FedRunner(workload, StepSettings(torch_defaults("cpu")))
    assert runner.fresh({ALLOC_CONF: "x"}, batch=8, above=[], seconds=1, timeout_s=60) is None
    assert resolve_workload("mlp").rebuild == "mlp"


@pytest.mark.slow  # a Python process that imports torch and trains: seconds
def test_the_fresh_process_trains_under_the_environment_it_was_given() -> None:
    request = request_for(
        StepSettings(torch_defaults("cpu")), "mlp", 1, batch=8, above=[16, 32], seconds=2.0
    )
    found = run_fresh(request, {ALLOC_CONF: EXPANDABLE_SEGMENTS}, timeout_s=300)
    assert found.error is None
    assert found.seen == EXPANDABLE_SEGMENTS
    assert found.fits == {8: True, 16: True, 32: True}
    assert found.largest == 32
    broken = dataclasses.replace(request, rebuild="no_such_package.module:factory")
    failed = run_fresh(broken, {ALLOC_CONF: None}, timeout_s=300)
    assert failed.error is not None
    assert "no_such_package" in failed.error
    assert failed.largest is None


def test_the_largest_is_below_the_first_size_that_did_not_fit() -> None:
    assert FreshOutcome({120: True, 126: True, 130: False, 132: True}).largest == 126
    assert FreshOutcome({120: False}).largest is None


@pytest.mark.parametrize(
    ("stdout", "code", "said"),
    [
        ("torch-autotune-fresh {not json\n", 0, "its answer could not be read"),
        ('torch-autotune-fresh {"fits": 3}\n', 0, "its answer could not be read"),
        ("the user's own print\n", 0, "it exited with 0: no output"),
        (
            "torch-autotune-fresh "
            + '{"fits": [[8, true]], "samples_per_s": "x", "seen": null, "error": null}',
            0,
            "its answer could not be read",
        ),
        ("", -9, "it exited with -9"),
    ],
)
def test_a_fresh_process_that_answers_badly_is_an_error_not_a_crash(
    monkeypatch: pytest.MonkeyPatch, stdout: str, code: int, said: str
) -> None:
    import subprocess

    from torch_autotune.probe import fresh

    def answered(command: list[str], *_args: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, code, stdout=stdout, stderr="")

    monkeypatch.setattr(fresh, "_run", answered)
    request = request_for(StepSettings(torch_defaults("cpu")), "mlp", 1, batch=8)
    found = run_fresh(request, {ALLOC_CONF: None}, timeout_s=10)
    assert found.error is not None
    assert found.error.startswith(said)
    assert found.largest is None


def test_a_fresh_process_past_its_time_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from torch_autotune.probe import fresh

    def slow(command: list[str], _given: str, _env: object, timeout: float) -> object:
        raise subprocess.TimeoutExpired(command, timeout)

    monkeypatch.setattr(fresh, "_run", slow)
    request = request_for(StepSettings(torch_defaults("cpu")), "mlp", 1, batch=8)
    found = run_fresh(request, {ALLOC_CONF: None}, timeout_s=42)
    assert found.error == "it ran past 42 s and was stopped"


def test_kept_where_without_it_not_even_the_points_batch_trained() -> None:
    from torch_autotune.probe.allocator_phase import _kept

    assert _kept(120, None, 1000.0, None)  # the fresh process without it fit nothing
    assert not _kept(None, 120, None, 1000.0)
    assert not _kept(110, 120, 1000.0, 1000.0)
    assert _kept(120, 120, 980.0, 1000.0)  # 2% slower: within noise
    assert not _kept(120, 120, 900.0, 1000.0)


def test_a_process_that_has_it_under_either_name_or_among_other_options_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch_autotune.probe.allocator_phase import _has_it

    assert not _has_it(EXPANDABLE_SEGMENTS)
    monkeypatch.setenv(ALLOC_CONF, "max_split_size_mb:128, expandable_segments:True")
    assert _has_it(EXPANDABLE_SEGMENTS)
    monkeypatch.delenv(ALLOC_CONF)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:true")
    assert _has_it(EXPANDABLE_SEGMENTS)


def test_the_summary_says_what_the_fresh_process_measured() -> None:
    import io
    import re

    from rich.console import Console

    from torch_autotune.render import render_run

    profile = _tuned(_decoder((132, 1.0)))
    out = io.StringIO()
    render_run(profile, Console(file=out, width=400, color_system=None), saved=None)
    row = re.search(r"^allocator\s+(.*)$", out.getvalue(), re.MULTILINE)
    assert row is not None
    assert row.group(1).startswith(f"{EXPANDABLE_SEGMENTS} kept: measured, with it in a fresh")
    assert "at least 132 (every size tried trained) with it and 120 without" in row.group(1)
