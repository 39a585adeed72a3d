"""``autotune bench``: the baseline, the profile, and each setting on alone and off alone, in
interleaved rounds on this machine; then the profile without what measured slower.

Which arms, what the numbers mean and what is dropped is decided in ``torch_autotune.bench``
(pure); this module runs the arms. ``measure`` is the seam: by default a real
``TrainingLoop``, in tests any function of (config, seconds) that returns samples/s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from torch_autotune.bench import (
    NOT_ABLATED,
    ArmFailed,
    ArmRecord,
    BenchEvidence,
    TrainConfig,
    apply_bench,
    effect,
    final_config,
    judge,
    plan_arms,
    round_order,
    tuned_config,
)
from torch_autotune.bounds import MAX_ROUNDS
from torch_autotune.errors import ProbeError

if TYPE_CHECKING:
    from torch_autotune.probe.workloads import Workload
    from torch_autotune.profile import Profile

DEFAULT_ROUNDS = 5
DEFAULT_SECONDS = 2.0

Measure = Callable[[TrainConfig, float], float]
"""(config, seconds) -> samples/s; raises ``ArmFailed`` when the arm cannot be measured."""
Progress = Callable[[str, str], None]


def _loader_free(config: TrainConfig, baseline: TrainConfig) -> TrainConfig:
    """``config`` with the baseline's DataLoader settings (a workload without a dataset)."""
    fields = ("num_workers", "prefetch_factor", "pin_memory")
    return config.model_copy(update={f: getattr(baseline, f) for f in fields})


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
    ) -> list[ArmRecord]:
        return [
            ArmRecord(
                names=names[i],
                config=config,
                samples_per_s=tuple(row[i] for row in rows),
                error=self.errors.get(config),
            )
            for i, config in enumerate(configs)
        ]


def bench(
    profile: Profile | None = None,
    workload: str | Workload | None = None,
    *,
    baseline: TrainConfig | None = None,
    rounds: int = DEFAULT_ROUNDS,
    seconds: float = DEFAULT_SECONDS,
    budget_s: float | None = None,
    progress: Progress | None = None,
    measure: Measure | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Profile:
    """Measure the profile against the baseline on this machine; return the profile with the
    bench in its evidence and the settings that measured slower dropped.

    ``profile``: a measured profile (from ``tune()``); None tunes the workload first, in
    ``budget_s`` seconds (None: ``tune()``'s default budget).
    ``workload``: default the one the profile was measured on. ``baseline``: default fp32,
    batch 32, no workers, no pinning, eager, torch's default backends. Every arm runs once per
    round, ``rounds`` rounds, each measurement at least ``seconds`` long after its warm-up.
    """
    from torch_autotune.probe.run import tune
    from torch_autotune.probe.trials import preserved
    from torch_autotune.probe.workloads import resolve_workload

    if not 1 <= rounds <= MAX_ROUNDS or not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(
            f"rounds must be in [1, {MAX_ROUNDS}] and seconds finite and > 0, got {rounds} "
            f"and {seconds}"
        )
    report = progress or (lambda _phase, _what: None)
    started = clock()
    if profile is None:
        profile = tune(workload, budget_s=budget_s, progress=progress, clock=clock)
    if profile.evidence is None:
        raise ProbeError(
            "this profile was not measured (rules only): the bench needs the batch size the "
            "probe ran; run 'autotune' first"
        )
    chosen = resolve_workload(workload if workload is not None else profile.evidence.workload)
    base = baseline or TrainConfig()
    tuned = tuned_config(profile, base)
    not_ablated = list(NOT_ABLATED)
    if chosen.dataset is None:
        tuned = _loader_free(tuned, base)
        not_ablated.append(
            f"DataLoader settings: the {chosen.name} workload has no dataset to load from"
        )
    plan = plan_arms(base, tuned)
    labels = [", ".join(names) for names in plan.names]
    with preserved():
        if measure is None:
            from torch_autotune.probe.loop import TrainingLoop

            loop = TrainingLoop(
                chosen, profile.settings.device, settings=profile.settings, clock=clock
            )
            measure = loop.measure
        runs = _Rounds(measure, seconds, report)
        rows = runs.run(plan.configs, labels, rounds)
        tuned_effect, settings = judge(plan, rows, mode=profile.mode.value)
        records = runs.records(plan.configs, plan.names, rows)
        final = final_config(plan, settings)
        final_effect = None
        if final != plan.tuned:
            baseline_at = plan.index(plan.baseline)
            if final in plan.configs:
                at = plan.index(final)
                final_effect = effect([r[at] for r in rows], [r[baseline_at] for r in rows])
            else:  # the profile without its dropped settings has not run yet: run it
                configs = (plan.baseline, final)
                names = (("baseline (second run)",), ("final",))
                more = runs.run(configs, ["baseline", "without the dropped settings"], rounds)
                final_effect = effect([r[1] for r in more], [r[0] for r in more])
                records += runs.records(configs, names, more)
    overall = final_effect or tuned_effect
    evidence = BenchEvidence(
        workload=chosen.name,
        device=profile.settings.device,
        rounds=rounds,
        seconds_per_measurement=seconds,
        arms=tuple(records),
        tuned=tuned_effect,
        settings=tuple(settings),
        final=final_effect,
        reverted=overall is not None and overall.verdict == "slower",
        not_ablated=tuple(not_ablated),
        elapsed_s=round(max(0.0, clock() - started), 3),
    )
    return apply_bench(profile, plan, evidence)
