"""How a run's time budget is shared among its phases on simulated CPUs: seconds a later phase
will not need go to the phases that can use them, the DataLoader's workers keep their share,
and the run's time, phase by phase, is what the run took."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.probe.fake_trials import recorded, tune_on
from torch_autotune.api import tune
from torch_autotune.evidence import Evidence, ThroughputRecord
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe import workers_phase
from torch_autotune.probe.budget import Skip
from torch_autotune.probe.points import dropped_note, unmeasured_warning
from torch_autotune.probe.presets import preset
from torch_autotune.probe.simulated import SimulatedMachine, SimulatedTrials
from torch_autotune.probe.trials import PointOutcome, StepSettings
from torch_autotune.probe.workers_phase import workers_seconds
from torch_autotune.probe.workloads import Workload, resolve_workload

LAPTOP = recorded("cpu-laptop-linux")
H100 = recorded("h100-80gb-hbm3")


def _busy_cpu(factor: float) -> SimulatedMachine:
    """The 2-core CPU with the conv net, its steps ``factor`` times slower (a neighbour's
    load: this CPU's search took 33 s of a 60 s budget at 4x)."""
    calm = preset("cpu-conv")
    return preset(
        "cpu-conv",
        fixed_s=calm.fixed_s * factor,
        per_sample_s=calm.per_sample_s * factor,
        first_s=calm.first_s * factor,
    )


def _workers_start(evidence: Evidence) -> float:
    """Seconds of the run gone when the workers phase, the last, began."""
    workers = next(p for p in evidence.phases if p.name == "workers")
    return evidence.elapsed_s - workers.seconds


@pytest.fixture(autouse=True)
def _two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)


def test_a_busy_cpu_measures_a_point_with_the_seconds_no_confirmation_needs() -> None:
    """The defect: the search took 33 s of 60; the throughput phase kept 12 s for the workers
    and 30 s for running batch 512 again, so it had none, measured no point and asked for a
    longer --budget; the confirmation did not run either (a point confirms, and 512 ran in the
    search) and the run ended at 35.8 s with 24 s unused."""
    profile = tune_on(_busy_cpu(4), "conv", LAPTOP, budget_s=60)
    evidence = profile.evidence
    assert evidence is not None
    assert [r.batch_size for r in evidence.throughput if r.steady] == [128]
    assert evidence.batch_size == 128
    assert not [w for w in evidence.warnings if w.startswith("no throughput point ran")]
    assert 0.9 * 60 <= evidence.elapsed_s <= 60
    assert 60 - _workers_start(evidence) >= workers_seconds("cpu", 60)  # the workers' share kept
    assert evidence.fed  # and its passes ran


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(factor=st.floats(0.5, 8.0), budget_s=st.floats(30.0, 120.0))
def test_throughput_leaves_the_workers_their_share(factor: float, budget_s: float) -> None:
    """Where the search left the workers their share, the throughput phase, within its own
    seconds, hands it on whole."""
    profile = tune_on(_busy_cpu(factor), "conv", LAPTOP, budget_s=budget_s)
    evidence = profile.evidence
    assert evidence is not None
    share = workers_seconds("cpu", budget_s)
    search = next(p for p in evidence.phases if p.name == "search")
    if budget_s - search.seconds >= share + 1.0:  # detection takes the simulated clock no time
        assert budget_s - _workers_start(evidence) >= share - 1e-6
    throughput = next(p for p in evidence.phases if p.name == "throughput")
    assert throughput.allowed_s is not None
    assert throughput.seconds <= max(0.0, throughput.allowed_s) + 1e-6


def test_a_run_that_left_nothing_out_for_time_does_not_ask_for_more() -> None:
    """The defect: on a CPU twice as busy, 58 s of a 60 s budget went by with every phase
    running what it planned, and the run said 'the run used 58 s of its 60 s budget; more
    time (--budget) measures more'. Nothing was left out for time: no ask for more."""
    evidence = tune_on(_busy_cpu(2), "conv", LAPTOP, budget_s=60).evidence
    assert evidence is not None
    assert evidence.elapsed_s >= 0.9 * 60
    assert [w for w in evidence.warnings if "--budget" in w] == []


