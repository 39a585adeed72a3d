"""The optimizer implementation, the batch settings and the seed.

Rules catalog I1-I6 (fused Adam/AdamW, surprise S14; I6: a workload whose optimizer is built
fused keeps it), K1-K2 (a batch size is only ever one the
probe ran), L1 (gradient accumulation) and C4 (seeding in the reproducible mode). Every rule
yields one finding per setting it owns, every time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from torch_autotune.bounds import MAX_GLOBAL_BATCH
from torch_autotune.evidence import EAGER, BatchChoice, OptimizerMemoryRecord
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
    """I1-I6: fused=True for Adam/AdamW on CUDA/ROCm GPUs with torch 2.0 or newer, and where
    the workload's optimizer is built fused (``Preferences.optimizer_fused_by``): the probe
    passes no ``fused`` where the profile keeps torch's default, so it trained fused."""
    off = _not_fused_reason(ctx)
    if off is None:
        why = (
            f"{ctx.preferences.optimizer} on a CUDA/ROCm GPU with torch "
            f"{ctx.snapshot.software.torch_version}: the fused kernel (one launch for all "
            "parameters) is the fastest implementation and stable, yet not torch's default "
            "(foreach). Needs every parameter floating-point on the GPU and differentiable=False"
        )
        measured = ctx.measurements.optimizer_memory if ctx.measurements is not None else None
        if measured is None:
            yield Finding("optimizer.fused", True, "I2", why)
            return
        memory = f"{why}; {optimizer_memory_text(measured)}"
        yield Finding("optimizer.fused", True, "I2", memory, Source.MEASURED)
        return
    rule, why = off
    fixed = ctx.preferences.optimizer_fused_by
    if fixed is not None:  # the workload's own optimizer trains fused, whatever the rules say
        yield Finding(
            "optimizer.fused",
            True,
            "I6",
            f"fixed by {fixed}: the workload's optimizer is built fused, and the probe trained"
            f" it so; the rules alone would keep torch's default (foreach): {why}",
        )
        return
    yield Finding(
        "optimizer.fused", False, rule, f"torch's default (foreach) implementation: {why}"
    )


def optimizer_memory_text(record: OptimizerMemoryRecord) -> str:
    """What the fused step's memory measured against foreach's, where memory limited the batch
    (``probe.optimizer_memory``)."""
    at = f"measured at batch {record.batch_size}, the largest that trained"
    fused = record.fused_peak_bytes
    if not record.foreach_fits:
        return f"{at}: torch's default (foreach) ran out of memory there, so fused decides it"
    foreach = record.foreach_peak_bytes
    if fused is None or foreach is None:
        return f"{at}: torch's default (foreach) trained it too (no peak was read)"
    more = foreach - fused
    text = (
        f"{at}: the fused step peaked at {fused / 2**30:.2f} GiB, foreach at {foreach / 2**30:.2f}"
    )
    if more > 0:
        return f"{text} ({more / 2**20:,.0f} MiB more)"
    return f"{text}: no more memory here"


def _rate(samples_per_s: float | None) -> str:
    return "?" if samples_per_s is None else f"{samples_per_s:,.0f} samples/s"


_HOW = {
    "fastest point": "the fastest steady batch measured here",
    "fastest unsteady point": "no throughput point was steady, so the size whose point ran"
    " fastest (a smaller one within 3% is kept), though the timings were noisy",
    "largest point": "no throughput point was steady, so the largest size a point measured, not"
    " the fastest",
    "top candidate": "no throughput point ran, so the top candidate itself",
}
_CONFIRMED = {
    "its point": "its throughput point ran after the search, with these settings",
    "ran again": "it ran once more, with these settings, before it was kept",
    "stepped down": "the candidate did not run when run again, and this smaller size did",
    "not run again": "it was not run a second time (it would not fit in the time budget left):"
    " it ran once, with these settings",
    "its fed pass": "it trained fed by the DataLoader, with these settings",
}


