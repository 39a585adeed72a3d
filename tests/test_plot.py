"""Charts of a measured profile: the chart data, the PNG (panels, marks, atomic writes, no
matplotlib) and the text rendering for terminals.

Profiles are built from made-up measurements, without torch: an H100 whose search ran out of
memory at 832, a DataLoader whose 8-worker candidate failed, and a bench in which channels_last
measured slower in every round and was dropped.
"""

from __future__ import annotations

import io
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from torch_autotune import plot
from torch_autotune.bench import (
    ArmRecord,
    BenchEvidence,
    Plan,
    TrainConfig,
    apply_bench,
    effect,
    final_config,
    judge,
    knob_value,
    plan_arms,
    tuned_config,
)
from torch_autotune.errors import EXIT_USAGE, PlotUnavailableError, ProfileFileError, StoreError
from torch_autotune.evidence import BatchChoice
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.plot import build_figure, data, png, render_charts, save_png
from torch_autotune.plot.text import text_bar
from torch_autotune.profile import (
    Evidence,
    LoaderRecord,
    Preferences,
    Profile,
    SearchTrialRecord,
    ThroughputRecord,
)
from torch_autotune.rules.context import Measurements
from torch_autotune.rules.engine import build_profile

SNAPSHOT_DIR = Path(__file__).parent / "fixtures" / "snapshots"
NOW = datetime(2026, 11, 1, tzinfo=timezone.utc)
GIB = 1 << 30
LIMIT = 79 * GIB + (123 << 20)  # bytes the trials could use on the H100
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Each setting multiplies the rate when an arm takes it from the profile: channels_last slows.
FACTORS = {"precision": 2.0, "batch_size": 1.3, "channels_last": 0.9, "num_workers": 1.2}
JITTER = (1.0, 1.004, 0.996, 1.002, 0.998)  # per arm and round: noise far below 2%


def trial(
    size: int, fits: bool, peak_gib: float | None = None, step: str = "bisect"
) -> SearchTrialRecord:
    return SearchTrialRecord(
        batch_size=size,
        fits=fits,
        peak_memory_bytes=None if peak_gib is None else int(peak_gib * GIB),
        seconds=0.5 if fits else None,
        step=step,
    )


def h100_evidence(*, loader: bool = True) -> Evidence:
    """The probe on an H100: 768 is the largest batch that trained, 832 ran out of memory."""
    return Evidence(
        workload="conv",
        device="cuda",
        max_batch_size=768,
        fastest_batch_size=512,
        batch_size=512,
        limited_by="memory",
        search=(
            trial(1, True, 2.1, "start"),
            trial(8, True, 3.0, "model"),
            trial(512, True, 52.0, "predict"),
            trial(1024, False, None, "double"),
            trial(768, True, 74.5),
            trial(896, False),
            trial(832, False),
            trial(512, True, 52.2, "confirm"),
        ),
        throughput=(
            ThroughputRecord(batch_size=64, samples_per_s=900.0, relative_spread=0.04),
            ThroughputRecord(batch_size=128, samples_per_s=1500.0, relative_spread=0.03),
            ThroughputRecord(batch_size=256, samples_per_s=2100.0, relative_spread=0.02),
            ThroughputRecord(batch_size=512, samples_per_s=2300.0, relative_spread=0.02),
            ThroughputRecord(batch_size=768, samples_per_s=2310.0, relative_spread=0.05),
        ),
        loader=(
            LoaderRecord(num_workers=0, samples_per_s=800.0),
            LoaderRecord(num_workers=2, samples_per_s=1900.0),
            LoaderRecord(num_workers=4, samples_per_s=3500.0),
            LoaderRecord(
                num_workers=8, samples_per_s=None, error="DataLoader worker killed by signal 7"
            ),
        )
        if loader
        else (),
        budget_s=120,
        elapsed_s=95,
        memory_limit_bytes=LIMIT,
    )


