"""Where the search starts (``probe.smallest``): a model that cannot train on one sample
(BatchNorm in training mode) is searched from the smallest size it trains at, never below it;
an error at every size is the user's; an error below and out of memory above does not fit. On
simulated models behind a real ``SearchGuard``, and end to end with real torch on this CPU."""

from __future__ import annotations

import functools
import re
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.probe.fake_trials import Ticks, mlp_machine, recorded, tune_on, tune_ticking
from torch_autotune import api
from torch_autotune.api import tune
from torch_autotune.cli import cli
from torch_autotune.errors import (
    EXIT_DOES_NOT_FIT,
    EXIT_USAGE,
    EXIT_WORKLOAD,
    DoesNotFitError,
    WorkloadError,
    blame_user_code,
)
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe.budget import Budget
from torch_autotune.probe.guard import SearchGuard, search_with_guard
from torch_autotune.probe.search import TrialOutcome, find_max_batch_size
from torch_autotune.probe.smallest import GROWTH, smallest_batch
from torch_autotune.probe.trials import StepSettings
from torch_autotune.profile import Profile

LAPTOP = recorded("cpu-laptop-linux")
BATCHNORM = "Expected more than 1 value per channel when training"


class Simulated:
    """A model that raises an error of the user's below ``trains_from`` (as BatchNorm does
    at one sample) and runs out of memory above ``fits_up_to``; every size it ran, in order."""

    settings = StepSettings()

    def __init__(self, trains_from: int, fits_up_to: int, *, error: str = BATCHNORM) -> None:
        self.trains_from = trains_from
        self.fits_up_to = fits_up_to
        self.error = error
        self.ran: list[int] = []
        self.errors: list[BaseException] = []

    def __call__(self, batch_size: int) -> TrialOutcome:
        self.ran.append(batch_size)
        if batch_size < self.trains_from:
            error = ValueError(f"{self.error}, got input size [{batch_size}, 16]")
            blame_user_code(error)  # as the step marks what the model raises
            self.errors.append(error)
            raise error
        if batch_size > self.fits_up_to:
            return TrialOutcome(False)
        return TrialOutcome(True, (100 + batch_size) << 20, 0.03, 0.01, 0.01)


def guard(model: Any) -> SearchGuard:
    return SearchGuard(model, Budget(1e6, Ticks(0.001)), lambda _phase, _what: None, reserve_s=0.0)


# --- the start, on simulated models ------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    start=st.integers(1, 8),
    above=st.integers(0, 7 * 8),
    room=st.integers(0, 200),
    cap=st.integers(64, 512),
)
def test_the_start_is_exactly_the_smallest_size_that_trains(
    start: int, above: int, room: int, cap: int
) -> None:
    trains_from = min(start + above, 8 * start)
    model = Simulated(trains_from, trains_from + room)
    found = smallest_batch(guard(model), start, cap, name="simulated")
    assert found.size == trains_from
    assert (found.reason is None) == (trains_from == start)
    assert min(model.ran) == start
    assert max(model.ran) <= min(8 * start, cap)


def test_the_reason_names_the_error_and_the_size_that_trained() -> None:
    guarded = guard(Simulated(2, 1000))
    found = smallest_batch(guarded, 1, 512, name="simulated")
    assert found.reason == (
        f"batch 1 raised ValueError: {BATCHNORM}, got input size [1, 16]; batch 2 trained, so"
        " the search started at 2 (--min-batch-size sets the start). An epoch's last batch"
        " below 2 raises it too: profile.dataloader_kwargs() sets drop_last=True"
    )
    first = guarded.records[0]
    assert (first.batch_size, first.fits, first.step) == (1, False, "start")
    assert first.error == f"ValueError: {BATCHNORM}, got input size [1, 16]"
    assert first.seconds is None  # it did not run out of memory: the search does not avoid it


def test_a_model_that_raises_at_every_size_raises_the_users_first_error() -> None:
    model = Simulated(10**6, 10**6)
    with pytest.raises(ValueError, match=BATCHNORM) as raised:
        smallest_batch(guard(model), 3, 512, name="simulated")
    assert raised.value is model.errors[0]
    assert model.ran == [3, *(3 * factor for factor in GROWTH)]


