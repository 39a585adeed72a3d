"""The CPU threads of a workload without a dataset, on its own batches (``probe.own_threads``):
recorded rates through the fake of the fed passes, a clock it moves."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from tests.probe.fake_trials import (
    cpu_machine,
    recorded,
    tiny_mlp_on_two_busy_cores,
    tune_on,
    tune_ticking,
)
from tests.probe.test_fed import FakeFed, RatesTable
from tests.rules.helpers import two_cpus, with_host
from tests.test_claims import _with_reason, disagreements, summary
from torch_autotune import together
from torch_autotune.api import tune
from torch_autotune.plot.data import throughput_series
from torch_autotune.probe import fed_passes, workers_phase
from torch_autotune.probe.budget import Budget
from torch_autotune.probe.fed_passes import FED_WITHIN, FedTrial, fmt_rate, pass_seconds
from torch_autotune.probe.own_threads import (
    OWN_BATCHES,
    OwnThreads,
    measure_own_threads,
    own_batches,
)
from torch_autotune.probe.simulated import SimulatedMachine, SimulatedTrials
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.workers_phase import kept_seconds
from torch_autotune.probe.workloads import Workload, resolve_workload
from torch_autotune.profile import Profile, Source
from torch_autotune.render import results
from torch_autotune.render.results import render_run
from torch_autotune.rules.engine import build_profile


def _measure(
    rates: RatesTable,
    *,
    default: int = 4,
    until: float | None = None,
    smaller: tuple[int, ...] = (),
) -> tuple[FakeFed, OwnThreads]:
    """Batch 256 on ``default`` cores, the rules' threads torch's own pool; then ``smaller``."""
    fake = FakeFed(rates)
    own = measure_own_threads(
        fake,
        batch_size=256,
        default_threads=default,
        rules_threads=None,
        step_rates={256: 1_000.0},
        until=until,
        clock=fake.clock,
        smaller=smaller,
    )
    return fake, own


def test_the_defect_a_tiny_model_keeps_torchs_pool_where_one_thread_trains_15x_faster() -> None:
    # this 2-core VM: a tiny MLP at 13,178 samples/s at torch's 2 threads, 205,000 at 1
    fake, own = _measure({(256, 0, None): 13_178.0, (256, 0, 1): 205_000.0}, default=2)
    assert fake.calls == [(256, 0, None), (256, 0, 1), (256, 0, 1), (256, 0, None)]
    assert own.threads is not None
    assert own.threads.threads == 1
    reason = own.threads.reason
    assert reason.startswith(
        f"1 thread: training on {OWN_BATCHES} at batch 256 ran at 205,000 samples/s with it, "
        "against 13,178 with torch's default (2 threads), the rules' count"
    )
    assert "a second round, in the reverse order, bore out 1 thread:" in reason
    assert "worker" not in reason  # no DataLoader: no worker count to speak of
    assert "1 thread: 205,000 (second round)" in reason


def test_fewer_threads_halve_while_each_is_faster_and_the_fewest_within_noise_wins() -> None:
    rates = {(256, 0, None): 1_000.0, (256, 0, 4): 1_000.0, (256, 0, 2): 1_500.0}
    fake, own = _measure({**rates, (256, 0, 1): 1_510.0})
    assert [c[2] for c in fake.calls[:4]] == [None, 2, 1, 1]  # 1 was faster than 2: tried
    assert own.threads is not None
    assert own.threads.threads == 1  # within 2% of 2 threads: the fewest
    fake, own = _measure({**rates, (256, 0, 1): 1_200.0})
    assert [c[2] for c in fake.calls[:3]] == [None, 2, 1]  # 1 slower than 2: no further
    assert own.threads is not None
    assert own.threads.threads == 2


def test_torchs_pool_stands_where_no_fewer_threads_are_faster_beyond_noise() -> None:
    fake, own = _measure({(256, 0, None): 1_000.0, (256, 0, 2): 1_015.0, (256, 0, 1): 900.0})
    assert fake.calls == [(256, 0, None), (256, 0, 2), (256, 0, 1)]  # 2 within 2%: no 2nd round
    assert own.threads is not None
    assert own.threads.threads is None
    assert own.threads.reason.startswith(
        f"torch's default (4 threads), the rules' count: on {OWN_BATCHES}, no fewer threads "
        "trained faster beyond 2%"
    )
    assert "2 threads: 1,015" in own.threads.reason


def test_a_lucky_pass_the_second_round_does_not_bear_out_leaves_torchs_pool() -> None:
    rates = {(256, 0, None): (1_000.0, 1_010.0), (256, 0, 2): (1_300.0, 990.0), (256, 0, 1): 800.0}
    fake, own = _measure(rates)
    assert fake.calls[3:] == [(256, 0, 2), (256, 0, None)]
    assert own.threads is not None
    assert own.threads.threads is None
    assert own.threads.reason.startswith(
        f"torch's default (4 threads), the rules' count, the plain alternative on {OWN_BATCHES}; "
        "a second round, in the reverse order, did not bear out 2 threads"
    )


def test_a_pass_at_fewer_threads_that_would_not_end_in_time_is_not_started() -> None:
    # the plain pass ends at about 1.8 s; one at 2 threads could take twice as long
    plain = pass_seconds(256, 0, 1_000.0)
    fake, own = _measure({(256, 0, None): 1_000.0, (256, 0, 2): 2_000.0}, until=plain + 1.0)
    assert fake.calls == [(256, 0, None)]
    assert own.threads is not None
    assert own.threads.threads is None
    assert own.threads.reason.startswith(
        f"torch's default (4 threads), the rules' count, measured on {OWN_BATCHES} alone: a "
        "pass at 2 threads did not fit in the 1 s of the time budget left"
    )


def test_at_fewer_threads_the_smaller_sizes_run_and_the_smallest_as_fast_as_the_best_wins() -> None:
    rates = {(256, 0, None): 1_000.0, (256, 0, 2): 1_500.0, (256, 0, 1): 1_400.0}
    smaller = {(128, 0, 2): 2_400.0, (64, 0, 2): 2_380.0, (32, 0, 2): 1_000.0}
    fake, own = _measure({**rates, **smaller}, smaller=(128, 64, 32))
    assert [c for c in fake.calls if c[0] < 256] == [(128, 0, 2), (64, 0, 2), (32, 0, 2)]
    assert own.batch_size == 64  # within 2% of 128's 2,400: the smallest as fast
    assert own.batch_reason is not None
    assert own.batch_reason.startswith("64: the step's throughput points ran at torch's default")
    assert own.batch_reason.endswith(
        "at 2 threads: 256: 1,500, 256: 1,500 (second round), 128: 2,400, 64: 2,380, 32: 1,000 "
        "samples/s"
    )
    # fewer threads, no smaller size to run: the batch stays, said as it ran at them
    fake, alone = _measure(rates)
    assert alone.batch_size == 256
    assert alone.batch_reason is not None
    assert alone.batch_reason.endswith(
        "trains at 2 threads (cpu_threads), where it ran at 1,500 samples/s; no other batch trained"
        " at 2 threads"
    )
    # torch's pool kept: the batch stays the points', and no smaller size runs
    fake, kept = _measure({(256, 0, None): 1_000.0, (256, 0, 2): 900.0}, smaller=(128, 64))
    assert (kept.batch_size, kept.batch_reason) == (None, None)
    assert all(c[0] == 256 for c in fake.calls)


def test_where_no_pass_ran_to_a_rate_the_threads_are_left_to_the_rules() -> None:
    fake, own = _measure({(256, 0, None): 1_000.0}, until=0.5)
    assert (fake.calls, own) == ([], OwnThreads((), None))
    fake, own = _measure({(256, 0, None): None})
    assert fake.calls == [(256, 0, None)]
    assert own.threads is None  # the rules' guess stays, as it was


def _budget(left_s: float) -> Budget:
    now = [0.0]
    budget = Budget(60.0, lambda: now[0])
    now[0] = 60.0 - left_s
    return budget


def test_threads_not_measured_for_want_of_time_are_said_so_with_what_did_not_fit() -> None:
    fake = FakeFed({(256, 0, None): 1_000.0, (256, 0, 1): 900.0})
    progress: list[tuple[str, str]] = []
    rates = {256: 1_000.0}
    for left in (0.0, 0.5):  # no time at all; too little for the plain alternative's pass
        budget = _budget(left)
        own = own_batches(
            fake,
            (256, 128),
            default_threads=2,
            rules_threads=None,
            step_rates=rates,
            budget=budget,
            progress=lambda phase, what: progress.append((phase, what)),
        )
        assert (fake.calls, own.trials, own.threads) == ([], (), None)
        predicted = pass_seconds(256, 0, 1_000.0)
        assert own.warning is not None
        assert own.warning.startswith("the CPU threads were not measured (with no dataset")
        assert f"a pass of training on its own batches at batch 256 ({predicted:.1f} s" in (
            own.warning
        )
        assert own.warning.endswith("so the rules chose them; more time (--budget) measures them")
        assert [(s.what, s.warned) for s in budget.skipped] == [
            ("a pass of training on its own batches at batch 256", True)
        ]
    assert progress == [("workers", "CPU threads on the workload's own batches")]  # 0.5 s left
    # with time for it, the same call measures and warns of nothing
    measured = own_batches(
        fake,
        (256,),
        default_threads=2,
        rules_threads=None,
        step_rates=rates,
        budget=_budget(60.0),
        progress=lambda phase, what: None,
    )
    assert measured.trials
    assert measured.warning is None


def test_a_tune_whose_threads_pass_did_not_fit_warns_and_claims_no_measurement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    monkeypatch.setattr(fed_passes, "PASS_S", 3_600.0)  # a pass predicted past the budget
    profile = tune_on(tiny_mlp_on_two_busy_cores(), _no_dataset("mlp"), two_cpus(), budget_s=60)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.fed == ()
    said = [w for w in evidence.warnings if w.startswith("the CPU threads were not measured")]
    assert len(said) == 1
    threads = profile.decision("cpu_threads")
    assert threads is not None
    assert threads.source is not Source.MEASURED
    assert disagreements(profile) == []


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(100.0, 10_000.0), min_size=4, max_size=4),
    st.lists(st.floats(100.0, 10_000.0), min_size=4, max_size=4),
)
def test_the_threads_chosen_never_trained_slower_than_torchs_pool_in_any_pass(
    first: list[float], second: list[float]
) -> None:
    threads = (None, 4, 2, 1)
    rates = {(256, 0, t): (a, b) for t, a, b in zip(threads, first, second, strict=True)}
    fake, own = _measure(rates, default=8)
    assert own.threads is not None
    chosen = own.threads.threads
    if chosen is not None:  # moved from the plain alternative: faster in every pass it ran
        plain = [fake.rate(256, 0, None, n) for n in (1, 2)][: fake.calls.count((256, 0, None))]
        mine = [fake.rate(256, 0, chosen, n) for n in (1, 2)][: fake.calls.count((256, 0, chosen))]
        assert min(r for r in mine if r) > max(r for r in plain if r) * (1 + FED_WITHIN)


# --- whole runs on simulated machines ------------------------------------------------------


def _no_dataset(name: str) -> Workload:
    """The built-in ``name`` as objects in hand with an example batch would make it: no dataset."""
    return dataclasses.replace(resolve_workload(name), dataset=None, max_batch_size=None)


def test_the_defect_objects_in_hand_on_a_busy_cpu_train_at_the_threads_measured_fastest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    machine = tiny_mlp_on_two_busy_cores()
    profile = tune_on(machine, _no_dataset("mlp"), two_cpus(), budget_s=60)
    evidence = profile.evidence
    assert evidence is not None
    batch = profile.settings.batch.batch_size
    assert batch is not None
    assert evidence.fed[0].batch_size == batch  # a smaller batch ran at 1 thread: slower
    rates = {
        r.cpu_threads: r.samples_per_s
        for r in evidence.fed
        if (r.round, r.batch_size) == (1, batch)
    }
    assert set(rates) == {None, 1}  # torch's pool, then half of it
    assert rates[1] == pytest.approx(machine.fed_rate(batch, 0, 1, compiled=False))
    assert {r.batch_size for r in evidence.fed if r.cpu_threads is None} == {batch}
    assert rates[1] > 1.3 * (rates[None] or 0.0)
    assert all(not r.dataloader and r.num_workers == 0 for r in evidence.fed)
    assert profile.settings.cpu_threads == 1
    assert profile.settings.environment.get("OMP_NUM_THREADS") == "1"
    threads = profile.decision("cpu_threads")
    assert threads is not None
    assert threads.source is Source.MEASURED
    assert threads.reason.startswith(f"1 thread: training on {OWN_BATCHES} at batch {batch}")
    workers = profile.decision("dataloader.num_workers")
    assert workers is not None
    assert workers.source is Source.INFERRED  # no DataLoader: nothing to measure
    assert evidence.loader == ()
    console = Console(record=True, width=120)
    render_run(profile, console, None)
    shown = console.export_text()
    assert "Training fed by the DataLoader" not in shown
    table = shown.split("Training on its own batches (no dataset): CPU threads")[1]
    assert re.findall(r"\n +\d+ +0 +(\S+) +[\d.]+ +recommended", table) == ["1"]
    names = [series.name for series in throughput_series(evidence) if series.kind == "fed"]
    assert names == ["own batches, default threads", "own batches, 1 thread"]


def test_on_real_torch_objects_in_hand_have_their_threads_measured_on_their_own_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    profile = tune_ticking(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        example_batch=(torch.randn(32, 8), torch.randint(0, 4, (32,))),
        loss_fn=torch.nn.functional.cross_entropy,
        snapshot=two_cpus(),
        budget_s=30,
    )
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.fed
    assert all(not r.dataloader and r.num_workers == 0 for r in evidence.fed)
    assert all((r.samples_per_s or 0) > 0 for r in evidence.fed)
    assert evidence.fed[0].cpu_threads is None  # torch's own pool first: the plain alternative
    threads = profile.decision("cpu_threads")
    assert threads is not None
    assert threads.source is Source.MEASURED
    assert OWN_BATCHES in threads.reason


class _Probed(Exception):
    """What stands in for the probe where a test wants only what tune() gave it."""


def test_threads_set_before_tune_are_the_ones_the_passes_say_they_ran_at(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A script's torch.set_num_threads(1) before tune(): the passes at torch's pool ran at 1
    thread, and the profile said they ran at torch's default (2 threads), then 1 thread."""
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    objects = {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "example_batch": (torch.randn(32, 8), torch.randint(0, 4, (32,))),
        "loss_fn": torch.nn.functional.cross_entropy,
    }
    read: list[int | None] = []

    def probed(_ranks: object, _workload: object, rules_only: Profile, **_: object) -> None:
        read.append(rules_only.provenance.snapshot.software.torch_num_threads)
        raise _Probed

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with monkeypatch.context() as patch:  # what tune() reads of this process
            patch.setattr(together, "probe", probed)
            with pytest.raises(_Probed):
                tune(**objects, snapshot=two_cpus(), budget_s=20)  # type: ignore[arg-type]
        software = two_cpus().software.model_copy(update={"torch_num_threads": read[0]})
        snapshot = two_cpus().model_copy(update={"software": software})
        profile = tune_ticking(**objects, snapshot=snapshot, budget_s=20)
    finally:
        torch.set_num_threads(before)
    assert read == [1]
    assert profile.provenance.snapshot.software.torch_num_threads == 1
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.fed == ()  # one thread: none fewer to try
    threads = profile.decision("cpu_threads")
    assert threads is not None
    assert threads.source is not Source.MEASURED
    assert "torch's pool has 1 thread in the process that read the machine" in threads.reason
    said = profile.model_dump_json() + summary(profile)
    assert "(2 threads)" not in said