def measured(*, loader: bool = True) -> Profile:
    machine = HardwareSnapshot.model_validate_json(
        (SNAPSHOT_DIR / "h100-80gb-hbm3.json").read_text()
    )
    return build_profile(
        machine,
        Measurements(batch_size=512, num_workers=4 if loader else None),
        Preferences(model_kind="conv"),
        now=NOW,
        host_id="test",
        evidence=h100_evidence(loader=loader),
    )


def rounds_for(plan: Plan, factors: dict[str, float] = FACTORS) -> list[list[float | None]]:
    def rate(config: TrainConfig, jitter: float) -> float:
        value = 1000.0 * jitter
        for knob in plan.knobs:
            if knob_value(config, knob) == knob_value(plan.tuned, knob):
                value *= factors.get(knob.name, 1.0)
        return value

    return [
        [rate(c, JITTER[(r + i) % len(JITTER)]) for i, c in enumerate(plan.configs)]
        for r in range(len(JITTER))
    ]


def benched(profile: Profile, factors: dict[str, float] = FACTORS) -> Profile:
    """The profile after a bench with made-up rounds (the pure half of autotune bench)."""
    plan = plan_arms(TrainConfig(), tuned_config(profile))
    rows = rounds_for(plan, factors)
    tuned, settings = judge(plan, rows)
    final = plan.index(final_config(plan, settings))
    at = plan.index(plan.baseline)
    bench = BenchEvidence(
        workload="conv",
        device="cuda",
        rounds=len(rows),
        seconds_per_measurement=1.0,
        arms=tuple(
            ArmRecord(names=names, config=config, samples_per_s=tuple(row[i] for row in rows))
            for i, (names, config) in enumerate(zip(plan.names, plan.configs, strict=True))
        ),
        tuned=tuned,
        settings=tuple(settings),
        final=effect([r[final] for r in rows], [r[at] for r in rows]),
        elapsed_s=30.0,
    )
    return apply_bench(profile, plan, bench)


@pytest.fixture(scope="module")
def full() -> Profile:
    return benched(measured())


def panels(profile: Profile) -> list[str]:
    figure = build_figure(profile)
    return [ax.get_label() for ax in figure.axes if ax.get_label() != "memory"]


def axis(profile: Profile, label: str) -> Any:
    return next(ax for ax in build_figure(profile).axes if ax.get_label() == label)


# --- the PNG ------------------------------------------------------------------------------------


@pytest.mark.slow  # draws a PNG with matplotlib: a second
def test_the_png_is_written_whole_and_has_the_figure_size(full: Profile, tmp_path: Path) -> None:
    from matplotlib.image import imread

    path = save_png(full, tmp_path / "charts" / "report.png")
    data = path.read_bytes()
    assert path == tmp_path / "charts" / "report.png"
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 10_000
    width, height = build_figure(full).get_size_inches() * png.DPI
    assert imread(path).shape[:2] == (round(height), round(width))
    assert [p.name for p in path.parent.iterdir()] == ["report.png"]  # no temporary left


def test_one_panel_per_kind_of_data(full: Profile) -> None:
    assert panels(full) == ["throughput", "loader", "bench"]
    assert panels(measured()) == ["throughput", "loader"]
    assert panels(measured(loader=False)) == ["throughput"]
    assert panels(benched(measured(loader=False))) == ["throughput", "bench"]


def test_the_title_names_workload_device_gpu_and_torch(full: Profile) -> None:
    title = build_figure(full).get_suptitle()
    assert title == "conv on cuda: NVIDIA H100 80GB HBM3, torch 2.8.0+cu128"


def test_memory_limit_recommended_size_and_first_misfit_are_marked(full: Profile) -> None:
    figure = build_figure(full)
    throughput = next(ax for ax in figure.axes if ax.get_label() == "throughput")
    memory = next(ax for ax in figure.axes if ax.get_label() == "memory")
    (limit,) = [line for line in memory.get_lines() if line.get_gid() == "memory-limit"]
    assert limit.get_ydata()[0] == pytest.approx(LIMIT / GIB)
    (recommended,) = [line for line in throughput.get_lines() if line.get_gid() == "recommended"]
    assert recommended.get_xdata()[0] == 512
    (misfit,) = [p for p in throughput.patches if p.get_gid() == "misfit"]
    assert misfit.get_x() == 832  # the smallest size above 768 that did not fit
    assert "832 and up: out of memory" in [t.get_text() for t in throughput.get_legend().texts]