def test_batchnorms_error_at_one_and_out_of_memory_at_two_does_not_fit() -> None:
    """Not the user's error (exit 5): the model does not fit (exit 7), for the size out of
    memory, so that the plan and the retry with checkpointing follow."""
    model = Simulated(trains_from=2, fits_up_to=1)
    guarded = guard(model)
    with pytest.raises(DoesNotFitError) as raised:
        smallest_batch(guarded, 1, 512, name="simulated")
    error = raised.value
    assert (error.batch_size, error.exit_code) == (2, EXIT_DOES_NOT_FIT)
    assert error.fact == (
        "the simulated workload does not train even at batch size 2 on cpu: it runs out of"
        f" memory, and batch 1 cannot train BatchNorm (ValueError: {BATCHNORM}, got input size"
        " [1, 16])"
    )
    assert str(error) == f"{error.fact}; use a smaller model or a larger device"
    assert model.ran == [1, 2]
    assert [(r.batch_size, r.fits, r.error is None) for r in guarded.records] == [
        (1, False, False),
        (2, False, True),
    ]


def test_an_error_at_every_size_that_fits_is_the_users_even_with_out_of_memory_above() -> None:
    """Only BatchNorm's error is known to go away at a larger batch: any other error at every
    size below one out of memory is the user's bug, raised as it was (their traceback, exit
    5), not a model too large for the device."""
    model = Simulated(trains_from=4, fits_up_to=3, error="the mask has the wrong shape")
    with pytest.raises(ValueError, match="the mask has the wrong shape") as raised:
        smallest_batch(guard(model), 1, 512, name="simulated")
    assert model.ran == [1, 2, 4, 3]  # 3, between the last that raised and 4, raised too
    assert raised.value is model.errors[0]


def test_batchnorm_at_one_and_two_below_out_of_memory_does_not_fit() -> None:
    model = Simulated(trains_from=4, fits_up_to=3)
    with pytest.raises(DoesNotFitError) as raised:
        smallest_batch(guard(model), 1, 512, name="simulated")
    assert model.ran == [1, 2, 4, 3]
    assert raised.value.batch_size == 4
    assert raised.value.fact.endswith("and batch 3 raised an error too")


def test_the_larger_sizes_tried_stop_at_the_cap() -> None:
    model = Simulated(10**6, 10**6)
    with pytest.raises(ValueError, match=BATCHNORM):
        smallest_batch(guard(model), 1, 5, name="simulated")
    assert model.ran == [1, 2, 4, 5]


def test_out_of_memory_at_the_start_is_left_to_the_search() -> None:
    model = Simulated(1, 0)
    found = smallest_batch(guard(model), 4, 512, name="simulated")
    assert (found.size, found.reason) == (4, None)
    assert model.ran == [4]


def test_an_error_that_is_not_the_users_is_not_retried() -> None:
    class Ours(Simulated):
        def __call__(self, batch_size: int) -> TrialOutcome:
            self.ran.append(batch_size)
            raise WorkloadError("'w': no loss for the step")

    model = Ours(2, 100)
    with pytest.raises(WorkloadError, match="no loss for the step"):
        smallest_batch(guard(model), 1, 512, name="simulated")
    assert model.ran == [1]


def test_a_long_error_is_recorded_as_its_first_line_cut_short() -> None:
    guarded = guard(Simulated(2, 100, error="x" * 300 + "\nsecond line"))
    smallest_batch(guarded, 1, 512, name="simulated")
    error = guarded.records[0].error
    assert error is not None
    assert error.startswith("ValueError: xxx")
    assert error.endswith("...")
    assert len(error) == len("ValueError: ") + 160


