"""Out-of-memory classification and clean-up (``torch_autotune.probe.oom``).

A table of real exception objects (torch's own classes, constructed with the messages the
allocators write) and lookalikes that must not count: a shape bug, a device-side assert, an
illegal memory access, a memory-sounding error of the wrong type. Wrapped errors are covered
both with a stand-in wrapper and with the real ``torch.compile`` wrapper. Two tests allocate for
real: torch's CPU allocator refusing an absurd tensor, and the failed trial's tensors being freed
once ``run_guarded`` returns. CUDA is never touched: its functions are replaced by recorders.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from collections.abc import Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from torch_autotune.probe import oom
from torch_autotune.probe.oom import (
    OomInfo,
    describe_out_of_memory,
    is_out_of_memory,
    oom_kind,
    release_memory,
    run_guarded,
)

ABSURD_BYTES = 2**62  # 4 EiB: more than any machine's address space

# Messages as the allocators and vendor libraries write them (numbers vary).
CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of "
    "which 1.23 GiB is free. Including non-PyTorch memory, this process has 77.86 GiB memory in "
    "use. Of the allocated memory 75.12 GiB is allocated by PyTorch, and 1.91 GiB is reserved by "
    "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
    "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
HIP_OOM = (
    "HIP out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 191.98 GiB of "
    "which 0 bytes is free. Of the allocated memory 190.12 GiB is allocated by PyTorch, and "
    "1.02 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
    "try setting PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
CUDA_KERNEL_HINT = (
    "\nCUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)
MPS_OOM = (
    "MPS backend out of memory (MPS allocated: 17.98 GB, other allocations: 1.02 GB, max allowed: "
    "18.13 GB). Tried to allocate 256.00 MB on private pool. Use "
    "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations (may "
    "cause system failure)."
)
CPU_OOM_POSIX = (
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 4611686018427387904 bytes. Error code 12 (Cannot allocate memory)"
)
CPU_OOM_WINDOWS = (
    "[enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: not enough memory: you tried "
    "to allocate 37984010240 bytes."
)
SHAPE_BUG = "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"


def _raised(make: Callable[[], BaseException]) -> BaseException:
    """The exception ``make`` raises, with its chain and traceback set as Python sets them."""
    try:
        raise make()
    except BaseException as exc:  # the test wants the object itself
        return exc
    raise AssertionError("unreachable")


def _raised_while_handling(first: BaseException, second: BaseException) -> BaseException:
    """``second``, raised inside the ``except`` block that caught ``first`` (implicit context)."""
    try:
        try:
            raise first
        except BaseException:
            raise second  # noqa: B904 - the implicit chain is what is being tested
    except BaseException as exc:
        return exc
    raise AssertionError("unreachable")


def _raised_from(wrapper: BaseException, cause: BaseException | None) -> BaseException:
    """``wrapper`` raised ``from cause`` inside the handler of ``cause`` (``from None`` if None)."""
    inner = cause if cause is not None else RuntimeError(CUDA_OOM)
    try:
        try:
            raise inner
        except BaseException:
            raise wrapper from cause
    except BaseException as exc:
        return exc
    raise AssertionError("unreachable")


class BackendCompilerFailedLike(RuntimeError):
    """Stands in for a compiler wrapper that chains the original with ``raise ... from``."""


class InnerExceptionWrapper(RuntimeError):
    """Stands in for dynamo's wrappers: raised ``from None``, the original in an attribute."""

    def __init__(self, inner: BaseException) -> None:
        super().__init__(f"backend='inductor' raised:\n{type(inner).__name__}")
        self.inner_exception = inner


# --- the table: (exception, expected kind or None) ----------------------------------------------

