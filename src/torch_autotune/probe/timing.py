"""The one timer of training: an injected clock, read after the device has caught up.

GPU work is asynchronous: a kernel launch returns long before the kernel finishes, so the
timer synchronises the device (see :func:`device_sync`) before every clock read it times
with; otherwise a sample would measure launch overhead, and the queued work would land in
whichever sample happens to wait for it. The clock is injected (``time.perf_counter`` by
default), so tests drive it with a list of times. The search trials (``probe.trials``) and the
bench's training loop (``probe.loop``) both time with it.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from types import ModuleType

__all__ = ["Clock", "Timer", "device_sync"]

Clock = Callable[[], float]
"""A monotonic clock returning seconds, like ``time.perf_counter``."""

_SUPPORTED_DEVICES = ("cpu", "cuda", "mps")


class Timer:
    """Seconds of work on ``device``, read with ``clock`` after the device has caught up.

    ``sync`` waits for the device's queued work (default: :func:`device_sync` of ``device``;
    None on the CPU, where operations return when they are done).
    """

    def __init__(
        self,
        device: str = "cpu",
        *,
        clock: Clock = time.perf_counter,
        sync: Callable[[], object] | None = None,
    ) -> None:
        self.clock = clock
        self._sync = sync if sync is not None else device_sync(device)

    def sync(self) -> None:
        """Wait until the device has run everything queued so far."""
        if self._sync is not None:
            self._sync()

    def read(self) -> float:
        """The clock, in seconds, once the device has caught up."""
        self.sync()
        return self.clock()

    def seconds(self, fn: Callable[[], object], count: int = 1) -> float:
        """Seconds ``count`` calls of ``fn`` take, the device's work included."""
        started = self.read()
        for _ in range(count):
            fn()
        return self.read() - started

    def run_for(
        self, fn: Callable[[], object], *, seconds: float, min_calls: int
    ) -> tuple[int, float]:
        """Call ``fn`` until at least ``min_calls`` calls and ``seconds`` have passed; returns
        (calls, seconds they took, the device's work included).

        The deadline is checked on the clock alone between calls (no synchronisation inside the
        run, so the device's queue stays full as in training); the end is read after it.
        """
        started = self.read()
        calls = 0
        while calls < min_calls or self.clock() - started < seconds:
            fn()
            calls += 1
        return calls, self.read() - started


def device_sync(device: str) -> Callable[[], None] | None:
    """The function that waits for ``device``'s queued work, or None where there is none.

    - ``"cuda"`` (also ROCm; ``"cuda:N"`` waits for device N): a function calling
      ``torch.cuda.synchronize(device)`` if CUDA is initialised when it runs, and doing nothing
      otherwise (no work can be queued on an uninitialised device, and synchronising would
      initialise it). The check is made at each call, because ``fn`` usually initialises CUDA
      during warm-up, after this was created.
    - ``"mps"``: ``torch.mps.synchronize`` where the MPS backend is available (torch >= 2.0);
      None otherwise, since no MPS work can exist.
    - ``"cpu"``: None; CPU ops return when they are done.

    torch is imported here, not at module import; without torch there is nothing to wait for.

    Raises:
        ValueError: ``device`` is not a ``cpu``, ``cuda`` or ``mps`` device string.
    """
    kind = device.split(":", 1)[0].strip().lower()
    if kind not in _SUPPORTED_DEVICES:
        raise ValueError(
            f"unknown device {device!r}: expected one of {', '.join(_SUPPORTED_DEVICES)} "
            "(optionally with an index, such as 'cuda:1')"
        )
    if kind == "cpu":
        return None
    torch = _import_torch()
    if torch is None:
        return None
    if kind == "cuda":
        return _cuda_sync(torch, device)
    return _mps_sync(torch)


def _import_torch() -> ModuleType | None:
    """torch, imported now (seconds, the first time); None where it is not installed."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


def _cuda_sync(torch: ModuleType, device: str) -> Callable[[], None]:
    cuda = torch.cuda

    def sync() -> None:
        if cuda.is_initialized():
            cuda.synchronize(device)

    return sync


def _mps_sync(torch: ModuleType) -> Callable[[], None] | None:
    mps = getattr(torch, "mps", None)
    backend = getattr(getattr(torch, "backends", None), "mps", None)
    if mps is None or backend is None or not hasattr(mps, "synchronize"):
        return None
    if not backend.is_available():
        return None
    synchronize: Callable[[], None] = mps.synchronize
    return synchronize
