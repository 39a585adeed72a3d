"""The `autotune` command through click's runner, on recorded snapshots."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import torch_autotune
from tests.test_bench import measured
from torch_autotune import __version__, api
from torch_autotune.cli import cli
from torch_autotune.errors import (
    EXIT_BAD_INPUT,
    EXIT_DIFFERENT,
    EXIT_INTERNAL,
    EXIT_STORE,
    EXIT_USAGE,
    EXIT_WORKLOAD,
)
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Profile
from torch_autotune.store import ProfileStore


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="autotune")


def test_version() -> None:
    result = run("--version")
    assert result.exit_code == 0
    assert __version__ in result.output


@pytest.mark.parametrize("command", [[], *[[name] for name in sorted(cli.commands)]])
def test_every_command_has_help(command: list[str]) -> None:
    result = run(*command, "--help")
    assert result.exit_code == 0
    assert "Usage: autotune" in result.output


@pytest.mark.parametrize("name", ["tesla-t4", "a100-sxm4-80gb-8x", "apple-m2-pro-mps"])
def test_json_output_is_the_snapshot_exactly(snapshot_path: Path, name: str) -> None:
    path = snapshot_path / f"{name}.json"
    result = run("detect", "--snapshot", str(path), "--json")
    assert result.exit_code == 0
    assert result.output == path.read_text()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("tesla-t4", [r"Tesla T4\s+turing\s+7\.5\s+yes\s.*\s40\s"], id="t4"),
        pytest.param("gtx-1660-ti", [r"GTX 1660 Ti\s+turing\s+7\.5\s+no\s"], id="no-tensor-cores"),
        pytest.param(
            "cpu-container-quota-4",
            ["training runs on the CPU", r"CPUs usable\s+4 .*quota 4\)"],
            id="quota",
        ),
        pytest.param(
            "a100-sxm4-40gb-mig-1g5gb", ["NVIDIA A100-SXM4-40GB MIG", "1g.5gb", "14"], id="mig"
        ),
        pytest.param("jetson-agx-orin-32gb", ["Could not read", "memory_total_bytes"], id="orin"),
        pytest.param("mi300x-rocm", [r"cdna3 \(rocm\)\s+9\.4", "ROCm/HIP"], id="rocm"),
        pytest.param("rtx-3060-windows", ["windows", "start method spawn"], id="windows"),
    ],
)
def test_summary_shows_what_matters(snapshot_path: Path, name: str, expected: list[str]) -> None:
    result = run("detect", "--snapshot", str(snapshot_path / f"{name}.json"))
    assert result.exit_code == 0
    for pattern in expected:
        assert re.search(pattern, result.output), pattern


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0.0, "under 1 ms"), (0.0038, "4 ms"), (0.7814, "781 ms"), (7.2, "7.20 s")],
)
def test_summary_says_how_long_detection_took_in_units_a_person_reads(
    snapshot_path: Path, tmp_path: Path, seconds: float, shown: str
) -> None:
    """A fast detection takes milliseconds (4 here, 780 on the H100 with NVML): "0.00 s" read as
    a clock that had not run."""
    recorded = json.loads((snapshot_path / "tesla-t4.json").read_text())
    path = tmp_path / "t4.json"
    path.write_text(json.dumps({**recorded, "detection_seconds": seconds}))
    result = run("detect", "--snapshot", str(path))
    assert result.exit_code == 0
    assert result.output.splitlines()[0].endswith(f" detection in {shown}")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(None, "does not exist", id="missing"),
        pytest.param('{\n  "schema_version": 1,\n', "is not valid JSON", id="truncated"),
        pytest.param('{"schema_version": 1}', "is not a valid hardware snapshot", id="schema"),
    ],
)
def test_bad_snapshot_is_one_line_and_exit_code_3(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "machine.json"
    if content is not None:
        path.write_text(content)
    result = run("detect", "--snapshot", str(path))
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("autotune: error: ")
    assert message in lines[0]
    assert "Traceback" not in result.output
    if content is not None:
        assert path.read_text() == content  # nothing on disk changed


def test_unknown_option_is_a_usage_error() -> None:
    assert run("detect", "--jsn").exit_code == EXIT_USAGE


# --- profiles ------------------------------------------------------------------------------------


def test_recommend_explains_every_setting(snapshot_path: Path) -> None:
    result = run("recommend", "--snapshot", str(snapshot_path / "tesla-t4.json"))
    assert result.exit_code == 0
    assert re.search(r"precision\.dtype = float16\s+\[A2\]", result.output)
    assert "matmul.tf32 = off" in result.output
    assert "rules only, not measured" in result.output


def test_recommend_json_is_a_valid_profile(snapshot_path: Path) -> None:
    from torch_autotune.profile_io import parse_profile

    result = run(
        "recommend", "--snapshot", str(snapshot_path / "h100-80gb-hbm3.json"), "--json",
        "--mode", "reproducible", "--model-kind", "conv",
    )  # fmt: skip
    assert result.exit_code == 0
    profile = parse_profile(result.stdout)
    assert profile.settings.backends.deterministic_algorithms is True
    assert profile.provenance.preferences.model_kind == "conv"


def test_save_then_show_and_export_use_the_stored_profile(
    snapshot_path: Path, tmp_path: Path
) -> None:
    machine = str(snapshot_path / "l4.json")
    saved = run("recommend", "--snapshot", machine, "--save", "--store", str(tmp_path))
    assert saved.exit_code == 0
    assert "saved to" in saved.stderr
    shown = run("show", "--snapshot", machine, "--store", str(tmp_path))
    assert shown.exit_code == 0
    assert "NVIDIA L4" in shown.output
    out = tmp_path / "l4.yaml"
    exported = run("export", "--snapshot", machine, "--store", str(tmp_path), "-o", str(out))
    assert exported.exit_code == 0
    assert run("validate", str(out)).exit_code == 0


def test_show_without_a_stored_profile_says_rules_only(snapshot_path: Path, tmp_path: Path) -> None:
    result = run("show", "--snapshot", str(snapshot_path / "l4.json"), "--store", str(tmp_path))
    assert result.exit_code == 0
    assert "no profile stored for the machine in " in result.stderr


@pytest.fixture
def l4_store(tmp_path: Path) -> Path:
    """A store with profiles measured on resnet50, then gpt2, on the recorded L4."""
    store = ProfileStore(tmp_path / "store")
    for workload, batch in (("resnet50", 512), ("gpt2", 64)):
        store.save(measured("l4", batch=batch, workload=workload))
    return store.directory


def on_the_l4(snapshot_path: Path, command: str, store: Path, *args: str) -> Result:
    return run(command, "--snapshot", str(snapshot_path / "l4.json"), "--store", str(store), *args)


def test_show_and_export_select_the_workload_with_m(snapshot_path: Path, l4_store: Path) -> None:
    shown = on_the_l4(snapshot_path, "show", l4_store, "-m", "resnet50")
    assert shown.exit_code == 0, shown.output
    l4 = snapshot_path / "l4.json"  # the machine the command is about: not this one
    assert f"measured on the machine in {l4} with the resnet50 workload" in shown.stdout
    assert "gpt2" in on_the_l4(snapshot_path, "show", l4_store).stdout  # saved last
    exported = on_the_l4(snapshot_path, "export", l4_store, "--format", "json", "-m", "resnet50")
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["evidence"]["workload"] == "resnet50"


@pytest.mark.parametrize(
    ("asked", "note"),
    [("conv", "(measured here: gpt2, resnet50)"), ("resnet5", "perhaps you meant 'resnet50'?")],
)
def test_show_of_a_workload_not_measured_says_what_was_and_how_to_measure_it(
    snapshot_path: Path, l4_store: Path, asked: str, note: str
) -> None:
    result = on_the_l4(snapshot_path, "show", l4_store, "-m", asked)
    assert result.exit_code == 0
    assert "rules only, not measured" in result.stdout
    assert f"no profile measured on {asked} for the machine in " in result.stderr
    assert note in result.stderr
    # a remedy that works: 'autotune -m resnet5' exits 5, the name is what to fix
    measure = f"run 'autotune -m {asked}' on that machine"
    assert (measure in result.stderr) == (asked == "conv")


def test_export_to_json_on_stdout(snapshot_path: Path, tmp_path: Path) -> None:
    result = run(
        "export", "--snapshot", str(snapshot_path / "rtx-3090.json"), "--store", str(tmp_path),
        "--format", "json",
    )  # fmt: skip
    assert result.exit_code == 0
    assert result.stdout.startswith("{")


def test_export_does_not_touch_an_existing_file_when_it_fails(
    snapshot_path: Path, tmp_path: Path
) -> None:
    target = tmp_path / "profile.yaml"
    target.write_text("my notes\n")
    result = run("export", "--snapshot", str(tmp_path / "missing.json"), "-o", str(target))
    assert result.exit_code == EXIT_BAD_INPUT
    assert target.read_text() == "my notes\n"


def test_diff_lists_the_settings_that_differ(snapshot_path: Path, tmp_path: Path) -> None:
    for name in ("tesla-t4", "h100-80gb-hbm3"):
        machine = str(snapshot_path / f"{name}.json")
        out = tmp_path / f"{name}.yaml"
        assert (
            run("export", "--snapshot", machine, "--store", str(tmp_path), "-o", str(out)).exit_code
            == 0
        )
    result = run("diff", str(tmp_path / "tesla-t4.yaml"), str(tmp_path / "h100-80gb-hbm3.yaml"))
    assert result.exit_code == EXIT_DIFFERENT  # as diff(1)
    assert re.search(r"precision\.dtype\s+float16\s+bfloat16", result.output)
    same = run("diff", str(tmp_path / "tesla-t4.yaml"), str(tmp_path / "tesla-t4.yaml"))
    assert same.exit_code == 0
    assert "same settings" in same.output
    broken = tmp_path / "broken.yaml"
    broken.write_text("schema_version: [\n")
    for first, second in ((broken, tmp_path / "tesla-t4.yaml"), (tmp_path, broken)):
        trouble = run("diff", str(first), str(second))
        assert trouble.exit_code == EXIT_BAD_INPUT  # never 1, which means "they differ"
        assert trouble.stderr.count("\n") == 1


def test_a_bug_in_the_users_model_shows_their_traceback_and_exits_5(
    monkeypatch: pytest.MonkeyPatch, detected_as: Callable[[str], HardwareSnapshot]
) -> None:
    detected_as("cpu-laptop-linux")  # trains on the CPU, also on a machine with a GPU
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "probe" / "sample_user_models"))
    result = run("--model", "shape_bug:make_workload", "--budget", "10", "--no-save")
    assert result.exit_code == EXIT_WORKLOAD
    assert "mat1 and mat2 shapes cannot be multiplied" in result.stderr
    assert "not out-of-memory" in result.stderr
    assert 'shape_bug.py", line' in result.stderr or "linear.py" in result.stderr
    frames = re.findall(r'^  File "([^"]+)"', result.stderr, re.MULTILINE)
    assert frames  # their traceback, from the first frame that is not ours: torch's, theirs
    ours = str(Path(torch_autotune.__file__).resolve().parent)
    assert not any(str(Path(frame).resolve()).startswith(ours) for frame in frames), frames
    assert "torch-autotune: the probe's training step" not in result.stderr  # its own line says it


# --- progress and output without a terminal -------------------------------------------------------

PROGRESS = [
    ("detect", "this machine"),
    ("search", "batch 1"),
    ("search", "batch 64"),
    ("search", "batch 64"),  # the same call again: no second line
    ("throughput", "batch 64"),
    ("confirm", "batch 64"),
    ("workers", "DataLoader worker counts"),
]


@pytest.fixture
def fake_tune(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """tune() reports PROGRESS and returns a measured profile; the budgets it got are kept."""
    budgets: list[float] = []

    def tune(_workload: object, *, budget_s: float, progress: Any, **_options: object) -> Profile:
        budgets.append(budget_s)
        for phase, what in PROGRESS:
            progress(phase, what)
        return measured("cpu-laptop-linux", workload="conv", workers=None)

    monkeypatch.setattr(api, "tune", tune)
    return budgets


def test_without_a_terminal_each_phase_and_trial_is_one_plain_line(fake_tune: list[float]) -> None:
    result = run("--budget", "30", "--no-save")
    assert result.exit_code == 0, result.output
    assert fake_tune == [30.0]
    lines = result.stderr.splitlines()
    assert all(re.match(r"autotune: \[\d+\.\d s of 30 s budget\] ", line) for line in lines), lines
    assert [line.split("] ", 1)[1] for line in lines] == [
        "detect: this machine",
        "search: batch 1",
        "search: batch 64",
        "throughput: batch 64",
        "confirm: batch 64",
        "workers: DataLoader worker counts",
    ]


def test_piped_output_is_neither_wrapped_at_80_columns_nor_padded(
    fake_tune: list[float], snapshot_path: Path, tmp_path: Path
) -> None:
    summary = run("--no-save")
    shown = run(
        "show", "--snapshot", str(snapshot_path / "tesla-t4.json"), "--store", str(tmp_path)
    )
    detected = run("detect", "--snapshot", str(snapshot_path / "a100-sxm4-80gb-8x.json"))
    for result in (summary, shown, detected):
        assert result.exit_code == 0, result.output
        assert not [line for line in result.stdout.splitlines() if line != line.rstrip()]
    reasons = [line.strip() for line in shown.stdout.splitlines() if line.startswith("    ")]
    assert max(len(reason) for reason in reasons) > 200  # a long reason stays on one line
    assert any(reason.endswith("do not underflow to zero") for reason in reasons)


def test_on_a_terminal_progress_is_a_bar_that_leaves_no_lines() -> None:
    from rich.console import Console

    from torch_autotune.render import progress_reporter

    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=100)
    with progress_reporter(30, console=terminal) as report:
        for phase, what in PROGRESS:
            report(phase, what)
    drawn = screen.getvalue()
    assert "workers: DataLoader worker counts" in drawn  # the bar's last description
    assert drawn.endswith("\x1b[2K")  # then erased
    assert "autotune: [" not in drawn


def test_a_plain_progress_line_says_the_time_spent_of_the_budget() -> None:
    """The clock starts at the first report, which tune() makes as its budget starts: the
    seconds shown are the budget's, not those of importing torch before it (1 s on a CPU)."""
    from rich.console import Console

    from torch_autotune.render import progress_reporter

    log = io.StringIO()
    times = iter([100.0, 102.5, 190.0])
    with progress_reporter(120, console=Console(file=log), clock=lambda: next(times)) as report:
        report("detect", "this machine")
        report("search", "batch [8]")  # a name with brackets is text, not markup
        report("workers", "0, 1, 2")
    assert log.getvalue().splitlines() == [
        "autotune: [0.0 s of 120 s budget] detect: this machine",
        "autotune: [2.5 s of 120 s budget] search: batch [8]",
        "autotune: [90.0 s of 120 s budget] workers: 0, 1, 2",
    ]


