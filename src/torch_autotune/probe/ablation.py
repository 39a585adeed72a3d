"""The bench's runner: the baseline, the profile, and each setting on alone and off alone, in
interleaved rounds on this machine; then the profile without what measured slower.

Which arms, what the numbers mean and what is dropped is decided in ``torch_autotune.bench``
(pure); ``torch_autotune.api.bench()`` plans the arms and builds the benched profile; this
module only runs the arms. ``measure`` is the seam: by default a real
``TrainingLoop``, in tests any function of (config, seconds) that returns samples/s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch_autotune.bench import (
    ArmFailed,
    ArmRecord,
    Effect,
    Plan,
    SettingEffect,
    TrainConfig,
    arm_record,
    effect,
    final_config,
    judge,
    round_order,
)
from torch_autotune.knobs import train_settings

if TYPE_CHECKING:
    from torch_autotune.evidence import Evidence
    from torch_autotune.probe.seam import Progress
    from torch_autotune.probe.workloads import Workload
    from torch_autotune.settings import Settings

DEFAULT_ROUNDS = 5
DEFAULT_SECONDS = 2.0

Measure = Callable[[TrainConfig, float], float]
"""(config, seconds) -> samples/s; raises ``ArmFailed`` when the arm cannot be measured."""


class _Rounds:
    """Runs configs in interleaved, rotated rounds and keeps the first error of each."""

    def __init__(self, measure: Measure, seconds: float, progress: Progress) -> None:
        self.measure = measure
        self.seconds = seconds
        self.progress = progress
        self.errors: dict[TrainConfig, str] = {}

    def run(
        self, configs: tuple[TrainConfig, ...], labels: list[str], rounds: int
    ) -> list[list[float | None]]:
        """``rows[r][i]``: samples/s of ``configs[i]`` in round ``r`` (None: it failed)."""
        rows: list[list[float | None]] = []
        for r in range(rounds):
            row: list[float | None] = [None] * len(configs)
            for i in round_order(len(configs), r):
                self.progress("bench", f"round {r + 1}/{rounds}: {labels[i]}")
                try:
                    row[i] = self.measure(configs[i], self.seconds)
                except ArmFailed as failure:
                    self.errors.setdefault(configs[i], str(failure))
            rows.append(row)
        return rows

    def records(
        self,
        configs: tuple[TrainConfig, ...],
        names: tuple[tuple[str, ...], ...],
        rows: list[list[float | None]],
        settings: Settings,
    ) -> list[ArmRecord]:
        """Each config's record, with the settings that change memory as it ran them (the
        profile's ``settings`` under the config)."""
        return [
            arm_record(names[i], config, tuple(row[i] for row in rows), settings).model_copy(
                update={"error": self.errors.get(config)}
            )
            for i, config in enumerate(configs)
        ]


@dataclass(frozen=True)
class ArmResults:
    """What the rounds measured: every arm's record, the profile's effect over the baseline,
    each setting's effects, and the effect of the profile without the settings that measured
    slower (None: nothing was dropped, or every setting was). ``final_is_baseline``: every
    setting was dropped, so what is left is the baseline's own config, and no arm compared it
    with itself."""

    records: tuple[ArmRecord, ...]
    tuned: Effect | None
    settings: tuple[SettingEffect, ...]
    final: Effect | None
    final_is_baseline: bool = False


def run_arms(
    plan: Plan,
    workload: Workload,
    settings: Settings,
    *,
    mode: str,
    rounds: int = DEFAULT_ROUNDS,
    seconds: float = DEFAULT_SECONDS,
    progress: Progress | None = None,
    measure: Measure | None = None,
    clock: Callable[[], float] = time.perf_counter,
    memory_limit_bytes: int | None = None,
    evidence: Evidence | None = None,
) -> ArmResults:
    """Train every arm of ``plan`` once per round, ``rounds`` rounds, each measurement at least
    ``seconds`` long after its warm-up; judge each setting (``bench.judge``) and, when some
    measured slower, run the profile without them against the baseline too (not where every
    setting was dropped: that is the baseline itself, ``final_is_baseline``). Every arm trains
    with the device held to ``memory_limit_bytes`` (the profile's ``--memory-limit``, as the
    probe was: ``probe.memory.memory_capped``), so that an arm that would not fit the smaller
    or shared GPU the profile is for fails here as it would there; on the CPU, where nothing
    raises, an arm that took more host RAM than it fails (``TrainingLoop``), as a search trial
    over it does not fit; an arm the profile's ``evidence`` predicts over it is not run
    (``predicted_over``), and fails with the prediction as its reason.

    ``measure`` is the seam: by default a real ``TrainingLoop`` over ``workload`` on the
    device of ``settings`` (the profile's), each arm trained with its config applied to them.
    The user's RNG and torch's global flags are as before when this returns.
    """
    from torch_autotune.probe import memory
    from torch_autotune.probe.oom import long_lived_objects_frozen
    from torch_autotune.probe.state import preserved
    from torch_autotune.probe.workloads.copies import parked

    report = progress or (lambda _phase, _what: None)
    labels = [", ".join(names) for names in plan.names]
    capped = memory.memory_capped(settings.device, memory_limit_bytes)
    with preserved(), long_lived_objects_frozen(), parked(workload.make_model), capped:
        if measure is None:
            from torch_autotune.probe.loop import TrainingLoop

            loop = TrainingLoop(
                workload,
                settings.device,
                settings=settings,
                clock=clock,
                memory_limit_bytes=memory_limit_bytes,
            )
            measure = loop.measure
        refused = predicted_over(plan.configs, settings, evidence, memory_limit_bytes)
        runs = _Rounds(_refusing(measure, refused), seconds, report)
        rows = runs.run(plan.configs, labels, rounds)
        tuned_effect, effects = judge(plan, rows, mode=mode)
        records = runs.records(plan.configs, plan.names, rows, settings)
        final = final_config(plan, effects)
        final_effect = None
        is_baseline = final == plan.baseline != plan.tuned  # every setting dropped
        if final != plan.tuned and not is_baseline:
            baseline_at = plan.index(plan.baseline)
            if final in plan.configs:
                at = plan.index(final)
                final_effect = effect([r[at] for r in rows], [r[baseline_at] for r in rows])
            else:  # the profile without its dropped settings has not run yet: run it
                configs = (plan.baseline, final)
                names = (("baseline (second run)",), ("final",))
                more = runs.run(configs, ["baseline", "without the dropped settings"], rounds)
                final_effect = effect([r[1] for r in more], [r[0] for r in more])
                records += runs.records(configs, names, more, settings)
    return ArmResults(tuple(records), tuned_effect, tuple(effects), final_effect, is_baseline)


