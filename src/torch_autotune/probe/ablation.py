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

if TYPE_CHECKING:
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
) -> ArmResults:
    """Train every arm of ``plan`` once per round, ``rounds`` rounds, each measurement at least
    ``seconds`` long after its warm-up; judge each setting (``bench.judge``) and, when some
    measured slower, run the profile without them against the baseline too (not where every
    setting was dropped: that is the baseline itself, ``final_is_baseline``). Every arm trains
    with the device held to ``memory_limit_bytes`` (the profile's ``--memory-limit``, as the
    probe was: ``probe.memory.memory_capped``), so that an arm that would not fit the smaller
    or shared GPU the profile is for fails here as it would there; on the CPU, where nothing
    raises, an arm that took more host RAM than it fails (``TrainingLoop``), as a search trial
    over it does not fit.

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
        runs = _Rounds(measure, seconds, report)
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
