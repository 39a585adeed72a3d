"""Writing files so that a crash or a bad input never leaves a half-written one behind.

A regular file (or a path that does not exist yet) is replaced atomically: the data goes to a
temporary file beside it, which is flushed and renamed over the old one. A symbolic link is
followed, so the file it points to is replaced and the link stays. Anything else is written in
place, as ``open()`` would: a pipe, a FIFO, a terminal, ``/dev/null``, and ``/dev/stdout`` or
``/proc/self/fd/N`` whatever they lead to (renaming over ``/dev/stdout`` replaced the device
node with a regular file and printed nothing, issue 11).

A writer killed between creating its temporary file and the rename (SIGKILL, power loss)
leaves the temporary file behind. Its name says which host and process wrote it
(``.<name>.<host>-<pid>-<random>.autotune.tmp``), and the next write into that directory
removes it once its writer is gone (``GONE_WRITER_GRACE_S`` after it was written), or once it is
older than ``STALE_TEMPORARY_S``.
"""

from __future__ import annotations

import errno
import hashlib
import os
import platform
import re
import stat
import sys
import tempfile
import time
from pathlib import Path

from torch_autotune.errors import StoreError

TEMPORARY_SUFFIX = ".autotune.tmp"
# A write takes milliseconds; a temporary file this old is left over from a writer that died,
# on this host or on another one sharing the directory (whose processes we cannot see).
STALE_TEMPORARY_S = 600.0
# A temporary file whose writer is gone is left this long all the same: a process in another
# PID namespace (a container sharing the directory under the same host name) looks gone.
GONE_WRITER_GRACE_S = 10.0
# Where a path names an open file descriptor or a device rather than a file on a disk.
_DESCRIPTOR_TREES = ("/dev/", "/proc/")
_TEMPORARY = re.compile(
    r"\..+\.(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)-[a-z0-9_]+" + re.escape(TEMPORARY_SUFFIX)
)


def _host() -> str:
    """8 hex digits of this host's name, so a temporary file says where its writer ran."""
    return hashlib.sha256(platform.node().encode()).hexdigest()[:8]


def _mode_for(path: Path) -> int:
    """The permissions a new file gets from ``open()`` (0o666 less the umask), or the ones the
    file already has: a temporary file is created 0o600, which would otherwise stick."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def writes_in_place(path: Path) -> bool:
    """Whether ``path`` is written in place rather than replaced: it exists and is not a
    regular file (a pipe, FIFO, character device, socket), or it leads into ``/dev`` or
    ``/proc`` (``/dev/stdout``, ``/proc/self/fd/1``), where a rename would replace the link
    itself instead of writing to what it stands for."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False  # missing (or unreadable: the atomic write reports why)
    if not stat.S_ISREG(mode):
        return True
    return sys.platform != "win32" and _leads_to_a_descriptor(path)


def _leads_to_a_descriptor(path: Path) -> bool:
    """Whether ``path``, or a symbolic link on the way from it, lies in ``/dev`` or ``/proc``:
    ``/dev/stdout`` leads to ``/proc/self/fd/1``, which leads to whatever standard output is
    (a regular file after ``> out.yaml``, which a rename would not write to)."""
    current = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on links followed
        if current.startswith(_DESCRIPTOR_TREES):
            return True
        if not os.path.islink(current):
            return False
        current = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
    return False


