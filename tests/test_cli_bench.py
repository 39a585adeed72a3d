"""`autotune bench` and `autotune report` through click's runner: a profile file measured on the
simulated machine of ``probe.simulated``, and the bench's arms measured by a speed model (the real
training loop runs in ``tests/probe/test_ablation.py`` and the system tier)."""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.probe.fake_trials import mlp_machine, tune_on
from tests.rules.helpers import snapshot
from tests.test_bench import measured
from torch_autotune import api
from torch_autotune.bench import TrainConfig
from torch_autotune.cli import cli
from torch_autotune.detect import host
from torch_autotune.errors import EXIT_BAD_INPUT, EXIT_PROBE, EXIT_USAGE, ProbeError
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe import workers_phase
from torch_autotune.probe.workloads import Workload
from torch_autotune.profile import Profile
from torch_autotune.profile_io import dump_profile, load_profile
from torch_autotune.rules.engine import build_profile
from torch_autotune.store import ProfileStore

QUICK = ("--rounds", "2", "--seconds", "0.05")


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="autotune")


def _arm_speed(config: TrainConfig, _seconds: float) -> float:
    """Samples/s of an arm: larger batches train faster, as the mlp's do on a CPU."""
    return 100.0 * config.batch_size**0.5


@pytest.fixture(scope="module", autouse=True)
def _simulated_arms() -> Iterator[None]:
    """The bench the command runs measures its arms with ``_arm_speed``: no training."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(api, "bench", functools.partial(api.bench, measure=_arm_speed))
        yield


@pytest.fixture(scope="module")
def measured_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A profile the probe measured for the mlp workload on a recorded laptop (CPU), its
    training steps simulated."""
    machine = mlp_machine()
    # at most 48: the candidates (48, 24, 12) never equal the baseline's 32, so batch_size is
    # always one of the settings benched. The workers phase sees 2 CPUs for this process
    # whatever runs the tests: it measures no more workers and threads than the process's
    # CPUs, so the settings benched were two or three, as the runner's CPUs were
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(workers_phase, "_process_cpus", lambda: 2)
        profile = tune_on(
            machine, "mlp", snapshot("cpu-laptop-linux"), budget_s=15, max_batch_size=48
        )
    path = tmp_path_factory.mktemp("profiles") / "laptop.yaml"
    path.write_text(dump_profile(profile))
    return path


def test_bench_prints_arms_settings_and_the_verdict(
    measured_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_AUTOTUNE_HOME", str(tmp_path / "store"))
    before = measured_file.read_bytes()
    result = run("bench", "--profile", str(measured_file), *QUICK)
    assert result.exit_code == 0, result.output
    assert "autotune bench: mlp on cpu" in result.output
    assert "baseline" in result.output
    assert "float32, batch 32, 0 workers" in result.output
    assert "the baseline's speed" in result.output
    assert result.stderr.splitlines()[0] == (  # before the bench starts: how long, and why
        "autotune: the bench should take about 8 s: 4 arms x 2 rounds x (0.05 s + about 1 s to"
        " start each)"
    )
    assert measured_file.read_bytes() == before  # the file benched is never rewritten
    assert not (tmp_path / "store").exists()  # nor the store: --profile leaves it alone


def test_every_row_of_the_arms_table_holds_an_arm_and_its_numbers(measured_file: Path) -> None:
    """An arm that goes by two names (the baseline is also the profile without its batch)
    printed its second name on a row of its own, a row with no values."""
    result = run("bench", "--profile", str(measured_file), *QUICK)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["arm", "trains"]) + 2
    rows = lines[start : lines.index("", start)]
    arms = json.loads(run("bench", "--profile", str(measured_file), *QUICK, "--json").stdout)
    names = [" = ".join(arm["names"]) for arm in arms["arms"]]
    assert names == [
        "baseline",
        "tuned",
        "baseline + batch_size = tuned - num_workers",
        "tuned - batch_size = baseline + num_workers",
    ]
    assert [row.strip().split("  ")[0] for row in rows] == names  # one row an arm
    for row in rows:
        assert re.search(r"\d+\.\d+\s+\d+%$", row), row  # samples/s and spread, on every row


