"""The throughput chart draws one series per variant: the eager step, the compiled step, and
training fed by the DataLoader at each worker count; a compiled point never stands for (or
overwrites) an eager one at the same size. Profiles measured on the simulated machine."""

from __future__ import annotations

import dataclasses
import io
import re

import pytest
from rich.console import Console

from tests.probe.fake_trials import cpu_machine, recorded, tune_on
from tests.rules.helpers import two_cpus
from tests.test_plot import NOW, SNAPSHOT_DIR, h100_evidence
from torch_autotune.evidence import BatchChoice, FedRecord
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.plot import build_figure, data, render_charts
from torch_autotune.probe import workers_phase
from torch_autotune.probe.simulated import SimulatedMachine
from torch_autotune.probe.workloads import resolve_workload
from torch_autotune.profile import Preferences, Profile
from torch_autotune.render.results import render_run
from torch_autotune.rules.context import Measurements
from torch_autotune.rules.engine import build_profile

H100 = recorded("h100-80gb-hbm3")


@pytest.fixture(scope="module")
def h100_speed() -> Profile:
    """ResNet-50 on an H100 in speed mode: eager at 1664, 832 and 416, compiled at 832 and
    1664, 832 compiled recommended (the recorded run's shape); no dataset, so no workers
    phase."""
    simulated = dataclasses.replace(resolve_workload("conv"), dataset=None, name="simulated")
    return tune_on(SimulatedMachine(), simulated, H100, mode="speed")


