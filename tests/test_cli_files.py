"""Files the command line writes (the store, -o, --plot) where they cannot be written: one line,
exit 4, nothing measured for nothing and nothing on disk lost."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result

from torch_autotune.cli import cli
from torch_autotune.errors import EXIT_STORE


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="autotune")


def error_line(text: str) -> str:
    """The one line of the error (a note may stand above it), with no traceback."""
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if not line.startswith("autotune: note:")]
    assert len(lines) == 1, text
    assert lines[0].startswith("autotune: error: "), text
    return lines[0]


def test_an_output_name_too_long_is_exit_4_on_one_line(tmp_path: Path, snapshot_path: Path) -> None:
    output = tmp_path / f"{'a' * 300}.yaml"
    machine = str(snapshot_path / "tesla-t4.json")
    result = run("export", "--snapshot", machine, "-o", str(output))
    assert result.exit_code == EXIT_STORE, result.output
    assert error_line(result.stderr).endswith(f"cannot write {output}: File name too long")
