"""Baseline against tuned, and every setting on alone and off alone: the arms, the statistics,
and the profile without the settings that measured slower.

Pure: no torch, no hardware. ``probe.ablation`` runs the arms; this module says which arms to
run, what the interleaved rounds mean, and what to take out of the profile.

**The arms.** A ``TrainConfig`` is how one arm trains: the speed settings of a profile and
nothing else. The baseline is fp32, batch 32, no workers, no pinning, eager, torch's default
backends (or the user's own baseline). A setting is ablated when the tuned profile and the
baseline disagree on it: "on alone" is the baseline with only that setting taken from the
profile, "off alone" is the profile with only that setting taken from the baseline. Arms that
come out identical (with one setting, "on alone" is the profile itself) are run once.

**Faster, slower, or noise.** Every round measures every arm once, in a rotated order, so a
drift of the machine (a warming GPU, another job starting) lands on all arms alike. An effect is
the ratio of throughputs within each round; the speedup is the median ratio and the range is
the lowest and the highest. An effect counts only when every round agrees on its direction and
the median moves by more than ``MIN_EFFECT``: a fixed "3% better" margin is smaller than timing
noise (a no-op setting has been measured anywhere from 0.84x to 1.11x, see
shared/reference/anchors.md), an effect that all rounds agree on is not.

**Never slower.** A setting whose "off alone" arm is faster than the profile beyond noise is
dropped: it goes back to the baseline's value with the measurement as its reason (rule ``M1``).
Settings a mode needs for correctness (TF32 off and no cuDNN autotuner in reproducible mode)
are reported but never dropped. If the profile, after drops, is still slower than the baseline
beyond noise, every ablated setting goes back to the baseline (rule ``M2``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from torch_autotune.bench_record import (
    BASELINE_BATCH_SIZE,
    ArmRecord,
    BenchEvidence,
    CompileMode,
    Dtype,
    Effect,
    Outcome,
    SettingEffect,
    TrainConfig,
    Verdict,
)
from torch_autotune.evidence import Evidence
from torch_autotune.knobs import (
    KNOB_BY_NAME,
    KNOBS,
    Knob,
    couples,
    goes_with_parent,
    knob_value,
    settings_config,
    show_value,
    switched_off,
    switched_on,
    train_settings,
    with_knob,
)
from torch_autotune.profile import Decision, Profile
from torch_autotune.settings import Settings, Source, memory_settings, setting_value

__all__ = [
    "BASELINE_BATCH_SIZE",
    "KNOBS",
    "MIN_EFFECT",
    "MIN_ROUNDS",
    "ArmFailed",
    "ArmRecord",
    "BenchEvidence",
    "CompileMode",
    "Dtype",
    "Effect",
    "Knob",
    "Outcome",
    "Plan",
    "SettingEffect",
    "TrainConfig",
    "Verdict",
    "ablated_knobs",
    "apply_bench",
    "arm_record",
    "effect",
    "final_config",
    "judge",
    "knob_value",
    "plan_arms",
    "round_order",
    "show_value",
    "train_settings",
    "tuned_config",
    "with_knob",
]

MIN_EFFECT = 0.02
"""Smallest change of the median ratio that counts as faster or slower (2%)."""

MIN_ROUNDS = 3
"""Fewer rounds than this cannot tell an effect from noise."""


class ArmFailed(Exception):
    """One arm could not be measured (out of memory, a DataLoader worker died): the arm has no
    number for that round, the others go on."""


def tuned_config(profile: Profile, baseline: TrainConfig | None = None) -> TrainConfig:
    """The TrainConfig a profile trains with (``knobs.settings_config`` of its settings)."""
    return settings_config(profile.settings, baseline)


def ablated_knobs(baseline: TrainConfig, tuned: TrainConfig) -> list[Knob]:
    """The settings on which the profile and the baseline disagree."""
    return [k for k in KNOBS if knob_value(baseline, k) != knob_value(tuned, k)]


# --- the arms -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The arms of one bench: each distinct config once, with every name it goes by.

    ``off_batch``: settings whose "off alone" arm brings back the batch that ran without them
    (activation checkpointing: the profile's batch may not fit without it), by knob name; a
    drop takes that batch too. ``required``: settings that cannot be switched off here, by knob
    name, with why (nothing trained without them): no "off alone" arm, kept."""

    baseline: TrainConfig
    tuned: TrainConfig
    knobs: tuple[Knob, ...]
    configs: tuple[TrainConfig, ...]
    names: tuple[tuple[str, ...], ...]  # names[i]: the arms configs[i] stands for
    off_batch: Mapping[str, int] = field(default_factory=dict)
    required: Mapping[str, str] = field(default_factory=dict)

    def index(self, config: TrainConfig) -> int:
        return self.configs.index(config)

    def on_alone(self, knob: Knob) -> TrainConfig:
        return switched_on(self.baseline, knob, self.tuned)

    def off_alone(self, knob: Knob) -> TrainConfig:
        return off_arm(self.tuned, knob, self.baseline, self.off_batch)


