"""``--memory-limit`` (``tune(memory_limit_gib=...)``): the probe tunes as on a smaller GPU, the
limit recorded in the profile and said in the summary; on the CPU it caps the host RAM the
search may fill. On the simulated H100 with GPT-2's recorded memory curve, and from the CLI."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from rich.console import Console

from tests.probe.fake_trials import Ticks, recorded, tune_on
from torch_autotune import compose
from torch_autotune.api import tune
from torch_autotune.bounds import MIN_MEMORY_GIB, memory_limit_refused
from torch_autotune.cli import cli
from torch_autotune.errors import EXIT_USAGE, MemoryLimitError
from torch_autotune.probe.budget import Budget
from torch_autotune.probe.guard import (
    OVER_CAP,
    OVER_CAP_PREDICTED,
    Found,
    SearchGuard,
    search_with_guard,
)
from torch_autotune.probe.presets import preset
from torch_autotune.probe.search import TrialOutcome
from torch_autotune.probe.simulated import SimulatedMachine
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.workloads import resolve_workload
from torch_autotune.render.results import render_run

H100 = recorded("h100-80gb-hbm3")
LAPTOP = recorded("cpu-laptop-linux")
GIB = 1 << 30


def _gpt2(machine: SimulatedMachine, **options: object):  # type: ignore[no-untyped-def]
    import dataclasses

    workload = dataclasses.replace(resolve_workload("gpt2"), dataset=None)
    return tune_on(machine, workload, H100, mode="balanced", budget_s=120, **options)


def test_a_smaller_gpu_takes_a_smaller_batch_and_the_profile_says_so() -> None:
    whole = _gpt2(preset("h100-gpt2", load_s=None))
    machine = preset("h100-gpt2", load_s=None)
    capped = _gpt2(machine, memory_limit_gib=24)
    assert whole.evidence is not None
    assert capped.evidence is not None
    assert capped.provenance.preferences.memory_limit_bytes == 24 * GIB
    assert capped.evidence.memory_limit_bytes is not None
    assert capped.evidence.memory_limit_bytes <= 24 * GIB
    largest = capped.evidence.max_batch_size
    assert largest < whole.evidence.max_batch_size
    # exact, as on a real 24 GiB device: the largest fits the cap, one more does not
    assert machine.peak(largest) <= 24 * GIB < machine.peak(largest + 1)
    out = io.StringIO()
    render_run(capped, Console(file=out, width=300, color_system=None), saved=None)
    assert re.search(r"^memory limit\s{2,}24 GiB of the GPU, as asked\s*$", out.getvalue(), re.M)


def test_on_the_cpu_the_limit_caps_the_host_ram_the_search_may_fill() -> None:
    machine = SimulatedMachine(
        limit=100_000, memory_bytes=None, fixed_bytes=200 << 20, per_sample_bytes=4 << 20, leaves=1
    )
    workload = "mlp"
    profile = tune_on(machine, workload, LAPTOP, budget_s=60, memory_limit_gib=0.5)
    evidence = profile.evidence
    assert evidence is not None
    refused = [t for t in evidence.search if t.step == OVER_CAP_PREDICTED]
    assert refused  # sizes predicted past 0.5 GiB were not run
    assert evidence.max_batch_size * (4 << 20) + (200 << 20) <= 0.5 * GIB
    # the user's limit is memory's: the batch is memory-bound, so checkpointing is measured
    assert evidence.limited_by == "memory"
    assert "0.5 GiB of host RAM the memory limit allows (--memory-limit, memory_limit_gib)" in (
        evidence.limit_reason or ""
    )
    decision = profile.decision("activation_checkpointing")
    assert decision is not None
    assert "checkpointed at batch" in decision.reason
    assert "not memory-bound" not in decision.reason


def _summary(profile: object) -> str:
    out = io.StringIO()
    render_run(profile, Console(file=out, width=300, color_system=None), saved=None)  # type: ignore[arg-type]
    (line,) = [line for line in out.getvalue().splitlines() if line.startswith("memory limit")]
    return " ".join(line.split())


def test_a_gpu_with_less_free_than_the_limit_says_the_limit_in_effect() -> None:
    """A shared GPU with 20 GiB free under --memory-limit 24: the trials could use 20, and the
    summary said '24 GiB of the GPU, as asked'."""
    machine = preset("h100-gpt2", load_s=None, memory_bytes=20 * GIB)
    capped = _gpt2(machine, memory_limit_gib=24)
    assert capped.evidence is not None
    assert capped.evidence.memory_limit_bytes == 20 * GIB
    assert _summary(capped) == (
        "memory limit 24 GiB of the GPU asked; 20.0 GiB in effect, what the GPU had free (other"
        " processes' memory and the CUDA context left out)"
    )


def test_on_the_cpu_a_limit_above_the_ram_the_probe_may_fill_says_the_limit_in_effect() -> None:
    """--memory-limit 100000 on a 23.5 GiB host said '100000 GiB of host RAM, as asked', where
    the search held a trial's peak to 15.8 GiB, the 70% of the RAM available it may fill. The
    laptop's snapshot has 8.9 GiB available: 6.3 GiB may be filled."""
    machine = SimulatedMachine(
        limit=100_000, memory_bytes=None, fixed_bytes=200 << 20, per_sample_bytes=4 << 20, leaves=1
    )
    above = tune_on(machine, "mlp", LAPTOP, budget_s=30, memory_limit_gib=10)
    assert above.provenance.preferences.memory_limit_bytes == 10 * GIB  # what was asked
    assert _summary(above) == (
        "memory limit 10 GiB of host RAM asked; 6.3 GiB in effect, the host RAM the probe may "
        "fill (70% of what was available), less what the process already held"
    )
    within = tune_on(machine, "mlp", LAPTOP, budget_s=30, memory_limit_gib=0.5)
    assert _summary(within) == "memory limit 0.5 GiB of host RAM, as asked"


