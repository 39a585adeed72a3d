"""Measure what a DataLoader delivers with one worker count on this machine.

``measure_loader`` runs a real ``torch.utils.data.DataLoader`` over the user's dataset with one
worker count and returns a ``LoaderTrial`` (samples/s, or the reason it failed); the search over
worker counts is ``probe.workers``. ``loader_kwargs``, ``worker_failure``, ``shut_down`` and
``worker_deaths_between_batches`` are shared with the bench's training loop.

A worker that crashes (killed by a signal, out of shared memory, a segfault in a C extension)
or hangs (no batch within ``timeout_s``) fails its candidate; any other exception comes from the
user's dataset or collate function and propagates.

Process safety: the start method is multiprocessing's default, ``fork`` on Linux before
Python 3.14, ``forkserver`` on Linux from 3.14, ``spawn`` on macOS and Windows. Under spawn
and forkserver, the dataset and ``collate_fn`` are pickled into every worker, so they must be
defined at a module's top level (no lambdas, closures or classes defined in ``__main__`` of a
notebook), and the calling script must run under ``if __name__ == "__main__":``. Under fork,
CUDA must not be initialised in this process before the workers start (catalog F10). Importing
this module does not import torch.

Worker deaths are noticed between batches (``worker_deaths_between_batches``), never in the
middle of torch's own queue code: a SIGKILLed worker otherwise made torch's SIGCHLD handler raise
inside ``Queue.put`` after its lock was taken, and the put that shut the workers down then
waited for that lock forever.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch_autotune.errors import blame_user_code

if TYPE_CHECKING:
    from torch.utils.data import Dataset

__all__ = ["LoaderTrial", "loader_kwargs", "measure_loader", "shut_down", "worker_failure"]

# torch's own messages for a dead or hung worker (torch/utils/data/dataloader.py and
# torch/csrc/DataLoader.cpp, unchanged from 1.x to 2.13): "DataLoader worker (pid 123) is
# killed by signal: Killed.", "DataLoader worker (pid(s) 123) exited unexpectedly",
# "DataLoader worker (pid 123) exited unexpectedly with exit code 1", and
# "DataLoader timed out after 20 seconds". An exception the dataset raises inside a worker
# arrives re-raised as its own type with "Caught ValueError in DataLoader worker process 0",
# which matches neither prefix.
_CRASH_PREFIX = "DataLoader worker (pid"
_TORCH_PREFETCH_DEFAULT = 2  # batches per worker when prefetch_factor is None (torch >= 2.0)
_TIMEOUT_PREFIX = "DataLoader timed out after"


@dataclass(frozen=True)
class LoaderTrial:
    """One worker count measured: loader throughput, or why the candidate failed.

    ``samples_per_s`` is None when the candidate failed (``error`` says why). ``batches`` and
    ``samples`` count what was timed, and ``seconds`` is the time they took: each worker's
    first batch, which includes starting the workers, is timed separately as ``startup_s``.
    """

    num_workers: int
    samples_per_s: float | None
    batches: int
    samples: int
    seconds: float
    startup_s: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the candidate ran: a rate was measured."""
        return self.samples_per_s is not None


# --- measuring one candidate ---------------------------------------------------------------