def test_bench_json_and_output_file_hold_the_evidence(measured_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "benched.yaml"
    result = run("bench", "--profile", str(measured_file), *QUICK, "--json", "-o", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["rounds"] == 2
    assert data["arms"][0]["names"][0] == "baseline"
    benched = load_profile(out)
    assert benched.evidence is not None
    assert benched.evidence.bench is not None
    assert benched.evidence.bench.model_dump(mode="json") == data


def test_the_users_own_baseline_is_benched(measured_file: Path, tmp_path: Path) -> None:
    baseline = tmp_path / "mine.yaml"
    baseline.write_text("batch_size: 8\n")
    result = run(
        "bench", "--profile", str(measured_file), *QUICK, "--baseline", str(baseline), "--json"
    )
    assert result.exit_code == 0, result.output
    arms = json.loads(result.stdout)["arms"]
    assert arms[0]["config"]["batch_size"] == 8


def test_a_misspelt_baseline_key_is_named_with_the_fix(tmp_path: Path, measured_file: Path) -> None:
    baseline = tmp_path / "mine.yaml"
    baseline.write_text("batch_sise: 8\n")
    result = run("bench", "--profile", str(measured_file), "--baseline", str(baseline))
    assert result.exit_code == EXIT_BAD_INPUT
    assert "unknown key 'batch_sise'; did you mean 'batch_size'?" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- 1\n- 2\n", "is a list, not a baseline"),
        ("64\n", "is a number, not a baseline"),
        ("precision: float64\n", "precision"),
        ("num_workers: 0\nprefetch_factor: 2\n", "prefetch_factor needs num_workers"),
        ("batch_size: [\n", "is not valid YAML"),
    ],
)
def test_a_bad_baseline_is_one_line_and_exit_code_3(
    tmp_path: Path, measured_file: Path, text: str, message: str
) -> None:
    baseline = tmp_path / "mine.yaml"
    baseline.write_text(text)
    result = run("bench", "--profile", str(measured_file), "--baseline", str(baseline))
    assert result.exit_code == EXIT_BAD_INPUT
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


WORKERS_BOUND = "at most 8 DataLoader workers (4 a CPU, for a loader that waits on storage)"
THREADS_BOUND = "at most 2 CPU threads (1 a CPU, more would take turns on them, slower)"


@pytest.mark.parametrize(
    "case",
    [
        ("num_workers", 8000, WORKERS_BOUND),
        ("num_workers", 9, WORKERS_BOUND),
        ("num_workers", 8, None),
        ("cpu_threads", 64, THREADS_BOUND),
        ("cpu_threads", 3, THREADS_BOUND),
        ("cpu_threads", 2, None),
    ],
)
def test_a_baseline_asking_more_than_the_machine_can_run_is_refused(
    tmp_path: Path,
    measured_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[str, int, str | None],
) -> None:
    """num_workers: 8000 was accepted, and the bench hung starting 8000 DataLoader workers; the
    bound is 4 a usable CPU (thresholds.BASELINE_WORKERS_PER_CPU). cpu_threads: 64 on 2 CPUs
    was accepted: the baseline ran oversubscribed, slower than the user's script would run, and
    the profile measured faster against it; the bound is 1 a usable CPU."""
    key, count, bound = case
    started: list[object] = []
    monkeypatch.setattr(host, "cpus_usable_here", lambda: 2)
    monkeypatch.setattr(api, "bench", lambda *args, **_kwargs: started.append(args))
    baseline = tmp_path / "mine.yaml"
    baseline.write_text(f"{key}: {count}\n")
    result = run("bench", "--profile", str(measured_file), "--baseline", str(baseline))
    if bound is None:
        assert started  # past the check (the faked bench returns nothing to show)
        return
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.stderr.splitlines() == [
        f"autotune: error: {baseline}: {key} {count} is more than this machine can run: "
        f"2 usable CPUs, {bound}; ask for {bound.split()[2]} or fewer"
    ]
    assert not started


def test_the_workers_option_has_the_bound_a_baseline_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """'autotune --workers 9' on 2 CPUs was accepted where a baseline's num_workers: 9 was
    refused."""
    asked: list[int] = []

    def fake_tune(*_args: object, num_workers: int, **_kwargs: object) -> None:
        asked.append(num_workers)
        raise ProbeError("stopped by the test after tuning was asked for")

    monkeypatch.setattr(host, "cpus_usable_here", lambda: 2)
    monkeypatch.setattr(api, "tune", fake_tune)
    refused = run("--workers", "9", "--no-save", "--store", str(tmp_path))
    assert refused.exit_code == EXIT_USAGE, refused.output
    assert refused.stderr.splitlines() == [
        "autotune: error: --workers 9 is more than this machine can run: 2 usable CPUs, "
        f"{WORKERS_BOUND}; ask for 8 or fewer; see 'autotune --help'"
    ]
    assert asked == []
    run("--workers", "8", "--no-save", "--store", str(tmp_path))
    assert asked == [8]


