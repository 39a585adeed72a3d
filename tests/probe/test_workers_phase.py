"""The workers phase: which worker counts it measures (the recorded machine's CPUs, never more
than this process may run on: the workers start here), the time it keeps, and whole runs on
simulated machines where loading limits training, or does not."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from tests.probe.fake_trials import cpu_machine, recorded, tiny_mlp_on_two_busy_cores, tune_on
from tests.rules.helpers import snapshot, two_cpus, with_host
from tests.test_claims import disagreements
from torch_autotune.probe import workers_phase
from torch_autotune.probe.budget import Budget
from torch_autotune.probe.fed import FED_WITHIN, FedTrial
from torch_autotune.probe.loader import LoaderTrial
from torch_autotune.probe.simulated import SimulatedMachine
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.workloads import resolve_workload
from torch_autotune.profile import Evidence, Source
from torch_autotune.render.results import render_run
from torch_autotune.rules.engine import build_profile


@pytest.mark.parametrize(
    ("recorded", "here", "expected"),
    [
        (16, 2, 2),  # a CPU profile measures all the CPUs: 16 on the laptop, 2 on this box
        (16, 64, 16),
        (4, 64, 4),
        (16, None, 16),  # no affinity to read: the recorded machine's own count
    ],
)
def test_a_cpu_profile_measures_at_most_the_cpus_this_process_has(
    monkeypatch: pytest.MonkeyPatch, recorded: int, here: int | None, expected: int
) -> None:
    machine = with_host("cpu-laptop-linux", cpus_usable=recorded)
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: here)
    profile = build_profile(machine)
    assert profile.device == "cpu"
    assert workers_phase._max_workers(profile) == expected


def test_a_gpu_profile_shares_the_cpus_among_its_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = snapshot("a100-sxm4-80gb-8x")
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 10_000)
    profile = build_profile(machine)
    gpus = len(machine.accelerators)
    assert workers_phase._max_workers(profile) == machine.host.cpus_usable // gpus
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    assert workers_phase._max_workers(profile) == 1


def test_this_process_has_at_least_one_cpu() -> None:
    assert (workers_phase._process_cpus() or 1) >= 1


# --- the budget and the sizes ----------------------------------------------------------------


def test_a_cpu_run_keeps_more_time_for_the_workers_than_a_gpu_run() -> None:
    assert workers_phase.workers_seconds("cuda", 120.0) == pytest.approx(12.0)
    assert workers_phase.workers_seconds("cuda", 600.0) == workers_phase.WORKERS_MAX_S
    assert workers_phase.workers_seconds("cpu", 120.0) == pytest.approx(24.0)
    assert workers_phase.workers_seconds("cpu", 600.0) == workers_phase.CPU_WORKERS_MAX_S


@pytest.mark.parametrize(
    ("batch", "multiple", "floor", "expected"),
    [
        (512, 1, 1, (256, 128, 64)),
        (100, 8, 1, (48, 24, 8)),  # rounded down to Tensor-Core multiples
        (64, 1, 16, (32, 16)),  # never below the smallest batch the model trains at
        (1, 1, 1, ()),
        (3, 1, 1, (1,)),
    ],
)
def test_the_smaller_sizes_fed_are_halvings_above_the_floor(
    batch: int, multiple: int, floor: int, expected: tuple[int, ...]
) -> None:
    assert workers_phase.halvings(batch, multiple, floor) == expected


# --- whole runs on simulated machines --------------------------------------------------------

TWO_CPUS = two_cpus()


def _data_bound_cpu() -> SimulatedMachine:
    """This 2-core CPU, a small conv net (~4,000 samples/s at large batches) and a dataset of
    4 ms of CPU a sample (250 samples/s a core), as in the defect: workers and the step share
    the two cores."""
    return cpu_machine(first_s=0.3, autotune_s=0.0, load_s=0.004, shares_cpus=True, host_cpus=2)


def test_data_bound_on_two_cpus_the_plain_two_workers_are_fed_and_chosen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The defect: 0 workers chosen after trying 0 and 1, 0.51x a plain 2-worker loop."""
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    machine = _data_bound_cpu()
    profile = tune_on(machine, "conv", TWO_CPUS, budget_s=120)
    evidence = profile.evidence
    assert evidence is not None
    assert [r.num_workers for r in evidence.loader] == [0, 1, 2]  # up to the usable CPUs
    assert (evidence.fed[0].batch_size, evidence.fed[0].num_workers) == (512, 2)
    assert profile.settings.dataloader.num_workers == 2
    best = max(r.samples_per_s or 0.0 for r in evidence.fed)
    chosen = next(
        r
        for r in evidence.fed
        if (r.batch_size, r.num_workers) == (evidence.batch_size, 2) and r.samples_per_s
    )
    assert chosen.samples_per_s is not None
    assert chosen.samples_per_s >= best * (1 - FED_WITHIN)
    # 2 workers beside the step: the rules' one thread, as the pass trained with
    assert chosen.cpu_threads == profile.settings.cpu_threads == 1
    # loading limits training: 256 trains within 2% of 512 (438 against 443), 128 does not
    assert profile.settings.batch.batch_size == evidence.batch_size == 256
    assert evidence.fastest_batch_size == 512
    batch = profile.decision("batch.batch_size")
    assert batch is not None
    assert batch.reason.startswith("256: training fed by the DataLoader runs below the step")
    workers = profile.decision("dataloader.num_workers")
    assert workers is not None
    assert workers.source is Source.MEASURED
    assert "2 worker(s): training fed by the DataLoader ran at 443 samples/s" in workers.reason
    assert evidence.elapsed_s <= evidence.budget_s
    console = Console(record=True, width=120)
    render_run(profile, console, None)  # the summary shows the passes that decided
    summary = console.export_text()
    assert "Training fed by the DataLoader" in summary
    assert re.search(r"256 +2 +1 +438\.\d +recommended", summary)
    # the batch's facts say the fed passes chose it, and the summary no more than that
    choice = evidence.batch_choice
    assert choice is not None
    assert choice.fed
    assert choice.confirmed == "its fed pass"
    assert "256 (training fed by the DataLoader ran below the step alone: the smallest" in summary
    assert "ran again" not in summary


