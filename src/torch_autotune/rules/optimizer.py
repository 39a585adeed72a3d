"""The optimizer implementation, the batch settings and the seed.

Rules catalog I1-I5 (fused Adam/AdamW, surprise S14), K1-K2 (a batch size is only ever one the
probe ran), L1 (gradient accumulation) and C4 (seeding in the reproducible mode). Every rule
yields one finding per setting it owns, every time.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch_autotune.profile import Mode, Source
from torch_autotune.rules.context import Context, Finding

_FUSED_OPTIMIZERS = ("adam", "adamw")


def _not_fused_reason(ctx: Context) -> tuple[str, str] | None:
    """(catalog id, why) the optimizer keeps torch's default (foreach), or None to fuse."""
    name = ctx.preferences.optimizer
    torch_version = ctx.snapshot.software.torch_version
    if ctx.device == "cpu":
        return "I3", (
            "CPU training: fused CPU kernels exist for Adam/AdamW/SGD/Adagrad from torch 2.4 "
            "but are beta; opt in after measuring"
        )
    if ctx.device == "mps":
        return "I4", "MPS: fused Adam/AdamW/SGD are beta there; opt in after measuring"
    if name not in _FUSED_OPTIMIZERS:
        if name == "sgd":
            return "I5", "SGD: fused SGD on GPUs is beta; opt in after measuring"
        return "I1", (
            "the optimizer is not Adam/AdamW: fused kernels exist only for a few optimizers"
        )
    if not ctx.torch_at_least(2, 0):
        return "I2", (
            f"fused Adam/AdamW is trusted from torch 2.0 (1.13's had speed and numerics "
            f"problems); this is {torch_version}"
        )
    return None


def optimizer(ctx: Context) -> Iterator[Finding]:
    """I1-I5: fused=True for Adam/AdamW on CUDA/ROCm GPUs with torch 2.0 or newer."""
    off = _not_fused_reason(ctx)
    if off is None:
        yield Finding(
            "optimizer.fused",
            True,
            "I2",
            f"{ctx.preferences.optimizer} on a CUDA/ROCm GPU with torch "
            f"{ctx.snapshot.software.torch_version}: the fused kernel (one launch for all "
            "parameters) is the fastest implementation and stable, yet not torch's default "
            "(foreach). Needs every parameter floating-point on the GPU and differentiable=False",
        )
        return
    rule, why = off
    yield Finding(
        "optimizer.fused", False, rule, f"torch's default (foreach) implementation: {why}"
    )


def _batch_size(ctx: Context) -> Finding:
    measured = ctx.measurements.batch_size if ctx.measurements is not None else None
    if measured is not None:
        how = ctx.measurements.batch_reason if ctx.measurements is not None else None
        return Finding(
            "batch.batch_size",
            measured,
            "K2",
            how
            or f"{measured}: the largest batch the probe ran on this machine, less its safety "
            "margin, and run once more at that size before being kept",
            Source.MEASURED,
        )
    return Finding(
        "batch.batch_size",
        None,
        "K1",
        "not measured: torch-autotune never hands out a batch size it did not run on this "
        "machine (a size that only fits on paper runs out of memory later); run autotune to "
        "probe it, and keep your own batch size until then",
    )


def batch(ctx: Context) -> Iterator[Finding]:
    """K1-K2, L1, C4: the batch size (only measured), accumulation steps and the seed."""
    yield _batch_size(ctx)
    measured = ctx.measurements
    if measured is not None and measured.grad_accum_steps is not None:
        yield Finding(
            "batch.grad_accum_steps",
            measured.grad_accum_steps,
            "L1",
            f"{measured.grad_accum_steps}: keeps the target global batch with the batch size "
            "that fits (ceil(target / (batch size x processes)))",
            Source.MEASURED,
        )
    else:
        yield Finding(
            "batch.grad_accum_steps",
            1,
            "L1",
            "1: no target global batch is given, so every step updates the weights; with one, "
            "accumulation would be ceil(target / batch size)",
        )
    if ctx.mode is Mode.REPRODUCIBLE:
        yield Finding(
            "seed",
            ctx.preferences.seed,
            "C4",
            f"reproducible mode: seed torch, random and numpy with {ctx.preferences.seed} "
            "before the model is built",
        )
    else:
        yield Finding(
            "seed",
            None,
            "C4",
            f"not set: {ctx.mode.value} mode does not ask for repeatable runs",
        )