def test_tune_holds_num_workers_to_the_bound_the_command_line_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tune(num_workers=9) on 2 CPUs started nine workers a trial where 'autotune --workers 9'
    was refused."""

    def past_the_check(*_args: object, **_kwargs: object) -> None:
        raise ProbeError("past the check")

    monkeypatch.setattr(host, "cpus_usable_here", lambda: 2)
    monkeypatch.setattr(api, "detect", past_the_check)
    with pytest.raises(ValueError, match="more than this machine can run") as refused:
        api.tune("mlp", num_workers=9)
    assert str(refused.value) == (
        f"num_workers 9 is more than this machine can run: 2 usable CPUs, {WORKERS_BOUND}; ask"
        " for 8 or fewer"
    )
    with pytest.raises(ProbeError, match="past the check"):
        api.tune("mlp", num_workers=8)


@pytest.mark.parametrize(
    "config",
    [{"num_workers": 9}, {"cpu_threads": 3}],
    ids=["workers", "threads"],
)
def test_bench_holds_a_baseline_to_the_bounds_its_file_has(
    measured_file: Path, monkeypatch: pytest.MonkeyPatch, config: dict[str, int]
) -> None:
    """bench(baseline=TrainConfig(cpu_threads=3)) on 2 CPUs ran the baseline oversubscribed
    where the same baseline in a file was refused."""
    monkeypatch.setattr(host, "cpus_usable_here", lambda: 2)
    profile = load_profile(measured_file)
    ((key, count),) = config.items()
    with pytest.raises(ValueError, match="more than this machine can run") as refused:
        api.bench(profile, baseline=TrainConfig(**config))
    bound = WORKERS_BOUND if key == "num_workers" else THREADS_BOUND
    assert str(refused.value) == (
        f"baseline: {key} {count} is more than this machine can run: 2 usable CPUs, {bound};"
        f" ask for {bound.split()[2]} or fewer"
    )
    benched = api.bench(profile, baseline=TrainConfig(cpu_threads=2), rounds=1, seconds=0.01)
    assert benched.evidence is not None
    assert benched.evidence.bench is not None


def _with_counts(profile: Profile, num_workers: int, cpu_threads: int | None) -> Profile:
    """``profile`` hand-edited to ``num_workers`` DataLoader workers and ``cpu_threads`` threads
    (not validated here: the file it is written to is)."""
    loader = profile.settings.dataloader.model_copy(update={"num_workers": num_workers})
    settings = profile.settings.model_copy(
        update={"dataloader": loader, "cpu_threads": cpu_threads}
    )
    return profile.model_copy(update={"settings": settings})


@pytest.mark.parametrize(
    ("key", "count", "valid"),
    [
        ("num_workers", 33, False),
        ("num_workers", 32, True),
        ("cpu_threads", 9, False),
        ("cpu_threads", 8, True),
    ],
)
def test_a_profile_asking_more_than_its_machine_can_run_is_not_valid(
    tmp_path: Path, key: str, count: int, *, valid: bool
) -> None:
    """num_workers: 16 hand-edited into a profile of a 2-CPU machine was a 'valid profile', where
    a baseline asking for as many was exit 3; its bench ran 135 s past an 8 s estimate. A file
    is held to the machine it was made for (the laptop's 8 CPUs here), whatever reads it."""
    rules = build_profile(snapshot("cpu-laptop-linux"))
    workers, threads = (count, None) if key == "num_workers" else (2, count)
    edited = tmp_path / "edited.yaml"
    edited.write_text(dump_profile(_with_counts(rules, workers, threads)))
    result = run("validate", str(edited))
    if valid:
        assert result.exit_code == 0, result.output
        return
    path = "settings.dataloader.num_workers" if key == "num_workers" else "settings.cpu_threads"
    bound = "at most 32 DataLoader workers (4 a CPU, for a loader that waits on storage)"
    if key == "cpu_threads":
        bound = "at most 8 CPU threads (1 a CPU, more would take turns on them, slower)"
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.stderr.splitlines() == [
        f"autotune: error: {edited}: {path}: {count} is more than the machine it was made for "
        f"can run: 8 usable CPUs, {bound}; ask for {bound.split()[2]} or fewer"
    ]


def test_a_profile_of_several_processes_is_held_to_each_ones_share(tmp_path: Path) -> None:
    """8 processes of 32 CPUs each on a 256-CPU node: cpu_threads 256 validated (2,048
    threads on 256 CPUs), as did 1,024 workers in each process."""
    rules = build_profile(snapshot("a100-sxm4-80gb-8x"))
    assert (rules.topology.processes_per_node, rules.topology.cpus_per_process) == (8, 32)
    assert run("validate", _written(tmp_path / "as-made.yaml", rules)).exit_code == 0
    at_most = _with_counts(rules, rules.settings.dataloader.num_workers, 32)
    assert run("validate", _written(tmp_path / "at-most.yaml", at_most)).exit_code == 0
    threads = {"OMP_NUM_THREADS": "256", "MKL_NUM_THREADS": "256"}  # as the rules write them
    too_many = _with_counts(rules, 1, 256)
    settings = too_many.settings.model_copy(update={"environment": threads})
    edited = _written(tmp_path / "edited.yaml", too_many.model_copy(update={"settings": settings}))
    result = run("validate", edited)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.stderr.splitlines() == [
        f"autotune: error: {edited}: settings.cpu_threads: 256 is more than each of the 8 "
        "processes of the machine it was made for can run: 32 usable CPUs, at most 32 CPU "
        "threads (1 a CPU, more would take turns on them, slower); ask for 32 or fewer"
    ]


def _written(path: Path, profile: Profile) -> str:
    path.write_text(dump_profile(profile))
    return str(path)


@pytest.mark.parametrize(
    "case",
    [
        ("settings.dataloader.num_workers 16", 16, None, WORKERS_BOUND),
        ("settings.cpu_threads 3", 1, 3, THREADS_BOUND),
    ],
    ids=["workers", "threads"],
)
def test_a_profile_made_for_a_larger_machine_is_not_benched_here(
    tmp_path: Path,
    measured_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[str, int, int | None, str],
) -> None:
    """A profile made for the laptop (8 CPUs) may ask for 16 workers there, and validates; the
    bench trains it here, on 2 CPUs, and is refused as a baseline asking for as many is."""
    asked, workers, threads, bound = case
    started: list[object] = []
    monkeypatch.setattr(host, "cpus_usable_here", lambda: 2)
    monkeypatch.setattr(api, "bench", lambda *args, **_kwargs: started.append(args))
    edited = tmp_path / "larger.yaml"
    edited.write_text(dump_profile(_with_counts(load_profile(measured_file), workers, threads)))
    assert run("validate", str(edited)).exit_code == 0
    result = run("bench", "--profile", str(edited), *QUICK)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.stderr.splitlines() == [
        f"autotune: error: {edited}: {asked} is more than this machine can run: 2 usable CPUs, "
        f"{bound}; ask for {bound.split()[2]} or fewer"
    ]
    assert not started


def test_bench_holds_a_profile_to_the_bounds_of_this_machine(
    measured_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench(profile) from Python, as 'autotune bench --profile' on the command line, where
    the real loop trains it (``measure=None``: refused before anything trains); arms measured
    by a ``measure`` of the caller's train nothing here, and are not held to this machine."""
    monkeypatch.setattr(host, "cpus_usable_here", lambda: 2)
    sound = load_profile(measured_file)
    larger = _with_counts(sound, num_workers=1, cpu_threads=3)
    with pytest.raises(ValueError, match="more than this machine can run") as refused:
        api.bench(larger, rounds=1, seconds=0.01, measure=None)
    assert str(refused.value) == (
        f"profile: cpu_threads 3 is more than this machine can run: 2 usable CPUs, "
        f"{THREADS_BOUND}; ask for 2 or fewer"
    )
    benched = api.bench(_with_counts(sound, num_workers=1, cpu_threads=2), rounds=1, seconds=0.01)
    assert benched.evidence is not None
    assert api.bench(larger, rounds=1, seconds=0.01).evidence is not None  # simulated arms


def test_a_rules_only_profile_is_refused_with_the_fix(tmp_path: Path) -> None:
    rules_only = tmp_path / "rules.yaml"
    rules_only.write_text(dump_profile(build_profile(snapshot("cpu-laptop-linux"))))
    result = run("bench", "--profile", str(rules_only))
    assert result.exit_code == EXIT_BAD_INPUT
    assert "was not measured" in result.stderr
    assert "run 'autotune'" in result.stderr


@pytest.fixture
def this_machine_is_a_laptop(detected_as: Callable[[str], HardwareSnapshot]) -> None:
    """The bench finds the stored profile by detecting the machine: a recorded one here."""
    detected_as("cpu-laptop-linux")


@pytest.mark.usefixtures("this_machine_is_a_laptop")
def test_the_budget_reaches_the_tuning_the_bench_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[tuple[object, float]] = []

    def fake_tune(workload: Workload, *, budget_s: float, **_options: object) -> None:
        asked.append((workload.name, budget_s))  # the workload is resolved once, by the bench
        raise ProbeError("stopped by the test after tuning was asked for")

    monkeypatch.setattr(api, "tune", fake_tune)
    result = run("bench", "-m", "mlp", "--budget", "33", "--store", str(tmp_path))
    assert result.exit_code == EXIT_PROBE, result.output
    assert asked == [("mlp", 33.0)]
    assert "tuning first" in result.stderr


@pytest.mark.usefixtures("this_machine_is_a_laptop")
def test_the_bench_takes_the_profile_measured_on_the_workload_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ProfileStore(tmp_path)
    for workload in ("conv", "mlp"):
        store.save(measured("cpu-laptop-linux", workload=workload, workers=None))
    benched: list[tuple[str | None, str | None]] = []

    def fake_bench(profile: Profile, workload: str | None, **_options: object) -> Profile:
        benched.append((profile.evidence.workload if profile.evidence else None, workload))
        return profile

    monkeypatch.setattr(api, "bench", fake_bench)
    asked = run("bench", "-m", "conv", "--store", str(tmp_path))
    assert asked.exit_code == 0, asked.output
    assert "tuning first" not in asked.stderr
    assert "recommend(workload='conv') returns it" in asked.stdout
    plain = run("bench", "--store", str(tmp_path))  # the profile saved last: conv, just benched
    assert plain.exit_code == 0, plain.output
    assert benched == [("conv", "conv"), ("conv", None)]


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def benched_file(measured_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("benched") / "benched.yaml"
    result = run("bench", "--profile", str(measured_file), *QUICK, "-o", str(out))
    assert result.exit_code == 0, result.output
    return out


def test_report_draws_the_charts_in_the_terminal(benched_file: Path) -> None:
    result = run("report", "--profile", str(benched_file))
    assert result.exit_code == 0, result.output
    assert "recommended" in result.output
    assert "Bench: speedup" in result.output  # whatever was measured: a panel for the bench


@pytest.mark.slow  # draws a PNG with matplotlib: a second
def test_report_writes_a_png(benched_file: Path, tmp_path: Path) -> None:
    png = tmp_path / "report.png"
    result = run("report", "--profile", str(benched_file), "--plot", str(png))
    assert result.exit_code == 0, result.output
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_report_without_matplotlib_says_what_to_install_and_writes_nothing(
    benched_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    png = tmp_path / "report.png"
    result = run("report", "--profile", str(benched_file), "--plot", str(png))
    assert result.exit_code == EXIT_USAGE
    assert "torch-autotune[plot]" in result.stderr
    assert not png.exists()


def test_report_of_a_rules_only_profile_asks_for_a_measurement(tmp_path: Path) -> None:
    rules_only = tmp_path / "rules.yaml"
    rules_only.write_text(dump_profile(build_profile(snapshot("cpu-laptop-linux"))))
    result = run("report", "--profile", str(rules_only))
    assert result.exit_code == EXIT_BAD_INPUT
    assert "run autotune" in result.stderr


def test_bench_plots_and_falls_back_to_text_without_matplotlib(
    measured_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    png = tmp_path / "bench.png"
    drawn = run("bench", "--profile", str(measured_file), *QUICK, "--plot", str(png))
    assert drawn.exit_code == 0, drawn.output
    assert png.read_bytes().startswith(PNG_MAGIC)

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    other = tmp_path / "other.png"
    text = run("bench", "--profile", str(measured_file), *QUICK, "--plot", str(other))
    assert text.exit_code == 0, text.output  # the measurement stands; only the PNG is missing
    assert "matplotlib is not installed" in text.stderr
    assert "recommended" in text.stdout
    assert not other.exists()