@pytest.fixture(scope="module")
def data_bound() -> Profile:
    """The data-bound 2-core CPU: training fed by the DataLoader chose the batch."""
    machine = cpu_machine(first_s=0.3, autotune_s=0.0, load_s=0.004, shares_cpus=True, host_cpus=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(workers_phase, "_process_cpus", lambda: 2)
        return tune_on(machine, "conv", two_cpus(), budget_s=120)


def _rates(profile: Profile, compiled: bool) -> dict[int, float]:
    assert profile.evidence is not None
    return {
        r.batch_size: r.samples_per_s for r in profile.evidence.throughput if r.compiled == compiled
    }


def test_eager_and_compiled_points_are_two_series_each_in_order_of_size(
    h100_speed: Profile,
) -> None:
    evidence = h100_speed.evidence
    assert evidence is not None
    series = data.throughput_series(evidence)
    assert [s.name for s in series] == ["eager", "compiled"]
    eager, compiled = series
    assert {p.batch_size: p.samples_per_s for p in eager.points} == _rates(h100_speed, False)
    assert {p.batch_size: p.samples_per_s for p in compiled.points} == _rates(h100_speed, True)
    for s in series:  # no zig-zag: a line runs left to right
        sizes = [p.batch_size for p in s.points]
        assert sizes == sorted(sizes)


def test_a_compiled_point_does_not_overwrite_the_eager_one_at_its_size(
    h100_speed: Profile,
) -> None:
    evidence = h100_speed.evidence
    assert evidence is not None
    assert (evidence.batch_size, h100_speed.settings.compile.enabled) == (832, True)
    rows = [r for r in data.batch_rows(evidence) if r.batch_size == 832]
    assert [(r.series, r.samples_per_s, r.marks) for r in rows] == [
        ("eager", _rates(h100_speed, False)[832], ()),
        ("compiled", _rates(h100_speed, True)[832], ("recommended",)),
    ]
    # the training step consumes at the compiled rate: the step the profile recommends
    assert data.step_rate(evidence) == _rates(h100_speed, True)[832]


def test_the_png_draws_a_line_per_series(h100_speed: Profile) -> None:
    throughput = next(ax for ax in build_figure(h100_speed).axes if ax.get_label() == "throughput")
    lines = {line.get_gid(): line for line in throughput.get_lines() if line.get_gid()}
    for name, compiled in (("eager", False), ("compiled", True)):
        line = lines[f"series: {name}"]
        rates = _rates(h100_speed, compiled)
        assert list(line.get_xdata()) == sorted(rates)
        assert list(line.get_ydata()) == [rates[size] for size in sorted(rates)]
    legend = [t.get_text() for t in throughput.get_legend().texts]
    assert "training throughput, eager (median, spread)" in legend
    assert "training throughput, compiled (median, spread)" in legend


def _charts(profile: Profile) -> list[str]:
    out = io.StringIO()
    render_charts(profile, Console(file=out, width=120, color_system=None))
    return out.getvalue().splitlines()


def test_the_text_chart_names_the_series_of_each_row(h100_speed: Profile) -> None:
    lines = _charts(h100_speed)
    eager = next(line for line in lines if line.startswith("  batch  832 eager"))
    compiled = next(line for line in lines if line.startswith("  batch  832 compiled"))
    assert f"{_rates(h100_speed, False)[832]:,.1f}/s" in eager
    assert "recommended" not in eager
    assert f"{_rates(h100_speed, True)[832]:,.1f}/s" in compiled
    assert "◀ recommended" in compiled
    assert "batch 1850" in "".join(lines)  # the largest that ran, not timed, still marked
    assert sum("largest that ran" in line for line in lines) == 1


def test_passes_fed_by_the_dataloader_are_series_of_their_own(data_bound: Profile) -> None:
    evidence = data_bound.evidence
    assert evidence is not None
    assert evidence.batch_choice is not None
    assert evidence.batch_choice.fed
    series = data.throughput_series(evidence)
    fed = [s for s in series if s.kind == "fed"]
    assert [s.name for s in series if s.kind != "fed"] == ["eager"]
    ran = {(f.num_workers, f.batch_size) for f in evidence.fed if f.samples_per_s is not None}
    assert {(int(s.name.split()[1]), p.batch_size) for s in fed for p in s.points} == ran
    workers = data_bound.settings.dataloader.num_workers
    mark = data.chosen(data_bound)
    (recommended,) = [r for r in data.batch_rows(evidence, mark) if "recommended" in r.marks]
    assert recommended.batch_size == evidence.batch_size
    assert recommended.series is not None
    assert recommended.series.startswith(f"fed, {workers} workers")
    chart = _charts(data_bound)
    row = next(line for line in chart if "◀ recommended" in line)
    assert f"batch {evidence.batch_size} {recommended.series}" in row
    assert "one pass" in row
    throughput = next(ax for ax in build_figure(data_bound).axes if ax.get_label() == "throughput")
    gids = [line.get_gid() or "" for line in throughput.get_lines()]  # caps share a line's
    assert list(dict.fromkeys(g for g in gids if g.startswith("series: "))) == [
        f"series: {s.name}" for s in series
    ]


# --- activation checkpointing: its own curves ---------------------------------------------------


@pytest.fixture(scope="module")
def checkpointed() -> Profile:
    """The simulated decoder on the H100 whose larger checkpointed batch is faster
    (``tests/probe/test_checkpointing.py``): eager points up to 120, checkpointed beyond."""
    from tests.probe.test_checkpointing import _balanced, _growing

    return _balanced(_growing(1.05))


def test_checkpointed_points_are_a_series_of_their_own_and_the_choice_comes_from_it(
    checkpointed: Profile,
) -> None:
    evidence = checkpointed.evidence
    assert evidence is not None
    series = {s.name: s for s in data.throughput_series(evidence)}
    assert list(series) == ["eager", "checkpointed"]
    ran = {r.variant: set() for r in evidence.throughput}  # type: dict[str, set[int]]
    for r in evidence.throughput:
        ran[r.variant].add(r.batch_size)
    assert {p.batch_size for p in series["eager"].points} == ran["eager"]
    assert {p.batch_size for p in series["checkpointed"].points} == ran["checkpointed"]
    assert max(ran["eager"]) <= 120 < max(ran["checkpointed"])
    assert data.recommended_series(evidence) == "checkpointed"
    rate = data.step_rate(evidence)
    assert rate == next(
        r.samples_per_s
        for r in evidence.throughput
        if r.variant == "checkpointed" and r.batch_size == evidence.batch_size
    )


def test_memory_is_two_curves_and_checkpointing_lowers_the_peak_a_sample(
    checkpointed: Profile,
) -> None:
    evidence = checkpointed.evidence
    assert evidence is not None
    eager = dict(data.memory_peaks(evidence, "eager"))
    with_it = dict(data.memory_peaks(evidence, "checkpointed"))
    assert eager
    assert with_it
    assert max(with_it) > max(eager)  # larger batches fit with it
    per_sample = {b: m / b for b, m in eager.items()}
    assert all(m / b < min(per_sample.values()) for b, m in with_it.items())
    figure = build_figure(checkpointed)
    memory = next(ax for ax in figure.axes if ax.get_label() == "memory")
    labels = [line.get_label() for line in memory.get_lines()]
    assert "peak memory of a search trial" in labels
    assert "peak memory of a search trial, checkpointed" in labels
    throughput = next(ax for ax in figure.axes if ax.get_label() == "throughput")
    legend = [t.get_text() for t in throughput.get_legend().texts]
    assert "training throughput, activation checkpointing (median, spread)" in legend


def test_a_model_that_fit_only_with_checkpointing_has_no_eager_curve() -> None:
    from tests.probe.test_checkpointing import _simulated_token_workload

    machine = SimulatedMachine(limit=0, checkpointed_limit=12, leaves=1)
    profile = tune_on(machine, _simulated_token_workload(), H100, mode="balanced", budget_s=60)
    evidence = profile.evidence
    assert evidence is not None
    assert [s.name for s in data.throughput_series(evidence)] == ["checkpointed"]
    assert data.memory_peaks(evidence, "eager") == []
    assert data.memory_peaks(evidence, "checkpointed")
    text = io.StringIO()
    render_charts(profile, Console(file=text, width=100))
    assert "peak memory" in text.getvalue()
    assert ", checkpointed)" in text.getvalue()


# --- fed passes at several thread counts ----------------------------------------------------------


def _fed_at_two_thread_counts(threads: int | None) -> Profile:
    """The H100 profile of ``tests/test_plot.py`` whose batch of 512 the fed passes chose, with
    0 workers fed at torch's default threads (1,000 samples/s) and at 1 thread (1,500), and 2
    workers (1,200); the profile trains with 0 workers at ``threads``."""
    fed = (
        FedRecord(num_workers=0, batch_size=512, samples_per_s=1000.0),
        FedRecord(num_workers=0, batch_size=512, cpu_threads=1, samples_per_s=1500.0),
        FedRecord(num_workers=2, batch_size=512, samples_per_s=1200.0),
    )
    choice = BatchChoice(
        chosen_by="fastest point", largest=768, top=768, confirmed="its fed pass", fed=True
    )
    evidence = h100_evidence().model_copy(update={"fed": fed, "batch_choice": choice})
    machine = HardwareSnapshot.model_validate_json(
        (SNAPSHOT_DIR / "h100-80gb-hbm3.json").read_text()
    )
    profile = build_profile(
        machine,
        Measurements(batch_size=512, num_workers=0),
        Preferences(model_kind="conv"),
        now=NOW,
        host_id="test",
        evidence=evidence,
    )
    settings = profile.settings.model_copy(update={"cpu_threads": threads})
    return profile.model_copy(update={"settings": settings})


@pytest.mark.parametrize(
    ("threads", "series"), [(None, "fed, 0 workers"), (1, "fed, 0 workers, 1 thread")]
)
def test_the_fed_series_marked_is_the_one_of_the_profiles_workers_and_threads(
    threads: int | None, series: str
) -> None:
    """Two fed series of 0 workers: the one of the profile's CPU threads is marked, not the
    faster of the two (the 1-thread pass was marked for a profile at torch's default)."""
    profile = _fed_at_two_thread_counts(threads)
    lines = _charts(profile)
    (row,) = [line for line in lines if "◀ recommended" in line]
    assert row.startswith(f"  batch 512 {series} ")


def test_a_pass_run_again_in_the_second_round_is_one_point_with_its_spread() -> None:
    """The second round (``probe.fed_rounds``) feeds 0 workers at 1 thread and the plain 2
    workers again: each is one point, their passes' median and spread, not two at one size;
    the summary's table says which row is the second round's."""
    profile = _fed_at_two_thread_counts(1)
    assert profile.evidence is not None
    again = (
        FedRecord(num_workers=0, batch_size=512, cpu_threads=1, samples_per_s=1300.0, round=2),
        FedRecord(num_workers=2, batch_size=512, samples_per_s=1000.0, round=2),
    )
    evidence = profile.evidence.model_copy(update={"fed": profile.evidence.fed + again})
    profile = profile.model_copy(update={"evidence": evidence})
    series = {s.name: s.points for s in data.throughput_series(evidence)}
    (point,) = series["fed, 0 workers, 1 thread"]
    assert (point.samples_per_s, point.relative_spread) == (1400.0, pytest.approx(200 / 1400))
    (point,) = series["fed, 2 workers"]
    assert (point.samples_per_s, point.relative_spread) == (1100.0, pytest.approx(200 / 1100))
    (point,) = series["fed, 0 workers"]  # one pass: no spread
    assert point.relative_spread is None
    (row,) = [line for line in _charts(profile) if "◀ recommended" in line]
    assert row.startswith("  batch 512 fed, 0 workers, 1 thread ")
    assert "spread 14%" in row
    text = io.StringIO()
    render_run(profile, Console(file=text, width=120), None)
    table = text.getvalue().split("Training fed by the DataLoader")[1]
    assert re.findall(r"\n +512 +(\d+) +(\S+) +[\d.]+ +(.*?) *(?=\n)", table) == [
        ("0", "default", ""),
        ("0", "1", "recommended"),
        ("2", "default", ""),
        ("0", "1", "second round"),
        ("2", "default", "second round"),
    ]
