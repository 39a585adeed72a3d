"""Exit codes as the README documents them: input files, numbers, Ctrl-C, a closed pipe, and
the user's bug told apart from ours."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.conftest import env_importing_from
from tests.rules.helpers import with_host
from tests.test_bench import measured
from torch_autotune import api
from torch_autotune.bounds import MAX_SECONDS
from torch_autotune.cli import cli
from torch_autotune.errors import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_PROBE,
    EXIT_STORE,
    EXIT_USAGE,
    EXIT_WORKLOAD,
    blame_user_code,
)
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Profile

SRC = Path(__file__).resolve().parents[1] / "src"


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="autotune")


def one_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1, text
    return lines[0]


def autotune(*args: str, home: Path, **options: object) -> subprocess.Popen[str]:
    """The command in a new interpreter, on this checkout's code, with a store in ``home``."""
    env = env_importing_from(SRC, TORCH_AUTOTUNE_HOME=str(home))
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "torch_autotune", *args], env=env, text=True, **options
    )


# --- input files: 3, never click's 2 --------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["validate", "{path}"],
        ["diff", "{path}", "{path}"],
        ["detect", "--snapshot", "{path}"],
        ["recommend", "--snapshot", "{path}"],
        ["show", "--snapshot", "{path}"],
        ["export", "--snapshot", "{path}"],
        ["report", "--profile", "{path}"],
        ["bench", "--profile", "{path}"],
        ["bench", "--baseline", "{path}"],
    ],
)
@pytest.mark.parametrize("kind", ["directory", "unreadable", "missing"])
def test_an_input_file_that_cannot_be_read_is_exit_3_with_one_line(
    tmp_path: Path, command: list[str], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "input.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "unreadable":
        path.write_text("schema_version: 1\n")
        path.chmod(0)
        if getattr(os, "geteuid", lambda: 1)() == 0:  # root reads every file: refuse it here
            real_open = Path.open

            def refused(self: Path, *args: Any, **kwargs: Any) -> Any:
                if self == path:
                    raise PermissionError(13, "Permission denied", str(self))
                return real_open(self, *args, **kwargs)

            monkeypatch.setattr(Path, "open", refused)
    result = run(*(part.format(path=path) for part in command))
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert str(path) in one_line(result.stderr)
    assert "Traceback" not in result.output


def test_a_store_that_is_a_file_is_a_store_error_not_a_usage_error(
    tmp_path: Path, snapshot_path: Path
) -> None:
    store = tmp_path / "store"
    store.write_text("not a directory\n")
    machine = str(snapshot_path / "tesla-t4.json")
    result = run("recommend", "--snapshot", machine, "--save", "--store", str(store))
    assert result.exit_code == 4, result.output
    assert one_line(result.stderr).startswith("autotune: error: cannot write")


@pytest.mark.parametrize(
    "command",
    [
        ["export", "--snapshot", "{machine}", "-o", "{path}"],
        ["report", "--profile", "{profile}", "--plot", "{path}"],
        ["bench", "--plot", "{path}"],
        ["--plot", "{path}", "--no-save"],
    ],
    ids=["export-o", "report-plot", "bench-plot", "autotune-plot"],
)
def test_an_output_file_that_is_a_directory_is_exit_4_before_anything_runs(
    tmp_path: Path, snapshot_path: Path, command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's table gives 4 to an output file (-o, --plot) that cannot be written;
    click's own check gave a directory 2. It is still refused before anything is measured."""

    def never(*_args: object, **_kwargs: object) -> Profile:
        raise AssertionError("measured before the output was checked")

    monkeypatch.setattr(api, "tune", never)
    monkeypatch.setattr(api, "bench", never)
    directory = tmp_path / "charts"
    directory.mkdir()
    profile = tmp_path / "profile.json"
    profile.write_text(measured("tesla-t4").model_dump_json())
    machine = str(snapshot_path / "tesla-t4.json")
    arguments = [part.format(path=directory, machine=machine, profile=profile) for part in command]
    result = run(*arguments, "--store", str(tmp_path / "store"))
    assert result.exit_code == EXIT_STORE, result.output
    line = one_line(result.stderr)
    assert line.startswith("autotune: error: ")
    assert f"{directory} is a directory" in line
    assert "--help" not in line  # no misuse of the command: nothing to read in its usage
    assert list(directory.iterdir()) == []


# --- numbers: finite, positive, within what a machine can have: 2 ---------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "1e400", "1e300", "604801"])
@pytest.mark.parametrize(
    "command",
    [["--budget"], ["bench", "--seconds"], ["bench", "--budget"]],
    ids=["budget", "bench-seconds", "bench-budget"],
)
def test_a_number_that_cannot_run_is_a_usage_error_on_one_line(
    command: list[str], value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*_args: object, **_kwargs: object) -> Profile:
        raise AssertionError("the probe ran with an impossible number")

    monkeypatch.setattr(api, "tune", never)
    monkeypatch.setattr(api, "bench", never)
    result = run(*command, value, "--no-save")
    assert result.exit_code == EXIT_USAGE, result.output
    line = one_line(result.stderr)
    assert line.startswith(f"autotune: error: Invalid value for '{command[-1]}'")
    assert "--help" in line


@pytest.mark.parametrize(
    "args",
    [
        ["--workers", "1000000000000"],
        ["--max-batch-size", "1000000000000"],
        ["--target-batch", "1000000000000"],
        ["bench", "--rounds", "1000000000"],
    ],
)
def test_a_count_beyond_any_machine_is_a_usage_error(args: list[str]) -> None:
    result = run(*args)
    assert result.exit_code == EXIT_USAGE
    assert "is not in the range" in one_line(result.stderr)


def test_a_smallest_batch_above_the_largest_is_a_usage_error_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It was found in the search, after detection and torch's start-up, and read as the
    workload's fault: exit 5."""

    def never(*_args: object, **_kwargs: object) -> Profile:
        raise AssertionError("measured with no batch to search")

    monkeypatch.setattr(api, "tune", never)
    result = run("-m", "mlp", "--min-batch-size", "64", "--max-batch-size", "8", "--no-save")
    assert result.exit_code == EXIT_USAGE, result.output
    assert one_line(result.stderr) == (
        "autotune: error: --min-batch-size 64 is above --max-batch-size 8; give a smallest "
        "batch at or below the largest; see 'autotune --help'"
    )
    monkeypatch.undo()  # the library refuses it too, before anything starts
    with pytest.raises(ValueError, match=r"min_batch_size \(64\) must be at most max_batch_size"):
        api.tune("mlp", min_batch_size=64, max_batch_size=8)


def test_the_library_refuses_the_same_numbers() -> None:
    for budget in (float("nan"), float("inf"), 0.0, 1e300, MAX_SECONDS + 1):
        with pytest.raises(ValueError, match="budget_s must be a number of seconds > 0"):
            api.tune("mlp", budget_s=budget)
    with pytest.raises(ValueError, match="num_workers must be in"):
        api.tune("mlp", num_workers=10**12)
    profile = measured("cpu-laptop-linux")
    for seconds in (float("nan"), float("inf"), -1.0, 1e300):
        with pytest.raises(ValueError, match="seconds > 0 and at most"):
            api.bench(profile, seconds=seconds)


def test_workers_beyond_the_machine_a_snapshot_describes_are_the_same_one_line() -> None:
    """tune(snapshot=..., num_workers=5) for a machine of 1 CPU raised pydantic's
    ValidationError from the profile's own check, after the one for this machine passed."""
    one = with_host("cpu-laptop-linux", cpus_usable=1, cpu_affinity_count=1)
    with pytest.raises(ValueError, match="num_workers 5 is more than") as refused:
        api.tune("mlp", snapshot=one, num_workers=5, budget_s=10)
    assert type(refused.value) is ValueError
    assert str(refused.value) == (
        "num_workers 5 is more than this machine can run: 1 usable CPU, at most 4 DataLoader "
        "workers (4 a CPU, for a loader that waits on storage); ask for 4 or fewer"
    )


# --- Ctrl-C: 130 and one line ---------------------------------------------------------------------


def _interrupted(*_args: object, **_kwargs: object) -> Profile:
    raise KeyboardInterrupt


def _clean_up_fails_after_a_ctrl_c(*_args: object, **_kwargs: object) -> Profile:
    """A Ctrl-C while torch imported inductor left sympy half-imported; restoring torch's
    flags on the way out then raised AttributeError, reported as a bug of ours (exit 1)."""
    try:
        raise KeyboardInterrupt
    finally:
        raise AttributeError("module 'sympy' has no attribute 'printing'")


@pytest.mark.parametrize(
    "tune",
    [_interrupted, _clean_up_fails_after_a_ctrl_c],
    ids=["inside-a-command", "clean-up-fails-after-it"],
)
def test_ctrl_c_inside_a_command_is_130_and_one_line(
    monkeypatch: pytest.MonkeyPatch, tune: Callable[..., Profile]
) -> None:
    monkeypatch.setattr(api, "tune", tune)
    result = run("--no-save")
    assert result.exit_code == EXIT_INTERRUPTED
    assert one_line(result.stderr) == "autotune: interrupted"


def test_a_bug_of_ours_with_no_ctrl_c_behind_it_is_still_a_bug(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def buggy(*_args: object, **_kwargs: object) -> Profile:
        try:
            raise ValueError("handled")
        except ValueError:
            raise AttributeError("a bug in the handler") from None

    monkeypatch.setattr(api, "tune", buggy)
    result = run("--no-save")
    assert result.exit_code == EXIT_INTERNAL
    assert "Traceback" in result.stderr


@pytest.mark.child_process
@pytest.mark.slow  # a real run in a subprocess
def test_ctrl_c_in_a_real_run_is_130_and_one_line(tmp_path: Path) -> None:
    """SIGINT while the user's factory module is being imported (the probe is under way)."""
    (tmp_path / "sleepy.py").write_text(
        textwrap.dedent(
            """
            import sys, time
            print("ready", file=sys.stderr, flush=True)
            time.sleep(60)
            """
        )
    )
    process = autotune(
        "-m", "sleepy:make_workload", "--no-save", home=tmp_path, cwd=tmp_path,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None
    for line in process.stderr:  # the progress lines come first
        if line.strip() == "ready":
            break
    process.send_signal(signal.SIGINT)
    with process:
        rest = process.stderr.read()
    assert process.returncode == EXIT_INTERRUPTED, rest
    assert rest == "autotune: interrupted\n"


@pytest.mark.child_process
@pytest.mark.slow  # a subprocess each
@pytest.mark.parametrize(
    "module", ["torch_autotune", "torch_autotune.api", "pydantic", "torch_autotune.cli"]
)
def test_ctrl_c_while_the_command_is_imported_is_130_and_one_line(module: str) -> None:
    """The interrupt arrives exactly when the entry point imports ``module``: the package
    itself (whose API took 115 ms to load, unguarded, where the command's own modules take 11
    ms), what it loads, or the command."""
    code = textwrap.dedent(
        f"""
        import os, signal, sys

        class InterruptOnImport:
            def find_spec(self, name, path=None, target=None):
                if name == {module!r}:
                    os.kill(os.getpid(), signal.SIGINT)
                return None

        sys.meta_path.insert(0, InterruptOnImport())
        from _torch_autotune_main import main
        main()
        """
    )
    env = env_importing_from(SRC)
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_INTERRUPTED, done.stderr
    assert done.stderr == "autotune: interrupted\n"


def test_the_console_script_is_the_entry_point_outside_the_package() -> None:
    """pyproject's ``autotune`` script names it, and ``python -m torch_autotune`` runs it."""
    import _torch_autotune_main
    import torch_autotune.__main__

    pyproject = (SRC.parent / "pyproject.toml").read_text()
    scripts = pyproject.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    assert re.findall(r"^(\w+) = \"(.+)\"$", scripts, re.MULTILINE) == [
        ("autotune", "_torch_autotune_main:main")
    ]
    assert torch_autotune.__main__.main is _torch_autotune_main.main


# --- a closed pipe: quietly, 141 ------------------------------------------------------------------


@pytest.mark.child_process
@pytest.mark.slow  # a command in a subprocess
@pytest.mark.parametrize("command", [["recommend"], ["detect", "--json"], ["export"]])
def test_a_reader_that_went_away_ends_the_command_quietly_with_141(
    snapshot_path: Path, tmp_path: Path, command: list[str]
) -> None:
    read, write = os.pipe()
    os.close(read)  # as `autotune recommend | head -1` once head has its line
    machine = str(snapshot_path / "tesla-t4.json")
    process = autotune(
        *command, "--snapshot", machine, home=tmp_path, stdout=write, stderr=subprocess.PIPE
    )
    os.close(write)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == EXIT_BROKEN_PIPE
    assert "Traceback" not in stderr
    assert "error" not in stderr  # a note that no profile is stored may stand there


def closed_stdout(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """The command started with standard output closed (``autotune recommend >&-``): Python
    sets ``sys.stdout`` to None."""
    env = env_importing_from(SRC, TORCH_AUTOTUNE_HOME=str(home))
    line = ["sh", "-c", 'exec 1>&-; exec "$0" "$@"', sys.executable, "-m", "torch_autotune"]
    return subprocess.run(
        [*line, *args], env=env, stderr=subprocess.PIPE, text=True, timeout=120, check=False
    )


@pytest.mark.child_process
@pytest.mark.slow  # a command in a subprocess
@pytest.mark.parametrize("command", [["recommend"], ["detect", "--json"], ["show"]])
def test_a_command_started_with_stdout_closed_is_141_and_quiet(
    snapshot_path: Path, tmp_path: Path, command: list[str]
) -> None:
    """Every command that printed raised AttributeError on the None that sys.stdout is then:
    an internal error, exit 1, a traceback."""
    done = closed_stdout(
        *command, "--snapshot", str(snapshot_path / "tesla-t4.json"), home=tmp_path
    )
    assert done.returncode == EXIT_BROKEN_PIPE, done.stderr
    assert "Traceback" not in done.stderr
    assert "error" not in done.stderr


@pytest.mark.child_process
@pytest.mark.slow  # a real probe on the CPU, for seconds
def test_a_measuring_run_with_stdout_closed_saves_its_profile_then_is_141(tmp_path: Path) -> None:
    done = closed_stdout("-m", "mlp", "--budget", "8", "--workers", "0", home=tmp_path)
    assert done.returncode == EXIT_BROKEN_PIPE, done.stderr
    assert "Traceback" not in done.stderr
    saved = list((tmp_path / "profiles").glob("*/mlp.json"))
    assert len(saved) == 1, done.stderr
    assert json.loads(saved[0].read_text())["evidence"]["workload"] == "mlp"


# --- a current directory that was removed: 2, before torch starts -------------------------------


@pytest.mark.child_process
@pytest.mark.parametrize("command", [["-m", "mlp", "--budget", "15", "--no-save"], ["detect"]])
def test_a_current_directory_that_was_removed_is_exit_2_with_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    """torch's start-up there printed only oneMKL's 'FATAL ERROR: Cannot load libtorch_cpu.so'
    and exited 2; nothing said why."""
    gone = tmp_path / "gone"
    gone.mkdir()
    env = env_importing_from(SRC, TORCH_AUTOTUNE_HOME=str(tmp_path / "home"))
    line = 'cd "$0" && rmdir "$0" && exec "$@"'
    done = subprocess.run(
        ["sh", "-c", line, str(gone), sys.executable, "-m", "torch_autotune", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stdout == ""
    assert one_line(done.stderr) == (
        "autotune: error: the current directory no longer exists (it was removed while in use); "
        "cd to a directory that exists and run autotune again"
    )


# --- a torch that fails to import: 6, as no torch is ----------------------------------------------


@pytest.mark.child_process
@pytest.mark.parametrize(
    "command", [["-m", "mlp", "--budget", "15", "--no-save"], ["bench", "--no-save"]]
)
def test_a_torch_that_fails_to_import_is_exit_6_with_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    """Only a torch that is not installed was looked for: one that is, but whose import raises
    (a missing library, a half-removed install), was an internal error, exit 1, a traceback."""
    broken = tmp_path / "site" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("simulated: torch broken")\n')
    env = env_importing_from(tmp_path / "site", TORCH_AUTOTUNE_HOME=str(tmp_path / "home"))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), str(SRC), env["PYTHONPATH"]])
    done = subprocess.run(
        [sys.executable, "-m", "torch_autotune", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == EXIT_PROBE, done.stderr
    assert "Traceback" not in done.stderr
    line = done.stderr.splitlines()[-1]  # after the bench's note that it tunes first
    assert "torch is installed but fails to import (ImportError: simulated: torch broken)" in line
    assert "reinstall" in line


# --- the user's bug is 5, ours is 1 ---------------------------------------------------------------


def test_a_bug_of_ours_in_tune_is_exit_1_with_the_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def buggy(*_args: object, **_kwargs: object) -> Profile:
        raise KeyError("a key our own code forgot")

    monkeypatch.setattr(api, "tune", buggy)
    result = run("--no-save")
    assert result.exit_code == EXIT_INTERNAL
    assert "Traceback (most recent call last)" in result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith("autotune: internal error: KeyError:")
    assert "please report it" in last
    assert "fix the model" not in result.stderr


def test_a_bug_of_ours_in_bench_is_exit_1(
    monkeypatch: pytest.MonkeyPatch, detected_as: Callable[[str], HardwareSnapshot]
) -> None:
    from pydantic import ValidationError

    from torch_autotune.bench import TrainConfig

    def buggy(*_args: object, **_kwargs: object) -> Profile:
        TrainConfig(batch_size=0)  # an internal ValidationError, as 'bench --seconds nan' gave
        raise AssertionError("unreachable")

    detected_as("cpu-laptop-linux")
    monkeypatch.setattr(api, "bench", buggy)
    result = run("bench", "--model", "mlp", "--no-save", "--budget", "5")
    assert result.exit_code == EXIT_INTERNAL, result.output
    assert f"internal error: {ValidationError.__name__}" in result.stderr


def test_an_error_the_probe_marked_as_the_users_is_exit_5(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def users_bug(*_args: object, **_kwargs: object) -> Profile:
        error = ValueError("the user's dataset is broken")
        blame_user_code(error)
        raise error

    monkeypatch.setattr(api, "tune", users_bug)
    result = run("--no-save")
    assert result.exit_code == EXIT_WORKLOAD
    assert "the user's dataset is broken" in result.stderr
    assert "fix the model or its data" in result.stderr.splitlines()[-1]


def test_the_users_data_failing_in_a_real_step_is_theirs(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    detected_as("cpu-laptop-linux")
    (tmp_path / "bad_optimizer.py").write_text(
        textwrap.dedent(
            """
            import torch

            def optimizer(params, **kwargs):
                raise ValueError("no learning rate given")

            def make_workload():
                return {
                    "model": torch.nn.Linear(4, 2),
                    "optimizer": optimizer,
                    "example_batch": (torch.randn(8, 4), torch.randint(0, 2, (8,))),
                }
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = run("--model", "bad_optimizer:make_workload", "--budget", "10", "--no-save")
    assert result.exit_code == EXIT_WORKLOAD, result.output
    assert "no learning rate given" in result.stderr
    assert 'bad_optimizer.py", line' in result.stderr
    # our one line on what their code did, not "the training step raised WorkloadError"
    assert result.stderr.splitlines()[-1] == (
        "autotune: error: 'bad_optimizer:make_workload': the optimizer factory raised "
        "ValueError: no learning rate given"
    )


@pytest.mark.parametrize(
    ("source", "users_line"),
    [
        (
            "def make_workload():\n    return helper()\n\ndef helper():\n    raise KeyError('x')\n",
            "line 5, in helper",
        ),
        ("import json\njson.loads('{')\n\ndef make_workload():\n    pass\n", "line 2, in <module>"),
    ],
    ids=["the-factory-raised", "importing-the-module-raised"],
)
def test_the_users_factory_failing_shows_their_traceback_then_one_line(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    detected_as: Callable[[str], HardwareSnapshot],
    source: str,
    users_line: str,
) -> None:
    """README, exit 5: "your traceback is shown" when the factory itself raises, as when the
    model raises in a step; the message is the last line."""
    detected_as("cpu-laptop-linux")
    module = re.sub(r"\W", "_", tmp_path.name)  # a module of its own for each case
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = run("--model", f"{module}:make_workload", "--budget", "10", "--no-save")
    assert result.exit_code == EXIT_WORKLOAD, result.output
    assert f'{module}.py", {users_line}' in result.stderr
    assert result.stderr.splitlines()[-1].startswith(f"autotune: error: '{module}:make_workload'")


def test_a_missing_dependency_of_the_factory_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    """Nothing of the user's failed, only the environment: no traceback."""
    detected_as("cpu-laptop-linux")
    (tmp_path / "needs_a_package.py").write_text("import no_such_package_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = run("--model", "needs_a_package:make_workload", "--budget", "10", "--no-save")
    assert result.exit_code == EXIT_WORKLOAD, result.output
    assert "Traceback" not in result.stderr
    assert "install it in this environment" in result.stderr.splitlines()[-1]


# --- torch's warning that numpy is missing --------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "shown"),
    [("torch._subclasses.functional_tensor", False), ("mypkg.models", True)],
)
def test_torchs_numpy_warning_does_not_open_the_output(
    monkeypatch: pytest.MonkeyPatch, module: str, shown: bool
) -> None:
    from tests.test_the_suite import warn_from

    message = "Failed to initialize NumPy: No module named 'numpy'"

    def tune(*_args: object, **_kwargs: object) -> Profile:
        warn_from(module, message, UserWarning)  # as torch does on its first import
        return measured("cpu-laptop-linux", workload="conv")

    monkeypatch.setattr(api, "tune", tune)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run("--no-save")
    assert result.exit_code == 0, result.output
    assert [str(w.message) for w in caught] == ([message] if shown else [])


# --- standard output that cannot write Unicode: ASCII, never an error ---------------------------


@pytest.mark.child_process
@pytest.mark.parametrize(
    ("command", "environment"),
    [
        (["report", "--profile", "{profile}"], {"PYTHONIOENCODING": "ascii"}),
        (
            ["report", "--profile", "{profile}"],
            {"PYTHONUTF8": "0", "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0"},
        ),
        (["detect", "--snapshot", "{snapshot}"], {"PYTHONIOENCODING": "ascii", "COLUMNS": "80"}),
    ],
    ids=["report-ascii", "report-c-locale", "detect-long-name"],
)
def test_a_stdout_that_cannot_write_unicode_gets_ascii(
    tmp_path: Path, command: list[str], environment: dict[str, str]
) -> None:
    """The charts' bars and marks, and the '…' rich cuts a long GPU name with, raised
    UnicodeEncodeError on an ASCII stdout: an internal error, exit 1."""
    snapshot = json.loads((SRC.parent / "tests/fixtures/snapshots/tesla-t4.json").read_text())
    snapshot["accelerators"][0]["name"] += " " + "X" * 300
    (tmp_path / "long.json").write_text(json.dumps(snapshot))
    profile = SRC.parent / "tests/fixtures/profiles/schema-2.yaml"
    arguments = [part.format(profile=profile, snapshot=tmp_path / "long.json") for part in command]
    env = env_importing_from(SRC, TORCH_AUTOTUNE_HOME=str(tmp_path), **environment)
    done = subprocess.run(
        [sys.executable, "-m", "torch_autotune", *arguments],
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    text = done.stdout.decode("ascii")  # nothing but ASCII
    marks = {"report": "########  ", "detect": "XXXXXXXX~ |"}[command[0]]
    assert marks in text  # bars as '#', a cut name as '~' (one cell: the columns stay aligned)


def test_every_character_drawn_has_one_ascii_character_of_the_same_width() -> None:
    from torch_autotune.render.console import _IN_ASCII

    assert all(len(ascii_) == 1 and ascii_.isascii() for ascii_ in _IN_ASCII.values())