def test_before_a_provisional_budget_is_told_the_lines_name_none() -> None:
    """'autotune' without --budget: the first line said '[0.0 s of 180 s budget]' (the most
    it could be) and the next '120 s' on a CPU, where compile is not measured."""
    from rich.console import Console

    from torch_autotune.render import progress_reporter

    log = io.StringIO()
    times = iter([0.0, 0.4, 3.0])
    with progress_reporter(
        180, console=Console(file=log), clock=lambda: next(times), provisional=True
    ) as report:
        report("detect", "this machine")
        report("budget", "120 s")
        report("search", "batch 8")
    assert log.getvalue().splitlines() == [
        "autotune: [0.0 s] detect: this machine",
        "autotune: [0.4 s of 120 s budget] budget: 120 s",
        "autotune: [3.0 s of 120 s budget] search: batch 8",
    ]


def test_a_bench_progress_line_says_its_estimate_and_when_it_is_past_it() -> None:
    """'autotune bench' that tuned first read '[334.5 s of 30 s]': the tuning's budget had
    replaced the bench's estimate, and nothing said what the 30 s was."""
    from rich.console import Console

    from torch_autotune.render import progress_reporter

    log = io.StringIO()
    times = iter([0.0, 0.0, 20.0, 20.0, 34.0])
    reporter = progress_reporter(
        36, console=Console(file=log), clock=lambda: next(times), estimate=True
    )
    with reporter as report:
        report("detect", "this machine")
        report("budget", "20 s")  # the tuning's, part of the estimate already
        report("workers", "0, 1, 2")
        report("estimate", "12 s for 2 arms x 5 rounds")  # what is left, from the arms planned
        report("bench", "round 5/5: tuned")
    assert log.getvalue().splitlines() == [
        "autotune: [0.0 s of about 36 s (estimate)] detect: this machine",
        "autotune: [0.0 s of about 36 s (estimate)] budget: 20 s",
        "autotune: [20.0 s of about 36 s (estimate)] workers: 0, 1, 2",
        "autotune: [20.0 s of about 32 s (estimate)] estimate: 12 s for 2 arms x 5 rounds",
        "autotune: [34.0 s, past the 32 s estimate] bench: round 5/5: tuned",
    ]