def loader_kwargs(
    *,
    batch_size: int,
    num_workers: int,
    pin_memory: bool,
    persistent_workers: bool,
    prefetch_factor: int | None,
    timeout_s: float,
    worker_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """DataLoader keyword arguments torch accepts for this worker count (catalog F3).

    With 0 workers torch refuses ``persistent_workers=True``, a ``prefetch_factor``, a
    ``timeout`` (the main process cannot time itself out) and a ``multiprocessing_context``,
    so they are left out there, as are the ``worker_options`` (the user's ``worker_init_fn``,
    which torch runs in workers only).
    """
    kwargs: dict[str, Any] = {
        "batch_size": batch_size,
        "num_workers": num_workers,
        "pin_memory": pin_memory,
    }
    if num_workers > 0:
        kwargs["persistent_workers"] = persistent_workers
        kwargs["timeout"] = timeout_s
        if prefetch_factor is not None:
            kwargs["prefetch_factor"] = prefetch_factor
        kwargs.update(worker_options or {})
    return kwargs


def worker_failure(exc: RuntimeError) -> str | None:
    """The failure a dead or hung worker caused, as a short sentence; None for other errors."""
    message = str(exc).strip()
    first_line = message.splitlines()[0] if message else ""
    if first_line.startswith(_CRASH_PREFIX):
        return f"worker crashed: {first_line}"
    if first_line.startswith(_TIMEOUT_PREFIX):
        seconds = first_line.removeprefix(_TIMEOUT_PREFIX).strip().removesuffix("seconds")
        return f"timed out after {seconds.strip()} s: no batch arrived (a worker hung or is slow)"
    return None


def measure_loader(
    dataset: Dataset[Any],
    *,
    batch_size: int,
    num_workers: int,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    batches: int = 20,
    timeout_s: float = 20.0,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    seconds: float | None = None,
    worker_options: Mapping[str, Any] | None = None,
) -> LoaderTrial:
    """Samples/s a DataLoader over ``dataset`` delivers with ``num_workers`` workers.

    Each worker's first batch (``max(1, num_workers)`` batches, one round) is a warm-up:
    it includes starting the workers and is timed apart as ``startup_s``. Then ``batches``,
    rounded up to a whole number of rounds, are timed; the rate is their samples over their
    seconds. The sampler holds the batches workers prefetch beyond those (``num_workers *
    prefetch_factor``), never consumed, so no worker runs out of work inside the timed
    window. Both matter on short measurements: workers start together and deliver their
    first batches together, so timing from the very first batch would count the other
    ``num_workers - 1`` first batches, made during start-up, as free, and a sampler that runs
    dry leaves workers idle at the end; either skews the rate by up to
    ``(num_workers - 1) / batches``, in opposite directions, by amounts that depend on how
    the workers' phases line up.

    Indices cycle over the dataset when it is shorter. Batches are only fetched, not sent
    to a device, so ``pin_memory`` should be True only where pinning is real (a CUDA device;
    catalog F6, F7).

    With ``seconds``, the timed batches stop early once they have taken that long, at the end
    of a whole round (at least one): a slow dataset (tens of ms a sample, in batches of
    hundreds) would otherwise take minutes of a time budget for ``batches`` batches. Where the
    first round alone takes that long, it is the measurement, its start-up included (a rate
    slightly low; in the main process, where nothing starts, the rate).

    ``timeout_s`` (seconds, > 0) bounds the wait for each batch with workers, the first batch
    included, so it must cover worker start-up (seconds per worker under spawn). With
    ``num_workers == 0`` the main process loads and nothing can interrupt a hung
    ``__getitem__``.

    A worker killed by a signal, exiting unexpectedly, or sending nothing within
    ``timeout_s`` returns a failed trial (``samples_per_s`` None, ``error`` says which).
    Anything else the dataset or ``collate_fn`` raises propagates (with workers torch
    re-raises it in this process with the same type). The workers are shut down before this
    returns or raises, so no worker process outlives the call; a hung worker is given torch's
    status interval (5 s) to exit at shutdown, then terminated, so a hang costs ``timeout_s``
    plus up to 5 s per hung worker.

    Process safety: under spawn or forkserver the dataset and ``collate_fn`` must be
    picklable (defined at module top level); see the module docstring. ``worker_options``
    are the user's DataLoader arguments for its workers (``loader_kwargs``).
    """
    _check_arguments(dataset, batch_size=batch_size, batches=batches, timeout_s=timeout_s)
    per_round = max(1, num_workers)
    timed = -(-batches // per_round) * per_round
    ahead = num_workers * (prefetch_factor or _TORCH_PREFETCH_DEFAULT)
    total = batch_size * (per_round + timed + ahead)
    loader = _make_loader(
        dataset,
        sampler=_cycled_indices(len(dataset), total),
        collate_fn=collate_fn,
        kwargs=loader_kwargs(
            batch_size=batch_size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor,
            timeout_s=timeout_s,
            worker_options=worker_options,
        ),
    )
    try:
        startup_s, took, timed = _timed_pass(
            loader, clock, warmup=per_round, timed=timed, per_round=per_round, seconds=seconds
        )
    except Exception as exc:  # the user's dataset raised, or a worker died
        error = worker_failure(exc) if num_workers > 0 and isinstance(exc, RuntimeError) else None
        if error is None:
            blame_user_code(exc)
            raise
        return LoaderTrial(num_workers, None, 0, 0, 0.0, None, error)
    if timed == 0:  # the first round alone took ``seconds``: it is the measurement
        timed, took = per_round, startup_s
    samples = batch_size * timed
    if took <= 0:  # an infinite rate is no measurement (and the evidence refuses it)
        failed = "no time measured: the clock did not move"
        return LoaderTrial(num_workers, None, timed, samples, took, startup_s, failed)
    return LoaderTrial(num_workers, samples / took, timed, samples, took, startup_s)


def _check_arguments(
    dataset: Dataset[Any], *, batch_size: int, batches: int, timeout_s: float
) -> None:
    """ValueError or TypeError for arguments no measurement can use."""
    if batch_size < 1 or batches < 1:
        raise ValueError(f"batch_size and batches must be >= 1, got {batch_size}, {batches}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise TypeError(
            f"{type(dataset).__name__} is not a map-style dataset (__len__ and __getitem__): "
            "the worker measurement indexes it"
        )
    if len(dataset) == 0:
        raise ValueError("the dataset is empty: there is nothing to load")


def _cycled_indices(length: int, count: int) -> list[int]:
    """``count`` indices 0, 1, ... wrapping at ``length``: exactly the batches asked for."""
    return [i % length for i in range(count)]


def _make_loader(
    dataset: Dataset[Any],
    *,
    sampler: Sequence[int],
    collate_fn: Callable[[list[Any]], Any] | None,
    kwargs: dict[str, Any],
) -> Any:
    """A DataLoader over ``dataset`` that visits ``sampler``'s indices in order."""
    from torch.utils.data import DataLoader

    if collate_fn is not None:
        kwargs = {**kwargs, "collate_fn": collate_fn}
    return DataLoader(dataset, sampler=sampler, drop_last=False, **kwargs)


def _timed_pass(
    loader: Any,
    clock: Callable[[], float],
    *,
    warmup: int,
    timed: int,
    per_round: int = 1,
    seconds: float | None = None,
) -> tuple[float, float, int]:
    """(seconds for the first ``warmup`` batches, seconds for the timed batches after them,
    how many were timed): ``timed`` of them, or fewer whole rounds of ``per_round`` once
    ``seconds`` have passed; none where the warm-up alone took ``seconds``.

    The workers are shut down before this returns or raises, whatever happened.
    """
    with worker_deaths_between_batches() as check:
        start = clock()
        iterator = iter(loader)
        try:
            check()
            for _ in range(warmup):
                next(iterator)
                check()
            first = clock()
            done = 0
            if seconds is not None and first - start >= seconds:
                timed = 0  # the first round is the measurement (the caller's)
            while done < timed:
                next(iterator)
                check()
                done += 1
                if seconds is not None and done % per_round == 0 and clock() - first >= seconds:
                    break
            end = clock()
        finally:
            shut_down(iterator)
    return first - start, end - first, done


@contextlib.contextmanager
def worker_deaths_between_batches() -> Iterator[Callable[[], None]]:
    """Hold torch's SIGCHLD handler while a DataLoader's workers run; ``check()``, called
    between batches, runs it for the signals that came meanwhile.

    torch's handler raises ``RuntimeError`` ("DataLoader worker (pid N) is killed by signal")
    at whatever bytecode the main thread is on. When that was inside ``multiprocessing.Queue.put``
    just after its lock was taken (putting indices while the workers start), the lock was never
    released, and the ``put`` that shuts the workers down waited for it forever: a test that
    SIGKILLs a worker hung the suite about once in fifteen runs (torch 2.13, Python 3.11).
    Held, the handler runs at a point that holds no lock; a death while the main thread waits
    for the dead worker's batch is reported by torch when that wait times out (``timeout_s``).
    Outside the main thread, on Windows, or where torch has no such handler, nothing changes.
    """
    torch_handler = _torch_sigchld_handler()
    if torch_handler is None:
        yield lambda: None
        return
    came: list[int] = []
    signal.signal(signal.SIGCHLD, lambda number, _frame: came.append(number))

    def check() -> None:
        if came:
            came.clear()
            torch_handler(signal.SIGCHLD, None)  # raises for a dead worker; chains the user's

    try:
        yield check
    finally:
        signal.signal(signal.SIGCHLD, torch_handler)
        if came:  # our workers' pids are gone by now: this reaches the user's handler, if any
            torch_handler(signal.SIGCHLD, None)


def _torch_sigchld_handler() -> Callable[[int, Any], Any] | None:
    """torch's SIGCHLD handler, installed now if it was not yet (torch installs it once per
    process, with the first DataLoader that has workers); None where there is none to hold."""
    if not hasattr(signal, "SIGCHLD") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        from torch.utils.data._utils import signal_handling
    except ImportError:
        return None
    install = getattr(signal_handling, "_set_SIGCHLD_handler", None)
    if install is None:
        return None
    install()
    handler = signal.getsignal(signal.SIGCHLD)
    return handler if callable(handler) else None


def shut_down(iterator: Any) -> None:
    """Stop the iterator's worker processes now (a no-op without workers or when done).

    Dropping the last reference is not enough: when a worker re-raises the dataset's error,
    torch's ``ExceptionWrapper.reraise`` leaves the exception in a reference cycle with the
    frames that hold the iterator, so its workers would live on until the cyclic garbage
    collector runs, possibly inside a worker forked later, where shutting them down fails
    ("can only test a child process"). Persistent workers are also kept by the DataLoader.
    ``_shutdown_workers`` is idempotent, and ``__del__`` calls it too (torch 1.x to 2.13).
    """
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