def test_a_process_of_more_threads_than_cpus_tunes_within_them() -> None:
    """torch.set_num_threads(8) on 2 usable CPUs: the passes halved from the process's 8, the
    profile took the 4 that won, more than the machine can run, and its validation raised a
    pydantic error after the whole run."""
    software = two_cpus().software.model_copy(update={"torch_num_threads": 8})
    snapshot = two_cpus().model_copy(update={"software": software})
    machine = cpu_machine(
        first_s=0.3,
        shares_cpus=True,
        host_cpus=2,
        fixed_s=0.001,
        per_sample_s=0.002,
        thread_sync_s=0.0001,
    )
    profile = tune_on(machine, "mlp", snapshot, budget_s=60)
    assert profile.settings.cpu_threads == 2
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.fed
    assert all(r.cpu_threads is not None and r.cpu_threads <= 2 for r in evidence.fed)
    assert disagreements(profile) == []


def test_at_the_threads_chosen_a_smaller_batch_that_trains_faster_is_recommended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the conv net on 2 busy cores: batch 128 fastest at 2 threads, 32 at 1 (1.6x of 128);
    # here the sizes below the points' batch train 1.6x as fast at 1 thread as the model says
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    machine = tiny_mlp_on_two_busy_cores()

    def trials(workload: Workload, step: StepSettings) -> SimulatedTrials:
        runner = machine.trials(workload, step)
        fed, first = runner.fed, []

        def faster_below(
            batch: int, count: int, threads: int | None, *, seconds: float
        ) -> FedTrial:
            trial = fed(batch, count, threads, seconds=seconds)
            first.append(first[0] if first else batch)
            if threads != 1 or batch >= first[0] or trial.samples_per_s is None:
                return trial
            return dataclasses.replace(trial, samples_per_s=1.6 * trial.samples_per_s)

        runner.fed = faster_below  # type: ignore[method-assign]
        return runner

    profile = tune(
        _no_dataset("mlp"), snapshot=two_cpus(), clock=machine.clock, trials=trials, budget_s=60
    )
    evidence = profile.evidence
    assert evidence is not None
    points = evidence.fed[0].batch_size
    batch = profile.settings.batch.batch_size
    assert batch is not None
    assert batch < points
    assert batch in {r.batch_size for r in evidence.fed if r.cpu_threads == 1}  # it ran there
    assert profile.settings.cpu_threads == 1
    decision = profile.decision("batch.batch_size")
    assert decision is not None
    assert decision.reason.startswith(
        f"{batch}: the step's throughput points ran at torch's default (2 threads) and chose "
        f"batch {points}; training on {OWN_BATCHES} trains at 1 thread (cpu_threads)"
    )
    assert evidence.batch_choice is not None
    assert evidence.batch_choice.fed_why == "fewer threads"
    assert disagreements(profile) == []
    assert (
        "on its own batches at the CPU threads its passes chose, within 2% of the fastest"
        in summary(profile)
    )
    # the checker reads these reasons: a pass that did not run at that rate is found
    wrong = re.sub(r"(\d+): [\d,]+ samples/s$", r"\1: 1 samples/s", decision.reason)
    assert wrong != decision.reason
    found = disagreements(_with_reason(profile, "batch.batch_size", wrong))
    assert any("the own-batch reason's pass at" in d for d in found), found
    # a larger batch than the smallest as fast, said as chosen
    larger = max(r.batch_size for r in evidence.fed if r.cpu_threads == 1)
    wrong = profile.model_copy(
        update={
            "settings": profile.settings.model_copy(
                update={"batch": profile.settings.batch.model_copy(update={"batch_size": larger})}
            )
        }
    )
    wrong = _with_reason(wrong, "batch.batch_size", f"{larger}{decision.reason[len(str(batch)) :]}")
    found = disagreements(wrong)
    assert any("is not the smallest as fast" in d for d in found), found
    # the form where no other batch ran: its one rate is checked too
    ran = next(r for r in evidence.fed if (r.batch_size, r.cpu_threads) == (batch, 1))
    alone = (
        f"{batch}: the step's throughput points ran at torch's default (2 threads) and chose "
        f"batch {batch}; training on {OWN_BATCHES} trains at 1 thread (cpu_threads), where it ran"
        f" at {{}} samples/s; no other batch trained at 1 thread"
    )
    right = alone.format(fmt_rate(ran.samples_per_s))
    assert disagreements(_with_reason(profile, "batch.batch_size", right)) == []
    found = disagreements(_with_reason(profile, "batch.batch_size", alone.format("1")))
    assert any("the own-batch reason's pass at" in d for d in found), found
    threads = profile.decision("cpu_threads")
    assert threads is not None
    wrong = threads.reason.replace("bore out 1 thread", "bore out 2 threads")
    assert wrong != threads.reason
    found = disagreements(_with_reason(profile, "cpu_threads", wrong))
    assert any("are not the challenger's" in d for d in found), found


