"""The summary's run-time row: every phase's seconds as the evidence recorded them."""

from __future__ import annotations

from torch_autotune.evidence import PhaseRecord
from torch_autotune.probe.budget import Budget
from torch_autotune.render.results import _run_time


def test_a_phase_shorter_than_a_tenth_of_a_second_shows_its_milliseconds() -> None:
    """Seen on a busy 2-core CPU: the workers phase measured the loader alone at 0 workers
    (128 samples at 16,159 samples/s) in 11 ms, and the row read 'workers 0.0 s'."""
    ticks = iter([0.0, 0.0, 49.705, 49.705, 49.705, 49.9, 49.911])
    budget = Budget(60, lambda: next(ticks))
    for name in ("search", "throughput", "workers"):
        with budget.phase(name):
            pass
    records = budget.records()
    assert records == (
        PhaseRecord(name="search", seconds=49.705, allowed_s=None),
        PhaseRecord(name="throughput", seconds=0.0, allowed_s=None),
        PhaseRecord(name="workers", seconds=0.011, allowed_s=None),
    )

    class Evidence:
        elapsed_s, budget_s, phases = 49.911, 60.0, records

    row = _run_time(Evidence())  # type: ignore[arg-type]
    assert row == "49.9 s of 60 s budget (search 49.7 s, throughput 0.0 s, workers 0.011 s)"