def test_a_point_left_out_for_time_is_named_with_its_numbers() -> None:
    """ResNet-50 on the H100 with 30 s: the point at 416 did not fit in the time left, with
    the cuDNN autotuner's warm-up the two points before it paid (8.1 s each). The closing
    warning said only 'the run used 30 s of its 30 s budget'; it names the point."""
    machine = preset("h100-resnet50", load_s=None)
    workload = dataclasses.replace(resolve_workload("conv"), dataset=None, name="simulated")
    evidence = tune_on(machine, workload, H100, mode="balanced", budget_s=30).evidence
    assert evidence is not None
    assert (
        "the run used 30 s of its 30 s budget and left out for time: the throughput point at "
        "batch 416 (8.4 s predicted, 0.4 s of the run left, 0.4 s of them kept for later"
        " phases); more time (--budget) measures more"
    ) in evidence.warnings
    # with 120 s, the same point was left out of the phase's share, and 90 s went unused
    longer = tune_on(machine, workload, H100, mode="speed", budget_s=120).evidence
    assert longer is not None
    assert [w for w in longer.warnings if "--budget" in w] == []


def test_no_point_that_did_not_fit_asks_for_no_more_time() -> None:
    """No point ran, and none was left out for time (they ran out of memory): more time is
    not what they need."""
    assert "--budget" not in unmeasured_warning([])


def _starved_throughput() -> Evidence:
    """The 2-core CPU 16x busy with 20 s: the search takes 13 s, and the throughput phase's
    3 s hold none of its points (its batch 2 alone, 4.0 s predicted)."""
    evidence = tune_on(_busy_cpu(16), "conv", LAPTOP, budget_s=20).evidence
    assert evidence is not None
    return evidence


def test_the_cpu_note_on_candidates_left_out_says_what_ran() -> None:
    """It said 'the smaller ones were measured (2)' where no point ran at 2."""
    evidence = _starved_throughput()
    assert evidence.throughput == ()
    (note,) = [w for w in evidence.warnings if w.startswith("batches 8 and 4 were not measured")]
    assert note.endswith("no smaller one was measured either"), note


def test_the_confirmation_leaves_the_workers_their_share() -> None:
    """Running batch 8 again was predicted at 4.3 s, with 7.0 s of the run left, 4.0 s of them
    the workers'. It ran (4.2 s), leaving the workers 2.8 s of their 4 s; now it keeps the run
    batch 8 had and says why."""
    evidence = _starved_throughput()
    assert "confirm" not in [p.name for p in evidence.phases]
    assert (
        "batch 8 was not run a second time: running batch 8 again (4.3 s predicted, 7.0 s of the"
        " run left, 4.0 s of them kept for later phases) did not fit (it ran once with these"
        " settings)"
    ) in evidence.warnings
    assert 20 - _workers_start(evidence) >= workers_seconds("cpu", 20)


Started = tuple[float, float, float, PointOutcome]
"""A point as ``_Points`` saw it: when it began, its ``until`` and ``deadline``, its outcome."""


class _Points(SimulatedTrials):
    """The simulated trials, whose points are kept in ``points``; from the first point on,
    steps ``slower`` times slower than the search measured (a neighbour's job began on the
    shared CPU)."""

    slower = 1.0  # set on a runner, as ``points``
    points: list[Started]

    def point(
        self, batch_size: int, *, until: float, deadline: float | None = None
    ) -> PointOutcome:
        m = self.machine
        if not any(line.startswith("point") for line in m.log):
            m.fixed_s, m.per_sample_s = m.fixed_s * self.slower, m.per_sample_s * self.slower
        assert deadline is not None  # the phases give their end
        began = m.now
        point = super().point(batch_size, until=until, deadline=deadline)
        self.points.append((began, until, deadline, point))
        return point


def _tune_seeing_points(
    machine: SimulatedMachine,
    workload: object,
    snapshot: HardwareSnapshot,
    slower: float = 1.0,
    **options: object,
) -> tuple[Evidence, list[Started]]:
    """``tune_on`` with ``_Points`` (``slower``): the evidence, and the points as they ran."""
    points: list[Started] = []

    def trials(workload: Workload, step: StepSettings) -> _Points:
        runner = _Points(machine, step, workload=workload)
        runner.points, runner.slower = points, slower
        return runner

    profile = tune(workload, snapshot=snapshot, clock=machine.clock, trials=trials, **options)  # type: ignore[arg-type]
    assert profile.evidence is not None
    return profile.evidence, points


