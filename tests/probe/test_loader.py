"""DataLoader worker measurement: real loaders with real worker processes on this CPU, and the
search logic against fake measurements.

The datasets are module-level classes so that workers can unpickle them under spawn too.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from torch_autotune.errors import WorkloadError, raised_by_user_code
from torch_autotune.probe.loader import (
    LoaderTrial,
    loader_kwargs,
    measure_loader,
    worker_deaths_between_batches,
    worker_failure,
)
from torch_autotune.probe.workers import (
    Measure,
    choose_workers,
    search_workers,
    worker_candidates,
)

TIMEOUT_S = 5.0  # per batch; worker start-up by fork takes well under a second here
DEATH_TIMEOUT_S = 2.0  # a killed worker is reported once the wait for its batch times out


class Tiny(Dataset[torch.Tensor]):
    """32 items of 4 floats, item i filled with i."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((4,), float(index))


class KillsItsWorker(Tiny):
    """Kills the worker process that loads it (SIGKILL, like the kernel's OOM killer)."""

    def __getitem__(self, index: int) -> torch.Tensor:
        if get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


class HangsInWorker(Tiny):
    """Sleeps 1.5 s on a worker's first item, far past a 0.3 s timeout; instant in the main
    process. (Once per worker, whose copy of the dataset remembers it, so shutting the
    timed-out worker down is quick.)"""

    slept = False

    def __getitem__(self, index: int) -> torch.Tensor:
        if get_worker_info() is not None and not self.slept:
            self.slept = True
            time.sleep(1.5)
        return super().__getitem__(index)


class Buggy(Tiny):
    """A user's bug: every item raises ValueError."""

    def __getitem__(self, index: int) -> torch.Tensor:
        raise ValueError(f"bad item {index}")


class BuggyRuntime(Tiny):
    """A user's bug that raises RuntimeError, which must not pass for a worker crash."""

    def __getitem__(self, index: int) -> torch.Tensor:
        raise RuntimeError("shape mismatch in item")


class Stream(IterableDataset[torch.Tensor]):
    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter([torch.zeros(1)])


@pytest.fixture(autouse=True)
def _no_worker_left() -> Iterator[None]:
    """Every test leaves no DataLoader worker process behind."""
    yield
    assert multiprocessing.active_children() == []


def _measure(dataset: Dataset[torch.Tensor], num_workers: int, **kwargs: object) -> LoaderTrial:
    options: dict[str, object] = {"batch_size": 4, "batches": 3, "timeout_s": TIMEOUT_S}
    options.update(kwargs)
    return measure_loader(dataset, num_workers=num_workers, **options)  # type: ignore[arg-type]


# --- measure_loader on real DataLoaders -----------------------------------------------------


@pytest.mark.parametrize(("num_workers", "timed"), [(0, 3), (1, 3), (2, 4)])
def test_measures_a_positive_rate_over_whole_rounds_of_batches(
    num_workers: int, timed: int
) -> None:
    trial = _measure(Tiny(), num_workers)  # 3 batches asked, rounded up to whole rounds
    assert trial.ok
    assert trial.error is None
    assert trial.samples_per_s is not None
    assert trial.samples_per_s > 0
    assert (trial.batches, trial.samples) == (timed, 4 * timed)  # the warm-up round apart
    assert trial.startup_s is not None
    assert trial.startup_s >= 0
    assert trial.seconds > 0


def test_persistent_workers_and_prefetch_are_passed_with_workers() -> None:
    trial = _measure(Tiny(), 1, persistent_workers=True, prefetch_factor=4)
    assert trial.ok


def test_profile_options_are_dropped_where_torch_refuses_them_with_zero_workers() -> None:
    trial = _measure(Tiny(), 0, persistent_workers=True, prefetch_factor=4)
    assert trial.ok


