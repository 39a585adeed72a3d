"""Turn settings into torch calls: the only code that translates a profile into torch.

Global flags (TF32 through the one API the installed torch has, the cuDNN autotuner and
determinism, threads, seed, environment), the prepared model (memory format, torch.compile),
batches on the device, autocast, the GradScaler and the optimizer's and DataLoader's keyword
arguments: every one is a function of the typed ``Settings`` here, and the user's script (through
``Profile``'s methods), the probe's search trials and the bench's arms all call them, so what
is measured is what the profile applies. ``global_flags`` and ``restore_flags`` save and put
back the flags these functions change.

Each function touches torch only when called (torch is imported here, lazily, never by
``import torch_autotune``). ``Profile`` exposes them as methods, so a training script needs no
glue::

    profile = torch_autotune.recommend()
    profile.apply()                                   # global flags, threads, seed, env
    loader = DataLoader(dataset, batch_size=..., **profile.dataloader_kwargs())
    model = profile.prepare_model(model.to(profile.device))
    optimizer = torch.optim.AdamW(model.parameters(), **profile.optimizer_kwargs())
    scaler = profile.grad_scaler()
    with profile.autocast():
        loss = model(x).loss
"""

from __future__ import annotations

import os
import random
import warnings
from typing import TYPE_CHECKING, Any, Literal

from torch_autotune.errors import LateEnvironmentWarning, ProfileUseWarning

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    from torch_autotune.detect.host import HostSystem
    from torch_autotune.settings import Settings


# Variables read once when CUDA (or OpenMP) starts: setting them later changes nothing.
_READ_AT_CUDA_START = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "CUBLAS_WORKSPACE_CONFIG",
    "HIPBLAS_WORKSPACE_CONFIG",
)


def apply_environment(settings: Settings) -> list[str]:
    """Export the settings' environment variables; return the names set.

    Call before ``import torch`` for OMP/MKL thread counts, and before the first CUDA call for
    the allocator and cuBLAS settings. A variable the user already set is left alone.
    """
    applied: list[str] = []
    for name, value in settings.environment.items():
        if name in os.environ and os.environ[name] != value:
            continue  # the user's own choice wins
        os.environ[name] = value
        applied.append(name)
    return applied


def apply_torch_settings(settings: Settings, *, system: HostSystem | None = None) -> None:
    """Apply the global torch settings: TF32, cuDNN, determinism, threads, seed, environment.

    Warns (``LateEnvironmentWarning``) when CUDA has already started, so that the allocator
    and cuBLAS variables can no longer take effect. ValueError, before anything is set, where
    the settings ask for more CPU threads or DataLoader workers than this machine can run
    (``invariants.too_many``): a profile made for a larger machine is sound there, not here.
    ``system``: the OS calls that count this machine's CPUs (``process_cpus``).
    """
    check_counts_here(settings, system)
    import torch

    applied = apply_environment(settings)
    late = [name for name in applied if name in _READ_AT_CUDA_START]
    if late and torch.cuda.is_initialized():
        warnings.warn(
            LateEnvironmentWarning(
                f"{', '.join(late)} set after CUDA started: it takes effect only in a new process."
                " Call profile.apply() before any CUDA work, or export it in the shell"
                " ('autotune export --format env')"
            ),
            stacklevel=2,
        )
    apply_flags(settings)
    torch.backends.cudnn.deterministic = settings.backends.cudnn_deterministic
    torch.use_deterministic_algorithms(settings.backends.deterministic_algorithms)
    if settings.seed is not None:
        random.seed(settings.seed)
        torch.manual_seed(settings.seed)


def check_counts_here(settings: Settings, system: HostSystem | None = None) -> None:
    """ValueError with ``invariants.too_many``'s line where ``settings`` ask for more CPU
    threads or DataLoader workers than the CPUs this process may use can run (``process_cpus``):
    the bounds of a bench baseline. 64 threads on 2 CPUs take turns on them, slower than
    torch's default."""
    from torch_autotune.invariants import check_cpu_counts, cpu_counts

    counts = cpu_counts(settings)
    check_cpu_counts(counts, lambda: process_cpus(system), lambda name: f"profile: {name}")


