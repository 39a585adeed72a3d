"""The batch decision and the summary say what the probe did, no more: how the batch was chosen
(the fastest steady point, the largest point, the top candidate), whether a margin was taken,
whether it ran again, and the global batch that accumulation makes (issue 18, point 7)."""

from __future__ import annotations

import dataclasses
import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from tests.probe.fake_trials import cpu_machine, recorded, tune_on
from torch_autotune import api
from torch_autotune.cli import cli
from torch_autotune.errors import EXIT_USAGE
from torch_autotune.evidence import BatchChoice
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.integrations import process_count
from torch_autotune.probe.points import unmeasured_warning, unsteady_choice
from torch_autotune.probe.presets import preset
from torch_autotune.probe.simulated import SimulatedMachine
from torch_autotune.probe.workloads import Workload, resolve_workload
from torch_autotune.profile import Profile, Source, ThroughputRecord
from torch_autotune.profile_io import dump_profile
from torch_autotune.render.results import render_run
from torch_autotune.rules.engine import build_profile
from torch_autotune.rules.optimizer import accumulation, batch_reason

H100 = recorded("h100-80gb-hbm3")
LAPTOP = recorded("cpu-laptop-linux")


def _workload() -> Workload:
    """The conv workload without a dataset: no real DataLoader in these tests."""
    return dataclasses.replace(resolve_workload("conv"), dataset=None, name="simulated")


def _decision(profile: Profile, setting: str) -> str:
    decision = profile.decision(setting)
    assert decision is not None
    return decision.reason


def _summary(profile: Profile) -> str:
    out = io.StringIO()
    render_run(profile, Console(file=out, width=400, color_system=None), saved=None)
    return out.getvalue()


# --- what the probe records ---------------------------------------------------------------------


def test_the_h100_batch_is_the_fastest_point_and_says_so_not_the_largest_less_a_margin() -> None:
    """The H100 profile read '832: the largest batch the probe ran, less its safety margin, and
    run once more': 832 was the fastest steady point, and ran once, as that point."""
    profile = tune_on(SimulatedMachine(), _workload(), H100, mode="balanced")
    evidence = profile.evidence
    assert evidence is not None
    choice = evidence.batch_choice
    assert choice is not None
    assert choice.chosen_by == "fastest point"
    assert choice.confirmed == "its point"
    assert choice.margin == 0.1  # memory limited the search on the simulated H100
    reason = _decision(profile, "batch.batch_size")
    assert reason.startswith(f"{evidence.batch_size}: the fastest steady batch measured here (")
    assert "its throughput point ran after the search, with these settings" in reason
    assert "once more" not in reason
    assert f"the largest batch that trained was {evidence.max_batch_size}" in reason
    summary = _summary(profile)
    assert "ran again" not in summary
    assert "its throughput point ran after the search" in summary


def test_a_batch_limited_by_the_cap_claims_no_memory_margin() -> None:
    machine = cpu_machine(fixed_s=0.05, per_sample_s=0.002, first_s=0.3, autotune_s=0.0)
    profile = tune_on(machine, _workload(), LAPTOP, budget_s=60)
    assert profile.provenance.preferences.max_batch_size is None  # none asked for
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.limited_by == "cap"
    assert evidence.batch_choice is not None
    assert evidence.batch_choice.margin is None
    reason = _decision(profile, "batch.batch_size")
    assert "margin" not in reason
    assert "K2)" not in reason


