"""How a run's time budget is shared among its phases on simulated CPUs: seconds a later phase
will not need go to the phases that can use them, the DataLoader's workers keep their share,
and the run's time, phase by phase, is what the run took."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.probe.fake_trials import recorded, tune_on
from torch_autotune.evidence import Evidence
from torch_autotune.probe import workers_phase
from torch_autotune.probe.presets import preset
from torch_autotune.probe.simulated import SimulatedMachine
from torch_autotune.probe.workers_phase import workers_seconds

LAPTOP = recorded("cpu-laptop-linux")


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
