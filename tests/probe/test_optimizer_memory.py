"""The fused optimizer's step against torch's default (foreach), measured where it decides the
batch (``probe.optimizer_memory``): on a simulated H100 held to 24 GiB with a model of about a
billion parameters (16 GiB of parameters, gradients and Adam's moments whatever the batch, 1 GiB
of activations a sample), where the foreach step's intermediates are the peak."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.probe.fake_trials import recorded, tune_on
from tests.probe.test_checkpointing import _simulated_token_workload
from torch_autotune.probe.optimizer_memory import DECIDES, FOREACH, may_decide
from torch_autotune.probe.presets import preset
from torch_autotune.probe.search import TrialOutcome
from torch_autotune.probe.simulated import SimulatedMachine
from torch_autotune.probe.trials import StepSettings
from torch_autotune.profile import Profile, SearchTrialRecord, Source
from torch_autotune.settings import torch_defaults

H100 = recorded("h100-80gb-hbm3")
GIB = 1 << 30


def _billion(foreach_gib: float) -> SimulatedMachine:
    """Six samples fit fused (16 + 6 GiB of the 22 the allocator holds); the foreach step
    holds ``foreach_gib`` beyond the fused one's at the optimizer's step."""
    return SimulatedMachine(
        limit=6,
        fixed_bytes=16 * GIB,
        per_sample_bytes=GIB,
        memory_bytes=24 * GIB,
        foreach_bytes=int(foreach_gib * GIB),
        fixed_s=0.05,
        per_sample_s=0.05,
        first_s=1.0,
        new_shape_s=0.05,
        autotune_s=0.0,
        leaves=1,
    )


def _tuned(machine: SimulatedMachine) -> Profile:
    return tune_on(machine, _simulated_token_workload(), H100, mode="balanced", budget_s=120)


def test_where_foreach_runs_out_at_the_largest_batch_the_fused_step_decides_it() -> None:
    profile = _tuned(_billion(7.0))  # foreach's step: 16 + 7 GiB, above the 22 GiB held
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.max_batch_size == 6
    record = evidence.optimizer_memory
    assert record is not None
    assert record.batch_size == 6
    assert record.fused_peak_bytes == 22 * GIB
    assert not record.foreach_fits
    assert record.foreach_peak_bytes is None
    (trial,) = [t for t in evidence.search if t.variant == FOREACH]
    assert (trial.batch_size, trial.fits, trial.step) == (6, False, "optimizer memory (foreach)")
    (control,) = [t for t in evidence.search if t.step == "optimizer memory (fused again)"]
    assert (control.batch_size, control.fits) == (6, True)  # the fused step fits there still
    assert "optimizer" in [p.name for p in evidence.phases]
    decision = profile.decision("optimizer.fused")
    assert decision is not None
    assert decision.value is True
    assert decision.source is Source.MEASURED
    assert decision.reason.endswith(
        "measured at batch 6, the largest that trained: torch's default (foreach) ran out of"
        " memory there, so fused decides it"
    )
    assert profile.settings.batch.batch_size is not None
    assert profile.settings.batch.batch_size <= 6  # the batch is the fused search's


def test_where_foreach_fits_both_peaks_are_said() -> None:
    profile = _tuned(_billion(6.5))  # foreach: 22.5 GiB at its step; held 22 GiB: no
    assert profile.evidence is not None
    assert profile.evidence.optimizer_memory is not None
    assert not profile.evidence.optimizer_memory.foreach_fits
    profile = _tuned(_billion(5.5))  # foreach: 21.5 GiB at its step, under the 22 of the batch
    record = profile.evidence.optimizer_memory if profile.evidence is not None else None
    assert record is not None
    assert record.foreach_fits
    assert record.foreach_peak_bytes == record.fused_peak_bytes == 22 * GIB
    decision = profile.decision("optimizer.fused")
    assert decision is not None
    assert decision.reason.endswith(
        "the fused step peaked at 22.00 GiB, foreach at 22.00: no more memory here"
    )


def test_a_small_model_on_a_large_gpu_is_not_measured() -> None:
    # ResNet-50 on the H100: the optimizer's extra, half a GiB, is 11 of 1,850 samples
    simulated = dataclasses.replace(_simulated_token_workload(), name="simulated")
    profile = tune_on(preset("h100-resnet50"), simulated, H100, mode="balanced")
    assert profile.evidence is not None
    assert profile.evidence.limited_by == "memory"
    assert profile.evidence.optimizer_memory is None
    assert not any(t.variant == FOREACH for t in profile.evidence.search)
    decision = profile.decision("optimizer.fused")
    assert decision is not None
    assert decision.source is Source.INFERRED


def test_an_optimizer_that_is_not_fused_is_not_measured() -> None:
    laptop = recorded("cpu-laptop-linux")  # the CPU: torch's default optimizer (rule I3)
    profile = tune_on(_billion(3.0), _simulated_token_workload(), laptop, budget_s=60)
    assert profile.evidence is not None
    assert not profile.settings.optimizer.fused
    assert profile.evidence.optimizer_memory is None


def _trials(peaks: dict[int, float]) -> list[SearchTrialRecord]:
    return [
        SearchTrialRecord(
            batch_size=b, fits=True, peak_memory_bytes=int(p * GIB), seconds=1.0, step="model"
        )
        for b, p in peaks.items()
    ]


def test_it_may_decide_where_a_quarter_of_the_fixed_memory_is_worth_samples() -> None:
    assert may_decide(_trials({1: 17, 6: 22}), 6)  # 4 GiB at the step: 4 samples of 6
    assert not may_decide(_trials({1: 2.044, 1850: 80}), 1850)  # 0.5 GiB: 11 of 1,850
    assert not may_decide(_trials({4: 20}), 4)  # one trial: no line through the peaks
    unread = [t.model_copy(update={"peak_memory_bytes": None}) for t in _trials({1: 17, 6: 22})]
    assert not may_decide(unread, 6)


@given(
    fixed_gib=st.floats(0.1, 64),
    per_sample_mib=st.floats(1, 4096),
    largest=st.integers(2, 4096),
)
def test_it_may_decide_exactly_where_the_extra_is_worth_its_share(
    fixed_gib: float, per_sample_mib: float, largest: int
) -> None:
    fixed, per_sample = fixed_gib * GIB, per_sample_mib * (1 << 20)
    peaks = {1: (fixed + per_sample) / GIB, largest: (fixed + per_sample * largest) / GIB}
    samples = fixed / 4 / per_sample
    if abs(samples - DECIDES * largest) > 0.01 * samples + 1e-3:  # clear of rounding
        assert may_decide(_trials(peaks), largest) == (samples >= DECIDES * largest)


@pytest.mark.parametrize("fits", [True, False])
def test_the_record_survives_a_save_and_a_load(fits: bool) -> None:
    from torch_autotune.profile_io import dump_profile, parse_profile

    profile = _tuned(_billion(5.5 if fits else 7.0))
    again = parse_profile(dump_profile(profile))
    assert again.evidence is not None
    assert profile.evidence is not None
    assert again.evidence.optimizer_memory == profile.evidence.optimizer_memory


class _Runner:
    """The seam at its narrowest: each call's outcome from ``fits`` (fused or foreach)."""

    def __init__(self, fits: dict[bool, bool], fused: bool = True) -> None:
        self.fits, self.fused = fits, fused
        self.settings = StepSettings(
            torch_defaults("cuda").model_copy(
                update={
                    "optimizer": torch_defaults("cuda").optimizer.model_copy(
                        update={"fused": fused}
                    )
                }
            )
        )

    def variant(self, _variant: object) -> _Runner:
        return _Runner(self.fits, fused=False)

    def __call__(self, batch_size: int) -> TrialOutcome:
        fits = self.fits[self.fused]
        return TrialOutcome(fits, 22 * GIB if fits else None, 1.0, 0.1, 0.3)