def test_with_no_steady_point_the_fastest_point_is_kept_and_is_its_own_confirmation() -> None:
    """The largest point trained after the search with the final settings: it is not run once
    more (on a busy 2-core CPU, batch 512 again took 16 s of a 30 s budget, and the DataLoader
    went unmeasured)."""
    noisy = dict.fromkeys(range(1, 2000), 0.5)  # every point alternates by 50%
    machine = SimulatedMachine(noise=noisy, leaves=1)
    profile = tune_on(machine, _workload(), H100, mode="balanced")
    evidence = profile.evidence
    assert evidence is not None
    choice = evidence.batch_choice
    assert choice is not None
    assert choice.chosen_by == "fastest unsteady point"
    assert choice.confirmed == "its point"
    assert choice.samples_per_s is None
    batch = profile.settings.batch.batch_size
    assert any(not p.steady for p in evidence.throughput if p.batch_size == batch)
    rates = {p.batch_size: p.samples_per_s for p in evidence.throughput}
    assert rates[batch] >= max(rates.values()) * 0.97  # the fastest, or a smaller one within 3%
    assert not [t for t in evidence.search if t.step == "confirm"]  # nothing ran again
    reason = _decision(profile, "batch.batch_size")
    assert "no throughput point was steady" in reason
    assert "its throughput point ran after the search, with these settings" in reason
    assert "once more" not in reason
    summary = _summary(profile)
    assert re.search(r"fastest batch +not measured: no throughput point was steady", summary)


# --- the sentences, for every way the batch can be chosen ----------------------------------------


_CONFIRMED_TEXT = {
    "its point": "with these settings",
    "ran again": "with these settings",
    "stepped down": "",
    "not run again": "with these settings",
}
"""Whether each way of confirming the batch speaks of 'these settings' (stepped down does not)."""


@given(
    chosen_by=st.sampled_from(["fastest point", "largest point", "top candidate"]),
    confirmed=st.sampled_from(["its point", "ran again", "stepped down", "not run again"]),
    margin=st.sampled_from([None, 0.1, 0.2]),
    multiple=st.sampled_from([1, 8]),
    compiled=st.booleans(),
)
def test_the_batch_reason_states_exactly_what_was_done(
    chosen_by: str, confirmed: str, margin: float | None, multiple: int, compiled: bool
) -> None:
    fastest = chosen_by == "fastest point"
    choice = BatchChoice(
        chosen_by=chosen_by,  # type: ignore[arg-type]
        largest=1000,
        top=896,
        margin=margin,
        multiple=multiple,
        variant="compiled" if compiled and fastest else "eager",
        samples_per_s=2000.0 if fastest else None,
        best_samples_per_s=2050.0 if fastest else None,
        best_batch_size=896 if fastest else None,
        confirmed=confirmed,  # type: ignore[arg-type]
    )
    reason = batch_reason(448, choice)
    assert ("margin" in reason) is (margin is not None)
    assert ("multiple of 8" in reason) is (multiple == 8)
    assert ("once more" in reason) is (confirmed == "ran again")
    # not run again: predicted not to fit in the time left, which was not nothing
    assert "spent" not in reason
    assert ("would not fit in the time budget left" in reason) is (confirmed == "not run again")
    assert ("fastest steady batch measured" in reason) is fastest
    assert ("compiled" in reason) is (compiled and fastest)
    # a compiled point came from the compiled model's own search, and the reason says so
    assert ("trained compiled was 1000" in reason) is (compiled and fastest)
    assert ("within 3%" in reason) is fastest  # 896 was faster, 448 within 3% of it
    ran_compiled = compiled and fastest
    for compiles in (False, True):
        told = batch_reason(448, choice, compiles)
        says_these = "with these settings" in _CONFIRMED_TEXT[confirmed]
        assert ("these settings but eager" in told) is (
            says_these and compiles and not ran_compiled
        )
        assert ("these settings but compiled" in told) is (
            says_these and ran_compiled and not compiles
        )


@pytest.mark.parametrize(
    ("target", "batch", "processes", "steps", "text"),
    [
        (1000, 256, 1, 4, "global batch of 1024; the target 1000 is not a whole number"),
        (1024, 256, 1, 4, "global batch of 1024, the target (1024)"),
        (4096, 64, 8, 8, "batch 64 x 8 steps x 8 processes = a global batch of 4096"),
    ],
)
def test_accumulation_says_the_global_batch_and_when_the_target_was_rounded(
    target: int, batch: int, processes: int, steps: int, text: str
) -> None:
    made, reason = accumulation(batch, target, processes)
    assert made == steps
    assert text in reason