class _Superlinear:
    """A CPU step whose peak grows faster than the batch, (base + b²/8) MiB: the readings the
    search predicts from say less than a larger size then takes. As the runner does, a trial
    whose own peak passed ``cap`` does not fit."""

    settings = StepSettings()

    def __init__(self, cap: int, base_mib: int = 200) -> None:
        self.cap, self.base_mib = cap, base_mib

    def __call__(self, batch_size: int) -> TrialOutcome:
        peak = (self.base_mib + batch_size**2 // 8) << 20
        return TrialOutcome(peak <= self.cap, peak, 0.03, 0.01, 0.01)


def _capped(runner: _Superlinear) -> tuple[SearchGuard, Found]:
    guarded = SearchGuard(runner, Budget(1e6, Ticks(0.001)), lambda *_: None, reserve_s=0)
    guarded.ram_budget_bytes, guarded.ram_cap_bytes = 64 * GIB, runner.cap  # host RAM: more
    return guarded, search_with_guard(guarded, cap=4096, limit=runner.cap, cap_reason="the cap")


def test_on_the_cpu_a_trial_that_peaked_past_the_limit_is_said_so() -> None:
    """On a GPU the capped allocator raises; on the CPU nothing does: the runner counts a trial
    whose own peak passed --memory-limit as one that does not fit, and the guard says so (not
    'ran out of memory')."""
    guarded, found = _capped(_Superlinear(cap=512 << 20, base_mib=60))
    over = [t for t in guarded.records if t.peak_memory_bytes and t.peak_memory_bytes > 512 << 20]
    assert over
    assert all(not t.fits and t.step == OVER_CAP for t in over)
    assert all(t.seconds == 0.03 for t in over)  # it ran its time: it read 0.0, as an OOM
    assert found.largest is not None
    assert (60 + found.largest**2 // 8) << 20 <= 512 << 20
    assert found.limited_by == "memory"  # the user's limit: memory-bound, as on a capped GPU
    assert "the memory limit allows (--memory-limit, memory_limit_gib)" in found.reason
    _, at_once = _capped(_Superlinear(cap=512 << 20, base_mib=600))  # batch 1 past it
    assert (at_once.largest, at_once.limited_by) == (None, "start")
    assert at_once.reason == (
        "batch 1 took 0.59 GiB of host RAM, more than the 0.5 GiB the memory limit allows "
        "(--memory-limit, memory_limit_gib)"  # its whole peak: this runner said nothing held
    )


@pytest.mark.parametrize("bad", ["0.2", True])
def test_tune_refuses_a_memory_limit_that_is_no_number(bad: float) -> None:
    """A string raised a bare TypeError of the comparison, and True passed as 1 GiB."""
    with pytest.raises(ValueError, match="memory_limit_gib must be a number of GiB, got "):
        compose.check_tune_arguments(None, None, None, None, memory_limit_gib=bad)


_LEAST = "is less than 0.01 GiB, the least it may be; ask for 0.01 or more"


@pytest.mark.parametrize(
    ("bad", "line"),
    [
        ("0.005", f"--memory-limit 0.005 {_LEAST}"),
        ("1e-12", f"--memory-limit 1e-12 {_LEAST}"),
        ("0", f"--memory-limit 0 {_LEAST}"),
        ("-3", f"--memory-limit -3 {_LEAST}"),
        ("nan", "--memory-limit nan is not a number of GiB; ask for 0.01 or more"),
        ("inf", "--memory-limit inf is not a number of GiB; ask for 0.01 or more"),
        (
            "1e30",
            "--memory-limit 1e+30 is more than 1.07374e+09 GiB, the most any device may have;"
            " ask for less",
        ),
    ],
)
def test_the_cli_and_tune_refuse_a_memory_limit_outside_its_bounds_with_one_line(
    bad: str, line: str
) -> None:
    """--memory-limit 0.005 was exit 2 with a floor the reference did not name, while
    tune(memory_limit_gib=1e-12) was taken as a cap of one byte, said as '9.3e-10 GiB': the same
    bounds and the same line, from the command line and from Python."""
    done = CliRunner().invoke(cli, ["--memory-limit", bad, "--no-save"], prog_name="autotune")
    assert done.exit_code == EXIT_USAGE
    assert done.stderr.splitlines() == [f"autotune: error: {line}; see 'autotune --help'"]
    with pytest.raises(MemoryLimitError) as refused:
        tune("mlp", memory_limit_gib=float(bad), budget_s=20)
    assert str(refused.value) == line
    assert isinstance(refused.value, ValueError)


def test_the_least_memory_limit_is_accepted() -> None:
    compose.check_tune_arguments(None, None, None, None, memory_limit_gib=MIN_MEMORY_GIB)
    assert memory_limit_refused(MIN_MEMORY_GIB) is None
    assert memory_limit_refused(MIN_MEMORY_GIB / 2) is not None


def test_the_cli_refuses_a_memory_limit_that_is_no_number() -> None:
    done = CliRunner().invoke(cli, ["--memory-limit", "lots", "--no-save"], prog_name="autotune")
    assert done.exit_code == EXIT_USAGE
    assert "--memory-limit" in done.output


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")
def test_on_linux_each_trial_reads_its_own_peak_not_the_process_lifetimes() -> None:
    """A 512 MiB tensor freed before a trial (a dataset loaded and dropped) is not that
    trial's peak: the high-water mark starts again at the trial (it capped a small model at
    batch 8 under --memory-limit 1, its every trial 'peaking' at 1.9 GB)."""
    import torch

    from torch_autotune.probe.memory import peak_read, peak_reset

    big = torch.ones(128 << 20)  # 512 MiB
    big.add_(1)
    del big
    before = peak_read(torch, "cpu")
    peak_reset(torch, "cpu")
    after = peak_read(torch, "cpu")
    assert before is not None
    assert after is not None
    assert after < before - (256 << 20)


class _Hungry(torch.nn.Module):
    """A step that takes 96 MiB of fresh host RAM (written, so resident) beside its output."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.ones(24 << 20)  # 96 MiB
        return self.linear(x) + scratch[:1]


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")
def test_the_runner_on_the_cpu_counts_a_trial_past_the_limit_as_too_big() -> None:
    """Real torch: a trial that took more host RAM than the cap, beyond what the process held
    before it, did not fit, its peak kept; under a cap above what it takes it fits (the whole
    process, torch and this test suite, holds far more than either)."""
    from torch_autotune.probe.trials import TrialRunner
    from torch_autotune.probe.workloads import as_workload

    workload = as_workload(
        {
            "model": _Hungry,
            "optimizer": lambda params: torch.optim.SGD(params, lr=0.1),
            "example_batch": (torch.randn(4, 4), torch.randint(0, 2, (4,))),
        },
        name="hungry",
    )
    capped = TrialRunner(workload, StepSettings(memory_limit_bytes=32 << 20))(4)
    assert not capped.fits
    assert capped.peak_memory_bytes is not None
    assert TrialRunner(workload, StepSettings(memory_limit_bytes=1 << 30))(4).fits


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")
def test_a_process_that_holds_more_than_the_limit_still_searches_past_it() -> None:
    """The script holds 320 MiB (a dataset in RAM) under --memory-limit 0.25: what the trials
    take is counted, not the process (the search stopped at batch 8, 'predicted to need more
    than the 0.25 GiB', and recommended batch 1)."""
    import functools

    from torch_autotune import tune

    held = torch.ones(80 << 20)
    held.add_(1)  # resident
    profile = tune(
        model=torch.nn.Linear(16, 3),
        optimizer=functools.partial(torch.optim.SGD, lr=0.1),
        dataset=[(torch.randn(16), i % 3) for i in range(64)],
        budget_s=10,
        memory_limit_gib=0.25,
        snapshot=LAPTOP,  # the CPU's limit, also on a machine with a GPU
    )
    assert profile.evidence is not None
    assert profile.evidence.max_batch_size == 64  # the workload's largest
    assert held.numel() == 80 << 20


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")
def test_a_model_whose_first_trial_takes_more_than_the_limit_says_so_not_out_of_memory() -> None:
    from torch_autotune import tune
    from torch_autotune.errors import DoesNotFitError

    with pytest.raises(DoesNotFitError) as raised:
        tune(
            model=_Hungry(),
            optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
            example_batch=(torch.randn(4, 4), torch.randint(0, 2, (4,))),
            budget_s=10,
            memory_limit_gib=0.05,
            snapshot=LAPTOP,  # the CPU's limit, also on a machine with a GPU
        )
    said = str(raised.value)
    said_limit = "the memory limit allows (--memory-limit, memory_limit_gib)"
    took = re.search(r"batch 1 took ([0-9.]+) GiB of host RAM beyond what the process held", said)
    assert took is not None
    assert float(took.group(1)) > 0.05
    assert f"more than the 0.05 GiB {said_limit}" in said
    assert "(raise it)" in said
    assert "runs out of memory" not in said
    assert raised.value.over_cap  # through the retry with checkpointing, which reads it


def test_where_only_checkpointing_fits_under_a_cpu_cap_the_reason_says_over_the_cap() -> None:
    """The plain step took more than --memory-limit on the CPU, where nothing runs out: the
    reason said 'not even batch 1 trained without it (out of memory)'."""
    from tests.rules.helpers import snapshot
    from tests.test_bench import measured
    from torch_autotune.errors import DoesNotFitError
    from torch_autotune.probe.run import ProbeResult
    from torch_autotune.together import _with_checkpointing

    profile = measured(snapshot("cpu-laptop-linux"), workload="mlp")
    assert profile.evidence is not None
    result = ProbeResult(profile.evidence, 0)
    for over_cap, said in ((True, "it took more than --memory-limit"), (False, "out of memory")):
        error = DoesNotFitError("batch 1 did not fit", batch_size=1, over_cap=over_cap)
        found = _with_checkpointing(lambda _profile: result, profile, error)
        assert not isinstance(found, DoesNotFitError)
        assert found[1].startswith(f"not even batch 1 trained without it ({said}); with each")


class _PerSample(torch.nn.Module):
    """A step that takes 4 MiB of fresh host RAM per sample (written, so resident)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.ones(x.shape[0], 1 << 20)  # 4 MiB a sample
        return self.linear(x) + scratch[:, :1]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")
def test_the_bench_on_the_cpu_holds_every_arm_to_the_limit() -> None:
    """A profile tuned under --memory-limit hands out batch 1; the bench's baseline trains at
    32, 128 MiB of activations against a 48 MiB cap: it fails as an arm over the cap of a GPU
    does, so it gives no number to go back to (it trained, and the bench reverted the profile
    to batch 32 and saved it under the limit)."""
    from torch_autotune.bench import TrainConfig, plan_arms
    from torch_autotune.compose import bench_evidence
    from torch_autotune.probe.ablation import run_arms
    from torch_autotune.probe.workloads import as_workload
    from torch_autotune.settings import torch_defaults

    workload = as_workload(
        {
            "model": _PerSample,
            "optimizer": lambda params: torch.optim.SGD(params, lr=0.1),
            "example_batch": (torch.randn(4, 4), torch.randint(0, 2, (4,))),
        },
        name="per-sample",
    )
    plan = plan_arms(TrainConfig(), TrainConfig(batch_size=1))
    results = run_arms(
        plan,
        workload,
        torch_defaults("cpu"),
        mode="balanced",
        rounds=3,
        seconds=0.02,
        memory_limit_bytes=48 << 20,
    )
    baseline, tuned = (results.records[plan.index(c)] for c in (plan.baseline, plan.tuned))
    assert baseline.samples_per_s == (None, None, None)
    assert baseline.error is not None
    assert (
        "more than the 0.047 GiB the memory limit allows (--memory-limit, memory_limit_gib)"
        in baseline.error
    )
    assert all(tuned.samples_per_s)
    evidence = bench_evidence(
        results,
        workload="per-sample",
        device="cpu",
        rounds=3,
        seconds=0.02,
        not_ablated=(),
        elapsed_s=1.0,
    )
    assert not evidence.reverted
    assert 32 not in evidence.ran()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")
def test_on_the_cpu_the_search_predicts_from_the_limit_not_from_host_ram() -> None:
    """4 MiB a sample under 0.03 GiB: the search predicts where the cap is reached from what
    the process held plus the cap, and the evidence says so (it predicted from the host RAM the
    probe may fill, 11.8 GiB on the machine of the report, and ran batch 8 past the cap)."""
    from torch_autotune import tune

    profile = tune(
        model=_PerSample(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        example_batch=(torch.randn(4, 4), torch.randint(0, 2, (4,))),
        budget_s=5,
        max_batch_size=64,
        memory_limit_gib=0.03,
        snapshot=LAPTOP,  # the CPU's limit, also on a machine with a GPU
    )
    evidence = profile.evidence
    assert evidence is not None
    held = min(t.peak_memory_bytes or 0 for t in evidence.search if t.fits)
    assert evidence.memory_limit_bytes is not None
    assert evidence.memory_limit_bytes <= held + int(0.03 * GIB), evidence.search
    ran = [t.batch_size for t in evidence.search if t.seconds is not None]
    assert ran[1:2] == [2]  # batch 1's peak is most of the limit: 8 could pass it


class _Weighty(torch.nn.Module):
    """16 MiB of weights (written, so resident in each copy the probe builds) and a step that
    takes 4 MiB of fresh host RAM a sample."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        self.weights = torch.nn.Parameter(torch.ones(4 << 20), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.ones(x.shape[0], 1 << 20)
        return self.linear(x) + scratch[:, :1]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")
def test_on_the_cpu_every_trial_is_held_to_the_limit_the_evidence_records() -> None:
    """The evidence records the peak a trial may reach (``memory_limit_bytes``), and a trial
    that fit never peaked above it, nor did one over the cap peak within it: each trial was
    held to its growth over what the process held as it began, and the limit to what it held
    at the first, before the probe's copy of the model and torch's first step, so a later
    trial fit up to 16 MiB past the recorded limit (conv: 'peak memory 0.6 GiB (batch 78) of
    0.5 GiB the trials could use')."""
    from torch_autotune import tune

    profile = tune(
        model=_Weighty(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        example_batch=(torch.randn(4, 4), torch.randint(0, 2, (4,))),
        budget_s=6,
        max_batch_size=64,
        memory_limit_gib=0.0625,  # 16 samples beyond the model
        snapshot=LAPTOP,  # the CPU's limit, also on a machine with a GPU
    )
    evidence = profile.evidence
    assert evidence is not None
    limit = evidence.memory_limit_bytes
    assert limit is not None
    ran = [t for t in evidence.search if t.peak_memory_bytes is not None]
    fit = [t.peak_memory_bytes for t in ran if t.fits]
    assert fit
    assert all(peak is not None and peak <= limit for peak in fit), (limit, evidence.search)
    over = [t.peak_memory_bytes for t in ran if t.step == OVER_CAP]
    assert all(peak is not None and peak > limit for peak in over), (limit, evidence.search)
    assert evidence.max_batch_size >= 4  # the model's copy is not the trials' to take
