"""Time a callable: warm up, repeat, synchronise the device, report median and spread in seconds.

The clock is injected (``time.perf_counter`` by default), so tests drive it with a list of
times. GPU work is asynchronous: a kernel launch returns long before the kernel finishes, so
``sync`` (see :func:`device_sync`) runs before every clock read; otherwise a sample would measure
launch overhead, and the queued work would land in whichever sample happens to wait for it.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

__all__ = ["Clock", "Timing", "device_sync", "measure"]

Clock = Callable[[], float]
"""A monotonic clock returning seconds, like ``time.perf_counter``."""

_SUPPORTED_DEVICES = ("cpu", "cuda", "mps")
_IQR_MIN_SAMPLES = 4


@dataclass(frozen=True)
class Timing:
    """Durations of repeated calls, in seconds, and their summary.

    ``spread_s`` is the interquartile range (third minus first quartile, quartiles by linear
    interpolation between samples: ``statistics.quantiles(method="inclusive")``, numpy's
    default) when there are at least 4 samples, and ``max_s - min_s`` below that, where
    quartiles mean little. It is 0.0 for a single sample.
    """

    samples_s: tuple[float, ...]
    median_s: float = field(init=False)
    spread_s: float = field(init=False)
    min_s: float = field(init=False)
    max_s: float = field(init=False)

    def __post_init__(self) -> None:
        samples = tuple(float(s) for s in self.samples_s)
        if not samples:
            raise ValueError("a Timing needs at least one sample")
        if any(not math.isfinite(s) or s < 0 for s in samples):
            raise ValueError(
                f"samples must be finite and >= 0 s, got {samples}: "
                "is the clock monotonic (time.perf_counter, not time.time)?"
            )
        import statistics  # 2 ms of imports (decimal, fractions): paid when timing, not on import

        object.__setattr__(self, "samples_s", samples)
        object.__setattr__(self, "median_s", statistics.median(samples))
        object.__setattr__(self, "spread_s", _spread(samples))
        object.__setattr__(self, "min_s", min(samples))
        object.__setattr__(self, "max_s", max(samples))

    def throughput(self, items_per_call: float) -> float:
        """Items per second at the median duration (``items_per_call / median_s``).

        Raises:
            ValueError: ``items_per_call`` is not positive, or the median is 0 s (the clock
                did not advance: time more work per call).
        """
        if not items_per_call > 0:
            raise ValueError(f"items_per_call must be > 0, got {items_per_call}")
        if self.median_s == 0:
            raise ValueError(
                "the median duration is 0 s, so throughput is undefined: the clock did not "
                "advance during the call; time more work per call or use a finer clock"
            )
        return items_per_call / self.median_s


def measure(
    fn: Callable[[], object],
    *,
    repeats: int = 5,
    warmup: int = 1,
    clock: Clock = time.perf_counter,
    sync: Callable[[], object] | None = None,
) -> Timing:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times timed; durations in seconds.

    ``sync``, if given, runs immediately before every clock read (before the start read, so
    work queued by earlier calls is not counted, and before the end read, so this call's work
    is). Pass :func:`device_sync` of the device ``fn`` runs on. ``fn``'s result is discarded.

    Raises:
        ValueError: ``repeats < 1`` or ``warmup < 0``; or the clock went backwards.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    for _ in range(repeats):
        start = _read(clock, sync)
        fn()
        samples.append(_read(clock, sync) - start)
    return Timing(tuple(samples))


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


def _read(clock: Clock, sync: Callable[[], object] | None) -> float:
    """One clock read, in seconds, after the device has caught up."""
    if sync is not None:
        sync()
    return clock()


def _spread(samples: tuple[float, ...]) -> float:
    """Interquartile range from 4 samples up, max - min below (see :class:`Timing`)."""
    if len(samples) < _IQR_MIN_SAMPLES:
        return max(samples) - min(samples)
    import statistics

    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q3 - q1


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
