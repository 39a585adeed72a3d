"""Atomic writes: the whole file or the old one, with the permissions a plain open() gives."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from torch_autotune.errors import StoreError
from torch_autotune.files import write_atomically


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("umask_022")
def test_a_new_file_gets_the_umask_not_the_temporary_files_0600(tmp_path: Path) -> None:
    target = tmp_path / "profile.yaml"
    write_atomically(target, "a: 1\n")
    assert target.read_text() == "a: 1\n"
    assert mode(target) == 0o644


@pytest.mark.usefixtures("umask_022")
def test_an_existing_file_keeps_its_permissions_and_bytes_are_written_as_is(
    tmp_path: Path,
) -> None:
    target = tmp_path / "chart.png"
    target.write_bytes(b"old")
    target.chmod(0o600)
    write_atomically(target, b"\x89PNG")
    assert target.read_bytes() == b"\x89PNG"
    assert mode(target) == 0o600


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "profile.yaml"
    target.write_text("old\n")
    with pytest.raises(TypeError):
        write_atomically(target, 42)  # type: ignore[arg-type]
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["profile.yaml"]


def test_an_unwritable_place_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError, match="cannot write"):
        write_atomically(blocker / "profile.yaml", "a: 1\n")