def test_the_misfit_band_never_says_a_size_that_ran_was_not_run(full: Profile) -> None:
    """On the CPU under --memory-limit the search ran 896 over the cap, then refused 832 by
    its prediction: the band said '832 and up: not run (predicted over --memory-limit)', 896
    among them. Each reason is said at the smallest size it holds for."""
    assert full.evidence is not None
    steps = {832: "over --memory-limit (not run)", 896: "over --memory-limit"}
    search = [
        t.model_copy(update={"step": steps.get(t.batch_size, "over --memory-limit")})
        if not t.fits
        else t
        for t in full.evidence.search
    ]
    evidence = full.evidence.model_copy(update={"search": search})
    mixed = full.model_copy(update={"evidence": evidence})
    throughput = axis(mixed, "throughput")
    (misfit,) = [p for p in throughput.patches if p.get_gid() == "misfit"]
    assert misfit.get_x() == 832
    labels = [t.get_text() for t in throughput.get_legend().texts]
    assert (
        "832 and up: 832 not run (predicted over --memory-limit), 896 over --memory-limit" in labels
    )
    assert data.misfit_band(full.evidence) == "832 and up: out of memory"  # one reason: as it was


def test_the_loader_panel_marks_failures_and_the_training_rate(full: Profile) -> None:
    loader = axis(full, "loader")
    (rate,) = [line for line in loader.get_lines() if line.get_gid() == "step-rate"]
    assert rate.get_ydata()[0] == 2300.0  # the throughput at the recommended batch
    texts = [t.get_text() for t in loader.texts]
    assert "failed: DataLoader worker killed by signal 7" in texts
    assert [label.get_text() for label in loader.get_xticklabels()] == ["0", "2", "4", "8"]


def test_dropped_settings_are_hatched_and_labelled(full: Profile) -> None:
    bench = axis(full, "bench")
    hatched = {p.get_gid() for p in bench.patches if p.get_hatch()}
    assert hatched == {"channels_last: on alone", "channels_last: in the profile"}
    labels = [label.get_text() for label in bench.get_yticklabels()]
    assert "channels_last off→on (dropped)" in labels
    assert labels[0] == "whole profile"
    assert {"whole profile: as tuned", "whole profile: after drops"} <= {
        p.get_gid() for p in bench.patches
    }
    assert [line.get_xdata()[0] for line in bench.get_lines() if line.get_gid() == "no-change"]