def test_a_gpu_whose_loader_keeps_ahead_is_not_fed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 64)
    machine = SimulatedMachine(load_s=0.0005, host_cpus=64)  # 2,000 samples/s a worker
    profile = tune_on(machine, "conv", recorded("h100-80gb-hbm3"), mode="balanced", budget_s=120)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.fed == ()
    assert not [line for line in machine.log if line.startswith("fed")]
    assert "keeps 10% ahead of the training step" in (evidence.workers_reason or "")


def test_a_gpu_whose_main_process_loads_5x_the_step_gets_a_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The defect: 0 workers at 20,000 samples/s kept "10% ahead" of a step of 4,009, but the
    main process loads in series with the step: fed, 0 trained at 3,340 (0.83x), 1 worker at
    the step's own 4,009."""
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 64)
    machine = SimulatedMachine(load_s=0.00005, host_cpus=64)  # 20,000 samples/s a worker
    profile = tune_on(machine, "conv", recorded("h100-80gb-hbm3"), mode="balanced", budget_s=120)
    evidence = profile.evidence
    assert evidence is not None
    batch = profile.settings.batch.batch_size
    step = batch / machine.step_s(batch, compiled=False)
    assert machine.loader_rate(0) > 4 * step  # the main process alone loads 5x the step
    assert profile.settings.dataloader.num_workers == 1
    fed = machine.fed_rate(batch, 1, None, compiled=False)
    assert fed >= step * (1 - FED_WITHIN)
    assert machine.fed_rate(batch, 0, None, compiled=False) < step * 0.9
    assert evidence.fed == ()  # a worker loads beside the step: the loader alone decides
    assert "keeps 10% ahead of the training step" in (evidence.workers_reason or "")