def test_a_short_dataset_is_cycled_to_fill_the_batches() -> None:
    class Five(Tiny):
        def __len__(self) -> int:
            return 5

    trial = _measure(Five(), 0, batch_size=4, batches=6)
    assert (trial.batches, trial.samples) == (6, 24)


class Counting(Tiny):
    """Counts the items loaded in this process."""

    def __init__(self) -> None:
        self.loaded = 0

    def __getitem__(self, index: int) -> torch.Tensor:
        self.loaded += 1
        return super().__getitem__(index)


def test_without_workers_only_the_warm_up_and_timed_batches_are_loaded() -> None:
    dataset = Counting()
    _measure(dataset, 0, persistent_workers=True, prefetch_factor=4)
    assert dataset.loaded == 4 * (1 + 3)  # batch_size 4: one warm-up batch, 3 timed


def test_the_rate_comes_from_the_injected_clock() -> None:
    times = iter([10.0, 10.5, 12.5])  # start, first batch, end
    trial = _measure(Tiny(), 0, clock=lambda: next(times))
    assert trial.startup_s == pytest.approx(0.5)
    assert trial.seconds == pytest.approx(2.0)
    assert trial.samples_per_s == pytest.approx(12 / 2.0)


def test_a_clock_that_did_not_move_fails_the_candidate_instead_of_an_infinite_rate() -> None:
    trial = _measure(Tiny(), 0, clock=lambda: 7.0)
    assert not trial.ok
    assert trial.error == "no time measured: the clock did not move"


