"""The device's memory as the probe reads and bounds it: what the trials may use
(``device_memory_limit``), the cap of ``--memory-limit`` (``memory_capped``), and the peak a
trial reached (``peak_reset``, ``peak_read``; the process's resident high-water mark on the
CPU, reset at each trial on Linux)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "device_memory_limit",
    "grown_since",
    "held_now",
    "memory_capped",
    "peak_read",
    "peak_reset",
    "process_peak_rss",
]


_PROC = Path("/proc/self")


def peak_reset(torch: Any, device: str) -> bool:
    """Start a trial's peak: the allocator's on CUDA; on Linux, the process's resident-set
    high-water mark (writing 5 to ``/proc/self/clear_refs``, Linux 4.0 and newer), which
    otherwise never goes down. Whether the peak read next is the trial's own: False where the
    mark could not be reset (macOS, a read-only /proc), and it is the process's lifetime's.

    The reset is the whole process's: its ``VmHWM`` and ``getrusage().ru_maxrss`` start again
    from here, for the caller's own logging too (the reference says so)."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return True
    if device != "cpu":
        return False
    try:
        (_PROC / "clear_refs").write_text("5")
    except OSError:
        return False
    return True


def process_peak_rss() -> int | None:
    """The process's resident-set high-water mark in bytes (Unix), None where unknown.

    The CPU allocator keeps no peak of its own. On Linux it is ``VmHWM``, which ``peak_reset``
    starts again at each trial, so it is that trial's peak (plus the interpreter, torch and
    whatever else the process holds). Elsewhere, or where it cannot be reset, the mark never
    goes down: the peak of the largest trial run so far, and of whatever the process did
    before.
    """
    with contextlib.suppress(OSError, ValueError):
        for line in (_PROC / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS bytes, Linux KiB


def peak_read(torch: Any, device: str) -> int | None:
    """Peak bytes the allocator held during the trial (reserved: what can run out)."""
    if device == "cuda":
        return int(torch.cuda.max_memory_reserved())
    if device == "mps":
        return int(torch.mps.driver_allocated_memory())  # no peak counter on MPS: the current
    return process_peak_rss()


def held_now(torch: Any, device: str) -> int | None:
    """On the CPU, what the process holds now, from which a step's growth is counted against
    --memory-limit: the peak starts again here (``peak_reset``). None off the CPU, and where
    the mark cannot be reset (the peak would be the process's lifetime's)."""
    if device != "cpu" or not peak_reset(torch, device):
        return None
    return peak_read(torch, device)


def grown_since(torch: Any, device: str, held: int | None) -> int | None:
    """What the process took beyond ``held`` (``held_now``) at its peak since; None without."""
    return None if held is None else (peak_read(torch, device) or held) - held


def device_memory_limit(device: str, cap: int | None = None) -> int | None:
    """Bytes the trials may use on the device: what is free plus what torch already holds, and
    no more than ``cap`` (``--memory-limit``).

    ``mem_get_info`` counts other processes and the CUDA context (catalog D4, K5); None off
    CUDA, where the search falls back to doubling.
    """
    if device != "cuda":
        return None
    import torch

    free, _total = torch.cuda.mem_get_info()
    usable = int(free + torch.cuda.memory_reserved())
    return usable if cap is None else min(usable, cap)


@contextmanager
def memory_capped(device: str, cap: int | None) -> Iterator[None]:
    """The caching allocator held to ``cap`` bytes of the device for the block
    (``torch.cuda.set_per_process_memory_fraction``, of the current GPU's total), then given
    the whole device back: ``--memory-limit`` tunes for a smaller or shared GPU, and an
    allocation past the cap raises torch's out-of-memory error as a full GPU would."""
    if device != "cuda" or cap is None:
        yield
        return
    import torch

    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total))
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
