"""Atomic writes: the whole file or the old one, with the permissions a plain open() gives."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.conftest import env_importing_from, read_only_for_this_user
from torch_autotune import files
from torch_autotune.errors import StoreError
from torch_autotune.files import (
    GONE_WRITER_GRACE_S,
    STALE_TEMPORARY_S,
    TEMPORARY_SUFFIX,
    write_atomically,
    writes_in_place,
)

SRC = str(Path(files.__file__).parents[1])


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


@pytest.mark.parametrize(
    "error",
    [
        PermissionError(13, "Permission denied"),  # a directory on the way not searchable
        OSError(36, "File name too long"),
    ],
    ids=["not-searchable", "name-too-long"],
)
def test_a_path_that_cannot_even_be_looked_at_is_a_store_error(
    tmp_path: Path, error: OSError, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asking whether the path is a link raised before the write's own handling: an internal
    error, after a whole probe for a store inside a directory that cannot be searched."""
    target = tmp_path / "sub" / "profile.yaml"
    real_lstat = Path.lstat

    def refused(self: Path) -> os.stat_result:
        if self == target:
            raise error
        return real_lstat(self)

    monkeypatch.setattr(Path, "lstat", refused)
    with pytest.raises(StoreError, match=f"cannot write {target}: {error.strerror}"):
        write_atomically(target, "a: 1\n")


def test_a_name_too_long_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="File name too long"):
        write_atomically(tmp_path / f"{'a' * 300}.yaml", "a: 1\n")


def test_a_read_only_file_is_not_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rename replaced a file mode 444 where open() would have refused it."""
    target = tmp_path / "profile.yaml"
    target.write_text("old\n")
    read_only_for_this_user(monkeypatch, target)
    with pytest.raises(StoreError, match="read-only"):
        write_atomically(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["profile.yaml"]
    # the store's own files are replaced as before: a profile saved read-only (or by another
    # user of a shared store) was refused after the whole probe, and the measured one lost
    write_atomically(target, "new\n", replace_read_only=True)
    assert target.read_text() == "new\n"


def test_a_file_in_a_directory_that_cannot_be_written_is_refused_before_it_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is replaced by one written beside it: a writable file in a directory this
    user may not write passed the check, and the bench failed after it had run."""
    target = tmp_path / "bench.yaml"
    target.write_text("old\n")
    real_access = os.access

    def as_a_user(path: object, mode: int, **kwargs: object) -> bool:
        if Path(str(path)) == tmp_path and mode & os.W_OK:
            return False
        return real_access(path, mode, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "access", as_a_user)
    with pytest.raises(StoreError, match=f"Permission denied in {tmp_path}"):
        files.check_writable(target, make_parents=False)


def test_a_place_only_a_real_write_refuses_is_refused_before_it_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """access(2) lets root write anywhere: a store in /proc passed the check, and the run
    measured for its whole budget before the save failed (exit 4). Nothing is left behind."""
    target = tmp_path / "store" / "profiles"
    real_mkstemp = files.tempfile.mkstemp

    def refused(*args: object, **kwargs: object) -> tuple[int, str]:
        if Path(str(kwargs["dir"])) == tmp_path:
            raise FileNotFoundError(2, "No such file or directory")
        return real_mkstemp(*args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(files.tempfile, "mkstemp", refused)
    with pytest.raises(StoreError, match=f"no file can be created in {tmp_path} \\(No such"):
        files.check_writable(target)
    monkeypatch.undo()
    files.check_writable(target)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("asked", ["access", "write"])
def test_a_read_only_file_system_is_named_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asked: str
) -> None:
    """A store on a file system mounted read-only said "Permission denied": access(2) refuses
    root there too (EROFS), and the write itself fails with EROFS."""
    import errno

    if asked == "access":
        monkeypatch.setattr(files, "_read_only_file_system", lambda path: path == tmp_path)
        monkeypatch.setattr(os, "access", lambda *_args, **_kwargs: False)
    else:

        def read_only(*_args: object, **_kwargs: object) -> tuple[int, str]:
            raise OSError(errno.EROFS, "Read-only file system")

        monkeypatch.setattr(files.tempfile, "mkstemp", read_only)
    with pytest.raises(StoreError, match=f"{tmp_path} is on a read-only file system$"):
        files.check_writable(tmp_path / "profiles")