def test_a_worker_death_is_reported_between_batches_not_inside_torchs_queue_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch's SIGCHLD handler raised wherever the main thread was: once inside
    ``Queue.put`` with its lock taken, and shutting the workers down then waited forever."""
    from torch.utils.data._utils import signal_handling

    def a_worker_died() -> None:
        raise RuntimeError("DataLoader worker (pid 1234) is killed by signal: Killed.")

    monkeypatch.setattr(signal_handling, "_error_if_any_worker_fails", a_worker_died)
    with worker_deaths_between_batches() as check:
        os.kill(os.getpid(), signal.SIGCHLD)
        time.sleep(0.05)  # the handler has run: a held death raises nothing here
        with pytest.raises(RuntimeError, match="is killed by signal"):
            check()
        check()  # reported once


def test_torchs_sigchld_handler_is_back_afterwards() -> None:
    with worker_deaths_between_batches():
        held = signal.getsignal(signal.SIGCHLD)
    after = signal.getsignal(signal.SIGCHLD)
    assert held is not after
    assert callable(after)
    assert after.__module__ == "torch.utils.data._utils.signal_handling"  # type: ignore[union-attr]


@pytest.mark.slow  # the death is seen when the wait for the dead worker's batch times out
def test_a_killed_worker_fails_its_candidate() -> None:
    trial = _measure(KillsItsWorker(), 1, timeout_s=DEATH_TIMEOUT_S)
    assert not trial.ok
    assert trial.samples_per_s is None
    assert trial.error is not None
    assert trial.error.startswith("worker crashed: DataLoader worker (pid")


@pytest.mark.slow  # as above, once for each of the two counts with workers
def test_a_killed_worker_fails_only_its_candidate() -> None:
    choice = choose_workers(
        KillsItsWorker(), batch_size=4, max_workers=2, batches=3, timeout_s=DEATH_TIMEOUT_S
    )
    assert choice.num_workers == 0
    assert [t.num_workers for t in choice.trials] == [0, 1, 2]
    assert [t.ok for t in choice.trials] == [True, False, False]
    assert "worker crashed" in choice.reason


@pytest.mark.slow  # waits out a real DataLoader timeout
def test_a_hung_worker_fails_its_candidate_by_timeout_not_the_run() -> None:
    started = time.perf_counter()
    choice = choose_workers(HangsInWorker(), batch_size=4, max_workers=1, batches=3, timeout_s=0.3)
    assert time.perf_counter() - started < 5.0
    assert choice.num_workers == 0
    hung = choice.trials[1]
    assert (hung.num_workers, hung.ok) == (1, False)
    assert hung.error is not None
    assert hung.error.startswith("timed out after 0.3 s")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_datasets_own_error_propagates(num_workers: int) -> None:
    # With workers torch re-raises the worker's exception here with its own type, its message
    # prefixed "Caught ValueError in DataLoader worker process 0."
    with pytest.raises(ValueError, match="bad item") as caught:
        _measure(Buggy(), num_workers)
    assert raised_by_user_code(caught.value)  # the command says: fix your data (exit 5)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_runtime_error_of_the_dataset_is_not_taken_for_a_crash(num_workers: int) -> None:
    with pytest.raises(RuntimeError, match="shape mismatch"):
        _measure(BuggyRuntime(), num_workers)


def test_choose_workers_on_windows_keeps_zero_unless_told() -> None:
    choice = choose_workers(
        Tiny(), batch_size=4, max_workers=2, batches=2, timeout_s=TIMEOUT_S, platform="win32"
    )
    assert [t.num_workers for t in choice.trials] == [0]
    assert choice.num_workers == 0
    assert "Windows" in choice.reason


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"batch_size": 0}, ValueError),
        ({"batches": 0}, ValueError),
        ({"timeout_s": 0.0}, ValueError),
    ],
)
def test_unusable_arguments_are_refused(kwargs: dict[str, object], error: type) -> None:
    with pytest.raises(error):
        _measure(Tiny(), 0, **kwargs)


def test_an_empty_or_iterable_dataset_is_refused() -> None:
    class Empty(Tiny):
        def __len__(self) -> int:
            return 0

    with pytest.raises(ValueError, match="empty"):
        _measure(Empty(), 0)
    with pytest.raises(TypeError, match="map-style"):
        _measure(Stream(), 0)


# --- pure pieces ----------------------------------------------------------------------------


def test_loader_kwargs_leave_out_what_torch_refuses_with_zero_workers() -> None:
    kwargs = functools.partial(
        loader_kwargs, batch_size=8, pin_memory=False, persistent_workers=True, timeout_s=3.0
    )
    assert kwargs(num_workers=0, prefetch_factor=4) == {
        "batch_size": 8,
        "num_workers": 0,
        "pin_memory": False,
    }
    assert kwargs(num_workers=2, prefetch_factor=4) == {
        "batch_size": 8,
        "num_workers": 2,
        "pin_memory": False,
        "persistent_workers": True,
        "timeout": 3.0,
        "prefetch_factor": 4,
    }
    assert "prefetch_factor" not in kwargs(num_workers=2, prefetch_factor=None)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "DataLoader worker (pid 123) is killed by signal: Killed. ",
            "worker crashed: DataLoader worker (pid 123) is killed by signal: Killed.",
        ),
        (
            "DataLoader worker (pid(s) 7, 8) exited unexpectedly",
            "worker crashed: DataLoader worker (pid(s) 7, 8) exited unexpectedly",
        ),
        (
            "DataLoader timed out after 20 seconds",
            "timed out after 20 s: no batch arrived (a worker hung or is slow)",
        ),
        ("Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback", None),
        ("CUDA error: out of memory", None),
        ("", None),
    ],
)
def test_worker_failures_are_told_from_other_runtime_errors(
    message: str, expected: str | None
) -> None:
    assert worker_failure(RuntimeError(message)) == expected


@pytest.mark.parametrize(
    ("max_workers", "expected"),
    [
        (-3, (0,)),
        (0, (0,)),
        (1, (0, 1)),
        (2, (0, 1, 2)),
        (3, (0, 1, 2, 3)),
        (5, (0, 1, 2, 4, 5)),
        (8, (0, 1, 2, 4, 8)),
        (12, (0, 1, 2, 4, 8, 12)),
    ],
)
def test_candidates_are_zero_then_powers_of_two_then_the_maximum(
    max_workers: int, expected: tuple[int, ...]
) -> None:
    assert worker_candidates(max_workers) == expected


# --- the search with fake measurements ------------------------------------------------------


class FakeMeasure:
    """A measure function from a table of rates (None: the candidate fails); records calls."""

    def __init__(self, rates: dict[int, float | None]) -> None:
        self.rates = rates
        self.calls: list[int] = []

    def __call__(self, num_workers: int) -> LoaderTrial:
        self.calls.append(num_workers)
        rate = self.rates[num_workers]
        if rate is None:
            return LoaderTrial(num_workers, None, 0, 0, 0.0, None, "worker crashed: fake")
        return LoaderTrial(num_workers, rate, 10, int(rate), 1.0, 0.1)


def test_stops_when_two_counts_in_a_row_do_not_help() -> None:
    fake = FakeMeasure({0: 100.0, 1: 102.0, 2: 104.0, 4: 900.0, 8: 900.0, 16: 900.0})
    choice = search_workers(fake, max_workers=16)
    assert fake.calls == [0, 1, 2]
    assert choice.num_workers == 0
    assert "stopped at 2" in choice.reason


def test_one_count_that_does_not_help_does_not_stop_the_search() -> None:
    # Two CPUs: 1 worker only moves the loading out of the main process; 2 load in parallel.
    fake = FakeMeasure({0: 100.0, 1: 101.0, 2: 200.0, 4: 204.0, 8: 199.0, 16: 500.0})
    choice = search_workers(fake, max_workers=16)
    assert fake.calls == [0, 1, 2, 4, 8]
    assert choice.num_workers == 2  # 200 is within 5% of the best, 204


def test_far_behind_the_training_step_patience_does_not_stop_the_search() -> None:
    # Recorded on an H100 host (16 CPUs), ResNet-50's 224x224 images against a compiled step of
    # 4,972 samples/s: 1 and 2 workers were no faster than 0, and the search stopped at 0.
    rates: dict[int, float | None] = {0: 970.0, 1: 794.0, 2: 1014.0, 4: 2000.0, 8: 3900.0}
    rates[16] = 6100.0
    fake = FakeMeasure(rates)
    choice = search_workers(fake, max_workers=16, step_rate_samples_per_s=4972.0)
    assert fake.calls == [0, 1, 2, 4, 8, 16]
    assert choice.num_workers == 16  # 6,100 keeps 10% ahead of 4,972


def test_picks_the_smallest_count_that_keeps_ahead_of_the_step() -> None:
    fake = FakeMeasure({0: 100.0, 1: 190.0, 2: 340.0, 4: 800.0, 8: 900.0})
    choice = search_workers(fake, max_workers=8, step_rate_samples_per_s=300.0)
    assert choice.num_workers == 2  # 340 >= 300 * 1.1 = 330
    assert fake.calls == [0, 1, 2]  # nothing larger is needed
    assert "340 samples/s" in choice.reason
    assert "300 samples/s" in choice.reason


def test_the_main_process_loads_in_series_with_the_step_so_10_percent_is_not_ahead() -> None:
    # 0 workers at 1.1x the step trains at about half its rate: load, then step, per batch
    fake = FakeMeasure({0: 330.0, 1: 330.0, 2: 660.0})
    choice = search_workers(fake, max_workers=2, step_rate_samples_per_s=300.0)
    assert choice.num_workers == 1
    assert fake.calls == [0, 1]


def test_the_main_process_keeps_ahead_where_loading_takes_at_most_2_percent() -> None:
    # recorded on an H100 host: GPT-2's tokens against a step of 672 samples/s
    fake = FakeMeasure({0: 48709.0, 1: 48000.0})
    choice = search_workers(fake, max_workers=16, step_rate_samples_per_s=672.0)
    assert (choice.num_workers, fake.calls) == (0, [0])
    assert "in series with the training step's 672 samples/s, takes 1.4%" in choice.reason
    # this 2-core CPU's README run: 17,038 against 393 is 2.3%, so a worker is measured
    fake = FakeMeasure({0: 17038.0, 1: 9000.0, 2: 15000.0})
    assert search_workers(fake, max_workers=2, step_rate_samples_per_s=393.0).num_workers == 1
    assert fake.calls == [0, 1]


def test_a_fast_main_process_where_no_worker_keeps_ahead_says_why_it_is_not_ahead() -> None:
    # large tensors handed over by workers: each is slower than the step, the main process not
    fake = FakeMeasure({0: 20000.0, 1: 800.0, 2: 900.0})
    choice = search_workers(fake, max_workers=2, step_rate_samples_per_s=1000.0)
    assert choice.num_workers == 0
    assert "no count keeps ahead" in choice.reason
    assert "0 workers loads in series with the step: at 20,000 samples/s" in choice.reason
    assert "4.8% of training's time" in choice.reason


def test_a_rate_just_below_the_headroom_is_not_enough() -> None:
    fake = FakeMeasure({0: 100.0, 1: 320.0, 2: 700.0})
    assert search_workers(fake, max_workers=2, step_rate_samples_per_s=300.0).num_workers == 2


def test_loader_bound_training_takes_the_smallest_count_near_the_best() -> None:
    fake = FakeMeasure({0: 100.0, 1: 200.0, 2: 400.0, 4: 600.0, 8: 610.0})
    choice = search_workers(fake, max_workers=8, step_rate_samples_per_s=5000.0)
    assert choice.num_workers == 4
    assert "loading limits training" in choice.reason


def test_without_a_step_rate_the_smallest_count_within_5_percent_of_the_best_wins() -> None:
    fake = FakeMeasure({0: 100.0, 1: 196.0, 2: 200.0})
    assert search_workers(fake, max_workers=2).num_workers == 1


def test_a_failed_count_is_recorded_and_never_chosen() -> None:
    fake = FakeMeasure({0: 100.0, 1: None, 2: 300.0, 4: None, 8: None})
    choice = search_workers(fake, max_workers=8)
    assert choice.num_workers == 2
    assert [t.ok for t in choice.trials] == [True, False, True, False, False]
    assert "1: failed (worker crashed: fake)" in choice.reason


def test_failures_count_as_not_helping() -> None:
    fake = FakeMeasure({0: 100.0, 1: None, 2: None, 4: 1000.0})
    choice = search_workers(fake, max_workers=4)
    assert fake.calls == [0, 1, 2]
    assert choice.num_workers == 0


@pytest.mark.parametrize(
    ("max_workers", "calls"), [(-1, [0]), (0, [0]), (1, [0, 1]), (2, [0, 1, 2])]
)
def test_tiny_machines_measure_zero_and_what_there_is(max_workers: int, calls: list[int]) -> None:
    fake = FakeMeasure({0: 100.0, 1: 150.0, 2: 300.0})
    choice = search_workers(fake, max_workers=max_workers)
    assert fake.calls == calls
    assert choice.num_workers == calls[-1]


def test_windows_measures_only_zero_unless_candidates_are_given() -> None:
    fake = FakeMeasure({0: 100.0, 1: 150.0, 2: 300.0})
    assert search_workers(fake, max_workers=2, windows=True).num_workers == 0
    assert fake.calls == [0]
    fake = FakeMeasure({0: 100.0, 1: 150.0, 2: 300.0})
    choice = search_workers(fake, max_workers=2, windows=True, candidates=[2, 0])
    assert fake.calls == [0, 2]
    assert choice.num_workers == 2
    assert "Windows" not in choice.reason


def test_candidates_above_the_maximum_are_dropped() -> None:
    fake = FakeMeasure({0: 100.0, 1: 150.0, 2: 300.0, 4: 600.0})
    search_workers(fake, max_workers=2, candidates=[4, 1, 2, 1])
    assert fake.calls == [1, 2]
    with pytest.raises(ValueError, match="no candidate"):
        search_workers(fake, max_workers=2, candidates=[4, 8])


def test_when_every_candidate_fails_zero_is_measured_too() -> None:
    fake = FakeMeasure({0: 100.0, 2: None, 4: None})
    choice = search_workers(fake, max_workers=4, candidates=[2, 4])
    assert fake.calls == [2, 4, 0]
    assert choice.num_workers == 0
    assert "0 workers was measured as well" in choice.reason


def test_nothing_that_runs_is_a_workload_error() -> None:
    with pytest.raises(WorkloadError, match="no worker count could load"):
        search_workers(FakeMeasure({0: None, 1: None}), max_workers=1)


@pytest.mark.parametrize("step_rate", [0.0, -5.0, float("nan"), float("inf")])
def test_a_step_rate_must_be_positive_and_finite(step_rate: float) -> None:
    with pytest.raises(ValueError, match="step rate"):
        search_workers(FakeMeasure({0: 1.0}), max_workers=0, step_rate_samples_per_s=step_rate)


def _rate(trial: LoaderTrial) -> float:
    assert trial.samples_per_s is not None
    return trial.samples_per_s


rates = st.one_of(st.none(), st.floats(min_value=0.01, max_value=1e7))


def _ahead(num_workers: int, rate: float, step_rate: float) -> bool:
    """Workers keep ahead 10% above the step's rate; the main process, in series with the step,
    where loading takes at most 2% of a sample's time (load and step)."""
    if num_workers == 0:
        return (1 / rate) / (1 / rate + 1 / step_rate) <= 0.02
    return rate >= step_rate * 1.1


