"""Out-of-memory: tell it from real errors, and give the memory back afterwards.

This is the one place that decides whether an exception raised by a trial means "this batch is
too big" or "the user's code is broken". The decision is made on the exception's type first and
its message second, over every allocator torch has:

============  ===============================================================================
kind          what torch raises (torch 2.13 unless noted)
============  ===============================================================================
``"cuda"``    ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` is the same class;
              before torch 1.13 a plain ``RuntimeError``) saying "CUDA out of memory. Tried to
              allocate ..."; ``torch.AcceleratorError``/``RuntimeError`` "CUDA error: out of
              memory" (``cudaErrorMemoryAllocation`` outside the caching allocator);
              "CUBLAS_STATUS_ALLOC_FAILED" (cuBLAS workspace or handle); cuDNN
              "CUDNN_STATUS_ALLOC_FAILED" (cuDNN <= 8), "..._HOST_ALLOCATION_FAILED" and
              "..._DEVICE_ALLOCATION_FAILED" (cuDNN 9), "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE".
``"rocm"``    the same classes on a ROCm build, whose messages hipify "CUDA" to "HIP":
              "HIP out of memory", "HIP error: out of memory", "hipErrorOutOfMemory";
              hipBLAS "HIPBLAS_STATUS_ALLOC_FAILED", rocBLAS "rocblas_status_memory_error",
              MIOpen "miopenStatusAllocFailed".
``"mps"``     ``RuntimeError`` "MPS backend out of memory (MPS allocated: ..." from the MPS
              heap allocator (a ``TORCH_CHECK``, so no dedicated class).
``"cpu"``     ``RuntimeError`` "[enforce fail at alloc_cpu.cpp:...] ... DefaultCPUAllocator:
              can't allocate memory: you tried to allocate N bytes. Error code 12 (Cannot
              allocate memory)" (POSIX), "DefaultCPUAllocator: not enough memory: you tried to
              allocate N bytes." (Windows), and Python's own ``MemoryError``.
============  ===============================================================================

Everything else is not out-of-memory, however memory-flavoured it sounds: a CUDA "device-side
assert triggered" or "an illegal memory access was encountered" is a bug in the step, and a
shape mismatch is the user's to fix. Message texts are only trusted on ``RuntimeError`` (what
every torch and C++ error is), so a user's ``ValueError("... out of memory ...")`` stays theirs.

``torch.compile`` wraps errors: dynamo raises ``BackendCompilerFailed`` (and Inductor its
subclass ``InductorError``) ``from None``, keeping the original in ``inner_exception``. The chain
walked is therefore ``__cause__``, ``__context__`` (unless suppressed, as Python prints it) and
``inner_exception``.

Clean-up (:func:`release_memory`) runs *outside* the ``except`` block, once the exception object
is gone: an exception's traceback holds the frames of the failed step, and those frames hold its
activations. :func:`run_guarded` shows the pattern.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Literal, TypeVar

__all__ = [
    "OomInfo",
    "OomKind",
    "describe_out_of_memory",
    "is_out_of_memory",
    "long_lived_objects_frozen",
    "oom_kind",
    "release_memory",
    "run_guarded",
]

T = TypeVar("T")

OomKind = Literal["cuda", "rocm", "mps", "cpu"]
"""Which allocator ran out: CUDA, ROCm/HIP, Apple MPS, or host memory."""

# Message markers, matched case-sensitively as torch and the vendor libraries spell them; the
# first that occurs names the kind.
_MARKERS: tuple[tuple[str, OomKind], ...] = (
    ("HIP out of memory", "rocm"),
    ("HIP error: out of memory", "rocm"),
    ("hipErrorOutOfMemory", "rocm"),
    ("HIPBLAS_STATUS_ALLOC_FAILED", "rocm"),
    ("rocblas_status_memory_error", "rocm"),
    ("miopenStatusAllocFailed", "rocm"),
    ("MPS backend out of memory", "mps"),
    ("CUDA out of memory", "cuda"),
    ("CUDA error: out of memory", "cuda"),
    ("CUBLAS_STATUS_ALLOC_FAILED", "cuda"),
    ("CUDNN_STATUS_ALLOC_FAILED", "cuda"),
    ("CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED", "cuda"),
    ("CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", "cuda"),
    # Not in the cuDNN 8/9 status tables we checked; listed by users' OOM handlers. Unambiguous.
    ("CUDNN_STATUS_NOT_ENOUGH_WORKSPACE", "cuda"),
    ("DefaultCPUAllocator: can't allocate memory", "cpu"),
    ("DefaultCPUAllocator: not enough memory", "cpu"),
)

_MAX_CHAIN = 32  # links followed before giving up: chains are short; cycles are possible
_SUPPORTED_DEVICES = ("cpu", "cuda", "mps")


@dataclass(frozen=True)
class OomInfo:
    """What is kept of an out-of-memory error: never the exception, which pins the trial's frames.

    ``message`` is the text of the link in the chain that was recognised (the allocator's own
    words, not a wrapper's); ``exception_type`` its qualified class name, for the trace.
    """

    kind: OomKind
    message: str
    exception_type: str


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it wraps) means an allocator ran out of memory."""
    return describe_out_of_memory(exc) is not None


def oom_kind(exc: BaseException) -> OomKind | None:
    """Which allocator ran out (``"cuda"``, ``"rocm"``, ``"mps"``, ``"cpu"``); None if not OOM."""
    info = describe_out_of_memory(exc)
    return None if info is None else info.kind


def describe_out_of_memory(exc: BaseException) -> OomInfo | None:
    """Classify ``exc``: an :class:`OomInfo` for an out-of-memory error, None for anything else.

    The chain is searched by type first, then by message; within each pass the innermost
    (earliest raised) match wins, so the allocator's own message is kept rather than a
    wrapper's restatement of it. A torch ``OutOfMemoryError`` whose message names no allocator
    counts as ``"cuda"``, the allocator that class was made for. An error raised while handling
    an OOM (an unsuppressed ``__context__``) counts as that OOM: the memory ran out first.
    """
    chain = list(_chain(exc))
    chain.reverse()
    oom_types = _oom_types()
    for link in chain:
        if isinstance(link, oom_types):
            fallback: OomKind = "cpu" if isinstance(link, MemoryError) else "cuda"
            return _info(link, _kind_from_message(str(link)) or fallback)
    for link in chain:
        if isinstance(link, RuntimeError):
            kind = _kind_from_message(str(link))
            if kind is not None:
                return _info(link, kind)
    return None


@contextmanager
def long_lived_objects_frozen() -> Iterator[None]:
    """Keep the objects alive when a probe or a bench starts out of the ``gc.collect()`` that
    ``release_memory`` runs after every trial, and put them back when it ends.

    A collection walks every tracked object: 400,000 once transformers is imported, 0.33 s a
    collection on a 2-core CPU (0.12 s with torch alone), paid after each of a run's 20 to 40
    trials and points, against 2 microseconds with them frozen (``gc.freeze``). What the trials
    themselves allocate is still collected. A process that froze objects of its own is left as
    it is (``_froze_its_own``).
    """
    if _Seen.ours or _froze_its_own():  # inside a probe of ours (the bench's), or the user's
        yield
        return
    gc.collect()  # the garbage there is now goes first, so that none of it is kept frozen
    gc.freeze()
    _Seen.ours = True
    try:
        yield
    finally:
        gc.unfreeze()
        _Seen.ours = False  # after: a probe that starts meanwhile must not take ours for its own


class _Seen:
    """Whether this process was seen to hold frozen objects of its own (``_froze_its_own``),
    and whether the objects frozen now are ours (``long_lived_objects_frozen``)."""

    frozen = False
    ours = False


def _froze_its_own() -> bool:
    """Whether the process froze objects itself (``gc.freeze``) before a probe starts.

    ``gc.get_freeze_count()`` walks every frozen object: nothing where none are (the usual
    process), but 0.8 s a call for the 5.5 million a long test session froze, paid at every
    probe's start. So the walk is made until it finds some, and a process once seen to freeze
    objects is taken to keep them frozen: one that thaws them later only has its probes collect
    more slowly (each ``gc.collect()`` walks them again), and none of its objects are thawed by
    ours.
    """
    if not _Seen.frozen:
        _Seen.frozen = gc.get_freeze_count() > 0
    return _Seen.frozen


def release_memory(device: str) -> None:
    """Give back what a failed (or finished) trial left behind on ``device``.

    Runs ``gc.collect()`` (reference cycles can hold tensors), then empties the device's caching
    allocator so the next trial, and other processes, see the memory as free: for ``"cuda"``
    (also ROCm) ``torch.cuda.empty_cache()``, only if CUDA is already initialised, since
    initialising it here would cost seconds and hundreds of MiB; for ``"mps"``
    ``torch.mps.empty_cache()`` where the MPS backend is available; on ``"cpu"`` the glibc heap's
    free pages go back to the OS (``_trim_heap``).

    Call it outside your ``except`` block, after dropping the exception (see
    :func:`run_guarded`): while the exception lives, its traceback keeps the failed step's
    frames, and their tensors, alive, and emptying the cache frees nothing.

    Raises:
        ValueError: ``device`` is not a ``cpu``, ``cuda`` or ``mps`` device string.
    """
    kind = _device_type(device)
    gc.collect()
    torch = sys.modules.get("torch")  # not imported: no tensor was ever allocated, nothing cached
    if torch is None:
        return
    if kind == "cuda":
        _empty_cuda_cache(torch)
    elif kind == "mps":
        _empty_mps_cache(torch)
    else:
        _trim_heap()


def _trim_heap() -> None:
    """On glibc, give the heap's free pages back to the OS (``malloc_trim(0)``): tensors under
    its mmap threshold (32 MiB) are freed into the heap and stay resident, so the next trial's
    growth over what the process held would miss what it reuses of them. Elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import ctypes.util

    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)


def run_guarded(step: Callable[[], T]) -> tuple[T | None, OomInfo | None]:
    """Run ``step()``; return ``(result, None)``, or ``(None, info)`` if it ran out of memory.

    Only out-of-memory is caught. Any other exception propagates unchanged, with its original
    traceback, so the user sees the line in their own code that failed. Of an OOM only an
    :class:`OomInfo` is kept; the exception, and with it the failed step's frames, is dropped
    before this returns. The caller then frees the memory::

        result, oom = run_guarded(lambda: train_step(batch_size))
        if oom is not None:
            release_memory(device)  # outside any except block: the frames are gone now
    """
    info: OomInfo | None = None
    try:
        return step(), None
    except Exception as exc:  # narrowed on the next line; anything else is re-raised as is
        info = describe_out_of_memory(exc)
        if info is None:
            raise
    # Python deletes ``exc`` when the except block ends; nothing else refers to it.
    return None, info


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it wraps, outermost first, each once."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending and len(seen) < _MAX_CHAIN:
        link = pending.pop(0)
        if id(link) in seen:
            continue
        seen.add(id(link))
        yield link
        pending.extend(_wrapped(link))


def _wrapped(exc: BaseException) -> list[BaseException]:
    """The exceptions ``exc`` directly wraps: explicit cause, shown context, dynamo's inner one."""
    wrapped: list[BaseException] = []
    if exc.__cause__ is not None:
        wrapped.append(exc.__cause__)
    if exc.__context__ is not None and not exc.__suppress_context__:
        wrapped.append(exc.__context__)
    # torch._dynamo.exc.BackendCompilerFailed / torch._inductor.exc.InductorError (torch 2.x)
    # are raised ``from None`` and keep the original here.
    inner = getattr(exc, "inner_exception", None)
    if isinstance(inner, BaseException):
        wrapped.append(inner)
    return wrapped


def _oom_types() -> tuple[type[BaseException], ...]:
    """The exception classes that mean out-of-memory in the torch that is loaded, if any.

    torch is not imported for this: if it was never imported, no torch error can exist.
    ``torch.cuda.OutOfMemoryError`` appeared in torch 1.13 and the device-neutral
    ``torch.OutOfMemoryError`` (the same class) later, so both are looked up with ``getattr``;
    older torch raised a plain ``RuntimeError``, which the message pass recognises.
    """
    types: list[type[BaseException]] = [MemoryError]
    torch = sys.modules.get("torch")
    if torch is not None:
        for owner in (torch, getattr(torch, "cuda", None)):
            cls = getattr(owner, "OutOfMemoryError", None)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                types.append(cls)
    return tuple(types)


def _kind_from_message(message: str) -> OomKind | None:
    """The allocator an out-of-memory message names, or None if it names none."""
    for marker, kind in _MARKERS:
        if marker in message:
            return kind
    return None


def _info(exc: BaseException, kind: OomKind) -> OomInfo:
    cls = type(exc)
    return OomInfo(kind=kind, message=str(exc), exception_type=f"{cls.__module__}.{cls.__name__}")


def _empty_cuda_cache(torch: ModuleType) -> None:
    """``torch.cuda.empty_cache()``, if and only if CUDA is already initialised."""
    cuda = torch.cuda
    if cuda.is_initialized():
        cuda.empty_cache()


def _empty_mps_cache(torch: ModuleType) -> None:
    """``torch.mps.empty_cache()`` where the MPS backend exists (torch >= 2.0 on macOS)."""
    mps = getattr(torch, "mps", None)
    backend = getattr(getattr(torch, "backends", None), "mps", None)
    if mps is None or backend is None or not hasattr(mps, "empty_cache"):
        return
    if backend.is_available():
        mps.empty_cache()


def _device_type(device: str) -> str:
    """``"cuda"`` from ``"cuda:1"``; ValueError for a device type the probe does not run on."""
    kind = device.split(":", 1)[0].strip().lower()
    if kind not in _SUPPORTED_DEVICES:
        raise ValueError(
            f"unknown device {device!r}: expected one of {', '.join(_SUPPORTED_DEVICES)} "
            "(optionally with an index, such as 'cuda:1')"
        )
    return kind