def off_arm(
    config: TrainConfig, knob: Knob, baseline: TrainConfig, off_batch: Mapping[str, int]
) -> TrainConfig:
    """``config`` with ``knob`` as the baseline has it (``knobs.switched_off``), at the batch
    that ran without it where ``off_batch`` names one."""
    off = switched_off(config, knob, baseline)
    if knob.name in off_batch:
        off = off.model_copy(update={"batch_size": off_batch[knob.name]})
    return off


def plan_arms(
    baseline: TrainConfig,
    tuned: TrainConfig,
    *,
    off_batch: Mapping[str, int] | None = None,
    required: Mapping[str, str] | None = None,
) -> Plan:
    """Baseline, tuned, and each ablated setting on alone and off alone (not for a setting
    ``required`` names), duplicates merged (``Plan``)."""
    off_batch, required = dict(off_batch or {}), dict(required or {})
    knobs = tuple(ablated_knobs(baseline, tuned))
    named: list[tuple[str, TrainConfig]] = [("baseline", baseline), ("tuned", tuned)]
    for knob in knobs:
        named.append((f"baseline + {knob.name}", switched_on(baseline, knob, tuned)))
        if knob.name not in required:
            named.append((f"tuned - {knob.name}", off_arm(tuned, knob, baseline, off_batch)))
    configs: list[TrainConfig] = []
    names: list[list[str]] = []
    for name, config in named:
        if config in configs:
            names[configs.index(config)].append(name)
        else:
            configs.append(config)
            names.append([name])
    return Plan(
        baseline,
        tuned,
        knobs,
        tuple(configs),
        tuple(tuple(n) for n in names),
        off_batch,
        required,
    )


def round_order(arms: int, round_index: int) -> list[int]:
    """The order of the arms in one round: rotated by one each round, so that no arm always
    runs first (after a pause) or right after the slowest one."""
    return [(round_index + i) % arms for i in range(arms)]


# --- statistics ---------------------------------------------------------------------------------


def effect(with_setting: Sequence[float | None], without: Sequence[float | None]) -> Effect | None:
    """The effect of a change from paired throughputs (samples/s, one per round; None: that
    measurement failed). None when no round has both."""
    ratios = [
        a / b
        for a, b in zip(with_setting, without, strict=True)
        if a is not None and b is not None and a > 0 and b > 0
    ]
    if not ratios:
        return None
    median = statistics.median(ratios)
    low, high = min(ratios), max(ratios)
    verdict: Verdict
    if len(ratios) < MIN_ROUNDS:
        verdict = "too few rounds"
    elif high < 1 and median < 1 - MIN_EFFECT:
        verdict = "slower"
    elif low > 1 and median > 1 + MIN_EFFECT:
        verdict = "faster"
    else:
        verdict = "within noise"
    return Effect(speedup=median, low=low, high=high, rounds=len(ratios), verdict=verdict)


def _throughputs(
    plan: Plan, rounds: Sequence[Sequence[float | None]], config: TrainConfig
) -> list[float | None]:
    i = plan.index(config)
    return [row[i] for row in rounds]


REQUIRED_BY_MODE = {
    "reproducible": {
        "tf32": "the reproducible mode needs TF32 off for bit-identical float32 results",
        "cudnn_benchmark": "the reproducible mode forbids the autotuner: it picks kernels by "
        "timing, so two runs can differ",
    }
}