OOM_CASES = [
    pytest.param(torch.OutOfMemoryError(CUDA_OOM), "cuda", id="torch.OutOfMemoryError-cuda"),
    pytest.param(torch.cuda.OutOfMemoryError(CUDA_OOM), "cuda", id="torch.cuda.OutOfMemoryError"),
    pytest.param(torch.OutOfMemoryError("allocator says no"), "cuda", id="type-only-no-marker"),
    pytest.param(RuntimeError(CUDA_OOM), "cuda", id="pre-1.13-RuntimeError-cuda"),
    pytest.param(torch.OutOfMemoryError(HIP_OOM), "rocm", id="torch.OutOfMemoryError-hip"),
    pytest.param(
        torch.AcceleratorError("CUDA error: out of memory" + CUDA_KERNEL_HINT),
        "cuda",
        id="AcceleratorError-cudaErrorMemoryAllocation",
    ),
    pytest.param(
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        "cuda",
        id="cublas-alloc-failed",
    ),
    pytest.param(
        RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "cuda", id="cudnn8-alloc-failed"
    ),
    pytest.param(
        RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"),
        "cuda",
        id="cudnn9-device-allocation-failed",
    ),
    pytest.param(
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_ENOUGH_WORKSPACE"),
        "cuda",
        id="cudnn-not-enough-workspace",
    ),
    pytest.param(RuntimeError("HIP error: out of memory"), "rocm", id="hip-error-out-of-memory"),
    pytest.param(
        RuntimeError("hipMalloc failed: hipErrorOutOfMemory"), "rocm", id="hipErrorOutOfMemory"
    ),
    pytest.param(
        RuntimeError("MIOpen error: miopenStatusAllocFailed"), "rocm", id="miopen-alloc-failed"
    ),
    pytest.param(RuntimeError(MPS_OOM), "mps", id="mps-heap-allocator"),
    pytest.param(RuntimeError(CPU_OOM_POSIX), "cpu", id="cpu-posix"),
    pytest.param(RuntimeError(CPU_OOM_WINDOWS), "cpu", id="cpu-windows"),
    pytest.param(MemoryError(), "cpu", id="python-MemoryError"),
    pytest.param(
        _raised_from(BackendCompilerFailedLike("backend='inductor' raised"), MemoryError()),
        "cpu",
        id="wrapper-cause-MemoryError",
    ),
    pytest.param(
        _raised_from(
            BackendCompilerFailedLike("backend='inductor' raised"),
            torch.OutOfMemoryError(CUDA_OOM),
        ),
        "cuda",
        id="wrapper-cause-OutOfMemoryError",
    ),
    pytest.param(
        _raised_from(InnerExceptionWrapper(MemoryError()), None),
        "cpu",
        id="wrapper-from-None-inner_exception",
    ),
    pytest.param(
        _raised_while_handling(torch.OutOfMemoryError(HIP_OOM), KeyError("batch")),
        "rocm",
        id="implicit-context-OOM",
    ),
]

NOT_OOM_CASES = [
    pytest.param(RuntimeError(SHAPE_BUG), id="shape-mismatch"),
    pytest.param(KeyError("input_ids"), id="KeyError"),
    pytest.param(
        torch.AcceleratorError("CUDA error: device-side assert triggered" + CUDA_KERNEL_HINT),
        id="device-side-assert",
    ),
    pytest.param(
        RuntimeError("CUDA error: an illegal memory access was encountered" + CUDA_KERNEL_HINT),
        id="illegal-memory-access",
    ),
    pytest.param(
        RuntimeError(
            "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a "
            "non-contiguous input."
        ),
        id="cudnn-not-supported",
    ),
    pytest.param(RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"), id="cudnn-internal"),
    pytest.param(
        RuntimeError("out of resource: shared memory, Required: 98304, Hardware limit: 65536"),
        id="triton-shared-memory",
    ),
    pytest.param(ValueError(CUDA_OOM), id="oom-text-on-a-ValueError"),
    pytest.param(KeyError(CPU_OOM_POSIX), id="oom-text-on-a-KeyError"),
    pytest.param(
        _raised_from(ValueError("could not train"), None), id="context-suppressed-by-from-None"
    ),
    pytest.param(
        _raised_from(BackendCompilerFailedLike("backend raised"), RuntimeError(SHAPE_BUG)),
        id="wrapper-of-a-shape-bug",
    ),
]


@pytest.mark.parametrize(("exc", "kind"), OOM_CASES)
def test_out_of_memory_is_recognised_with_its_allocator(exc: BaseException, kind: str) -> None:
    assert is_out_of_memory(exc)
    assert oom_kind(exc) == kind


@pytest.mark.parametrize("exc", NOT_OOM_CASES)
def test_other_errors_are_not_out_of_memory(exc: BaseException) -> None:
    assert not is_out_of_memory(exc)
    assert oom_kind(exc) is None
    assert describe_out_of_memory(exc) is None


MARKERS = [marker for marker, _ in oom._MARKERS]


@given(text=st.text(max_size=200))
def test_runtime_errors_naming_no_allocator_are_not_oom(text: str) -> None:
    if not any(marker in text for marker in MARKERS):
        assert not is_out_of_memory(RuntimeError(text))


@given(before=st.text(max_size=50), marker=st.sampled_from(MARKERS), after=st.text(max_size=50))
def test_a_marker_anywhere_in_a_runtime_error_is_oom(before: str, marker: str, after: str) -> None:
    assert is_out_of_memory(RuntimeError(before + marker + after))
    assert not is_out_of_memory(ValueError(before + marker + after))


def test_torch_oom_classes_are_the_ones_classified() -> None:
    # torch 2.13 has one class under both names; RuntimeError is its base, so an old-style
    # handler catching RuntimeError still sees it.
    assert torch.OutOfMemoryError is torch.cuda.OutOfMemoryError
    assert issubclass(torch.OutOfMemoryError, RuntimeError)


def test_the_allocators_own_words_are_kept_not_the_wrappers() -> None:
    exc = _raised_from(
        BackendCompilerFailedLike(f"backend='inductor' raised:\nOutOfMemoryError: {CUDA_OOM}"),
        torch.OutOfMemoryError(CUDA_OOM),
    )
    assert describe_out_of_memory(exc) == OomInfo(
        kind="cuda", message=CUDA_OOM, exception_type="torch.OutOfMemoryError"
    )


def test_a_cyclic_chain_terminates() -> None:
    first, second = RuntimeError("first"), RuntimeError("second")
    first.__context__, second.__context__ = second, first
    assert not is_out_of_memory(first)


def test_inductor_error_wrapping_an_oom_is_recognised() -> None:
    from torch._inductor.exc import InductorError

    wrapped = InductorError(torch.OutOfMemoryError(CUDA_OOM), None)
    assert oom_kind(wrapped) == "cuda"


def test_real_torch_compile_wrapping_a_memory_error_is_recognised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch 2.13's dynamo raises BackendCompilerFailed "from None": no __cause__, a suppressed
    # __context__, the original in inner_exception, and a message ("MemoryError: ") that names
    # no allocator. Only following inner_exception finds it.
    from torch._dynamo.exc import BackendCompilerFailed

    # dynamo asks whether CUDA exists; answer as this CPU build would, without asking CUDA
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)

    def backend_out_of_memory(gm: object, example_inputs: object) -> object:
        raise MemoryError

    compiled = torch.compile(lambda x: x * 2 + 1, backend=backend_out_of_memory)
    with pytest.raises(BackendCompilerFailed) as excinfo:
        compiled(torch.ones(3))
    assert excinfo.value.__cause__ is None
    assert excinfo.value.__suppress_context__
    assert oom_kind(excinfo.value) == "cpu"