def batch_reason(size: int, choice: BatchChoice | None, compiles: bool | None = None) -> str:
    """Why the profile's batch is ``size``, from how the probe chose it (``choice``): what was
    measured, how the candidates were made, and whether it ran again; nothing it did not do.

    ``compiles``: whether the profile compiles. Where the batch ran otherwise (eager, in a
    profile whose rules keep torch.compile unmeasured), it is not said to have run "with these
    settings"."""
    if choice is None:
        return f"{size}: a batch the probe ran on this machine"
    how = _HOW[choice.chosen_by]
    if choice.chosen_by == "fastest point":
        how += f" ({_rate(choice.samples_per_s)}"
        if choice.best_batch_size not in (None, size):
            how += (
                f"; the best, {_rate(choice.best_samples_per_s)} at {choice.best_batch_size},"
                " is within 3%, so the smaller size is kept"
            )
        how += ", compiled)" if choice.compiled else ")"
    ran = f" {choice.variant}" if choice.variant != EAGER else ""  # its own search's
    top = f"the largest batch that trained{ran} was {choice.largest}"
    if choice.margin is not None:
        top += f", less a {choice.margin:.0%} margin against running out of memory later (K2)"
    if choice.memory_room is not None:  # the margin kept in memory, where that left more
        roomy, peak, limit = choice.memory_room
        top += (
            f" kept in memory: batch {roomy} peaked at {peak / 2**30:.1f} GiB of the"
            f" {limit / 2**30:.1f} GiB training could use, {1 - peak / limit:.0%} free"
        )
    if choice.multiple > 1:
        top += f", rounded down to a multiple of {choice.multiple} (K4)"
    if choice.top != choice.largest:
        top += f": {choice.top}"
    top += ", and halvings of it were the candidates"
    confirmed = _CONFIRMED[choice.confirmed]
    if compiles is not None and compiles != choice.compiled:
        confirmed = confirmed.replace("with these settings", except_compile(choice.compiled))
    return f"{size}: {how}; {top}; {confirmed}"


def except_compile(compiled: bool) -> str:
    """'with these settings', where the batch ran with all of them but torch.compile: eager in
    a profile whose rules keep compile unmeasured, or compiled in one that does not compile
    (the bench may drop compile after the batch ran compiled). The summary says it too."""
    if compiled:
        return "with these settings but compiled (this profile does not compile)"
    return (
        "with these settings but eager: this profile compiles, and torch.compile was not"
        " measured at this size"
    )


def _batch_size(ctx: Context) -> Finding:
    measured = ctx.measurements.batch_size if ctx.measurements is not None else None
    if measured is not None:
        assert ctx.measurements is not None
        return Finding(
            "batch.batch_size",
            measured,
            "K2",
            ctx.measurements.batch_reason  # the fed passes chose it: their numbers
            or batch_reason(
                measured, ctx.measurements.batch_choice, ctx.decided.get("compile.enabled")
            ),
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


def accumulation(batch: int, target: int, processes: int) -> tuple[int, str]:
    """(grad_accum_steps, why) that make up the global batch ``target`` from ``batch`` samples
    in each of ``processes`` training processes (L1): ceil(target / (batch x processes)), the
    global batch it makes, and whether the target had to be rounded up to whole batches."""
    steps = max(1, math.ceil(target / (batch * processes)))
    made = batch * steps * processes
    spread = f" x {processes} processes" if processes > 1 else ""
    text = f"{steps}: batch {batch} x {steps} steps{spread} = a global batch of {made}"
    if made == target:
        return steps, text + f", the target ({target})"
    return steps, text + (
        f"; the target {target} is not a whole number of batches of {batch * processes}, so it"
        " is rounded up"
    )


def _accumulation(ctx: Context) -> Finding:
    """L1: the steps that keep the target global batch (``--target-batch``) with the measured
    batch over the training processes of the job (every node's); 1 without a target or a
    batch, and where what would have made the target made one above ``MAX_GLOBAL_BATCH``
    (``target_global_batch_from`` without a target), which is not kept. Under DDP the first
    steps of each update run in ``model.no_sync()``."""
    target = ctx.preferences.target_global_batch
    batch = ctx.measurements.batch_size if ctx.measurements is not None else None
    given = ctx.preferences.target_global_batch_from
    whose = f"; the target is {given}, the global batch it trains, kept" if given else ""
    if target is not None and batch is not None:
        steps, why = accumulation(batch, target, ctx.topology.world_size)
        return Finding("batch.grad_accum_steps", steps, "L1", why + whose, Source.MEASURED)
    if target is not None:
        return Finding(
            "batch.grad_accum_steps",
            1,
            "L1",
            f"1: the target global batch {target} is made up from the batch size, which is "
            "only ever measured: run autotune to probe it; until then every step updates the "
            f"weights{whose}",
        )
    if given:  # what made a target above the most one may be (compose.workload_target)
        return Finding(
            "batch.grad_accum_steps",
            1,
            "L1",
            f"1: {given} is more than {MAX_GLOBAL_BATCH:,}, the most a target global batch may "
            "be, so it is not kept and every step updates the weights; a target of at most that "
            "(--target-batch, target_global_batch) is kept with accumulation",
        )
    return Finding(
        "batch.grad_accum_steps",
        1,
        "L1",
        "1: no target global batch is given, so every step updates the weights; with one, "
        "accumulation would be ceil(target / batch size)",
    )


def batch(ctx: Context) -> Iterator[Finding]:
    """K1-K2, L1, C4: the batch size (only measured), accumulation steps and the seed."""
    yield _batch_size(ctx)
    yield _accumulation(ctx)
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