# --- the search from there: never below the floor ------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    floor=st.integers(1, 64),
    above=st.integers(0, 64),
    limit=st.integers(0, 600),
    cap=st.integers(1, 512),
    memory=st.booleans(),
)
def test_the_search_never_runs_or_returns_a_size_below_its_floor(
    floor: int, above: int, limit: int, cap: int, memory: bool
) -> None:
    start = floor + above
    if start > cap:
        return
    ran: list[int] = []

    def fits(batch_size: int) -> TrialOutcome:
        ran.append(batch_size)
        return TrialOutcome(batch_size <= limit, (100 + batch_size) << 20)

    budget = (100 + limit) << 20 if memory else None
    result = find_max_batch_size(fits, cap=cap, memory_limit_bytes=budget, start=start, floor=floor)
    assert min(ran) >= floor
    expected = min(limit, cap)
    assert result.max_batch_size == (expected if expected >= floor else None)


@settings(max_examples=100, deadline=None)
@given(trains_from=st.integers(1, 8), room=st.integers(0, 300), cap=st.integers(8, 512))
def test_after_the_start_is_found_no_size_below_it_runs_again(
    trains_from: int, room: int, cap: int
) -> None:
    model = Simulated(trains_from, trains_from + room)
    guarded = guard(model)
    found = smallest_batch(guarded, 1, cap, name="simulated")
    tried = len(model.ran)
    guarded.start = found.size
    result = search_with_guard(guarded, cap, None, "the cap")
    assert all(size >= found.size for size in model.ran[tried:])
    assert result.largest == min(trains_from + room, cap)


# --- real torch on this CPU: BatchNorm tuned end to end ------------------------------------------


class BatchNormHead(nn.Module):
    """A CNN with BatchNorm1d in its head: it cannot train on one sample."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(4 * 8 * 8, 16), nn.BatchNorm1d(16), nn.Linear(16, 10))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))


class ResNetOn32(nn.Module):
    """A ResNet-like net on 32x32 images: strided BatchNorm2d stages down to a 1x1 map."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for _ in range(5):  # 32 -> 16 -> 8 -> 4 -> 2 -> 1
            layers += [nn.Conv2d(channels, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4)]
            layers.append(nn.ReLU())
            channels = 4
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(4, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(images).flatten(1))


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread for a few dozen steps of a tiny model: a second thread only adds
    contention (on a loaded 2-core machine, 5x slower), and the search does not depend on it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def images(size: int, count: int = 64) -> list[tuple[torch.Tensor, int]]:
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(3, size, size, generator=generator), i % 10) for i in range(count)]


def tune_real(model: nn.Module, data: Any, snapshot: HardwareSnapshot, **options: Any) -> Profile:
    """``tune()`` of the model on the data with real training steps on simulated time."""
    return tune_ticking(
        model=model,
        optimizer=functools.partial(torch.optim.AdamW, lr=1e-3),
        dataset=data,
        snapshot=snapshot,
        budget_s=30,
        max_batch_size=16,
        num_workers=0,
        **options,
    )


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(
    ("model", "size", "shape"),
    [(BatchNormHead, 8, "[1, 16]"), (ResNetOn32, 32, "[1, 4, 1, 1]")],
    ids=["BatchNorm1d-head", "BatchNorm2d-on-1x1"],
)
def test_a_batchnorm_model_is_tuned_from_two(
    model: Callable[[], nn.Module], size: int, shape: str
) -> None:
    profile = tune_real(model(), images(size), LAPTOP)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.details is not None
    ran = {t.batch_size for t in evidence.search if t.fits}
    assert profile.settings.batch.batch_size == evidence.batch_size >= 2
    assert evidence.batch_size in ran
    first = evidence.search[0]
    assert (first.batch_size, first.fits) == (1, False)
    assert first.error is not None
    assert BATCHNORM in first.error
    assert min(ran) == 2
    assert all(r.batch_size >= 2 for r in evidence.throughput)
    assert evidence.details.min_batch_size == 2
    reason = evidence.details.min_batch_reason
    assert reason is not None
    assert reason == (
        f"batch 1 raised ValueError: {BATCHNORM}, got input size torch.Size({shape}); batch 2"
        " trained, so the search started at 2 (--min-batch-size sets the start). An epoch's"
        " last batch below 2 raises it too: profile.dataloader_kwargs() sets drop_last=True"
    )
    assert profile.dataloader_kwargs()["drop_last"] is True  # the README's loop, every epoch
    from torch_autotune.integrations import (
        hf_notes,
        hf_training_arguments,
        lightning_notes,
        render_accelerate,
    )

    # the Trainer would drop evaluation's last batch too: left out, and its note says why
    assert "dataloader_drop_last" not in hf_training_arguments(profile)
    said = [n for n in hf_notes(profile) if n.startswith("drop_last: dataloader_drop_last is left")]
    assert len(said) == 1
    assert "#   drop_last: True, in the training DataLoader only" in render_accelerate(profile)

    (loader,) = [n for n in lightning_notes(profile) if n.startswith("DataLoader(")]
    assert "drop_last=True" in loader
    assert "drop_last in train_dataloader() alone" in loader
    asked = evidence.details.model_copy(
        update={"min_batch_reason": "asked for: the search started at 2"}
    )
    as_asked = profile.model_copy(
        update={"evidence": evidence.model_copy(update={"details": asked})}
    )
    assert "drop_last" not in as_asked.dataloader_kwargs()