def test_real_cpu_allocator_failure_is_a_runtime_error_of_kind_cpu() -> None:
    # What torch 2.13 raises on Linux: a plain RuntimeError from alloc_cpu.cpp (posix_memalign
    # failing, errno 12), not torch.OutOfMemoryError and not MemoryError.
    with pytest.raises(RuntimeError) as excinfo:
        torch.empty(ABSURD_BYTES, dtype=torch.uint8)
    assert type(excinfo.value) is RuntimeError
    assert "DefaultCPUAllocator: can't allocate memory" in str(excinfo.value)
    assert oom_kind(excinfo.value) == "cpu"


# --- run_guarded ---------------------------------------------------------------------------------


def test_run_guarded_returns_the_steps_result() -> None:
    assert run_guarded(lambda: 42) == (42, None)


def test_run_guarded_returns_only_a_description_of_an_oom() -> None:
    result, info = run_guarded(lambda: torch.empty(ABSURD_BYTES, dtype=torch.uint8))
    assert result is None
    assert info is not None
    assert info.kind == "cpu"
    assert info.exception_type == "builtins.RuntimeError"
    assert "you tried to allocate 4611686018427387904 bytes" in info.message


def user_training_step() -> torch.Tensor:
    """A user's step with a shape bug: its name must survive in the traceback."""
    return torch.ones(2, 3) @ torch.ones(4, 5)


def test_run_guarded_reraises_a_bug_with_the_users_traceback() -> None:
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied") as excinfo:
        run_guarded(user_training_step)
    assert type(excinfo.value) is RuntimeError
    assert "user_training_step" in [entry.name for entry in excinfo.traceback]


def test_run_guarded_lets_keyboard_interrupt_through() -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_guarded(interrupted)


def _step_leaving_a_tensor(refs: list[weakref.ref[torch.Tensor]]) -> Callable[[], None]:
    """A step that allocates 'activations', then asks the CPU allocator for too much."""

    def step() -> None:
        activations = torch.ones(1024, 1024)  # 4 MiB the failed trial must give back
        refs.append(weakref.ref(activations))
        torch.empty(ABSURD_BYTES, dtype=torch.uint8)

    return step


def test_run_guarded_frees_the_failed_steps_tensors() -> None:
    refs: list[weakref.ref[torch.Tensor]] = []
    _, info = run_guarded(_step_leaving_a_tensor(refs))
    release_memory("cpu")
    assert info is not None
    assert refs[0]() is None


