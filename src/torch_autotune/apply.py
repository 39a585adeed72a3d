"""Turn a profile into torch calls: the only module that changes torch's global state.

Each function reads the profile and touches torch only when called (torch is imported here,
lazily, never by ``import torch_autotune``). ``Profile`` exposes them as methods, so a training
script needs no glue::

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
from typing import TYPE_CHECKING, Any

from torch_autotune.errors import LateEnvironmentWarning

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from torch_autotune.profile import Profile


# Variables read once when CUDA (or OpenMP) starts: setting them later changes nothing.
_READ_AT_CUDA_START = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "CUBLAS_WORKSPACE_CONFIG",
    "HIPBLAS_WORKSPACE_CONFIG",
)


def apply_environment(profile: Profile) -> list[str]:
    """Export the profile's environment variables; return the names set.

    Call before ``import torch`` for OMP/MKL thread counts, and before the first CUDA call for
    the allocator and cuBLAS settings. A variable the user already set is left alone.
    """
    applied: list[str] = []
    for name, value in profile.settings.environment.items():
        if name in os.environ and os.environ[name] != value:
            continue  # the user's own choice wins
        os.environ[name] = value
        applied.append(name)
    return applied


def apply_torch_settings(profile: Profile) -> None:
    """Apply the global torch settings: TF32, cuDNN, determinism, threads, seed, environment.

    Warns (``LateEnvironmentWarning``) when CUDA has already started, so that the allocator
    and cuBLAS variables can no longer take effect.
    """
    import torch

    s = profile.settings
    applied = apply_environment(profile)
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
    apply_matmul(torch, s.matmul.api, s.matmul.tf32)
    torch.backends.cudnn.benchmark = s.backends.cudnn_benchmark
    torch.backends.cudnn.deterministic = s.backends.cudnn_deterministic
    torch.use_deterministic_algorithms(s.backends.deterministic_algorithms)
    if s.cpu_threads is not None:
        torch.set_num_threads(s.cpu_threads)
    if s.seed is not None:
        random.seed(s.seed)
        torch.manual_seed(s.seed)


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


def dataloader_kwargs(profile: Profile) -> dict[str, Any]:
    """Keyword arguments for ``torch.utils.data.DataLoader`` (batch_size left to the caller)."""
    dl = profile.settings.dataloader
    kwargs: dict[str, Any] = {"num_workers": dl.num_workers, "pin_memory": dl.pin_memory}
    if dl.num_workers > 0:
        kwargs["persistent_workers"] = dl.persistent_workers
        if dl.prefetch_factor is not None:
            kwargs["prefetch_factor"] = dl.prefetch_factor
    if dl.seed_workers:
        import torch

        kwargs["worker_init_fn"] = _seed_worker
        kwargs["generator"] = torch.Generator().manual_seed(profile.settings.seed or 0)
    return kwargs


def autocast(profile: Profile) -> AbstractContextManager[Any]:
    """``torch.autocast`` with the profile's dtype, always explicit (catalog A9)."""
    import torch

    p = profile.settings.precision
    context: AbstractContextManager[Any] = torch.autocast(
        device_type=profile.settings.device,
        dtype=getattr(torch, p.dtype) if p.autocast else None,
        enabled=p.autocast,
    )
    return context


def grad_scaler(profile: Profile) -> Any:
    """A GradScaler, enabled only for fp16 (bf16 needs none, catalog A1)."""
    import torch

    return make_scaler(
        torch, profile.settings.device, enabled=profile.settings.precision.grad_scaler
    )


def make_scaler(torch: Any, device: str, *, enabled: bool) -> Any:
    """A GradScaler for ``device``: ``torch.amp.GradScaler`` from torch 2.3 (A10), the CUDA
    one before."""
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device, enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)


def optimizer_kwargs(profile: Profile) -> dict[str, Any]:
    """Keyword arguments for Adam/AdamW: ``fused=True`` where the profile chose it."""
    return {"fused": True} if profile.settings.optimizer.fused else {}


def prepare_model(profile: Profile, model: Any) -> Any:
    """Memory format and torch.compile; returns the model to train (compiled or not)."""
    import torch

    if profile.settings.memory_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    if profile.settings.compile.enabled:
        model = torch.compile(model, mode=profile.settings.compile.mode)
    return model