def judge(
    plan: Plan,
    rounds: Sequence[Sequence[float | None]],
    *,
    mode: str = "speed",
) -> tuple[Effect | None, list[SettingEffect]]:
    """The profile against the baseline, and each setting's effect and outcome.

    ``rounds[r][i]``: samples/s of ``plan.configs[i]`` in round ``r`` (None: failed).
    """
    tuned = effect(
        _throughputs(plan, rounds, plan.tuned), _throughputs(plan, rounds, plan.baseline)
    )
    required = {**REQUIRED_BY_MODE.get(mode, {}), **plan.required}
    results = []
    for knob in plan.knobs:
        on = effect(
            _throughputs(plan, rounds, plan.on_alone(knob)),
            _throughputs(plan, rounds, plan.baseline),
        )
        off = None
        if knob.name not in plan.required:  # no arm: it cannot be off here
            off = effect(
                _throughputs(plan, rounds, plan.tuned),
                _throughputs(plan, rounds, plan.off_alone(knob)),
            )
        outcome: Outcome = "kept"
        if knob.name in required:
            outcome, reason = "kept (required)", required[knob.name]
        elif off is None:
            reason = "not measured: an arm failed in every round; kept as the rules set it"
        elif off.verdict == "slower":
            outcome = "dropped"
            reason = (
                f"measured slower on this machine: the profile trains at {off.speedup:.2f}x "
                f"the speed of the same profile without it (range {off.low:.2f}-{off.high:.2f} "
                f"over {off.rounds} interleaved rounds)"
            )
        elif off.verdict == "faster":
            reason = f"measured faster: {off.describe()}"
        else:
            reason = f"no measurable effect here ({off.describe()}); kept as the rules set it"
        results.append(
            SettingEffect(
                setting=knob.name,
                baseline_value=show_value(plan.baseline, knob),
                tuned_value=show_value(plan.tuned, knob),
                on_alone=on,
                off_alone=off,
                outcome=outcome,
                reason=reason,
            )
        )
    return tuned, results


def final_config(plan: Plan, settings: Sequence[SettingEffect]) -> TrainConfig:
    """The profile's config with every dropped setting back at the baseline's value, and
    what goes back with it (``couples``: channels_last with AMP), as ``apply_bench`` drops
    them: the config the final arm runs is the profile the bench hands out."""
    config = plan.tuned
    dropped = {s.setting for s in settings if s.outcome == "dropped"}
    for knob in plan.knobs:
        if knob.name in dropped and not goes_with_parent(knob, dropped):
            config = off_arm(config, knob, plan.baseline, plan.off_batch)
            for coupled, _why in couples(knob):
                config = with_knob(config, coupled, plan.baseline)
    return config


def arm_record(
    names: tuple[str, ...],
    config: TrainConfig,
    samples_per_s: tuple[float | None, ...],
    settings: Settings,
) -> ArmRecord:
    """One arm's record: the profile's ``settings`` under ``config`` give the settings that
    change memory as it ran them (``ArmRecord.memory``)."""
    memory = memory_settings(train_settings(config, settings))
    return ArmRecord(names=names, config=config, samples_per_s=samples_per_s, memory=memory)


# --- taking settings out of the profile: rules M1 and M2 -----------------------------------------


@dataclass(frozen=True)
class _Draft:
    """The profile's settings and decisions while the drops are made, one at a time."""

    settings: Settings
    decisions: tuple[Decision, ...]