def write_atomically(
    path: Path, data: str | bytes, *, make_parents: bool = False, replace_read_only: bool = False
) -> None:
    """Write ``data`` (text as UTF-8) to ``path``: a regular file through a temporary file in
    the same directory and a rename, anything else (pipe, FIFO, device, ``/dev/stdout``) in
    place.

    The old file stays intact until the new one is complete. As ``open()`` would, a file this
    user may not write is not replaced (the rename alone would), unless ``replace_read_only``
    (the store's files, which the store keeps: a profile saved read-only, or by another user
    of a shared store, is replaced as before, not lost after a whole probe), and a missing
    directory is not made, unless ``make_parents`` (the store's own). Raises StoreError on
    failure.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if writes_in_place(path):
        _write_in_place(path, payload)
        return
    try:
        # Follow a symbolic link, so that the file it points to is replaced, not the link.
        # Asking raises too, for a directory on the way that cannot be searched or a name
        # too long: that is the place that cannot be written, not a bug.
        target = Path(os.path.realpath(path)) if path.is_symlink() else path
        directory = target.parent if str(target.parent) else Path(".")
        if not replace_read_only and os.path.lexists(target) and not os.access(target, os.W_OK):
            raise PermissionError(errno.EACCES, "the file is read-only for this user")
        if make_parents:
            directory.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(directory)
        mode = _mode_for(target)
        handle, temporary = tempfile.mkstemp(
            dir=directory,
            prefix=f".{target.name}.{_host()}-{os.getpid()}-",
            suffix=TEMPORARY_SUFFIX,
        )
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(payload)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(temporary, mode)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None


def refuse_non_files(paths: list[Path]) -> None:
    """StoreError where one of ``paths``, where a file is to be written by a rename, holds
    what a rename cannot replace: a directory, or what is not a regular file (a link is
    followed; nothing there, or a dangling link, is fine)."""
    for path in paths:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise StoreError(f"cannot write {path}: it is {kind}, not a file; delete it")


def write_all_atomically(writes: list[tuple[Path, str]], *, make_parents: bool = False) -> None:
    """``write_atomically`` each of ``writes`` (path, text) as one: every path is looked at
    first, so a directory where a file belongs fails before anything is written, and where a
    write fails all the same (a full disk), those before it get their old bytes back (or are
    removed, where there were none). The store's files: a read-only one is replaced."""
    refuse_non_files([target for target, _ in writes])
    before = {target: _bytes_or_none(target) for target, _ in writes}
    done: list[Path] = []
    try:
        for target, data in writes:
            write_atomically(target, data, make_parents=make_parents, replace_read_only=True)
            done.append(target)
    except StoreError:
        for target in reversed(done):
            old = before[target]
            try:
                if old is None:
                    target.unlink(missing_ok=True)
                else:
                    write_atomically(target, old, replace_read_only=True)
            except (OSError, StoreError):
                pass  # the first failure is the one to report
        raise