def test_without_matplotlib_the_error_says_how_to_install_it(
    full: Profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert plot.matplotlib_available() is False
    with pytest.raises(PlotUnavailableError, match=r'pip install "torch-autotune\[plot\]"') as err:
        save_png(full, tmp_path / "report.png")
    assert err.value.exit_code == EXIT_USAGE
    assert not (tmp_path / "report.png").exists()
    assert list(tmp_path.iterdir()) == []


def test_an_old_matplotlib_is_refused_with_the_upgrade(
    full: Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib

    monkeypatch.setattr(matplotlib, "__version__", "3.4.3")
    assert plot.matplotlib_available() is False
    with pytest.raises(PlotUnavailableError, match=r"3\.4\.3 is too old.*torch-autotune\[plot\]"):
        build_figure(full)


def test_a_failed_drawing_leaves_the_existing_file_alone(
    full: Profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "report.png"
    path.write_bytes(b"the previous report")

    def broken(*_args: object, **_kwargs: object) -> None:
        raise ValueError("drawing failed")

    monkeypatch.setattr(png, "draw_bench", broken)
    with pytest.raises(ValueError, match="drawing failed"):
        save_png(full, path)
    assert path.read_bytes() == b"the previous report"
    assert [p.name for p in tmp_path.iterdir()] == ["report.png"]


@pytest.mark.slow  # draws a PNG with matplotlib: a second
def test_an_unwritable_path_is_a_store_error_and_leaves_nothing(
    full: Profile, tmp_path: Path
) -> None:
    (tmp_path / "report.png").mkdir()  # a directory where the file should go
    with pytest.raises(StoreError, match="cannot write"):
        save_png(full, tmp_path / "report.png")
    assert [p.name for p in tmp_path.iterdir()] == ["report.png"]


def test_a_rules_only_profile_has_nothing_to_plot(tmp_path: Path) -> None:
    machine = HardwareSnapshot.model_validate_json((SNAPSHOT_DIR / "tesla-t4.json").read_text())
    rules_only = build_profile(machine, now=NOW, host_id="test")
    with pytest.raises(ProfileFileError, match=r"not measured: .*run autotune first"):
        save_png(rules_only, tmp_path / "report.png")
    assert not (tmp_path / "report.png").exists()
    with pytest.raises(ProfileFileError, match="not measured"):
        render_charts(rules_only, Console(file=io.StringIO()))


def test_importing_the_module_imports_neither_matplotlib_nor_torch() -> None:
    code = (
        "import sys, torch_autotune.plot\n"
        "print(sorted({'matplotlib', 'torch'} & {m.split('.')[0] for m in sys.modules}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


# Each module of the package, and the packages it must not import: the chart data draws
# nothing, the PNG knows no terminal, the text charts no matplotlib; none of them needs torch
# or the CLI's click.
BOUNDARIES = {
    "data": ("matplotlib", "rich", "torch", "click"),
    "png": ("matplotlib", "rich", "torch", "click"),  # matplotlib: only when a PNG is drawn
    "panels": ("matplotlib", "rich", "torch", "click"),
    "text": ("matplotlib", "torch", "click"),
}


@pytest.mark.parametrize(("module", "banned"), BOUNDARIES.items())
def test_each_module_imports_without_what_it_must_not_use(
    module: str, banned: tuple[str, ...]
) -> None:
    """The banned packages are made unimportable, and the package's front (which re-exports
    both the PNG and the text charts) is bypassed, so the module is imported on its own."""
    code = (
        "import importlib, sys, types\n"
        "import torch_autotune\n"
        f"for name in {banned!r}:\n"
        "    sys.modules[name] = None\n"
        "front = types.ModuleType('torch_autotune.plot')\n"
        f"front.__path__ = [{str(Path(data.__file__).parent)!r}]\n"
        "sys.modules['torch_autotune.plot'] = front\n"
        f"importlib.import_module('torch_autotune.plot.{module}')\n"
        "print('imported')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.stdout.strip() == "imported", result.stderr


def test_the_public_names_are_pinned() -> None:
    assert sorted(plot.__all__) == [
        "PlotUnavailableError",
        "build_figure",
        "matplotlib_available",
        "render_charts",
        "save_png",
    ]
    assert all(hasattr(plot, name) for name in plot.__all__)


def test_the_chart_data_is_what_both_renderings_draw() -> None:
    evidence = h100_evidence()
    rows = data.batch_rows(evidence)
    assert [(r.batch_size, r.status, r.marks) for r in rows] == [
        (64, "timed", ()),
        (128, "timed", ()),
        (256, "timed", ()),
        (512, "timed", ("recommended",)),
        (768, "timed", ("fastest", "largest that ran")),  # 2,310 samples/s; 512 ran at 2,300
        (832, "out of memory", ()),
    ]
    assert data.first_misfit(evidence) == (832, "out of memory")
    over = evidence.model_copy(  # the CPU's --memory-limit: it ran, and took more than the cap
        update={
            "search": [
                t.model_copy(update={"step": "over --memory-limit"}) if not t.fits else t
                for t in evidence.search
            ]
        }
    )
    assert data.first_misfit(over) == (832, "over --memory-limit")
    assert data.step_rate(evidence) == 2300.0
    assert data.memory_peaks(evidence) == [
        (1, pytest.approx(2.1)),
        (8, pytest.approx(3.0)),
        (512, pytest.approx(52.0)),
        (512, pytest.approx(52.2)),
        (768, pytest.approx(74.5)),
    ]
    assert data.panels(evidence) == ["throughput", "loader"]
    assert data.shorten("a  long\n error text", 12) == "a long erro…"


# --- the terminal -------------------------------------------------------------------------------


def charts(profile: Profile, width: int = 100) -> str:
    out = io.StringIO()
    render_charts(profile, Console(file=out, width=width, color_system=None))
    return out.getvalue()


def test_the_text_charts_show_sizes_workers_and_effects(full: Profile) -> None:
    text = charts(full)
    lines = text.splitlines()
    assert lines[0] == "conv on cuda: NVIDIA H100 80GB HBM3, torch 2.8.0+cu128"
    row = next(line for line in lines if line.startswith("  batch 512"))
    assert "█" in row
    assert "2,300.0/s" in row
    assert "◀ recommended" in row
    assert "◀ fastest, largest that ran" in next(line for line in lines if "batch 768" in line)
    assert "batch 832  ✗ out of memory" in text
    assert "896" not in text  # only the first size that did not fit
    assert "peak memory 74.5 GiB (batch 768) of 79.1 GiB the trials could use" in text
    assert "training consumes 2,300.0/s at batch 512" in text
    four = next(line for line in lines if line.startswith("  4 workers"))
    assert "3,500.0/s  ahead of training  ◀ chosen" in four
    assert "behind training" in next(line for line in lines if line.startswith("  0 workers"))
    assert "8 workers  ✗ failed: DataLoader worker killed by signal 7" in text
    dropped = lines.index(next(line for line in lines if "channels_last off→on" in line))
    assert lines[dropped + 1].startswith("    ✗ dropped")
    assert "0.90x (0.90-0.91) slower" in lines[dropped + 1]
    assert "█│" in lines[dropped + 1]  # left of the 1.00x axis
    assert lines[dropped + 1].index("│") == lines[dropped - 1].index("│")
    axis = next(line for line in lines if "1.00x" in line and "3.15x" in line)
    assert axis.endswith("3.15x")  # the fastest round at the right end
    assert all(len(line) <= 100 for line in lines)
    assert "\x1b[" not in text  # plain text without a colour system


@pytest.mark.parametrize("width", [60, 80, 160])
def test_the_text_charts_fit_the_width(full: Profile, width: int) -> None:
    assert all(len(line) <= width for line in charts(full, width).splitlines())


def test_text_bars_are_scaled_in_eighths() -> None:
    assert text_bar(1.0, 4) == "████"
    assert text_bar(0.5, 4) == "██  "
    assert text_bar(1 / 32, 4) == "▏   "
    assert text_bar(0.0, 3) == "   "
    assert text_bar(2.0, 2) == "██"  # clipped to the cells


def test_a_size_not_run_for_the_budget_says_so() -> None:
    evidence = h100_evidence(loader=False).model_copy(
        update={
            "search": (
                trial(1, True, None, "start"),
                trial(512, True, None, "predict"),
                trial(768, True, None),
                trial(800, False, None, "time-guard (not run)"),
                trial(1024, False, None, "time-guard (not run)"),
            ),
            "limited_by": "budget",
        }
    )
    profile = measured(loader=False).model_copy(update={"evidence": evidence})
    text = charts(profile)
    assert "batch 800  ✗ not run (too slow for the time budget)" in text
    assert "peak memory" not in text  # not read: no memory axis either
    assert [ax.get_label() for ax in build_figure(profile).axes] == ["throughput"]


def test_a_main_process_loader_is_ahead_only_by_the_probes_own_test() -> None:
    # Seen on a 2-CPU machine: 0 workers loaded about 40x the step, which costs 2.4% of
    # training's time in series with it; the workers' reason said no count keeps ahead
    # (at most 2%), and the report called it "ahead of training"
    loader = (
        LoaderRecord(num_workers=0, samples_per_s=92_000.0),  # 40x the step's 2,300
        LoaderRecord(num_workers=4, samples_per_s=3_500.0),
    )
    evidence = h100_evidence().model_copy(update={"loader": loader})
    lines = charts(measured().model_copy(update={"evidence": evidence})).splitlines()
    main = next(line for line in lines if line.startswith("  0 workers"))
    assert "not ahead: in series with training, 2.4% of its time" in main
    assert "ahead of training" in next(line for line in lines if line.startswith("  4 workers"))


# --- the profile's batch, where it is not the probe's -------------------------------------------


def test_the_charts_mark_the_batch_the_bench_left_in_the_profile() -> None:
    """The bench dropped batch 512 (it measured slower): the profile trains at the baseline's
    32, and the charts marked 512, the evidence's batch, as recommended."""
    profile = benched(measured(), {"precision": 2.0, "batch_size": 0.9, "num_workers": 1.2})
    assert profile.evidence is not None
    assert (profile.settings.batch.batch_size, profile.evidence.batch_size) == (32, 512)
    lines = charts(profile, width=140).splitlines()
    (marked,) = [line for line in lines if "◀ recommended" in line]
    assert marked.startswith("  batch  32 ")
    assert "ran in the bench (not timed by the probe)" in marked
    assert marked.endswith("◀ recommended, the bench changed it from 512")
    throughput = axis(profile, "throughput")
    (line,) = [line for line in throughput.get_lines() if line.get_gid() == "recommended"]
    assert line.get_xdata()[0] == 32
    assert line.get_label() == "recommended: 32 (the bench changed it from 512)"


def test_the_fastest_mark_sits_on_the_fastest_bar_and_its_choice_says_within_3_percent() -> None:
    """As `autotune report` drew a run on a 2-core CPU: the step chose batch 100 (3,548
    samples/s), the smallest within 3% of the best, 200 (3,603); the report marked 100
    "fastest" and drew 200 just below it unmarked. The recommended batch is another's (a
    bench moved it to 50)."""
    rates = {50: 3_120.0, 100: 3_548.0, 200: 3_603.0}
    choice = BatchChoice(
        chosen_by="fastest point",
        largest=200,
        top=200,
        limited_by="cap",
        samples_per_s=rates[100],
        best_samples_per_s=rates[200],
        best_batch_size=200,
        confirmed="its point",
    )
    evidence = h100_evidence(loader=False).model_copy(
        update={
            "device": "cpu",
            "max_batch_size": 200,
            "fastest_batch_size": 100,
            "batch_size": 100,
            "limited_by": "cap",
            "search": tuple(trial(size, True, 1.0, "start") for size in rates),
            "throughput": tuple(
                ThroughputRecord(batch_size=size, samples_per_s=rate, relative_spread=0.01)
                for size, rate in rates.items()
            ),
            "batch_choice": choice,
        }
    )
    mark = data.Chosen(50, marks=("recommended", "the bench changed it from 100"))
    marked = {r.batch_size: r.marks for r in data.batch_rows(evidence, mark) if r.marks}
    assert marked == {
        50: ("recommended", "the bench changed it from 100"),
        100: ("within 3% of the fastest",),
        200: ("fastest", "largest that ran"),
    }
    # the fastest is the fastest bar drawn, and the choice is within 3% of it, as said
    assert rates[200] == max(rates.values())
    assert rates[100] >= rates[200] * 0.97
    # without the best recorded (a file of an earlier release), the bars themselves say which
    older = evidence.model_copy(update={"batch_choice": None})
    marked = {r.batch_size: r.marks for r in data.batch_rows(older, mark) if r.marks}
    assert marked[100] == ("within 3% of the fastest",)
    assert marked[200] == ("fastest", "largest that ran")


def test_the_charts_mark_a_batch_set_by_hand_as_such() -> None:
    from torch_autotune.hand_edits import with_hand_edits

    profile = measured()
    batch = profile.settings.batch.model_copy(update={"batch_size": 768})
    edited = with_hand_edits(
        profile.model_copy(
            update={"settings": profile.settings.model_copy(update={"batch": batch})}
        )
    )
    rows = data.batch_rows(h100_evidence(), data.chosen(edited))
    assert [(r.batch_size, r.marks) for r in rows if r.marks] == [
        (512, ("within 3% of the fastest",)),  # 768 ran at 2,310, 512 at 2,300
        (768, ("set by hand", "the probe chose 512", "largest that ran")),
    ]