def test_a_missing_directory_is_made_only_when_asked(tmp_path: Path) -> None:
    """An output (-o, --plot) into a directory that does not exist is refused, as open()
    refuses it; the store makes its own directories."""
    target = tmp_path / "missing" / "dir" / "x.yaml"
    with pytest.raises(StoreError, match="No such file or directory"):
        write_atomically(target, "a: 1\n")
    assert not (tmp_path / "missing").exists()
    write_atomically(target, "a: 1\n", make_parents=True)
    assert target.read_text() == "a: 1\n"


# --- what is not a regular file is written in place, never replaced (issue 11) ---------------

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and /dev are POSIX")


@posix_only
def test_a_fifo_is_written_to_and_stays_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "profile.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_atomically(fifo, "a: 1\n")
    reader.join(timeout=10)
    assert received == [b"a: 1\n"]
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["profile.fifo"]


@posix_only
def test_a_character_device_is_written_in_place() -> None:
    """Asked of the predicate only: a regression must not get to rename over /dev/null."""
    assert stat.S_ISCHR(Path(os.devnull).stat().st_mode)
    assert writes_in_place(Path(os.devnull))


@posix_only
@pytest.mark.parametrize("path", ["/dev/stdout", "/dev/stderr", "/proc/self/fd/1", "/dev/fd/1"])
def test_descriptor_paths_are_written_in_place_whatever_they_lead_to(path: str) -> None:
    if not Path(path).exists():
        pytest.skip(f"{path} does not exist here")
    assert writes_in_place(Path(path))


def test_a_regular_file_and_a_missing_path_are_replaced(tmp_path: Path) -> None:
    existing = tmp_path / "old.yaml"
    existing.write_text("old\n")
    assert not writes_in_place(existing)
    assert not writes_in_place(tmp_path / "new.yaml")


WRITE_TO_ARGV1 = (
    "import sys; from pathlib import Path; from torch_autotune.files import write_atomically; "
    "write_atomically(Path(sys.argv[1]), 'a: 1\\n')"
)


def run_writer(target: Path, stdout: int | IO[bytes]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", WRITE_TO_ARGV1, str(target)],
        stdout=stdout,
        stderr=subprocess.PIPE,
        env=env_importing_from(SRC),
        timeout=60,
        check=True,
    )


@posix_only
def test_stdout_through_a_link_reaches_a_pipe(tmp_path: Path) -> None:
    """`export -o /dev/stdout | ...` printed nothing and replaced the device node; a link to
    /dev/stdout inside tmp_path stands in for it (a regression replaces the link, not /dev)."""
    link = tmp_path / "out.yaml"
    link.symlink_to("/dev/stdout")
    done = run_writer(link, subprocess.PIPE)
    assert done.stdout == b"a: 1\n"
    assert link.is_symlink()
    assert [p.name for p in tmp_path.iterdir()] == ["out.yaml"]


@posix_only
def test_stdout_redirected_to_a_file_is_appended_to_not_replaced(tmp_path: Path) -> None:
    """`autotune export -o /dev/stdout >> log`: the log keeps what it held."""
    link, log = tmp_path / "out.yaml", tmp_path / "log"
    link.symlink_to("/dev/stdout")
    log.write_bytes(b"earlier\n")
    with log.open("ab") as out:
        run_writer(link, out)
    assert log.read_bytes() == b"earlier\na: 1\n"
    assert link.is_symlink()


@posix_only
def test_a_link_to_a_regular_file_replaces_the_file_and_keeps_the_link(tmp_path: Path) -> None:
    real = tmp_path / "dotfiles" / "profile.yaml"
    real.parent.mkdir()
    real.write_text("old\n")
    link = tmp_path / "profile.yaml"
    link.symlink_to(real)
    write_atomically(link, "new\n")
    assert link.is_symlink()
    assert real.read_text() == "new\n"