@pytest.mark.parametrize(("slower", "budget_s"), [(8.0, 30.0), (8.0, 60.0), (20.0, 45.0)])
def test_points_slower_than_the_search_end_by_the_phases_end(
    slower: float, budget_s: float
) -> None:
    """The defect: on a busy 2-core CPU, throughput took 14.04 s of its 11.6 s and the workers
    phase had 3.6 s of its 6 s: a point ran its warm-up, a sizing step and a whole first block
    before it looked at the clock, so with steps 8-20x slower than the search measured (a
    neighbour's job began), it ran past the phase's end by blocks of them (23.6 s of an 8.1 s
    phase, 8x slower with 30 s). No step now begins past the phase's end: the phase ends
    within its time and the one step under way then, and the workers lose no more than it."""
    machine = preset("cpu-conv")
    evidence, points = _tune_seeing_points(machine, "conv", LAPTOP, slower, budget_s=budget_s)
    throughput = next(p for p in evidence.phases if p.name == "throughput")
    assert throughput.allowed_s is not None
    assert points
    assert all(began < deadline for began, _, deadline, _ in points)  # none began past its end
    step = machine.step_s(points[-1][3].batch_size, compiled=False)  # as slow as the points ran
    over = max(0.0, throughput.seconds - throughput.allowed_s)
    assert over <= step + machine.new_shape_s + 1e-6  # the step under way at its end, if any
    assert budget_s - _workers_start(evidence) >= workers_seconds("cpu", budget_s) - over - 1e-6


def test_a_point_whose_warm_up_spent_its_share_keeps_a_timed_block() -> None:
    """ResNet-50 on the H100 with 35 s: the point at 832 paid the cuDNN autotuner (8.1 s)
    past its share of the phase, with 4 s of the phase left; it still times a block and is
    kept, as before (a cut at its share, reverted, left it out for time). The point at 416
    then began with 3.3 s of the phase left, its warm-up predicted from the search's (which
    trains without the autotuner) at 0.3 s: it ran 4.9 s past the phase's end, and the run
    took 38.7 s of its 35. It is now predicted with the autotuner's warm-up the points
    before it paid, and left out for time: the run ends within its budget."""
    machine = preset("h100-resnet50", load_s=None)
    workload = dataclasses.replace(resolve_workload("conv"), dataset=None, name="simulated")
    evidence, points = _tune_seeing_points(machine, workload, H100, mode="balanced", budget_s=35)
    at = {
        point.batch_size: (began, until, deadline, point)
        for began, until, deadline, point in points
    }
    began, until, deadline, point = at[832]
    assert point.warmup_s is not None
    assert until < began + point.warmup_s < deadline  # its warm-up spent its share, not the phase
    assert point.blocks == 1
    assert [r.blocks for r in evidence.throughput if r.batch_size == 832] == [1]
    assert 416 not in at
    assert machine.now <= 35
    assert any(
        "the throughput point at batch 416 (8.4 s predicted, 4.6 s of the run left" in warning
        for warning in evidence.warnings
    )


def test_a_point_whose_autotuner_ran_past_the_phases_end_times_one_step() -> None:
    """ResNet-50 on the H100 with 30 s: the point at 832 began with less of the phase left
    than the cuDNN autotuner's 8.1 s (the second point: the first one's warm-up, which may
    be a compile's, predicts nothing). The warm-up is paid, so one step after it is timed,
    its one block, and the point is kept: the phase ends one step past its end."""
    machine = preset("h100-resnet50", load_s=None)
    workload = dataclasses.replace(resolve_workload("conv"), dataset=None, name="simulated")
    evidence, points = _tune_seeing_points(machine, workload, H100, mode="balanced", budget_s=30)
    at = {point.batch_size: (began, deadline, point) for began, _, deadline, point in points}
    began, deadline, point = at[832]
    assert point.warmup_s is not None
    assert began < deadline < began + point.warmup_s  # its warm-up ran past the phase's end
    assert point.blocks == 1
    assert point.seconds == pytest.approx(point.warmup_s + 2 * machine.step_s(832, compiled=False))
    assert [r.blocks for r in evidence.throughput if r.batch_size == 832] == [1]


def test_the_cpu_note_says_a_smaller_batch_trains_as_fast_only_as_measured() -> None:
    """It said 'on a CPU a smaller batch trains as fast or faster' as a fact that nothing in
    the run measured (a small LM at 1 thread ran 61, 98 and 117 samples/s at 2, 8 and 32):
    with no steady points it is a rule of thumb, and said as measured only where this run's
    steady points showed the smaller as fast."""
    evidence = _starved_throughput()
    (note,) = [w for w in evidence.warnings if "not measured for throughput" in w]
    assert "as fast or faster" not in note
    assert "left out for time" in note
    assert "(a rule of thumb, not measured in this run)" in note
    skip = Skip("the shortest points of every candidate", 15.0, 18.5, 11.6)

    def point(size: int, rate: float) -> ThroughputRecord:
        return ThroughputRecord(batch_size=size, samples_per_s=rate, relative_spread=0.01)

    faster = dropped_note(skip, [512], [point(256, 300.0), point(128, 400.0)])
    assert "(as this run's steady points did: 400.0 samples/s at 128, 300.0 at 256)" in faster
    slower = dropped_note(skip, [512], [point(256, 400.0), point(128, 300.0)])
    assert "(a rule of thumb, not measured in this run)" in slower
