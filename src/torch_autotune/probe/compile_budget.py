"""Compile's activation memory budget measured against compile without it, where memory limits
the compiled batch (rule L2). No torch.

Where compile is kept, activation checkpointing is not what a memory-bound run tries next: a
checkpointed model costs a compile of its own, and checkpointing inside a compiled graph has
known hazards. Compile has its own lever: ``torch._functorch.config.activation_memory_budget``
(1.0, torch's default, saves what the runtime-optimal partition saves; 0.0 recomputes what it
can, as checkpointing the whole graph would), read when each graph is partitioned. At
``MEMORY_BUDGET`` the compiled graphs keep half of what they save, and recompute the cheapest
rest in backward (a knapsack over the flops of what they would recompute). It is a variant
(``probe.variants``) with a search of its own on the base's model, compiled again under the
budget (``apply.memory_budgeted``), judged against the fastest compiled point without it, and
kept only where faster beyond noise. It is measured under the conditions checkpointing is
(``checkpoint_phase.why_not_measured``: the compiled search stopped for memory and its fastest
point is its top candidate) and where the plan leaves the time for a second compile.
"""

from __future__ import annotations

from dataclasses import replace

from torch_autotune.errors import AutotuneError, said_in_one_line
from torch_autotune.evidence import BUDGETED
from torch_autotune.probe.budget import Budget
from torch_autotune.probe.checkpoint_phase import (
    RecomputeOutcome,
    measure_recomputing,
    why_not_measured,
)
from torch_autotune.probe.seam import Progress, Trials
from torch_autotune.probe.variant_phase import Bounds, VariantOutcome
from torch_autotune.probe.variants import Variant, compile_seconds
from torch_autotune.settings import Settings
from torch_autotune.thresholds import MEMORY_BUDGET_MIN_TORCH

__all__ = ["BUDGETED", "MEMORY_BUDGET", "budgeted", "measure_compile_budget"]


MEMORY_BUDGET = 0.5
"""The budget tried: torchtitan's default for its compiler-based activation checkpointing
(``MemoryBudgetAC``, ``memory_budget=0.5``)."""


def budgeted(mode: str, budget: float = MEMORY_BUDGET) -> Variant:
    """torch.compile in ``mode`` under an activation memory budget of ``budget``: the base's
    model compiled again (a backend of its own, so not the compiled variant's cached code),
    less memory a sample, a compile's one-off cost."""
    return Variant(
        BUDGETED,
        (("compile.enabled", True), ("compile.mode", mode), ("compile.memory_budget", budget)),
        changes_memory=True,
        warmup_s=compile_seconds,
        label=f"compile's memory budget of {budget:g}",
        paid_for="to compile again",
        warmup_noun="a second compile",
        phase="memory budget",
        costs_training=False,  # the probe compiles twice; training compiles once either way
    )


def measure_compile_budget(
    base: Trials,
    compiled: VariantOutcome,
    *,
    bounds: Bounds,
    budget: Budget,
    progress: Progress,
    workers_s: float,
    release: tuple[int, int] | None,
) -> RecomputeOutcome:
    """The memory budget against ``compiled``, the compile variant the run kept (its fastest
    point, search and candidates), on ``base``'s model (the eager runner's), within what the
    plan leaves after the workers (module docstring); ``release``: torch's (major, minor)."""
    settings = compiled.runner.settings.settings
    unfit = _unfit(settings, release)
    if unfit is not None or not settings.compile.mode:
        return RecomputeOutcome(note=f"not measured: {unfit or 'compile has no mode'}")
    variant = budgeted(settings.compile.mode)
    best, sizes, model = compiled.point, compiled.sizes, compiled.model
    unfit = why_not_measured(
        best, compiled.limited_by or "", sizes, "a memory budget", compiled.points
    )
    if unfit is not None or best is None or model is None:
        return RecomputeOutcome(note=f"not measured: {unfit or 'compile ran no search'}")
    try:
        measured = measure_recomputing(
            base,
            variant,
            best=best,
            sizes=sizes,
            model=model,
            bounds=bounds,
            budget=budget,
            progress=progress,
            workers_s=workers_s,
        )
    except AutotuneError:
        raise  # ours (a rank that failed, an interrupt): the run's to handle
    except Exception as error:  # the compiler under the budget, not the user's model
        compiled.runner.apply_flags()  # as the kept point trained (its search turned some off)
        return RecomputeOutcome(note=f"not kept: {_failed_compile(error)}")
    judged = measured.outcome.judgement if measured.outcome is not None else None
    if measured.note is not None or measured.outcome is None or judged is None:
        return measured
    reason = (
        f"{judged.reason.removeprefix(variant.label + ' ')}; the largest batch was "
        f"{measured.outcome.largest} with it and {compiled.largest} without"
    )
    return replace(measured, reason=reason)


def _unfit(settings: Settings, release: tuple[int, int] | None) -> str | None:
    """Why no budget is tried with ``settings`` on torch ``release``; None where it may be."""
    added = ".".join(map(str, MEMORY_BUDGET_MIN_TORCH))
    if release is None:
        return f"the torch version could not be read, and torch {added} added the budget"
    if release < MEMORY_BUDGET_MIN_TORCH:
        return f"this torch has no activation memory budget (torch {added} added it)"
    if settings.compile.memory_budget is not None:
        return f"the settings hold a budget already ({settings.compile.memory_budget:g})"
    if settings.activation_checkpointing:
        return (
            "the model's blocks are checkpointed already (it fits only so), and the budget "
            "would recompute inside what they recompute"
        )
    return None


def _failed_compile(error: Exception) -> str:
    """Why the budget is not kept where compiling under it raised: the model compiled without
    it, so the failure is the partitioner's (a prototype in torch), not the user's code."""
    return (
        f"compiling under it failed ({said_in_one_line(error)}); the model compiles without it,"
        " as the profile keeps it"
    )