# --- temporary files that a killed writer left behind ---------------------------------------


def leftover(directory: Path, *, pid: int, host: str | None = None, age_s: float = 0.0) -> Path:
    """A temporary file as a writer killed before its rename leaves it."""
    path = directory / f".profile.json.{host or files._host()}-{pid}-k3x9_q{TEMPORARY_SUFFIX}"
    path.write_text('{"half": ')
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize(
    ("writer", "age_s", "removed"),
    [
        pytest.param("dead", GONE_WRITER_GRACE_S + 5, True, id="writer-gone"),
        pytest.param("dead", 1.0, False, id="writer-gone-just-now"),
        pytest.param("alive", GONE_WRITER_GRACE_S + 5, False, id="writer-still-writing"),
        pytest.param("alive", STALE_TEMPORARY_S + 5, True, id="too-old-whoever-wrote-it"),
        pytest.param("other-host", GONE_WRITER_GRACE_S + 5, False, id="other-host-recent"),
        pytest.param("other-host", STALE_TEMPORARY_S + 5, True, id="other-host-too-old"),
    ],
)
def test_the_next_write_removes_stale_temporaries_only(
    tmp_path: Path, writer: str, age_s: float, removed: bool
) -> None:
    pid = dead_pid() if writer == "dead" else os.getpid()
    left = leftover(
        tmp_path, pid=pid, host="0badf00d" if writer == "other-host" else None, age_s=age_s
    )
    write_atomically(tmp_path / "profile.json", "{}\n")
    assert left.exists() is not removed
    assert (tmp_path / "profile.json").read_text() == "{}\n"


def test_files_that_are_not_ours_are_never_removed(tmp_path: Path) -> None:
    others = [".profile.json.swp", ".profile.json.abc123.tmp", ".x.autotune.tmp", "notes.tmp"]
    for name in others:
        (tmp_path / name).write_text("keep")
        os.utime(tmp_path / name, (0, 0))  # 1970: as old as can be
    write_atomically(tmp_path / "profile.json", "{}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*others, "profile.json"])


SLOW_WRITER = """
import os, sys, time
from pathlib import Path
from torch_autotune.files import write_atomically

def stuck(fd):
    print("writing", flush=True)
    time.sleep(120)

os.fsync = stuck
write_atomically(Path(sys.argv[1]), '{"new": 1}\\n')
"""


@posix_only
def test_a_writer_killed_mid_save_leaves_the_old_file_and_the_next_save_cleans_up(
    tmp_path: Path,
) -> None:
    target = tmp_path / "profile.json"
    target.write_text('{"old": 1}\n')
    writer = subprocess.Popen(
        [sys.executable, "-c", SLOW_WRITER, str(target)],
        stdout=subprocess.PIPE,
        env=env_importing_from(SRC),
    )
    assert writer.stdout is not None
    assert writer.stdout.readline() == b"writing\n"  # the temporary file is written, not renamed
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    writer.stdout.close()
    assert target.read_text() == '{"old": 1}\n'
    (left,) = (p for p in tmp_path.iterdir() if p.name.endswith(TEMPORARY_SUFFIX))
    then = time.time() - GONE_WRITER_GRACE_S - 1
    os.utime(left, (then, then))
    write_atomically(target, '{"next": 1}\n')
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]
    assert target.read_text() == '{"next": 1}\n'


def test_the_store_cleans_its_own_directory(tmp_path: Path) -> None:
    from tests.test_store import NOW, snapshot
    from torch_autotune.rules.engine import build_profile
    from torch_autotune.store import ProfileStore

    store = ProfileStore(tmp_path)
    store.profiles_dir.mkdir(parents=True)
    left = leftover(store.profiles_dir, pid=dead_pid(), age_s=GONE_WRITER_GRACE_S + 5)
    store.save(build_profile(snapshot(), now=NOW))
    assert not left.exists()