def _measure(fits: dict[bool, bool]) -> tuple[object, list[SearchTrialRecord]]:
    from types import SimpleNamespace

    from torch_autotune.probe.budget import Budget
    from torch_autotune.probe.optimizer_memory import measure_optimizer_memory
    from torch_autotune.probe.timemodel import StepTiming, TimeModel

    model = TimeModel()
    model.learn(StepTiming(1, 0.1, 0.1))
    model.learn(StepTiming(6, 0.1, 0.35))
    search = _trials({1: 17, 6: 22})
    run = SimpleNamespace(
        runner=_Runner(fits), search=search, budget=Budget(120, lambda: 0.0), report=print
    )
    found = SimpleNamespace(limited_by="memory")
    searched = SimpleNamespace(largest=6, found=found, guard=SimpleNamespace(model=model))
    return measure_optimizer_memory(run, searched)  # type: ignore[arg-type]


def test_where_the_fused_step_no_longer_fits_either_nothing_is_said() -> None:
    """A device shared since the search: the fused control runs out too, so foreach's
    failure says nothing of the optimizer."""
    record, trials = _measure({True: False, False: False})
    assert record is None
    assert [(t.step, t.fits) for t in trials] == [
        ("optimizer memory (foreach)", False),
        ("optimizer memory (fused again)", False),
    ]
    record, trials = _measure({True: True, False: False})
    assert record is not None
    assert not record.foreach_fits
    assert [t.step for t in trials][-1] == "optimizer memory (fused again)"
    record, trials = _measure({True: True, False: True})
    assert record is not None
    assert record.foreach_fits
    assert len(trials) == 1  # no control where foreach fit


def test_the_summary_gives_the_optimizers_step() -> None:
    import io
    import re

    from rich.console import Console

    from torch_autotune.render import render_run

    profile = _tuned(_billion(7.0))
    out = io.StringIO()
    render_run(profile, Console(file=out, width=400, color_system=None), saved=None)
    row = re.search(r"^optimizer memory\s+(.*)$", out.getvalue(), re.MULTILINE)
    assert row is not None
    assert row.group(1).rstrip() == (
        "measured at batch 6, the largest that trained: torch's default (foreach) ran out of"
        " memory there, so fused decides it"
    )