def process_cpus(system: HostSystem | None = None) -> int:
    """The CPUs this process may use, as detection counts them (``cpus_usable``): its affinity
    mask, capped by a container's CPU quota (cgroup ``cpu.max``: Docker's ``--cpus``,
    Kubernetes' ``limits.cpu``), which the mask does not show. ``system``: the OS calls, this
    machine's by default (``detect.host.HostSystem``)."""
    from torch_autotune.detect.host import cpus_usable_here

    return cpus_usable_here(system)


def apply_flags(
    settings: Settings, *, cudnn_benchmark: bool | None = None, threads: bool = True
) -> None:
    """Set the flags that change speed, not results: TF32, the cuDNN autotuner, threads.

    ``cudnn_benchmark`` overrides the settings' autotuner (the probe times both); ``threads``
    False leaves the thread count as it is (the search trials run at the process's count).
    TF32 with no API (``matmul.api`` None) sets nothing: torch's defaults stay. The caller
    saves and restores the flags (``global_flags``, ``restore_flags``).
    """
    import torch

    apply_matmul(torch, settings.matmul.api, settings.matmul.tf32)
    benchmark = settings.backends.cudnn_benchmark if cudnn_benchmark is None else cudnn_benchmark
    torch.backends.cudnn.benchmark = benchmark
    if threads and settings.cpu_threads is not None:
        torch.set_num_threads(settings.cpu_threads)


def tf32_api(torch: Any) -> Literal["allow_tf32", "fp32_precision"]:
    """The TF32 API the running torch has: ``fp32_precision`` from 2.9, ``allow_tf32`` before."""
    has_new = hasattr(torch.backends.cuda.matmul, "fp32_precision")
    return "fp32_precision" if has_new else "allow_tf32"


