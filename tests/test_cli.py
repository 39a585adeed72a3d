"""The `autotune` command through click's runner, on recorded snapshots."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from torch_autotune import __version__
from torch_autotune.cli import cli
from torch_autotune.errors import EXIT_BAD_INPUT, EXIT_USAGE, EXIT_WORKLOAD
from torch_autotune.hardware import HardwareSnapshot


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
    assert "no profile stored for this machine" in result.stderr


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
    assert result.exit_code == 0
    assert re.search(r"precision\.dtype\s+float16\s+bfloat16", result.output)
    same = run("diff", str(tmp_path / "tesla-t4.yaml"), str(tmp_path / "tesla-t4.yaml"))
    assert "same settings" in same.output


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


@pytest.mark.parametrize(
    ("module", "exit_code"),
    [
        pytest.param("torch.jit._script", 0, id="torch's"),
        pytest.param("torch_autotune.probe.trials", EXIT_WORKLOAD, id="ours"),
    ],
)
def test_a_deprecation_from_torch_is_shown_and_not_blamed_on_the_model(
    monkeypatch: pytest.MonkeyPatch, module: str, exit_code: int
) -> None:
    from tests.test_bench import measured
    from tests.test_the_suite import TORCH_DEPRECATION, warn_from
    from torch_autotune.probe import run as probe_run

    def tune(*_args: object, **_kwargs: object) -> object:
        warn_from(module, TORCH_DEPRECATION)  # torch.compile imports inductor in the first trial
        return measured("h100-80gb-hbm3")

    monkeypatch.setattr(probe_run, "tune", tune)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("error")  # as under python -W error or PYTHONWARNINGS=error
        result = run("--no-save")
    assert result.exit_code == exit_code, result.output
    if exit_code == 0:
        assert [str(w.message) for w in shown] == [TORCH_DEPRECATION]
        assert "largest batch" in result.stdout
    else:  # our own deprecations follow the filters: here they are errors
        assert "raised DeprecationWarning" in result.stderr
