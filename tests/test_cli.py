"""The `autotune` command through click's runner, on recorded snapshots."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from torch_autotune import __version__
from torch_autotune.cli import cli
from torch_autotune.errors import EXIT_BAD_INPUT, EXIT_USAGE


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