def test_the_progress_lines_end_where_the_run_time_does(tmp_path: Path) -> None:
    """tune() on a simulated machine, its clock also the reporter's: the last line's seconds
    are at most the run time the profile records (they were 0.9 s past it)."""
    from rich.console import Console

    from tests.probe.fake_trials import mlp_machine, tune_on
    from tests.probe.test_run import LAPTOP
    from torch_autotune.render import progress_reporter

    machine = mlp_machine()
    log = io.StringIO()
    with progress_reporter(30, console=Console(file=log), clock=machine.clock) as report:
        machine.advance(0.9)  # importing torch, before the budget starts
        profile = tune_on(machine, "mlp", LAPTOP, budget_s=30, progress=report)
    assert profile.evidence is not None
    shown = [float(line.split("[")[1].split(" s of")[0]) for line in log.getvalue().splitlines()]
    assert shown[0] == 0.0
    assert shown[-1] <= profile.evidence.elapsed_s


@pytest.mark.parametrize(
    ("module", "exit_code"),
    [
        pytest.param("torch.jit._script", 0, id="torch's"),
        pytest.param("torch_autotune.probe.trials", EXIT_INTERNAL, id="ours"),
    ],
)
def test_a_deprecation_from_torch_is_shown_and_not_blamed_on_the_model(
    monkeypatch: pytest.MonkeyPatch, module: str, exit_code: int
) -> None:
    from tests.test_bench import measured
    from tests.test_the_suite import TORCH_DEPRECATION, warn_from

    def tune(*_args: object, **_kwargs: object) -> object:
        warn_from(module, TORCH_DEPRECATION)  # torch.compile imports inductor in the first trial
        return measured("h100-80gb-hbm3")

    monkeypatch.setattr(api, "tune", tune)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("error")  # as under python -W error or PYTHONWARNINGS=error
        result = run("--no-save")
    assert result.exit_code == exit_code, result.output
    if exit_code == 0:
        assert [str(w.message) for w in shown] == [TORCH_DEPRECATION]
        assert "largest batch" in result.stdout
    else:  # our own deprecations follow the filters: here they are errors, and our bug
        assert "internal error: DeprecationWarning" in result.stderr
        assert "not out-of-memory" not in result.stderr


