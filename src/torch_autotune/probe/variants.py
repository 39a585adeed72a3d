"""The probe's variants: a change of the settings the probe trains with, measured against its
base. No torch.

The base (``EAGER``) is the rules-only profile's settings without torch.compile: the search
and the first throughput points run it. A variant is a change of those settings that the probe
measures against the base and keeps only where it is faster (``probe.judge``). Each declares
what the orchestration needs to measure it, so that the next one (activation checkpointing,
the allocator) is a declaration, not a copy of the code that measures compile:

- ``changes``: the settings it changes, by dotted path (``Settings``' leaves);
- ``fresh_model``: it needs a model of its own, built from the workload (False: it wraps the
  base's model, as torch.compile does, and shares its weights);
- ``changes_memory``: it changes how much memory a batch needs, so it gets a search of its own,
  on its own memory curve and its own time model (``probe.variant_phase``); a variant that
  does not is measured at the base's candidate sizes;
- ``warmup_s(leaf_modules)``: its one-off cost, predicted before it ran, which the plan
  weighs against the time left (``probe.plan``), with ``builds`` models built from the
  workload, each as long as the base's build took (the seam's ``built_s``);
- the words its judgement is written with.

The records of every trial and point name the variant they ran with (``SearchTrialRecord``,
``ThroughputRecord``, ``FedRecord``: ``variant``), and the evidence keeps the settings that
change memory as each variant ran them (``VariantRecord``), so the invariant accepts the
profile's batch only where it ran with the profile's (``invariants.batch_problems``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch_autotune.evidence import COMPILED, EAGER, VariantRecord
from torch_autotune.knobs import settings_with
from torch_autotune.settings import Settings, memory_settings

__all__ = [
    "BASE",
    "COMPILE_MIN_S",
    "COMPILE_S_PER_MODULE",
    "Variant",
    "compile_seconds",
    "compiled",
    "search_name",
    "search_settings",
    "variant_record",
]

COMPILE_S_PER_MODULE = 0.6  # H100, 16 CPUs: ResNet-50 (137 leaf modules) 80 s, GPT-2 (76) 30 s
COMPILE_MIN_S = 15.0


def compile_seconds(leaf_modules: int) -> float:
    """The compile time to expect before any was measured (H100 figures above)."""
    return max(COMPILE_MIN_S, COMPILE_S_PER_MODULE * leaf_modules)


def _no_warmup(_leaf_modules: int) -> float:
    return 0.0


@dataclass(frozen=True)
class Variant:
    """A change of the probe's settings (module docstring).

    ``name`` is what its records say ("compiled"); ``label`` names the setting in its
    judgement ("compile measured faster", "compile off"); ``paid_for`` and ``warmup_noun`` name
    its one-off cost ("53 s to compile", "eager training avoids the compile time"), which
    ``costs_training`` says training pays too (compile's memory budget: not, training compiles
    once with it or without); ``phase`` is the probe's phase that measures it.
    """

    name: str
    changes: tuple[tuple[str, str | int | float | bool | None], ...] = ()
    fresh_model: bool = False
    changes_memory: bool = False
    warmup_s: Callable[[int], float] = _no_warmup
    label: str = ""
    paid_for: str = "to warm up"
    warmup_noun: str = "the warm-up"
    phase: str = "variant"
    costs_training: bool = True  # training pays its one-off cost too (False: only the probe)
    builds: int = 0  # models it builds from the workload, each as long as the base's took

    def settings(self, base: Settings) -> Settings:
        """``base`` with this variant's changes."""
        for path, value in self.changes:
            base = settings_with(base, path, value)
        return base


BASE = Variant(
    EAGER,
    (("compile.enabled", False), ("compile.mode", None)),
    label="eager",
    phase="throughput",
)
"""The probe's base: the rules-only profile's settings, eager."""


def compiled(mode: str) -> Variant:
    """torch.compile in ``mode``: it wraps the base's model (the batch dimension marked
    dynamic, so it compiles once for every size), changes memory (on an H100 a compiled
    ResNet-50 reserved 74.1 GiB at batch 1536, eager 68.5), and costs a compile first."""
    return Variant(
        COMPILED,
        (("compile.enabled", True), ("compile.mode", mode)),
        fresh_model=False,
        changes_memory=True,
        warmup_s=compile_seconds,
        label="compile",
        paid_for="to compile",
        warmup_noun="the compile time",
        phase="compile",
    )


def search_name(variant: Variant, settings: Settings) -> str:
    """The name the search's records give ``variant``, whose settings are ``settings``: the
    search runs without the cuDNN autotuner (its warm-up per new shape would cost a minute over
    a search), so where the settings turn it on, the search ran another variant and says so."""
    if settings.backends.cudnn_benchmark:
        return f"{variant.name}, cuDNN autotuner off"
    return variant.name


def search_settings(settings: Settings) -> Settings:
    """The settings a search ran with: ``settings`` without the cuDNN autotuner."""
    backends = settings.backends.model_copy(update={"cudnn_benchmark": False})
    return settings.model_copy(update={"backends": backends})


def variant_record(name: str, settings: Settings) -> VariantRecord:
    """The evidence's record of a variant that ran with ``settings``."""
    return VariantRecord(name=name, settings=memory_settings(settings))