def test_keeping_the_exception_would_keep_the_tensors_alive() -> None:
    # The control for the test above: a guard that stores the exception leaks the trial.
    refs: list[weakref.ref[torch.Tensor]] = []
    kept: list[BaseException] = []
    try:
        _step_leaving_a_tensor(refs)()
    except RuntimeError as exc:
        kept.append(exc)
    gc.collect()
    assert refs[0]() is not None
    kept.clear()
    gc.collect()
    assert refs[0]() is None


# --- release_memory -----------------------------------------------------------------------------


class Recorder:
    """A stand-in for a torch function: counts its calls, returns None."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def __call__(self, *args: object) -> None:
        self.calls.append(args)


def test_release_memory_never_initialises_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    empty_cache = Recorder()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    release_memory("cuda")
    assert empty_cache.calls == []


def test_release_memory_empties_an_initialised_cuda_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    empty_cache, collect = Recorder(), Recorder()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    monkeypatch.setattr(oom.gc, "collect", collect)
    release_memory("cuda:1")
    assert empty_cache.calls == [()]
    assert collect.calls == [()]


def test_release_memory_without_torch_only_collects(monkeypatch: pytest.MonkeyPatch) -> None:
    collect = Recorder()
    monkeypatch.setattr(oom.gc, "collect", collect)
    monkeypatch.delitem(sys.modules, "torch")
    release_memory("cuda")
    assert collect.calls == [()]


def test_release_memory_empties_the_mps_cache_where_mps_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    empty_cache = Recorder()
    monkeypatch.setattr(torch.mps, "empty_cache", empty_cache)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    release_memory("mps")
    assert empty_cache.calls == [()]


def test_release_memory_skips_mps_without_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    empty_cache = Recorder()
    monkeypatch.setattr(torch.mps, "empty_cache", empty_cache)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    release_memory("mps")
    assert empty_cache.calls == []


def test_release_memory_on_cpu_touches_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    empty_cache = Recorder()
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    monkeypatch.setattr(torch.mps, "empty_cache", empty_cache)
    release_memory("cpu")
    assert empty_cache.calls == []


def test_release_memory_rejects_an_unknown_device() -> None:
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        release_memory("gpu")


@pytest.mark.child_process
def test_importing_oom_imports_no_torch() -> None:
    code = "import sys, torch_autotune.probe.oom; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_objects_alive_when_a_probe_starts_are_frozen_for_it_and_thawed_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gc

    from torch_autotune.probe import oom

    gc.unfreeze()  # the suite freezes its own long-lived objects (conftest): not for this test
    monkeypatch.setattr(oom._Seen, "frozen", False)  # as in a process that never froze any
    try:
        alive = [object() for _ in range(3)]
        with oom.long_lived_objects_frozen():
            assert gc.get_freeze_count() > 0  # collections after each trial skip them
            with oom.long_lived_objects_frozen():  # the bench's probe, inside the bench's
                assert gc.get_freeze_count() > 0
            assert gc.get_freeze_count() > 0  # the inner one thawed nothing
        assert gc.get_freeze_count() == 0
        assert alive
        assert not oom._Seen.frozen  # ours were not taken for the process's own
    finally:
        gc.freeze()


def test_frozen_objects_are_counted_until_some_are_found_then_never_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counting walks every frozen object (0.8 s a probe for the 5.5 million a long test
    session froze): a process seen to have frozen some is not walked again."""
    from torch_autotune.probe import oom

    counts = iter([0, 0, 5_500_000])
    walks: list[int] = []

    def count() -> int:
        walks.append(1)
        return next(counts)

    monkeypatch.setattr(oom._Seen, "frozen", False)
    monkeypatch.setattr(oom.gc, "get_freeze_count", count)
    monkeypatch.setattr(oom.gc, "freeze", lambda: None)
    monkeypatch.setattr(oom.gc, "unfreeze", lambda: None)
    monkeypatch.setattr(oom.gc, "collect", lambda: 0)
    for _ in range(5):
        with oom.long_lived_objects_frozen():
            pass
    assert len(walks) == 3  # none frozen, none, then some: the last two probes walk nothing
    assert oom._Seen.frozen


def test_a_process_that_froze_objects_of_its_own_is_left_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its frozen objects are neither frozen again nor thawed (their count may still fall, as
    frozen objects whose last reference goes are freed)."""
    import gc

    from torch_autotune.probe import oom

    gc.freeze()
    monkeypatch.setattr(oom._Seen, "frozen", False)  # found by counting them, not remembered
    calls: list[str] = []
    monkeypatch.setattr(oom.gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(oom.gc, "unfreeze", lambda: calls.append("unfreeze"))
    try:
        with oom.long_lived_objects_frozen():
            pass
        assert calls == []
    finally:
        monkeypatch.undo()
        gc.unfreeze()