def test_a_cpu_whose_main_process_loads_40x_the_step_feeds_the_plain_alternative(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As this CPU's README run: 0 workers loaded 43x the step (17,038 samples/s against 393)
    and was chosen from the loader alone; 2.3% of the time went to loading, and the plain
    alternative, 2 workers, was never measured. Now the passes fed by the DataLoader decide."""
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    machine = cpu_machine(first_s=0.3, autotune_s=0.0, load_s=6e-6, shares_cpus=True, host_cpus=2)
    profile = tune_on(machine, "conv", TWO_CPUS, budget_s=120)
    evidence = profile.evidence
    assert evidence is not None
    batch = evidence.fastest_batch_size
    step = batch / machine.step_s(batch, compiled=False)
    assert 30 * step < machine.loader_rate(0) < 49 * step
    assert [r.num_workers for r in evidence.fed][:2] == [2, 0]  # the plain alternative first
    assert profile.settings.dataloader.num_workers == 0  # fed, it trains fastest
    workers = profile.decision("dataloader.num_workers")
    assert workers is not None
    assert "training fed by the DataLoader ran at" in workers.reason


def test_a_main_process_that_loads_70x_the_step_keeps_ahead_and_a_cpu_feeds_its_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loader alone keeps ahead with 0 workers (1.1% of the time in series), so no other
    count loads; on a CPU the step's threads are still fed: the plain alternative, 0 at
    torch's 2 threads and at 1, where 2 threads stay (twice as fast)."""
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    machine = cpu_machine(first_s=0.3, autotune_s=0.0, load_s=3e-6, shares_cpus=True, host_cpus=2)
    profile = tune_on(machine, "conv", TWO_CPUS, budget_s=120)
    evidence = profile.evidence
    assert evidence is not None
    assert [r.num_workers for r in evidence.loader] == [0]
    fed = [(r.num_workers, r.cpu_threads, r.round) for r in evidence.fed]
    assert fed == [(2, 1, 1), (0, None, 1), (0, 1, 1), (0, None, 2), (2, 1, 2)]
    assert profile.settings.dataloader.num_workers == 0
    assert profile.settings.cpu_threads is None
    threads = profile.decision("cpu_threads")
    assert threads is not None
    assert threads.source is Source.MEASURED
    assert threads.reason.startswith("torch's default (2 threads), the rules' count: no fewer fed")
    assert "in series with the training step's" in (evidence.workers_reason or "")
    assert re.search(r"takes 1\.\d% of training's time, at most 2%", evidence.workers_reason or "")


def test_a_tiny_model_on_a_cpu_trains_at_the_threads_fed_fastest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tiny MLP on 2 busy cores: torch's 2 threads cost more to synchronise than the work
    they split, and taking a batch from a worker costs more than its step. 0 workers at 1
    thread feeds training fastest; the profile sets it, measured, and the bench's knob sees it
    (the profile's threads differ from a plain loop's)."""
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    machine = tiny_mlp_on_two_busy_cores(load_s=2e-6, receive_s=4e-6)
    profile = tune_on(machine, "mlp", TWO_CPUS, budget_s=60)
    evidence = profile.evidence
    assert evidence is not None
    first = evidence.fed[0].batch_size  # every count and thread count was fed at this batch
    fed = {
        (r.num_workers, r.cpu_threads): r.samples_per_s
        for r in evidence.fed
        if r.batch_size == first
    }
    assert fed[(0, 1)] > 1.3 * fed[(0, None)]  # as simulated: 132,231 against 93,979
    assert fed[(0, 1)] > 1.2 * fed[(2, 1)]  # the plain alternative: 104,575
    assert profile.settings.dataloader.num_workers == 0
    assert profile.settings.cpu_threads == 1
    assert profile.settings.environment.get("OMP_NUM_THREADS") == "1"
    threads = profile.decision("cpu_threads")
    assert threads is not None
    assert threads.source is Source.MEASURED
    assert threads.reason.startswith("1 thread: training fed by 0 worker(s) at batch")
    workers = profile.decision("dataloader.num_workers")
    assert workers is not None  # the loader alone compared with the points' rate, and says so
    assert "timed at torch's default 2 threads; the profile trains at 1 thread" in workers.reason
    console = Console(record=True, width=120)
    render_run(profile, console, None)  # one pass recommended: 0 workers at 1 thread
    fed_table = console.export_text().split("Training fed by the DataLoader")[1]
    assert re.findall(r"\n +\d+ +(\d+) +(\S+) +[\d.]+ +recommended", fed_table) == [("0", "1")]
    # it left the plain 2 workers: both ran again, in the reverse order, and bore it out
    again = re.findall(r"\n +\d+ +(\d+) +(\S+) +[\d.]+ +second round", fed_table)
    assert again == [("0", "1"), ("2", "1")]
    assert "a second round, in the reverse order, bore out 0 worker(s) at 1 thread" in (
        evidence.workers_reason or ""
    )


def _slow_step_cpu() -> SimulatedMachine:
    """2 cores, a step of 0.5 s at any batch and 4 ms of loading a sample: short budgets."""
    return cpu_machine(
        first_s=0.3, autotune_s=0.0, load_s=0.004, shares_cpus=True, host_cpus=2, fixed_s=0.5
    )


def test_a_cpu_without_time_to_feed_training_keeps_0_workers_where_it_loads_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """0 workers loads 250 samples/s against a step of 15.9: not ahead in series (6%), 1 worker
    is; on a CPU only training fed by the DataLoader tells whether the core the worker takes
    costs more, and with no time for it, 0 stays (fed: 0 trains at 15.0, 1 at about 8)."""
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    machine = _slow_step_cpu()
    profile = tune_on(machine, "conv", TWO_CPUS, budget_s=5)
    evidence = profile.evidence
    assert evidence is not None
    assert [r.num_workers for r in evidence.loader] == [0, 1]
    assert evidence.fed == ()
    assert profile.settings.dataloader.num_workers == 0
    batch = profile.settings.batch.batch_size
    zero = machine.fed_rate(batch, 0, None, compiled=False)
    assert zero > machine.fed_rate(batch, 1, 1, compiled=False)
    reason = evidence.workers_reason or ""
    assert reason.startswith("0 worker(s): on a CPU workers take cores from the training step")
    assert "takes 6.0% of training's time, in series with the step" in reason
    assert "The DataLoader alone, measured first: 1 worker(s) at 250 samples/s" in reason


def test_workers_left_unmeasured_for_want_of_time_are_said_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    profile = tune_on(_slow_step_cpu(), "conv", TWO_CPUS, budget_s=3)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.loader == ()
    (said,) = [w for w in evidence.warnings if w.startswith("the DataLoader's workers were not")]
    assert re.search(
        r"not measured: their measurement \(\d+\.\d s kept for it by the earlier phases, 0\.0 s "
        r"of the run left, none of them kept for later phases\) did not fit",
        said,
    ), said
    workers = profile.decision("dataloader.num_workers")
    assert workers is not None
    assert workers.source is Source.INFERRED
    assert workers.reason.endswith(
        "autotune ran out of time before measuring them (--budget gives it more)"
    )


def test_a_cpu_whose_threads_pass_did_not_fit_warns_that_they_were_not_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As a small LM on 2 busy cores with 30 s: 0 workers loaded far ahead of a slow step, so
    on a CPU only the passes fed by the DataLoader measure the threads, and none fit in the
    time left. The workers' reason said so; the threads were left to torch, and no warning
    said they were not measured (the run without a dataset warns)."""
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    machine = cpu_machine(
        first_s=0.3, autotune_s=0.0, load_s=3e-6, shares_cpus=True, host_cpus=2, fixed_s=0.5
    )
    profile = tune_on(machine, "conv", TWO_CPUS, budget_s=8)
    evidence = profile.evidence
    assert evidence is not None
    assert [r.num_workers for r in evidence.loader] == [0]
    assert evidence.fed == ()
    assert "Training fed by the DataLoader was not measured: no pass fit" in (
        evidence.workers_reason or ""
    )
    (said,) = [w for w in evidence.warnings if w.startswith("the CPU threads were not measured")]
    assert re.search(
        r"by the DataLoader\): a pass of training fed by 2 worker\(s\) at batch \d+ \(\d+\.\d s "
        r"predicted, \d+\.\d s of the run left, none of them kept for later phases\) did not fit, "
        r"so the rules chose them; more time \(--budget\) measures them",
        said,
    ), said
    threads = profile.decision("cpu_threads")
    assert threads is not None
    assert threads.source is not Source.MEASURED
    assert disagreements(profile) == []


def test_a_pass_that_did_not_fit_is_recorded_once_where_the_reason_and_warning_name_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The count kept (the usable CPUs, not reached) and the threads' warning both name the
    pass that did not fit: one skip on the budget, with the same numbers in both."""
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    runner = _SlowLoader({0: 21.0, 1: 250.0, 2: 480.0}, load_s=12.0)
    budget = Budget(10.0, runner.clock, started=0.0)
    outcome = workers_phase.measure_workers(
        workload=resolve_workload("conv"),
        profile=build_profile(TWO_CPUS),
        runner=runner,  # type: ignore[arg-type]
        batch_size=64,
        step_rates={64: 2000.0},
        budget=budget,
        progress=lambda _phase, _what: None,
        threads_for=lambda workers: None if workers == 0 else 1,
    )
    assert outcome.num_workers == 2
    (skip,) = budget.skipped
    assert skip.words() in (outcome.reason or "")
    assert outcome.warning is not None
    assert f": {skip.words()} did not fit, so the rules chose them" in outcome.warning


def test_a_data_bound_gpu_feeds_its_share_of_the_cpus_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 64)
    h100 = recorded("h100-80gb-hbm3")
    # 50 samples/s a worker: far behind the GPU
    machine = SimulatedMachine(load_s=0.02, host_cpus=64)
    profile = tune_on(machine, "conv", h100, mode="balanced", budget_s=180)
    evidence = profile.evidence
    assert evidence is not None
    most = min(h100.host.cpus_usable, 64)
    assert evidence.fed[0].num_workers == most
    assert profile.settings.dataloader.num_workers == most
    assert evidence.batch_size in evidence.ran()
    assert evidence.elapsed_s <= evidence.budget_s


# --- the evidence ------------------------------------------------------------------------------


def _evidence(**fields: object) -> Evidence:
    return Evidence.model_validate(
        {
            "workload": "conv",
            "device": "cpu",
            "max_batch_size": 512,
            "fastest_batch_size": 512,
            "batch_size": 512,
            "limited_by": "cap",
            "search": [
                {
                    "batch_size": 512,
                    "fits": True,
                    "peak_memory_bytes": None,
                    "seconds": 1.0,
                    "step": "start",
                }
            ],
            "throughput": [],
            "budget_s": 120,
            "elapsed_s": 60,
            **fields,
        }
    )


def test_evidence_written_before_the_fed_passes_still_loads() -> None:
    evidence = _evidence()
    assert evidence.fed == ()
    assert evidence.fed_reason is None


def test_a_batch_that_trained_fed_by_the_dataloader_ran_and_a_failed_pass_did_not() -> None:
    fed = [
        {"num_workers": 2, "batch_size": 128, "cpu_threads": 1, "samples_per_s": 410.0},
        {"num_workers": 2, "batch_size": 64, "samples_per_s": None, "error": "worker crashed"},
    ]
    ran = _evidence(fed=fed).ran()
    assert 128 in ran
    assert 64 not in ran


class _SlowLoader:
    """A runner whose DataLoader alone takes ``load_s`` of the clock a count, at ``rates``."""

    settings = StepSettings()

    def __init__(self, rates: dict[int, float], load_s: float) -> None:
        self.rates = rates
        self.load_s = load_s
        self.now = 0.0
        self.fed_calls: list[int] = []

    def clock(self) -> float:
        return self.now

    def load(
        self, num_workers: int, batch_size: int, *, batches: int, timeout_s: float, seconds: float
    ) -> LoaderTrial:
        self.now += self.load_s
        rate = self.rates[num_workers]
        return LoaderTrial(num_workers, rate, batches, batches * batch_size, self.load_s)

    def fed(
        self, batch_size: int, num_workers: int, threads: int | None, *, seconds: float
    ) -> FedTrial:
        self.fed_calls.append(num_workers)
        self.now += 5.0
        rate = 0.8 * self.rates[num_workers]  # the step takes a share of the CPUs
        return FedTrial(batch_size, num_workers, threads, rate, 5.0)


def _phase(runner: _SlowLoader, budget_s: float) -> workers_phase.WorkersOutcome:
    return workers_phase.measure_workers(
        workload=resolve_workload("conv"),
        profile=build_profile(TWO_CPUS),
        runner=runner,  # type: ignore[arg-type]
        batch_size=64,
        step_rates={64: 2000.0},
        budget=Budget(budget_s, runner.clock, started=0.0),
        progress=lambda _phase, _what: None,
        threads_for=lambda workers: None if workers == 0 else 1,  # G6 on 2 CPUs
    )


def test_out_of_time_before_the_plain_alternative_it_is_chosen_and_said_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Loading limits training (21 samples/s against a step of 2,000) and the budget ran out
    after 0 workers alone: 0 is not recommended on that, the usable CPUs are, with why."""
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    runner = _SlowLoader({0: 21.0, 1: 250.0, 2: 480.0}, load_s=12.0)
    outcome = _phase(runner, budget_s=10.0)
    assert [r.num_workers for r in outcome.loader] == [0]
    assert runner.fed_calls == []
    assert outcome.num_workers == 2
    assert outcome.reason is not None
    assert "not measured for want of time (a pass of training fed by 2" in outcome.reason
    assert "did not fit; give autotune more with --budget)" in outcome.reason


def test_with_time_the_plain_alternative_is_fed_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    runner = _SlowLoader({0: 21.0, 1: 250.0, 2: 480.0}, load_s=1.0)
    outcome = _phase(runner, budget_s=60.0)
    assert [r.num_workers for r in outcome.loader] == [0, 1, 2]
    assert runner.fed_calls == [2]  # 1 and 0 load slower alone than 2 trains fed (384)
    assert outcome.num_workers == 2
    assert outcome.reason is not None
    assert outcome.reason.startswith("2 worker(s): training fed by the DataLoader ran at 384")


def test_where_no_point_ran_the_step_rate_is_the_searchs_fastest_step() -> None:
    """A slow step (1.2 s at any batch) left no time for a throughput point: the fed passes
    compare with the step the search and the confirmation timed, not with nothing (batch 1
    was recommended, from one pass, where batch 8 had trained 8x faster)."""
    from torch_autotune.evidence import SearchTrialRecord, ThroughputRecord

    def trial(batch: int, step_s: float | None, *, fits: bool = True, variant: str = "eager"):
        return SearchTrialRecord(
            batch_size=batch,
            fits=fits,
            peak_memory_bytes=None,
            seconds=None,
            step="verify",
            step_s=step_s,
            variant=variant,
        )

    trials = [
        trial(1, 1.2),
        trial(8, 1.25),
        trial(8, 1.19),  # the confirmation: the faster of the two
        trial(16, None, fits=False),
        trial(4, 0.1, variant="compiled"),  # another variant's
    ]
    assert workers_phase.step_rates([], trials, "eager") == pytest.approx({1: 1 / 1.2, 8: 8 / 1.19})
    point = ThroughputRecord.model_construct(batch_size=8, samples_per_s=7.0, variant="eager")
    assert workers_phase.step_rates([point], trials, "eager")[8] == 7.0  # a point wins


def test_passes_left_out_for_time_are_said_with_their_numbers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first pass that did not fit is named with its prediction and the time left."""
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    runner = _SlowLoader({0: 21.0, 1: 250.0, 2: 480.0}, load_s=12.0)
    outcome = _phase(runner, budget_s=10.0)
    assert outcome.reason is not None
    assert re.search(
        r"want of time \(a pass of training fed by 2 worker\(s\) at batch 64 \(\d+\.\d s "
        r"predicted, 0\.0 s of the run left, none of them kept for later phases\) did not fit;",
        outcome.reason,
    ), outcome.reason


class _FailingFed(_SlowLoader):
    """Every pass fed by the DataLoader fails (a worker killed), in no time at all."""

    def fed(
        self, batch_size: int, num_workers: int, threads: int | None, *, seconds: float
    ) -> FedTrial:
        self.fed_calls.append(num_workers)
        self.now += 5.0
        killed = "RuntimeError: DataLoader worker (pid 7) is killed by signal: Killed."
        return FedTrial(batch_size, num_workers, threads, None, 5.0, killed)


def test_where_every_fed_pass_failed_the_reason_says_so_not_that_time_ran_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """0 workers keep ahead in the main process on 2 CPUs, and every pass fed by the
    DataLoader failed with 43 s of 60 left: it said 'not measured for want of time (a pass
    ... (2.1 s predicted, 43.0 s of the run left ...) did not fit'."""
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    runner = _FailingFed({0: 30000.0, 1: 20000.0, 2: 40000.0}, load_s=1.0)
    budget = Budget(60.0, runner.clock, started=0.0)
    outcome = workers_phase.measure_workers(
        workload=resolve_workload("conv"),
        profile=build_profile(TWO_CPUS),
        runner=runner,  # type: ignore[arg-type]
        batch_size=64,
        step_rates={64: 2000.0},
        budget=budget,
        progress=lambda _phase, _what: None,
        threads_for=lambda workers: None if workers == 0 else 1,
    )
    assert runner.fed_calls
    assert outcome.num_workers == 0
    assert outcome.reason is not None
    assert outcome.reason.startswith(
        "0 worker(s): on a CPU workers take cores from the training step, and training fed by"
        " the DataLoader was not measured: every pass of it failed (below); in the main process"
    )
    assert "for want of time" not in outcome.reason
    assert "every pass failed (2: RuntimeError: DataLoader worker (pid 7)" in outcome.reason
    assert not budget.skipped  # nothing was left out for time
    assert outcome.warning is None  # the threads' passes ran: not for want of time
