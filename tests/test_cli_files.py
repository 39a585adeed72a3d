"""Files the command line writes (the store, -o, --plot) where they cannot be written: one line,
exit 4, nothing measured for nothing and nothing on disk lost."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.conftest import read_only_for_this_user
from torch_autotune import api
from torch_autotune.cli import cli
from torch_autotune.errors import EXIT_STORE, StoreError
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Profile
from torch_autotune.profile_io import load_profile

FIXTURES = Path(__file__).parent / "fixtures"


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="autotune")


def error_line(text: str) -> str:
    """The one line of the error (notes may stand above it), with no traceback."""
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if "error" in line]
    assert len(lines) == 1, text
    assert lines[0].startswith("autotune: error: "), text
    return lines[0]


def test_an_output_name_too_long_is_exit_4_on_one_line(tmp_path: Path, snapshot_path: Path) -> None:
    output = tmp_path / f"{'a' * 300}.yaml"
    machine = str(snapshot_path / "tesla-t4.json")
    result = run("export", "--snapshot", machine, "-o", str(output))
    assert result.exit_code == EXIT_STORE, result.output
    assert error_line(result.stderr).endswith(f"cannot write {output}: File name too long")


# --- a store or an output that cannot be written: found before anything is measured ---------------


def unwritable(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory under which nothing can be written: ``kind`` 'file' (a file on the way),
    'denied' (a directory this user may not write in; root may, so access(2) says no) or
    'refused' (one access(2) allows but where no file can be created, as in /proc)."""
    if kind == "file":
        blocker = tmp_path / "blocker"
        blocker.write_text("")
        return blocker / "sub"
    if kind == "refused":
        from torch_autotune import files

        real_mkstemp = files.tempfile.mkstemp

        def refused(*args: Any, **kwargs: Any) -> Any:
            if Path(str(kwargs["dir"])).is_relative_to(tmp_path):
                raise FileNotFoundError(2, "No such file or directory")
            return real_mkstemp(*args, **kwargs)

        monkeypatch.setattr(files.tempfile, "mkstemp", refused)
        return tmp_path / "sub"
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    real_access = os.access

    def denied(path: Any, mode: int, **kwargs: Any) -> bool:
        if Path(path) == locked and mode & os.W_OK:
            return False
        return real_access(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", denied)
    return locked / "sub"


@pytest.fixture
def nothing_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*_args: object, **_kwargs: object) -> Profile:
        raise AssertionError("measured before the place to write was checked")

    monkeypatch.setattr(api, "tune", never)
    monkeypatch.setattr(api, "bench", never)


@pytest.mark.usefixtures("nothing_measured")
@pytest.mark.parametrize("kind", ["file", "denied", "refused"])
@pytest.mark.parametrize(
    "command",
    [
        ["-m", "mlp", "--store", "{place}"],
        ["bench", "-m", "mlp", "--store", "{place}"],
        ["-m", "mlp", "--no-save", "--plot", "{place}/p.png"],
        ["bench", "-m", "mlp", "--no-save", "--plot", "{place}/p.png"],
        ["bench", "-m", "mlp", "--no-save", "-o", "{place}/p.yaml"],
    ],
    ids=["store", "bench-store", "plot", "bench-plot", "bench-o"],
)
def test_a_place_that_cannot_be_written_is_exit_4_before_the_probe(
    tmp_path: Path, kind: str, command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store was found unwritable only after the whole probe (minutes on a GPU), and the
    run's summary was not shown either."""
    place = unwritable(tmp_path, kind, monkeypatch)
    result = run(*(part.format(place=place) for part in command))
    assert result.exit_code == EXIT_STORE, result.output
    assert f"cannot write {place}" in error_line(result.stderr)


@pytest.mark.parametrize(
    ("command", "shown"),
    [(["-m", "mlp"], "measured profile"), (["bench", "-m", "mlp"], "bench results")],
    ids=["autotune", "bench"],
)
def test_a_save_that_fails_after_the_probe_still_shows_what_was_measured(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    detected_as: Callable[[str], HardwareSnapshot],
    command: list[str],
    shown: str,
) -> None:
    """A store that fails only when written (a full disk): the summary, then the one line."""
    detected_as("cpu-laptop-linux")  # the bench detects the machine: here and on a GPU machine
    profile = load_profile(FIXTURES / "profiles" / "schema-2.yaml")

    def disk_full(*_args: object, **_kwargs: object) -> Path:
        raise StoreError("cannot write the profile: No space left on device")

    monkeypatch.setattr(api, "tune", lambda *_args, **_kwargs: profile)
    monkeypatch.setattr(api, "bench", lambda *_args, **_kwargs: profile)
    monkeypatch.setattr(api, "save", disk_full)
    result = run(*command, "--store", str(tmp_path / "store"))
    assert result.exit_code == EXIT_STORE, result.output
    assert shown in result.stdout
    assert "No space left on device" in error_line(result.stderr)


# --- -o and --plot: as open() would, no missing directory made, no read-only file replaced -------


@pytest.mark.usefixtures("nothing_measured")
@pytest.mark.parametrize(
    "command",
    [
        ["export", "--snapshot", "{machine}", "-o", "{path}"],
        ["report", "--profile", "{profile}", "--plot", "{path}"],
        ["-m", "mlp", "--no-save", "--plot", "{path}"],
        ["bench", "-m", "mlp", "--no-save", "-o", "{path}"],
    ],
    ids=["export-o", "report-plot", "autotune-plot", "bench-o"],
)
def test_an_output_in_a_directory_that_does_not_exist_is_exit_4(
    tmp_path: Path, snapshot_path: Path, command: list[str]
) -> None:
    """The missing directories were made (export -o /nonexistent/dir/x.yaml made both)."""
    path = tmp_path / "nonexistent" / "dir" / "x.png"
    profile = FIXTURES / "profiles" / "schema-2.yaml"
    machine = snapshot_path / "tesla-t4.json"
    result = run(*(part.format(path=path, machine=machine, profile=profile) for part in command))
    assert result.exit_code == EXIT_STORE, result.output
    line = error_line(result.stderr)
    assert f"the directory {path.parent} does not exist; create it first" in line
    assert not (tmp_path / "nonexistent").exists()


@pytest.mark.usefixtures("nothing_measured")
@pytest.mark.parametrize(
    "command",
    [
        ["export", "--snapshot", "{machine}", "-o", "{path}"],
        ["-m", "mlp", "--no-save", "--plot", "{path}"],
    ],
    ids=["export-o", "autotune-plot"],
)
def test_a_read_only_output_is_exit_4_and_left_alone(
    tmp_path: Path, snapshot_path: Path, command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file mode 444 was replaced (exit 0): the rename needs only the directory writable."""
    path = tmp_path / "out.yaml"
    path.write_text("mine\n")
    read_only_for_this_user(monkeypatch, path)
    machine = snapshot_path / "tesla-t4.json"
    result = run(*(part.format(path=path, machine=machine) for part in command))
    assert result.exit_code == EXIT_STORE, result.output
    assert "read-only for this user" in error_line(result.stderr)
    assert path.read_text() == "mine\n"