def test_accumulation_counts_the_processes_that_train_not_the_gpus_in_the_box() -> None:
    """An 8x A100 machine whose torch is a CPU build trains on the CPU, in one process: a
    target of 4096 at batch 64 is 64 steps, not 8 (the processes were every GPU detected)."""
    machine = recorded("a100-sxm4-80gb-8x")
    software = machine.software.model_copy(update={"torch_cuda_version": None})
    cpu_torch = machine.model_copy(update={"software": software})
    rules_only = build_profile(cpu_torch)
    assert rules_only.settings.device == "cpu"
    assert process_count(rules_only) == 1
    assert process_count(build_profile(machine)) == 8
    simulated = cpu_machine(fixed_s=0.05, per_sample_s=0.002, first_s=0.3, autotune_s=0.0)
    profile = tune_on(
        simulated, _workload(), cpu_torch, budget_s=60, max_batch_size=64, target_global_batch=4096
    )
    assert profile.settings.device == "cpu"
    assert profile.batch_size == 64
    assert profile.grad_accum_steps == 64
    assert "a global batch of 4096, the target" in _decision(profile, "batch.grad_accum_steps")


def test_a_target_below_the_batch_that_fits_caps_the_search_and_is_kept() -> None:
    """A target global batch of 24, where batch 64 fits and runs faster: the batch is at most
    24 and the global batch is the target (it was 64 x 1, 'rounded up')."""
    machine = cpu_machine(fixed_s=0.05, per_sample_s=0.002, first_s=0.3, autotune_s=0.0)
    profile = tune_on(
        machine, _workload(), LAPTOP, budget_s=60, max_batch_size=64, target_global_batch=24
    )
    assert profile.batch_size is not None
    assert profile.batch_size <= 24
    assert profile.batch_size * profile.grad_accum_steps == 24  # halvings of 24 divide it
    assert profile.evidence is not None
    assert max(t.batch_size for t in profile.evidence.search) <= 24  # never tried past it
    assert profile.provenance.preferences.max_batch_size == 64  # the user's own, as asked


SHARES = [  # (--max-batch-size, target, processes, smallest, multiple) -> the largest tried
    ((None, 100, 3, 1, 1), 34),  # 34 x 1 x 3 = 102; 33 would take 2 steps: 198
    ((None, 10, 4, 1, 1), 3),  # 3 x 1 x 4 = 12, not 2 x 2 x 4 = 16
    ((None, 100, 1, 1, 8), 104),  # a GPU's multiple of 8: 104 x 1, not 96 x 2
    ((None, 16, 8, 1, 8), 2),  # a share below the multiple stays: 2 x 8 = 16, not 8 x 8
    ((None, 4, 1, 1, 8), 4),
    ((64, 24, 1, 1, 1), 24),
    ((16, 24, 1, 1, 1), 16),  # --max-batch-size below the share stands
    ((None, 1, 1, 2, 1), 2),  # BatchNorm's smallest batch, above the share
    ((None, None, 4, 1, 8), None),
]


@pytest.mark.parametrize(("asked", "largest"), SHARES)
def test_the_largest_batch_a_process_tries_is_its_share_of_the_target_rounded_up(
    asked: tuple[int | None, int | None, int, int, int], largest: int | None
) -> None:
    from torch_autotune.compose import largest_asked

    assert largest_asked(*asked) == largest