def _bytes_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def check_writable(path: Path, *, make_parents: bool = True) -> None:
    """StoreError now, before anything is measured, when ``path`` cannot be written: a file
    there this user may not write, a path that cannot be looked at (a directory on the way
    that cannot be searched, a name too long), or a nearest existing directory that is no
    directory or that this user may not write in or search. With ``make_parents`` the
    directories still missing on the way are ones the write makes; without, a missing one is
    refused too.

    Asks the system's permission check (``access(2)``), then creates and removes an empty
    temporary file where the write would make its own (``_try_creating``): root passes
    ``access(2)`` everywhere, and ``/proc`` or a FUSE mount refuse only the real write, which
    was found after the whole probe. Nothing is left behind; a write can still fail later (a
    full disk), and says so itself. A read-only file system is named as such, not as "Permission
    denied"."""
    target = Path(os.path.realpath(path))  # a link's file is the one written
    if _exists(path, target):
        if target.is_dir():  # the store's: written in
            if not os.access(target, os.W_OK | os.X_OK):
                raise StoreError(f"cannot write {path}: {_denied(target)}")
            _try_creating(path, target)
        elif not os.access(target, os.W_OK):
            if _read_only_file_system(target):
                raise StoreError(f"cannot write {path}: {_denied(target)}")
            raise StoreError(
                f"cannot write {path}: the file is read-only for this user; make it writable "
                "(chmod u+w) or name another file"
            )
        elif not writes_in_place(target):
            if not os.access(target.parent, os.W_OK | os.X_OK):
                raise StoreError(  # the new file is written beside it, then renamed over it
                    f"cannot write {path}: {_denied(target.parent)} (the file is replaced by one"
                    " written beside it)"
                )
            _try_creating(path, target.parent)
        return
    directory = target.parent
    while not _exists(path, directory):
        if not make_parents:
            raise StoreError(
                f"cannot write {path}: the directory {path.parent} does not exist; "
                "create it first, or name a file in one that does"
            )
        directory = directory.parent
    if not directory.is_dir():
        raise StoreError(f"cannot write {path}: {directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise StoreError(f"cannot write {path}: {_denied(directory)}")
    _try_creating(path, directory)


def _read_only_file_system(path: Path) -> bool:
    """Whether ``path`` lies on a file system mounted read-only (``statvfs``'s ST_RDONLY;
    never on Windows, which has no ``statvfs``)."""
    try:
        return bool(os.statvfs(path).f_flag & getattr(os, "ST_RDONLY", 0))
    except (AttributeError, OSError):
        return False


def _denied(directory: Path) -> str:
    """Why ``access(2)`` refused to let this user write in ``directory``, in words: root is
    refused only by a read-only file system (EROFS), which "Permission denied" hid."""
    if _read_only_file_system(directory):
        return f"{directory} is on a read-only file system"
    return f"Permission denied in {directory}"


def _try_creating(path: Path, directory: Path) -> None:
    """Create and remove an empty temporary file in ``directory``, as a write of ``path``
    would there: StoreError naming ``path`` when it cannot be created. The name is the
    temporary files' own, so one a kill left behind is removed by the next write."""
    try:
        handle, temporary = tempfile.mkstemp(
            dir=directory,
            prefix=f".{path.name}.{_host()}-{os.getpid()}-",
            suffix=TEMPORARY_SUFFIX,
        )
    except OSError as exc:
        if exc.errno == errno.EROFS:
            why = f"{directory} is on a read-only file system"
        else:
            why = f"no file can be created in {directory} ({exc.strerror or exc})"
        raise StoreError(f"cannot write {path}: {why}") from None
    os.close(handle)
    Path(temporary).unlink(missing_ok=True)


def _exists(path: Path, candidate: Path) -> bool:
    """Whether ``candidate`` (``path`` or a directory above it) exists; StoreError for
    ``path`` when it cannot be looked at."""
    try:
        os.stat(candidate)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None
    return True


def _write_in_place(path: Path, payload: bytes) -> None:
    """Write to a pipe, FIFO, device or descriptor path as ``open()`` would, without truncating:
    a regular file behind ``/dev/stdout`` is appended to, so ``>> log`` keeps the log."""
    flags = os.O_WRONLY
    try:
        if stat.S_ISREG(path.stat().st_mode):
            flags |= os.O_APPEND
        descriptor = os.open(path, flags)
        with os.fdopen(descriptor, "wb") as out:
            out.write(payload)
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None


def remove_stale_temporaries(directory: Path, now: float | None = None) -> list[Path]:
    """Remove the temporary files that killed writers left in ``directory``; returns them.

    One is stale when this host wrote it and its process is gone (and it is older than
    ``GONE_WRITER_GRACE_S``), or when it is older than ``STALE_TEMPORARY_S``. Only names this
    module makes are touched.
    """
    import psutil

    now = time.time() if now is None else now
    host = _host()
    removed: list[Path] = []
    try:
        candidates = list(directory.glob(f".*{TEMPORARY_SUFFIX}"))
    except OSError:
        return removed
    for candidate in candidates:
        match = _TEMPORARY.fullmatch(candidate.name)
        if match is None:
            continue
        try:
            age = now - candidate.stat().st_mtime
            writer_gone = (
                age > GONE_WRITER_GRACE_S
                and match["host"] == host
                and not psutil.pid_exists(int(match["pid"]))
            )
            if writer_gone or age > STALE_TEMPORARY_S:
                candidate.unlink()
                removed.append(candidate)
        except OSError:
            continue  # removed by another writer meanwhile, or not ours to remove
    return removed