class BatchNormOverBlocks(nn.Module):
    """BatchNorm1d in its head, over repeated blocks whose activations 'do not fit' from
    batch 2 (a MemoryError, as the CPU's allocator raises) unless the blocks are checkpointed
    (checkpointing gives each block a forward of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            *(nn.Sequential(nn.Linear(192, 192), nn.GELU()) for _ in range(3))
        )
        self.head = nn.Sequential(nn.Linear(192, 16), nn.BatchNorm1d(16), nn.Linear(16, 10))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        checkpointed = all("forward" in vars(block) for block in self.blocks)
        if len(images) > 1 and not checkpointed:
            raise MemoryError("out of memory: every block's activations kept (simulated)")
        return self.head(self.blocks(images.flatten(1)))


@pytest.mark.usefixtures("one_thread")
def test_batchnorm_at_one_and_out_of_memory_at_two_is_retried_with_checkpointing() -> None:
    """The model does not fit without checkpointing (batch 1 cannot train BatchNorm, 2 runs
    out of memory); with it, batch 2 trains: the profile checkpoints, from batch 2."""
    profile = tune_real(BatchNormOverBlocks(), images(8), LAPTOP)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.details is not None
    assert profile.settings.activation_checkpointing
    assert evidence.details.min_batch_size == 2
    assert profile.settings.batch.batch_size == evidence.batch_size >= 2
    decision = profile.decision("activation_checkpointing")
    assert decision is not None
    assert decision.reason.startswith(
        "on: not even batch 2 trained without it (out of memory); with each repeated block's"
        " forward recomputed in backward, the largest batch that trained was "
    )


def test_batchnorm_at_one_and_out_of_memory_above_does_not_fit_through_the_command(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    detected_as("cpu-laptop-linux")
    (tmp_path / "batchnorm_oom.py").write_text(
        textwrap.dedent(
            """
            import functools

            import torch
            from torch import nn


            class Head(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.norm = nn.BatchNorm1d(4)

                def forward(self, x):
                    if len(x) > 1:
                        raise MemoryError("out of memory (simulated)")
                    return self.norm(x)


            def make_workload():
                return {
                    "model": Head(),
                    "optimizer": functools.partial(torch.optim.SGD, lr=0.1),
                    "example_batch": (torch.randn(4, 4), torch.randn(4, 4)),
                }
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(
        cli, ["--model", "batchnorm_oom:make_workload", "--budget", "20", "--no-save"]
    )
    assert result.exit_code == EXIT_DOES_NOT_FIT, result.output
    assert "Traceback" not in result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith("autotune: error: the ")
    assert (
        " workload does not train even at batch size 2 on cpu: it runs out of memory, and batch 1"
        f" cannot train BatchNorm (ValueError: {BATCHNORM}, got input size torch.Size([1, 4]));"
        " activation checkpointing was not tried: the model has no repeated block to checkpoint;"
        " use a smaller model or a larger device"
    ) in last


@pytest.mark.usefixtures("one_thread")
def test_min_batch_size_is_where_the_search_starts() -> None:
    profile = tune_real(BatchNormHead(), images(8), LAPTOP, min_batch_size=6)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.details is not None
    assert min(t.batch_size for t in evidence.search) == 6
    assert evidence.search[0].fits
    assert all(r.batch_size >= 6 for r in evidence.throughput)
    assert evidence.batch_size >= 6
    assert evidence.details.min_batch_size == 6
    assert evidence.details.min_batch_reason == "asked for: the search started at 6"


@pytest.mark.slow  # a real tune() on the real clock: 10-15 s on two cores
def test_a_resnet_on_32x32_images_is_tuned_on_the_real_clock() -> None:
    profile = tune(
        model=ResNetOn32(),
        optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
        dataset=images(32, 256),
        snapshot=LAPTOP,
        budget_s=10,
        num_workers=0,
    )
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.details is not None
    assert evidence.batch_size >= 2
    assert evidence.batch_size in {t.batch_size for t in evidence.search if t.fits}
    assert evidence.details.min_batch_size == 2


def test_a_model_that_raises_at_every_size_is_the_users_error_through_the_command(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    detected_as("cpu-laptop-linux")
    (tmp_path / "always_raises.py").write_text(
        textwrap.dedent(
            """
            import functools

            import torch
            from torch import nn


            class Broken(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.linear = nn.Linear(4, 2)

                def forward(self, x, mask):
                    raise ValueError("the mask has the wrong shape")


            def make_workload():
                return {
                    "model": Broken(),
                    "optimizer": functools.partial(torch.optim.SGD, lr=0.1),
                    "example_batch": {"x": torch.randn(4, 4), "mask": torch.ones(4, 4)},
                }
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(
        cli, ["--model", "always_raises:make_workload", "--budget", "20", "--no-save"]
    )
    assert result.exit_code == EXIT_WORKLOAD, result.output
    assert re.search(r'always_raises\.py", line \d+, in forward', result.stderr)
    assert "ValueError: the mask has the wrong shape" in result.stderr
    last = result.stderr.splitlines()[-1]
    assert last == (
        "autotune: error: the training step raised ValueError in model(**batch) with x, mask"
        " (not out-of-memory, so not a batch that is too big); fix the model or its data, see"
        " the traceback above"
    )


# --- --min-batch-size -------------------------------------------------------------------------


def test_min_batch_size_on_the_command_line_starts_the_search_there(
    monkeypatch: pytest.MonkeyPatch, detected_as: Callable[[str], HardwareSnapshot]
) -> None:
    detected_as("cpu-laptop-linux")
    machine = mlp_machine()
    asked: dict[str, Any] = {}

    def simulated(workload: Any, **options: Any) -> Profile:
        asked.update(options)
        return tune_on(machine, workload, LAPTOP, **options)

    monkeypatch.setattr(api, "tune", simulated)
    result = CliRunner().invoke(
        cli, ["-m", "mlp", "--min-batch-size", "24", "--budget", "20", "--no-save"]
    )
    assert result.exit_code == 0, result.output
    assert asked["min_batch_size"] == 24
    trials = [int(line.split()[1]) for line in machine.log if line.startswith("trial")]
    assert trials[0] == 24
    assert min(trials) == 24
    assert "--min-batch-size" in CliRunner().invoke(cli, ["--help"]).output


@pytest.mark.parametrize("value", ["0", "-2", "two", "2.5", "1048577"])
def test_a_min_batch_size_that_is_no_batch_size_is_a_usage_error(value: str) -> None:
    result = CliRunner().invoke(cli, ["--min-batch-size", value, "--no-save"])
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("autotune: error: Invalid value for '--min-batch-size'")


def test_a_min_batch_size_above_the_max_is_one_line(
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    detected_as("cpu-laptop-linux")
    # above --max-batch-size is a usage error (tests/test_cli_exits.py); above the device's
    # cap, the search says which cap
    result = CliRunner().invoke(cli, ["-m", "mlp", "--min-batch-size", "600", "--no-save"])
    assert result.exit_code == EXIT_WORKLOAD
    assert result.stderr.splitlines()[-1].startswith(
        "autotune: error: the mlp workload's smallest batch (600) is above the largest it may"
        " try: the CPU cap of 512"
    )
