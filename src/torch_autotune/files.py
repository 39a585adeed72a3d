"""Writing files so that a crash or a bad input never leaves a half-written one behind."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from torch_autotune.errors import StoreError


def _mode_for(path: Path) -> int:
    """The permissions a new file gets from ``open()`` (0o666 less the umask), or the ones the
    file already has: a temporary file is created 0o600, which would otherwise stick."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` through a temporary file in the same
    directory and a rename.

    The old file stays intact until the new one is complete. Raises StoreError on failure.
    """
    directory = path.parent if str(path.parent) else Path(".")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        directory.mkdir(parents=True, exist_ok=True)
        mode = _mode_for(path)
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(payload)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(temporary, mode)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None