@settings(max_examples=300, deadline=None)
@given(
    rate_list=st.lists(rates, min_size=1, max_size=40),
    max_workers=st.integers(min_value=-2, max_value=39),
    step_rate=st.one_of(st.none(), st.floats(min_value=0.01, max_value=1e7)),
)
def test_the_choice_is_always_a_count_that_ran_within_the_maximum(
    rate_list: list[float | None], max_workers: int, step_rate: float | None
) -> None:
    rate_list = (rate_list * 40)[:40]  # a rate (or failure) for every count up to 39
    fake = FakeMeasure(dict(enumerate(rate_list)))
    measure: Measure = fake
    try:
        choice = search_workers(measure, max_workers=max_workers, step_rate_samples_per_s=step_rate)
    except WorkloadError:
        assert all(rate_list[c] is None for c in fake.calls)
        return
    chosen = next(t for t in choice.trials if t.num_workers == choice.num_workers)
    assert chosen.ok
    assert 0 <= choice.num_workers <= max(max_workers, 0)
    tried = [t.num_workers for t in choice.trials]
    assert tried == sorted(tried)
    assert tried[0] == 0
    ran = [t for t in choice.trials if t.samples_per_s is not None]
    best = max(_rate(t) for t in ran)
    rate = chosen.samples_per_s
    assert rate is not None
    if step_rate is not None and _ahead(choice.num_workers, rate, step_rate):
        smaller = [t for t in ran if t.num_workers < choice.num_workers]
        assert not any(_ahead(t.num_workers, _rate(t), step_rate) for t in smaller)
    else:
        assert rate >= best * 0.95


def test_a_count_stopped_for_time_says_how_much_time_was_left() -> None:
    # Each count takes 5 s; at 15 s, 3 s are left: the reason said "the time budget ran out"
    now = [0.0]

    def measure(num_workers: int) -> LoaderTrial:
        now[0] += 5.0
        return FakeMeasure({0: 100.0, 1: 200.0, 2: 400.0})(num_workers)

    choice = search_workers(measure, max_workers=4, until=18.0, clock=lambda: now[0])
    assert [t.num_workers for t in choice.trials] == [0, 1, 2]
    assert "ran out" not in choice.reason
    assert (
        "stopped before 4: 3 s of the time budget were left, less than the longest count so far "
        "took (5.0 s)" in choice.reason
    )