def global_flags(torch: Any) -> dict[str, Any]:
    """The global flags ``apply_flags`` and ``apply_torch_settings`` change, to restore later."""
    flags: dict[str, Any] = {
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic.warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "num_threads": torch.get_num_threads(),
    }
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9: read the new API only (catalog B2):
        # get_float32_matmul_precision() raises once a profile set it ("mix of the legacy and
        # new APIs"; seen on an H100 with torch 2.11, where the workers phase read the flags)
        flags["fp32_precision"] = (
            matmul.fp32_precision,
            torch.backends.cudnn.conv.fp32_precision,
            torch.backends.cudnn.rnn.fp32_precision,
        )
    else:
        flags["allow_tf32"] = (matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        flags["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    return flags


def restore_flags(torch: Any, flags: dict[str, Any]) -> None:
    """Put back the flags ``global_flags`` saved."""
    torch.backends.cudnn.benchmark = flags["cudnn.benchmark"]
    torch.backends.cudnn.deterministic = flags["cudnn.deterministic"]
    torch.use_deterministic_algorithms(
        flags["deterministic"], warn_only=flags["deterministic.warn_only"]
    )
    torch.set_num_threads(flags["num_threads"])
    if "fp32_precision" in flags:
        matmul, conv, rnn = flags["fp32_precision"]
        torch.backends.cuda.matmul.fp32_precision = matmul
        torch.backends.cudnn.conv.fp32_precision = conv
        torch.backends.cudnn.rnn.fp32_precision = rnn
    else:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags["allow_tf32"]
        torch.set_float32_matmul_precision(flags["float32_matmul_precision"])


def apply_matmul(torch: Any, api: str | None, tf32: bool) -> None:
    """TF32 through exactly one API (mixing them raises in torch: rules catalog B2, S5)."""
    if api == "fp32_precision":
        value = "tf32" if tf32 else "ieee"
        torch.backends.cuda.matmul.fp32_precision = value
        torch.backends.cudnn.conv.fp32_precision = value
        torch.backends.cudnn.rnn.fp32_precision = value
    elif api == "allow_tf32":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32


def _seed_worker(worker_id: int) -> None:
    """Seed Python's and NumPy's generators in a DataLoader worker from torch's seed."""
    import torch

    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


class SeededWorkerInit:
    """A DataLoader's ``worker_init_fn`` that seeds the worker as a reproducible profile does
    (``_seed_worker``), then calls yours with the same worker id: a class at module level, not
    a closure, so it pickles where workers start by spawn or forkserver (where yours does)."""

    def __init__(self, yours: Callable[[int], object]) -> None:
        self.yours = yours

    def __call__(self, worker_id: int) -> None:
        _seed_worker(worker_id)
        self.yours(worker_id)

    def __repr__(self) -> str:
        return f"SeededWorkerInit({self.yours!r})"


def seeded_worker_init(yours: Callable[[int], object] | None) -> Callable[[int], object]:
    """The profile's worker seeding with ``yours`` after it (None: the seeding alone); a
    function that already seeds so (one this gave before) is kept as it is."""
    if yours is None or yours is _seed_worker or isinstance(yours, SeededWorkerInit):
        return yours or _seed_worker
    return SeededWorkerInit(yours)


def dataloader_kwargs(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``torch.utils.data.DataLoader`` (batch_size left to the caller)."""
    dl = settings.dataloader
    kwargs: dict[str, Any] = {"num_workers": dl.num_workers, "pin_memory": dl.pin_memory}
    if dl.num_workers > 0:
        kwargs["persistent_workers"] = dl.persistent_workers
        if dl.prefetch_factor is not None:
            kwargs["prefetch_factor"] = dl.prefetch_factor
    if dl.seed_workers:
        import torch

        kwargs["worker_init_fn"] = _seed_worker
        kwargs["generator"] = torch.Generator().manual_seed(settings.seed or 0)
    return kwargs


def autocast(settings: Settings) -> AbstractContextManager[Any]:
    """``torch.autocast`` with the settings' dtype, always explicit (catalog A9)."""
    import torch

    p = settings.precision
    context: AbstractContextManager[Any] = torch.autocast(
        device_type=settings.device,
        dtype=getattr(torch, p.dtype) if p.autocast else None,
        enabled=p.autocast,
    )
    return context


def grad_scaler(settings: Settings) -> Any:
    """A GradScaler for the settings' device, enabled only for fp16 (bf16 needs none, catalog
    A1): ``torch.amp.GradScaler`` from torch 2.3 (A10), the CUDA one before."""
    import torch

    enabled = settings.precision.grad_scaler
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(settings.device, enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)


def optimizer_kwargs(settings: Settings, optimizer: Any = None) -> dict[str, Any]:
    """Keyword arguments for an optimizer: ``fused=True`` where the settings chose it.

    ``optimizer``: the optimizer's class (or any callable that builds it): only the arguments
    its signature takes, and one ``ProfileUseWarning`` naming what it does not (in torch 2.13,
    RMSprop, Adamax, NAdam and LBFGS take no ``fused``). None: every argument (Adam, AdamW).
    """
    import inspect

    kwargs: dict[str, Any] = {"fused": True} if settings.optimizer.fused else {}
    if optimizer is None or not kwargs:
        return kwargs
    try:
        parameters = inspect.signature(optimizer).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: it cannot be told
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return kwargs
    taken = {p.name for p in parameters}
    left = [name for name in kwargs if name not in taken]
    if left:
        name = getattr(optimizer, "__name__", type(optimizer).__name__)
        warnings.warn(
            ProfileUseWarning(
                f"{name} takes no {', '.join(left)} argument: the profile's"
                f" {', '.join(f'{k}={kwargs[k]!r}' for k in left)} is left out, and it steps"
                " with its own default kernel"
            ),
            stacklevel=3,
        )
    return {k: v for k, v in kwargs.items() if k in taken}


def prepare_model(settings: Settings, model: Any) -> Any:
    """Memory format, activation checkpointing of the blocks (``wrapping``: the settings'
    classes, else the repeated blocks, of the model inside any DDP, FSDP or compile wrapper,
    each recomputed once however often this is called) and torch.compile; returns the model to
    train (compiled or not)."""
    import torch

    from torch_autotune.wrapping import checkpoint_blocks

    if settings.memory_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    if settings.activation_checkpointing:
        checkpoint_blocks(model, settings.blocks)
    return compile_model(settings, model)


def compile_model(settings: Settings, model: Any) -> Any:
    """``torch.compile(model, mode=...)`` where the settings enable it, else ``model``.

    Batches made by ``batch_to_device`` have their batch dimension marked dynamic, so the
    compiled model compiles once for every batch size (on an H100, ResNet-50: 80 s to compile,
    then 0.2 s for each new size; a static compile recompiles at the second size).
    """
    if not settings.compile.enabled:
        return model
    import torch

    budget = settings.compile.memory_budget
    if budget is None:
        return torch.compile(model, mode=settings.compile.mode)
    return torch.compile(model, backend=memory_budgeted(settings.compile.mode, budget))


def memory_budgeted(mode: str | None, budget: float) -> Any:
    """Inductor in ``mode`` (what ``torch.compile(mode=...)`` builds) that partitions each graph
    under ``torch._functorch.config.activation_memory_budget = budget``.

    The budget is torch's global setting, read when a graph is partitioned, at its first step
    and at every recompile: this backend sets it for its own compiles only, so one process can
    train a model with it beside a model without it. It is also a backend of its own to Dynamo,
    whose cache of compiled frames is keyed by the backend: a model compiled before with
    torch's default is compiled again under the budget, not served from that cache.
    """
    import torch
    from torch._functorch import config

    if not hasattr(config, "activation_memory_budget"):
        raise RuntimeError(
            f"compile.memory_budget: torch {torch.__version__} has no activation memory budget"
            " (torch 2.4 added it); tune again on this torch, or remove memory_budget from the"
            " profile"
        )
    inductor: Any = torch._TorchCompileInductorWrapper

    class MemoryBudgeted(inductor):  # type: ignore[misc]
        def __call__(self, model_: Any, inputs_: Any, **kwargs: Any) -> Any:
            with config.patch(activation_memory_budget=budget):
                return super().__call__(model_, inputs_, **kwargs)

        def __eq__(self, other: object) -> bool:
            return super().__eq__(other) and getattr(other, "budget", None) == budget

        __hash__ = None  # type: ignore[assignment]  # unhashable, as the wrapper it extends

    backend = MemoryBudgeted(mode, None, None)
    backend.budget = budget
    return backend


def batch_to_device(settings: Settings, batch: Any, *, non_blocking: bool = False) -> Any:
    """A batch on the settings' device, whatever its structure (``map_tensors``): image
    tensors (4-D floating point) in the settings' memory format, and the batch dimension of
    every tensor marked dynamic when the settings compile (``mark_dynamic_batch``)."""
    import torch

    device = settings.device
    channels_last = settings.memory_format == "channels_last"
    moved: list[Any] = []

    def to_device(tensor: Any) -> Any:
        if channels_last and tensor.dim() == 4 and tensor.is_floating_point():
            tensor = tensor.to(device, non_blocking=non_blocking, memory_format=torch.channels_last)
        else:
            tensor = tensor.to(device, non_blocking=non_blocking)
        moved.append(tensor)
        return tensor

    result = map_tensors(batch, to_device, device=device)
    if settings.compile.enabled:
        mark_dynamic_batch(torch, *moved)
    return result


def map_tensors(batch: Any, function: Any, *, device: str | None = None) -> Any:
    """``batch`` with ``function`` applied to every tensor in it, the containers rebuilt as
    they were: a tensor; a mapping (a dict, a tokenizer's ``BatchEncoding``: its own type where
    it can be built from a dict, else a dict); a tuple, a named tuple or a list; a dataclass.
    With ``device``, an object of another type that has a ``to`` method (a batch class of the
    user's) is moved with ``obj.to(device)``; any other value (a string, a number) is kept."""
    import dataclasses
    from collections.abc import Mapping

    import torch

    def walk(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return function(value)
        if isinstance(value, Mapping):
            items = {key: walk(item) for key, item in value.items()}
            kind: Any = type(value)
            try:
                return kind(items)
            except Exception:  # a mapping type that is not built from a dict
                return items
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
            return type(value)(*(walk(item) for item in value))
        if isinstance(value, (tuple, list)):
            return type(value)(walk(item) for item in value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: walk(getattr(value, f.name)) for f in dataclasses.fields(value)}
            return dataclasses.replace(
                value, **{k: v for k, v in fields.items() if _init(value, k)}
            )
        if device is not None and callable(getattr(value, "to", None)):
            return value.to(device)
        return value

    return walk(batch)


def _init(instance: Any, name: str) -> bool:
    """Whether the dataclass field ``name`` of ``instance`` is set through ``__init__``."""
    import dataclasses

    return next(f.init for f in dataclasses.fields(instance) if f.name == name)


def mark_dynamic_batch(torch: Any, *tensors: Any) -> None:
    """Mark dim 0 of ``tensors`` dynamic for torch.compile, so a compiled model compiles once
    for every batch size (``maybe_mark_dynamic``: no error where the model specialises it)."""
    mark = getattr(torch._dynamo, "maybe_mark_dynamic", None) or torch._dynamo.mark_dynamic
    for tensor in tensors:
        if tensor.dim() > 0:
            mark(tensor, 0)