def test_a_run_with_a_target_batch_shows_the_accumulation_and_the_rounding() -> None:
    machine = cpu_machine(fixed_s=0.05, per_sample_s=0.002, first_s=0.3, autotune_s=0.0)
    profile = tune_on(
        machine, _workload(), LAPTOP, budget_s=60, max_batch_size=256, target_global_batch=1000
    )
    assert profile.settings.batch.batch_size is not None
    batch = profile.batch_size
    assert batch == profile.settings.batch.batch_size
    steps = profile.grad_accum_steps
    assert steps == -(-1000 // batch)
    preferences = profile.provenance.preferences
    assert (preferences.target_global_batch, preferences.max_batch_size) == (1000, 256)
    assert profile.evidence is not None
    assert profile.evidence.limit_reason == "the largest batch asked for (256)"
    decision = profile.decision("batch.grad_accum_steps")
    assert decision is not None
    assert decision.source is Source.MEASURED
    assert f"a global batch of {batch * steps}" in decision.reason
    summary = _summary(profile)
    assert f"accumulation {steps}: batch {batch} x {steps} steps" in summary
    if batch * steps != 1000:
        assert "is rounded up" in summary


def test_a_rules_only_profile_has_no_batch_of_its_own() -> None:
    profile = build_profile(LAPTOP)
    assert profile.batch_size is None
    assert profile.grad_accum_steps == 1


# --- export --profile FILE ------------------------------------------------------------------------


@pytest.fixture
def measured_file(tmp_path: Path) -> Path:
    machine = cpu_machine(fixed_s=0.05, per_sample_s=0.002, first_s=0.3, autotune_s=0.0)
    profile = tune_on(machine, _workload(), LAPTOP, budget_s=60, max_batch_size=64)
    path = tmp_path / "profile.json"
    path.write_text(dump_profile(profile, "json"))
    return path


def test_export_reads_a_profile_file(measured_file: Path) -> None:
    result = CliRunner().invoke(cli, ["export", "--format", "hf", "--profile", str(measured_file)])
    assert result.exit_code == 0, result.output
    exported = json.loads(result.stdout)
    saved = json.loads(measured_file.read_text())
    assert exported["per_device_train_batch_size"] == saved["settings"]["batch"]["batch_size"]


@pytest.mark.parametrize("other", [["-m", "conv"], ["--mode", "speed"], ["--snapshot", "x.json"]])
def test_export_profile_with_a_stored_profile_option_is_a_usage_error(
    measured_file: Path, other: list[str]
) -> None:
    result = CliRunner().invoke(cli, ["export", "--profile", str(measured_file), *other])
    assert result.exit_code == EXIT_USAGE
    assert "--profile names the profile to export" in result.output


def test_save_is_public_and_its_file_exports(
    tmp_path: Path, detected_as: Callable[[str], HardwareSnapshot]
) -> None:
    detected_as("cpu-laptop-linux")
    machine = cpu_machine(fixed_s=0.05, per_sample_s=0.002, first_s=0.3, autotune_s=0.0)
    profile = tune_on(machine, _workload(), LAPTOP, budget_s=60, max_batch_size=64)
    import torch_autotune

    saved = torch_autotune.save(profile, tmp_path)
    assert saved.is_file()
    assert api.recommend(workload="simulated", store=tmp_path) == profile
    result = CliRunner().invoke(cli, ["export", "--profile", str(saved)])
    assert result.exit_code == 0, result.output
    assert "batch_size: " in result.stdout


# --- found by the property over simulated runs (tests/test_claims.py) -----------------------------


def test_a_batch_that_ran_eager_only_in_a_compiling_profile_is_not_said_to_have_run_with_it() -> (
    None
):
    """ResNet-50 on the H100 in speed mode with 90 s: no time to measure torch.compile, so the
    rules keep it, and the batch ran eager only. The summary said its point ran 'with these
    settings'."""
    machine = preset("h100-resnet50", load_s=None)
    profile = tune_on(machine, _workload(), H100, mode="speed", budget_s=90)
    assert profile.settings.compile.enabled
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.compile is not None
    assert not evidence.compile.measured
    assert evidence.batch_choice is not None
    assert not evidence.batch_choice.compiled
    assert (
        "recommended 832 (its throughput point ran after the search, with these settings but"
        " eager: this profile compiles, and torch.compile was not measured at this size)"
    ) in re.sub(r" {2,}", " ", _summary(profile))


def test_the_best_rate_said_beside_the_batch_is_the_chosen_variants_own() -> None:
    """Compile measured and not kept (1.02x, within the noise), its fastest point at another
    batch: the eager choice's 'best' is eager's, not the compiled point's (the summary said
    '160 at 366 samples/s (within 3% of the best, 372 samples/s at 152)', 372 compiled)."""
    from torch_autotune.probe.points import batch_choice
    from torch_autotune.profile import ThroughputRecord

    def point(size: int, rate: float, variant: str) -> ThroughputRecord:
        return ThroughputRecord(
            batch_size=size,
            samples_per_s=rate,
            relative_spread=0.0,
            steady=True,
            variant=variant,
            warmup_s=0.0,
            blocks=3,
            peak_memory_bytes=1,
        )

    eager = point(160, 365.7, "eager")
    records = [eager, point(80, 284.4, "eager"), point(152, 371.6, "compiled")]
    choice = batch_choice(
        largest=178,
        limited_by="memory",
        fixed_shapes=True,
        top=160,
        multiple=8,
        best=eager,
        records=records,
        confirmed=[],
        candidate=160,
    )
    assert (choice.variant, choice.best_batch_size, choice.best_samples_per_s) == (
        "eager",
        160,
        365.7,
    )


@pytest.mark.parametrize(
    ("blocks", "said"),
    [
        (1, "only 1 timed block ran in its time"),
        (2, "only 2 timed blocks ran in its time"),
        (3, "its timed blocks differed by more than 5%"),
        (0, "noisy"),  # a record from before the blocks were kept
    ],
)
def test_a_point_that_is_not_steady_says_why(blocks: int, said: str) -> None:
    """Time that ran out before three timed blocks is not noise (a point of one block, spread
    0%, was called noisy, and the warning said its blocks 'kept differing')."""
    from torch_autotune.profile import ThroughputRecord

    record = ThroughputRecord(
        batch_size=8, samples_per_s=10.0, relative_spread=0.0, steady=False, blocks=blocks
    )
    assert record.unsteady == said


def test_on_a_slow_cpu_the_smaller_candidates_are_measured_where_all_would_not_fit() -> None:
    """A busy 2-core CPU: batch 352's point alone took 23 s of a 26 s throughput phase, one
    unsteady point and no comparison; 52 s of the budget were left at the end."""
    machine = cpu_machine(first_s=1.2, autotune_s=0.0, fixed_s=0.05, per_sample_s=0.023)
    profile = tune_on(machine, _workload(), LAPTOP, budget_s=120)
    evidence = profile.evidence
    assert evidence is not None
    largest = evidence.max_batch_size
    measured = [p.batch_size for p in evidence.throughput]
    assert largest not in measured
    assert measured
    assert all(p.steady for p in evidence.throughput)
    batch = profile.settings.batch.batch_size
    assert batch in measured
    rate = batch / machine.step_s(batch, compiled=False)
    assert rate >= largest / machine.step_s(largest, compiled=False) * 0.97
    assert any(
        w.startswith((f"batch {largest} was not", f"batches {largest} and "))
        and "on a CPU a smaller batch often trains as fast" in w
        for w in evidence.warnings
    )
    assert evidence.elapsed_s <= evidence.budget_s


def _unsteady(batch: int, rate: float) -> ThroughputRecord:
    return ThroughputRecord(
        batch_size=batch, samples_per_s=rate, relative_spread=0.3, steady=False, blocks=2
    )


def test_with_no_steady_point_the_fastest_measured_size_is_chosen_not_the_largest() -> None:
    """The trial on a busy 2-core CPU: 512 at 253.8 samples/s and 128 at 321.1, neither steady;
    the largest, 512, was handed out and trained at 0.84-0.91x of a plain batch 32."""
    chosen = unsteady_choice([_unsteady(512, 253.8), _unsteady(128, 321.1)])
    assert chosen is not None
    assert chosen.batch_size == 128
    near = unsteady_choice([_unsteady(512, 300.0), _unsteady(256, 295.0), _unsteady(128, 250.0)])
    assert near is not None
    assert near.batch_size == 256  # within 3% of the fastest: the smaller, on less memory
    assert unsteady_choice([]) is None


def test_a_run_where_no_throughput_point_ran_says_so() -> None:
    assert unmeasured_warning([]).startswith("no throughput point ran: the batch is the top")
    line = unmeasured_warning([_unsteady(512, 253.8)])
    assert line.startswith("no throughput point was steady (")
    assert "the size whose point ran fastest in noisy timings stands for it" in line