# --- warnings that were false or missing (issue 11) -------------------------------------------


@pytest.mark.parametrize("command", ["show", "export"])
def test_a_snapshot_of_another_machine_is_not_compared_with_this_ones_history(
    snapshot_path: Path, tmp_path: Path, command: str
) -> None:
    """This machine's profile, made on the L4, was called stale for a recorded RTX 3090:
    "the stored profile was made before this machine changed (GPUs ... -> ...)"."""
    ProfileStore(tmp_path).save(measured("l4"))  # written by this machine (its machine_id)
    other = snapshot_path / "rtx-3090.json"
    result = run(command, "--snapshot", str(other), "--store", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "changed" not in result.stderr
    assert "warning" not in result.stderr
    assert f"no profile stored for the machine in {other}" in result.stderr
    assert "run 'autotune' on that machine" in result.stderr


def test_a_snapshot_with_a_stored_profile_shows_it(snapshot_path: Path, tmp_path: Path) -> None:
    ProfileStore(tmp_path).save(measured("l4", batch=512))
    l4 = snapshot_path / "l4.json"
    result = run("show", "--snapshot", str(l4), "--store", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert f"measured on the machine in {l4}" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("command", ["show", "export"])
def test_a_stored_rules_only_profile_is_not_called_missing(
    snapshot_path: Path, tmp_path: Path, command: str
) -> None:
    """After 'recommend --save', show said "no profile stored for this machine"."""
    machine = str(snapshot_path / "l4.json")
    assert (
        run("recommend", "--snapshot", machine, "--save", "--store", str(tmp_path)).exit_code == 0
    )
    result = run(command, "--snapshot", machine, "--store", str(tmp_path))
    assert result.exit_code == 0, result.output
    (note,) = result.stderr.splitlines()
    assert "no profile stored" not in note
    assert "is rules-only (saved by 'autotune recommend --save')" in note
    assert "run 'autotune' on that machine to measure" in note


@pytest.mark.parametrize("workload", [None, "resnet50"])
def test_a_profile_stored_for_another_mode_is_named_with_its_mode(
    snapshot_path: Path, tmp_path: Path, workload: str | None
) -> None:
    """show --mode reproducible, with a speed profile measured on resnet50, said "no profile
    measured on resnet50 ...; perhaps you meant 'resnet50'?"."""
    ProfileStore(tmp_path).save(measured("l4", workload="resnet50"))
    model = [] if workload is None else ["-m", workload]
    result = on_the_l4(snapshot_path, "show", tmp_path, "--mode", "reproducible", *model)
    assert result.exit_code == 0, result.output
    (note,) = result.stderr.splitlines()
    assert "perhaps you meant" not in note
    assert "no profile" not in note
    assert "is for speed mode, not reproducible" in note
    again = "autotune --mode reproducible" + ("" if workload is None else f" -m {workload}")
    assert f"run '{again}' on that machine to measure" in note


def test_a_snapshot_on_standard_input_is_named_so(snapshot_path: Path, tmp_path: Path) -> None:
    text = (snapshot_path / "l4.json").read_text()
    result = CliRunner().invoke(
        cli, ["show", "--snapshot", "-", "--store", str(tmp_path)], input=text
    )
    assert result.exit_code == 0, result.output
    assert "the machine on standard input" in result.stderr
    assert "machine in -" not in result.stderr


@pytest.mark.parametrize("command", [["recommend"], ["show"], ["export"]])
def test_a_gpu_torch_cannot_run_is_one_warning_line(
    snapshot_path: Path, tmp_path: Path, command: list[str]
) -> None:
    machine = snapshot_path / "rtx-5090-old-wheel.json"
    result = run(*command, "--snapshot", str(machine), "--store", str(tmp_path))
    assert result.exit_code == 0, result.output
    (warning,) = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warning.startswith("autotune: warning: training on the CPU although this machine has")
    assert "sm_120" in warning
    assert "CUDA 12.8" in warning


@pytest.mark.parametrize("command", [["recommend"], ["show"]])
def test_a_gpu_torch_runs_gets_no_such_warning(
    snapshot_path: Path, tmp_path: Path, command: list[str]
) -> None:
    result = run(
        *command, "--snapshot", str(snapshot_path / "rtx-5090.json"), "--store", str(tmp_path)
    )
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr


def test_autotune_warns_when_it_measured_the_cpu_of_a_machine_with_a_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def tune(_workload: object, **_options: object) -> Profile:
        return measured("rtx-5090-old-wheel", workload="conv", workers=None)

    monkeypatch.setattr(api, "tune", tune)
    result = run("--no-save")
    assert result.exit_code == 0, result.output
    assert "autotune: warning: training on the CPU although this machine has a GPU" in (
        result.stderr
    )


def test_recommend_save_refuses_to_replace_a_measured_profile(
    snapshot_path: Path, tmp_path: Path
) -> None:
    store = ProfileStore(tmp_path)
    store.save(measured("l4", workload="resnet50"))
    machine_file = next(store.profiles_dir.glob("*.json"))
    before = machine_file.read_bytes()
    machine = str(snapshot_path / "l4.json")
    refused = run("recommend", "--snapshot", machine, "--save", "--store", str(tmp_path))
    assert refused.exit_code == EXIT_STORE
    (line,) = refused.stderr.splitlines()
    assert "measured on resnet50" in line
    assert "--force" in line
    assert machine_file.read_bytes() == before
    forced = run("recommend", "--snapshot", machine, "--save", "--force", "--store", str(tmp_path))
    assert forced.exit_code == 0, forced.output
    assert json.loads(machine_file.read_text())["measured"] is False
    assert store.measured_workloads(
        json.loads(machine_file.read_text())["provenance"]["fingerprint"]
    ) == ["resnet50"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_export_to_a_fifo_writes_into_it(snapshot_path: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "profile.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    machine = str(snapshot_path / "l4.json")
    result = run("export", "--snapshot", machine, "--store", str(tmp_path), "-o", str(fifo))
    reader.join(timeout=10)
    assert result.exit_code == 0, result.output
    assert received[0].startswith(b"schema_version: 2")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


@pytest.mark.parametrize("command", [[], ["bench"]], ids=["autotune", "bench"])
def test_m_naming_a_profile_measured_on_objects_says_so_in_one_line(
    tmp_path: Path, command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """'autotune -m BNNet', which recommend()'s stale warning advised, said "'BNNet' is neither
    a built-in workload ... nor a package.module:factory reference" (exit 5)."""
    from tests.test_store import from_objects

    def never(*_args: object, **_kwargs: object) -> Profile:
        raise AssertionError("measured a workload that cannot be built")

    monkeypatch.setattr(api, "tune", never)
    monkeypatch.setattr(api, "bench", never)
    ProfileStore(tmp_path).save(from_objects("BNNet"))  # on the H100: another machine's
    result = run(*command, "-m", "BNNet", "--store", str(tmp_path))
    assert result.exit_code == EXIT_WORKLOAD, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("autotune: error: 'BNNet' was measured on objects given to tune()")
    assert "neither" not in line
    assert ("bench(" in line) == (command == ["bench"])


@pytest.mark.parametrize(
    ("here", "writer", "header"),
    [
        ("l4", "this host", "measured on this machine with the conv workload"),
        ("cpu-laptop-linux", "this host", "measured on this machine before it changed (GPUs"),
        ("cpu-laptop-linux", "another host", "measured on another machine (what differs, that"),
    ],
)
def test_show_says_where_a_profile_file_was_measured(
    tmp_path: Path,
    detected_as: Callable[[str], HardwareSnapshot],
    here: str,
    writer: str,
    header: str,
) -> None:
    """A profile file measured on an L4 was shown on a laptop as "measured on this machine"."""
    detected_as(here)
    profile = measured("l4")
    if writer == "another host":
        provenance = profile.provenance.model_copy(update={"machine_id": "0" * 16})
        profile = profile.model_copy(update={"provenance": provenance})
    path = tmp_path / "l4.yaml"
    path.write_text(torch_autotune.profile_io.dump_profile(profile))
    result = run("show", "--profile", str(path), "--store", str(tmp_path / "store"))
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith("Profile for NVIDIA L4 (cuda), mode speed: ")
    assert header in first
    assert ("this machine:" in first or "GPUs ['NVIDIA L4'] -> []" in first) == (here != "l4")


def test_show_takes_a_profile_file_as_export_bench_and_report_do(tmp_path: Path) -> None:
    """'autotune show --profile FILE' was "No such option" where export, bench and report
    take it."""
    from torch_autotune.profile_io import load_profile, parse_profile

    path = Path(__file__).parent / "fixtures" / "profiles" / "schema-2.yaml"
    shown = run("show", "--profile", str(path), "--json", "--store", str(tmp_path))
    assert shown.exit_code == 0, shown.output
    assert parse_profile(shown.stdout) == load_profile(path)
    assert shown.stderr == ""  # no note on the store: the file is the profile
    both = run("show", "--profile", str(path), "--mode", "speed")
    assert both.exit_code == EXIT_USAGE
    assert "--profile names the profile to show; --mode choose a stored one" in both.stderr