def test_without_a_dataset_a_gpu_or_a_single_core_measures_no_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    h100 = tune_on(SimulatedMachine(), _no_dataset("gpt2"), recorded("h100-80gb-hbm3"), budget_s=60)
    assert h100.evidence is not None
    assert h100.evidence.fed == ()
    workers = h100.decision("dataloader.num_workers")
    assert workers is not None
    assert "(a rule of thumb: the workload tuned had no dataset to measure them on)" in (
        workers.reason
    )
    rules_only = build_profile(recorded("h100-80gb-hbm3")).decision("dataloader.num_workers")
    assert rules_only is not None  # where autotune did not run, the hint stays
    assert "(a rule of thumb: run autotune to measure)" in rules_only.reason
    one = with_host("cpu-laptop-linux", cpus_usable=1, cpu_cores_physical=1, cpu_affinity_count=1)
    single = tune_on(tiny_mlp_on_two_busy_cores(), _no_dataset("mlp"), one, budget_s=60)
    assert single.evidence is not None
    assert single.evidence.fed == ()
    threads = single.decision("cpu_threads")
    assert threads is not None
    assert threads.source is Source.INFERRED


def test_a_cpu_whose_rules_keep_workers_leaves_the_threads_to_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 8 CPUs: the rules keep 2 workers and 6 threads beside them for a DataLoader this workload
    # does not have; threads measured at 0 workers would be said against the wrong count
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 8)
    eight = with_host(
        "cpu-laptop-linux",
        cpus_usable=8,
        cpu_cores_physical=8,
        cpu_cores_logical=8,
        cpu_affinity_count=8,
    )
    assert build_profile(eight).settings.dataloader.num_workers > 0
    machine = tiny_mlp_on_two_busy_cores()
    profile = tune_on(machine, _no_dataset("mlp"), eight, budget_s=60)
    assert profile.evidence is not None
    assert profile.evidence.fed == ()
    threads = profile.decision("cpu_threads")
    assert threads is not None
    assert threads.source is Source.INFERRED
    assert kept_seconds(build_profile(eight), _no_dataset("mlp"), 60.0) == 0.0
    # the rules' count, after autotune ran: not "run autotune to measure"
    workers = profile.decision("dataloader.num_workers")
    assert workers is not None
    assert workers.reason.endswith(
        "2 worker(s), the rest for compute (a heuristic: the workload tuned had no dataset to "
        "measure them on)"
    )