def apply_bench(profile: Profile, plan: Plan, bench: BenchEvidence) -> Profile:
    """The profile with the bench's evidence, and every dropped setting back at the baseline's
    value with its measurement as the reason.

    A drop the profile cannot hold (a baseline value invalid on this machine, such as a user's
    bf16 baseline on a V100) is not made; the decision says so. The settings a dropped one is
    coupled with go back with it (its record's ``couples``: channels_last with AMP, rule H1).
    """
    if profile.evidence is None:
        raise ValueError("the bench needs a measured profile (evidence from the probe)")
    reverted = bench.reverted
    drops = [
        s
        for s in bench.settings
        if s.outcome == "dropped" or (reverted and s.outcome != "kept (required)")
    ]
    evidence = profile.evidence.model_copy(update={"bench": bench})
    # A draft between two drops is a state no arm ran: it is checked for what the machine can
    # hold, not for a batch that ran with its settings; the profile after every drop is the
    # final arm's config (``final_config``), and is checked for both.
    arms = tuple(arm.model_copy(update={"memory": {}}) for arm in bench.arms)
    between = evidence.model_copy(
        update={"variants": (), "bench": bench.model_copy(update={"arms": arms})}
    )
    draft = _Draft(profile.settings, profile.decisions)
    for drop in drops:
        rule, reason = ("M2", _reverted_text(bench)) if reverted else ("M1", drop.reason)
        knob = KNOB_BY_NAME[drop.setting]
        if goes_with_parent(knob, {d.setting for d in drops}):
            continue  # back already, with its parent (couples), at the parent's batch
        candidate = _with_drop(draft, knob, plan.baseline, rule, reason)
        if knob.name in plan.off_batch and not reverted:  # the batch that ran without it
            batch = KNOB_BY_NAME["batch_size"]
            why = f"{knob.name} was dropped, and this batch ran without it: {drop.reason}"
            candidate = _with_drop(candidate, batch, plan.off_alone(knob), rule, why)
        for coupled, why in couples(knob):
            now = settings_config(candidate.settings, plan.baseline)
            if knob_value(now, coupled) == knob_value(plan.baseline, coupled):
                continue  # already as the baseline has it: nothing goes back
            reason_ = f"{why}, and {knob.name} was dropped: {drop.reason}"
            candidate = _with_drop(candidate, coupled, plan.baseline, "M1", reason_)
        try:
            _profile(profile, candidate, between)
        except ValidationError as error:
            problem = error.errors()[0]["msg"].removeprefix("Value error, ")
            note = _note_not_dropped(profile, drop, problem)
            draft = _Draft(draft.settings, (*draft.decisions, note))
            continue
        draft = candidate
    return _profile(profile, draft, evidence)


def _profile(profile: Profile, draft: _Draft, evidence: Evidence) -> Profile:
    """``profile`` with the draft's settings and decisions, validated (every invariant)."""
    measured = profile.measured or any(d.source is Source.MEASURED for d in draft.decisions)
    data = profile.model_dump(mode="python")
    data.update(
        settings=draft.settings.model_dump(mode="python"),
        decisions=[d.model_dump(mode="python") for d in draft.decisions],
        evidence=evidence.model_dump(mode="python"),
        measured=measured,
    )
    return type(profile).model_validate(data)


def _with_drop(draft: _Draft, knob: Knob, baseline: TrainConfig, rule: str, reason: str) -> _Draft:
    """The draft with ``knob`` at the baseline's value and one decision for each setting that
    holds it, naming the decision it overrides when the value changed."""
    settings = knob.put(draft.settings, baseline)
    decisions = list(draft.decisions)
    for path in knob.paths(baseline):
        value = setting_value(settings, path)
        earlier = next((d for d in reversed(decisions) if d.setting == path), None)
        text = reason
        if earlier is not None and earlier.value != value:
            text += f" (overrides {earlier.rule}: {earlier.value!r})"
        decisions.append(
            Decision(setting=path, value=value, rule=rule, reason=text, source=Source.MEASURED)
        )
    return _Draft(settings, tuple(decisions))


def _reverted_text(bench: BenchEvidence) -> str:
    return (
        "the tuned profile measured slower than the baseline as a whole: "
        f"{_final_text(bench)}; so every setting the bench switched is back at the "
        "baseline's value"
    )


def _final_text(bench: BenchEvidence) -> str:
    measured = bench.final or bench.tuned
    if measured is None:
        return "not measured"
    return (
        f"{measured.speedup:.2f}x the baseline's speed (range {measured.low:.2f}-"
        f"{measured.high:.2f} over {measured.rounds} interleaved rounds)"
    )


def _note_not_dropped(profile: Profile, drop: SettingEffect, problem: str) -> Decision:
    path = KNOB_BY_NAME[drop.setting].paths(TrainConfig())[0]
    current = profile.decision(path)
    return Decision(
        setting=path,
        value=current.value if current is not None else None,
        rule="M1",
        reason=f"{drop.reason}; but the baseline's value cannot be used here ({problem}), "
        "so it is kept",
        source=Source.MEASURED,
    )