def _refusing(measure: Measure, refused: dict[TrainConfig, str]) -> Measure:
    """``measure``, but an arm in ``refused`` fails with its reason and is not run."""

    def run(config: TrainConfig, seconds: float) -> float:
        if config in refused:
            raise ArmFailed(refused[config])
        return measure(config, seconds)

    return run


def predicted_over(
    configs: tuple[TrainConfig, ...], settings: Settings, evidence: Evidence | None, cap: int | None
) -> dict[TrainConfig, str]:
    """The CPU's, under --memory-limit: each arm whose batch the search's peaks predict to take
    more host RAM than ``cap`` beyond what the process held (the search's baseline: the
    evidence's memory limit less the cap, ``search_phase``), and why. From the trials that
    ran (fit, or went over the cap) with the arm's settings that change memory; an arm with
    activation checkpointing off, from the trials with it on where none ran without: a
    lower bound. No arm at or below a batch that fit with its settings is refused."""
    from torch_autotune.probe.guard import apart
    from torch_autotune.settings import memory_settings

    if cap is None or evidence is None or evidence.memory_limit_bytes is None:
        return {}
    held = evidence.memory_limit_bytes - cap
    if settings.device != "cpu" or held <= 0:
        return {}
    refused: dict[TrainConfig, str] = {}
    for config in configs:
        memory = memory_settings(train_settings(config, settings))
        bound, points = "", _points(evidence, memory, held)
        if not points and memory.get("activation_checkpointing") == "off":
            recomputed = {**memory, "activation_checkpointing": "on"}
            bound, points = "at least ", _points(evidence, recomputed, held)
        fit = [b for b, grown, fits in points if fits]
        if not points or (fit and config.batch_size <= max(fit)):
            continue
        if any(grown > cap for _b, grown, fits in points if fits):
            continue  # the baseline read from the evidence is not the search's: no prediction
        growth = _grown_at([(b, grown) for b, grown, _fits in points], config.batch_size)
        if growth > cap:
            said, allowed = apart(int(growth), cap)
            sizes = " and ".join(map(str, sorted({b for b, _grown, _fits in points})[-2:]))
            refused[config] = (
                f"not run: predicted to take {bound}{said} of host RAM beyond what the process"
                f" holds at batch {config.batch_size} (from the search's peaks at batch {sizes}),"
                f" more than the {allowed} the memory limit allows (--memory-limit,"
                " memory_limit_gib)"
            )
    return refused


def _points(evidence: Evidence, memory: dict[str, str], held: int) -> list[tuple[int, int, bool]]:
    """(batch, growth beyond ``held``, whether it fit) of each search trial that ran to a peak
    (it fit, or went over the cap) with the settings ``memory``, by batch."""
    from torch_autotune.probe.guard import OVER_CAP

    variants = {v.name: v.settings for v in evidence.variants}
    return sorted(
        (t.batch_size, t.peak_memory_bytes - held, t.fits)
        for t in evidence.search
        if t.peak_memory_bytes is not None
        and (t.fits or t.step == OVER_CAP)
        and variants.get(t.variant) == memory
    )


def _grown_at(points: list[tuple[int, int]], batch_size: int) -> float:
    """Growth at ``batch_size`` by the secant through the two largest of ``points`` (batch,
    bytes), never falling with the batch; from one point, in proportion to the batch."""
    most: dict[int, int] = {}
    for b, grown in points:  # a batch that ran twice: its larger growth
        most[b] = max(grown, most.get(b, grown))
    if len(most) == 1:
        [(b, grown)] = most.items()
        return grown * batch_size / b
    (b1, m1), (b2, m2) = sorted(most.items())[-2:]
    return m2 + max(0.0, (m2 - m1) / (b2 - b1)) * (batch_size - b2)