def test_the_phase_keeps_time_for_the_threads_only_where_it_measures_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    cpu, gpu = build_profile(two_cpus()), build_profile(recorded("h100-80gb-hbm3"))
    mlp = resolve_workload("mlp")
    assert kept_seconds(cpu, _no_dataset("mlp"), 60.0) == pytest.approx(9.0)
    assert kept_seconds(cpu, _no_dataset("mlp"), 600.0) == workers_phase.OWN_THREADS_MAX_S
    assert kept_seconds(gpu, _no_dataset("mlp"), 60.0) == 0.0
    assert kept_seconds(cpu, mlp, 60.0) == workers_phase.workers_seconds("cpu", 60.0)
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 1)
    assert kept_seconds(cpu, _no_dataset("mlp"), 60.0) == 0.0


def test_at_the_threads_chosen_a_larger_batch_the_search_ran_that_trains_faster_is_recommended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a tiny LM on 2 busy cores: the points, at torch's 2 threads, chose batch 2, which
    # trained at 61 samples/s at 1 thread, where 32 ran 117. Here the points at 256 and 512
    # are noisy, so they choose 128; at 1 thread, many times faster, larger batches are faster
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    machine = tiny_mlp_on_two_busy_cores()
    machine.noise.update({512: 0.3, 256: 0.3})
    profile = tune_on(machine, _no_dataset("mlp"), two_cpus(), budget_s=60)
    evidence = profile.evidence
    assert evidence is not None
    points = evidence.fed[0].batch_size
    batch = profile.settings.batch.batch_size
    assert batch is not None
    assert profile.settings.cpu_threads == 1
    assert points < batch <= evidence.max_batch_size  # a size the search ran
    at_one = {r.batch_size: r.samples_per_s or 0.0 for r in evidence.fed if r.cpu_threads == 1}
    assert at_one[batch] > at_one[points] * (1 + FED_WITHIN)
    decision = profile.decision("batch.batch_size")
    assert decision is not None
    sizes = sorted(at_one)
    listed = f"batches {', '.join(map(str, sizes[:-1]))} and {sizes[-1]}"
    assert f"(cpu_threads), where {listed} ran, so the batch is the smallest" in decision.reason
    assert f"{listed} ran at 1 thread" in summary(profile)
    assert disagreements(profile) == []
    # the checker reads the sizes the summary says ran: one that did not is found
    said = f"batches {points} and {2 * evidence.max_batch_size} ran at 1 thread"
    with monkeypatch.context() as patch:
        patch.setattr(results, "_sizes_at", lambda _profile, _evidence: said)
        found = disagreements(profile)
    assert any(f"the summary says {said}:" in d for d in found), found
