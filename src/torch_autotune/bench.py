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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, PositiveFloat, ValidationError, model_validator

from torch_autotune.bounds import (
    STRICT,
    BatchSize,
    CpuCount,
    PrefetchFactor,
    Rounds,
    WorkerCount,
)

if TYPE_CHECKING:
    from torch_autotune.profile import Decision, Profile

MIN_EFFECT = 0.02
"""Smallest change of the median ratio that counts as faster or slower (2%)."""

MIN_ROUNDS = 3
"""Fewer rounds than this cannot tell an effect from noise."""

BASELINE_BATCH_SIZE = 32

Dtype = Literal["float32", "float16", "bfloat16"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
Verdict = Literal["faster", "slower", "within noise", "too few rounds"]


class ArmFailed(Exception):
    """One arm could not be measured (out of memory, a DataLoader worker died): the arm has no
    number for that round, the others go on."""


class _Strict(BaseModel):
    model_config = STRICT


class TrainConfig(_Strict):
    """How one arm of the bench trains. The defaults are the baseline of speed guides.

    ``None`` for ``cudnn_benchmark``, ``tf32`` and ``cpu_threads`` means torch's default, left
    as the process found it.
    """

    batch_size: BatchSize = BASELINE_BATCH_SIZE
    precision: Dtype = Field(default="float32", description="float16 trains with a GradScaler.")
    channels_last: bool = False
    compile_mode: CompileMode | None = Field(default=None, description="None: eager.")
    cudnn_benchmark: bool | None = None
    tf32: bool | None = None
    fused_optimizer: bool = False
    num_workers: WorkerCount = 0
    prefetch_factor: PrefetchFactor | None = None
    pin_memory: bool = False
    cpu_threads: CpuCount | None = None

    @model_validator(mode="after")
    def _loader(self) -> TrainConfig:
        if self.prefetch_factor is not None and self.num_workers == 0:
            raise ValueError("prefetch_factor needs num_workers > 0 (torch refuses it otherwise)")
        return self

    def describe(self) -> str:
        """'bfloat16, batch 256, 4 workers, pinned, compiled (default)', the non-defaults."""
        parts = [self.precision, f"batch {self.batch_size}"]
        parts.append(f"{self.num_workers} worker{'s' if self.num_workers != 1 else ''}")
        if self.pin_memory:
            parts.append("pinned")
        if self.channels_last:
            parts.append("channels_last")
        if self.compile_mode is not None:
            parts.append(f"compiled ({self.compile_mode})")
        if self.cudnn_benchmark is not None:
            parts.append(f"cudnn.benchmark {'on' if self.cudnn_benchmark else 'off'}")
        if self.tf32 is not None:
            parts.append(f"TF32 {'on' if self.tf32 else 'off'}")
        if self.fused_optimizer:
            parts.append("fused optimizer")
        if self.cpu_threads is not None:
            parts.append(f"{self.cpu_threads} thread{'s' if self.cpu_threads != 1 else ''}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Knob:
    """One setting the bench switches: the TrainConfig fields that move together."""

    name: str
    fields: tuple[str, ...]


KNOBS: tuple[Knob, ...] = (
    Knob("precision", ("precision",)),
    Knob("batch_size", ("batch_size",)),
    Knob("compile", ("compile_mode",)),
    Knob("channels_last", ("channels_last",)),
    Knob("tf32", ("tf32",)),
    Knob("cudnn_benchmark", ("cudnn_benchmark",)),
    Knob("fused_optimizer", ("fused_optimizer",)),
    Knob("num_workers", ("num_workers", "prefetch_factor")),
    Knob("pin_memory", ("pin_memory",)),
    Knob("cpu_threads", ("cpu_threads",)),
)
"""Every setting the bench can ablate, in the order the report lists them."""

NOT_ABLATED = (
    "environment (PYTORCH_CUDA_ALLOC_CONF, CUBLAS_WORKSPACE_CONFIG, OMP_NUM_THREADS...): read "
    "once when CUDA or OpenMP starts, so it cannot change inside one process",
    "persistent_workers: saves worker start-up between epochs, which a steady-state "
    "measurement does not include",
)


def knob_value(config: TrainConfig, knob: Knob) -> Any:
    """The knob's value in a config: a scalar for one field, a tuple for several."""
    values = tuple(getattr(config, name) for name in knob.fields)
    return values[0] if len(values) == 1 else values


def with_knob(config: TrainConfig, knob: Knob, source: TrainConfig) -> TrainConfig:
    """``config`` with the knob's fields taken from ``source``."""
    return config.model_copy(update={name: getattr(source, name) for name in knob.fields})


def show_value(config: TrainConfig, knob: Knob) -> str:
    """The knob's value as the report prints it."""
    if knob.name == "num_workers":
        return str(config.num_workers)
    value = getattr(config, knob.fields[0])
    if value is None:
        return "eager" if knob.name == "compile" else "default"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


# --- the profile's own config ------------------------------------------------------------------


def tuned_config(profile: Profile, baseline: TrainConfig | None = None) -> TrainConfig:
    """The TrainConfig a profile trains with.

    A profile without a measured batch size keeps the baseline's: the bench never makes up a
    size. Settings that mean nothing on the profile's device (cuDNN off CUDA) stay at torch's
    default, as in the baseline.
    """
    s = profile.settings
    base = baseline or TrainConfig()
    cuda = s.device == "cuda"
    dl = s.dataloader
    return TrainConfig(
        batch_size=s.batch.batch_size or base.batch_size,
        precision=s.precision.dtype if s.precision.autocast else "float32",
        channels_last=s.memory_format == "channels_last",
        compile_mode=(s.compile.mode or "default") if s.compile.enabled else None,
        cudnn_benchmark=True if cuda and s.backends.cudnn_benchmark else None,  # off: default
        tf32=s.matmul.tf32 if s.matmul.api is not None else None,
        fused_optimizer=s.optimizer.fused,
        num_workers=dl.num_workers,
        prefetch_factor=dl.prefetch_factor if dl.num_workers > 0 else None,
        pin_memory=dl.pin_memory,
        cpu_threads=s.cpu_threads,
    )


def ablated_knobs(baseline: TrainConfig, tuned: TrainConfig) -> list[Knob]:
    """The settings on which the profile and the baseline disagree."""
    return [k for k in KNOBS if knob_value(baseline, k) != knob_value(tuned, k)]


# --- the arms -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The arms of one bench: each distinct config once, with every name it goes by."""

    baseline: TrainConfig
    tuned: TrainConfig
    knobs: tuple[Knob, ...]
    configs: tuple[TrainConfig, ...]
    names: tuple[tuple[str, ...], ...]  # names[i]: the arms configs[i] stands for

    def index(self, config: TrainConfig) -> int:
        return self.configs.index(config)

    def on_alone(self, knob: Knob) -> TrainConfig:
        return with_knob(self.baseline, knob, self.tuned)

    def off_alone(self, knob: Knob) -> TrainConfig:
        return with_knob(self.tuned, knob, self.baseline)


def plan_arms(baseline: TrainConfig, tuned: TrainConfig) -> Plan:
    """Baseline, tuned, and each ablated setting on alone and off alone, duplicates merged."""
    knobs = tuple(ablated_knobs(baseline, tuned))
    named: list[tuple[str, TrainConfig]] = [("baseline", baseline), ("tuned", tuned)]
    for knob in knobs:
        named.append((f"baseline + {knob.name}", with_knob(baseline, knob, tuned)))
        named.append((f"tuned - {knob.name}", with_knob(tuned, knob, baseline)))
    configs: list[TrainConfig] = []
    names: list[list[str]] = []
    for name, config in named:
        if config in configs:
            names[configs.index(config)].append(name)
        else:
            configs.append(config)
            names.append([name])
    return Plan(baseline, tuned, knobs, tuple(configs), tuple(tuple(n) for n in names))


def round_order(arms: int, round_index: int) -> list[int]:
    """The order of the arms in one round: rotated by one each round, so that no arm always
    runs first (after a pause) or right after the slowest one."""
    return [(round_index + i) % arms for i in range(arms)]


# --- statistics ---------------------------------------------------------------------------------


class Effect(_Strict):
    """How much faster ``with`` trains than ``without``, paired round by round."""

    speedup: PositiveFloat = Field(description="Median over rounds of with / without.")
    low: PositiveFloat = Field(description="Lowest ratio of a round.")
    high: PositiveFloat = Field(description="Highest ratio of a round.")
    rounds: Rounds = Field(description="Rounds in which both arms ran.")
    verdict: Verdict

    def describe(self) -> str:
        """'1.42x (1.38-1.47, 5 rounds): faster'."""
        return (
            f"{self.speedup:.2f}x ({self.low:.2f}-{self.high:.2f}, {self.rounds} rounds): "
            f"{self.verdict}"
        )


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


# --- the record ---------------------------------------------------------------------------------


class ArmRecord(_Strict):
    """One distinct config, what it stands for, and its throughput in each round."""

    names: tuple[str, ...] = Field(description="'baseline', 'tuned', 'tuned - compile', ...")
    config: TrainConfig
    samples_per_s: tuple[PositiveFloat | None, ...] = Field(
        description="One per round, in round order; None: the measurement failed."
    )
    error: str | None = Field(default=None, description="Why a measurement failed.")

    @property
    def median(self) -> float | None:
        ran = [v for v in self.samples_per_s if v is not None]
        return statistics.median(ran) if ran else None

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the rounds that ran."""
        ran = [v for v in self.samples_per_s if v is not None]
        median = self.median
        return (max(ran) - min(ran)) / median if ran and median else None


Outcome = Literal["kept", "dropped", "kept (required)"]


class SettingEffect(_Strict):
    """One ablated setting: its values, what it does alone and in the profile, the outcome."""

    setting: str
    baseline_value: str
    tuned_value: str
    on_alone: Effect | None = Field(description="Baseline with this setting vs baseline.")
    off_alone: Effect | None = Field(description="Profile vs profile without this setting.")
    outcome: Outcome
    reason: str


class BenchEvidence(_Strict):
    """What ``autotune bench`` ran and measured: the basis of every M1/M2 decision."""

    workload: str
    device: str
    rounds: Rounds
    seconds_per_measurement: PositiveFloat
    arms: tuple[ArmRecord, ...]
    tuned: Effect | None = Field(description="The profile as the probe made it vs baseline.")
    settings: tuple[SettingEffect, ...]
    final: Effect | None = Field(
        default=None, description="The profile after the drops vs baseline (None: no drops)."
    )
    reverted: bool = Field(default=False, description="Everything went back to the baseline.")
    not_ablated: tuple[str, ...] = ()
    elapsed_s: float = Field(ge=0)

    def ran(self) -> set[int]:
        """Batch sizes that trained in some arm."""
        return {arm.config.batch_size for arm in self.arms if any(v for v in arm.samples_per_s)}


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
    required = REQUIRED_BY_MODE.get(mode, {})
    results = []
    for knob in plan.knobs:
        on = effect(
            _throughputs(plan, rounds, plan.on_alone(knob)),
            _throughputs(plan, rounds, plan.baseline),
        )
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
    """The profile's config with every dropped setting back at the baseline's value."""
    config = plan.tuned
    dropped = {s.setting for s in settings if s.outcome == "dropped"}
    for knob in plan.knobs:
        if knob.name in dropped:
            config = with_knob(config, knob, plan.baseline)
    return config


# --- taking settings out of the profile ---------------------------------------------------------


def _knob_settings(knob: str, config: TrainConfig) -> Iterator[tuple[str, Any]]:
    """The profile settings (dotted paths) that hold a knob at ``config``'s value."""
    if knob == "precision":
        yield "precision.autocast", config.precision != "float32"
        yield "precision.dtype", config.precision
        yield "precision.grad_scaler", config.precision == "float16"
    elif knob == "batch_size":
        yield "batch.batch_size", config.batch_size
    elif knob == "compile":
        yield "compile.enabled", config.compile_mode is not None
        yield "compile.mode", config.compile_mode
    elif knob == "channels_last":
        yield "memory_format", "channels_last" if config.channels_last else "contiguous_format"
    elif knob == "tf32":
        yield "matmul.tf32", bool(config.tf32)
        if config.tf32 is None:
            yield "matmul.api", None  # torch's default: set nothing
    elif knob == "cudnn_benchmark":
        yield "backends.cudnn_benchmark", bool(config.cudnn_benchmark)
    elif knob == "fused_optimizer":
        yield "optimizer.fused", config.fused_optimizer
    elif knob == "num_workers":
        yield "dataloader.num_workers", config.num_workers
        yield "dataloader.prefetch_factor", config.prefetch_factor
        if config.num_workers == 0:
            yield "dataloader.persistent_workers", False
    elif knob == "pin_memory":
        yield "dataloader.pin_memory", config.pin_memory
    elif knob == "cpu_threads":
        yield "cpu_threads", config.cpu_threads
    else:  # pragma: no cover - KNOBS and this function are kept in step by a test
        raise KeyError(knob)


def _set(settings: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = settings
    for part in parents:
        node = node[part]
    node[leaf] = value


def apply_bench(profile: Profile, plan: Plan, bench: BenchEvidence) -> Profile:
    """The profile with the bench's evidence, and every dropped setting back at the baseline's
    value with its measurement as the reason.

    A drop the profile cannot hold (a baseline value invalid on this machine, such as a user's
    bf16 baseline on a V100) is not made; the decision says so. channels_last goes with AMP,
    as rule H1 asks, when precision is dropped.
    """
    from torch_autotune.profile import Profile as ProfileModel
    from torch_autotune.profile import Source

    if profile.evidence is None:
        raise ValueError("the bench needs a measured profile (evidence from the probe)")
    reverted = bench.reverted
    drops = [
        s
        for s in bench.settings
        if s.outcome == "dropped" or (reverted and s.outcome != "kept (required)")
    ]
    data = profile.model_dump(mode="python")
    data["evidence"] = profile.evidence.model_copy(update={"bench": bench}).model_dump(
        mode="python"
    )
    decisions = list(profile.decisions)
    for drop in drops:
        candidate = _with_drop(data, decisions, drop, plan, reverted=reverted, bench=bench)
        if drop.setting == "precision" and _channels_last_without_amp(candidate[0]):
            dependent = _dependent("channels_last", drop)
            candidate = _with_drop(*candidate, dependent, plan, reverted=False, bench=bench)
        try:
            ProfileModel.model_validate(candidate[0])
        except ValidationError as error:
            problem = error.errors()[0]["msg"].removeprefix("Value error, ")
            decisions.append(_note_not_dropped(profile, drop, problem))
            continue
        data, decisions = candidate
    data["decisions"] = [d.model_dump(mode="python") for d in decisions]
    data["measured"] = data["measured"] or any(d.source is Source.MEASURED for d in decisions)
    return ProfileModel.model_validate(data)


def _dependent(name: str, cause: SettingEffect) -> SettingEffect:
    return SettingEffect(
        setting=name,
        baseline_value="off",
        tuned_value="on",
        on_alone=None,
        off_alone=None,
        outcome="dropped",
        reason=f"goes with AMP (rule H1), and precision was dropped: {cause.reason}",
    )


def _channels_last_without_amp(data: dict[str, Any]) -> bool:
    s = data["settings"]
    return bool(s["memory_format"] == "channels_last" and not s["precision"]["autocast"])


def _with_drop(
    data: dict[str, Any],
    decisions: list[Any],
    drop: SettingEffect,
    plan: Plan,
    *,
    reverted: bool,
    bench: BenchEvidence,
) -> tuple[dict[str, Any], list[Any]]:
    import copy

    from torch_autotune.profile import Decision, Source

    new = copy.deepcopy(data)
    new_decisions = list(decisions)
    rule, reason = "M1", drop.reason
    if reverted:
        rule = "M2"
        reason = (
            "the tuned profile measured slower than the baseline as a whole: "
            f"{_final_text(bench)}; so every setting the bench switched is back at the "
            "baseline's value"
        )
    for path, value in _knob_settings(drop.setting, plan.baseline):
        _set(new["settings"], path, value)
        earlier = next((d for d in reversed(new_decisions) if d.setting == path), None)
        text = reason
        if earlier is not None and earlier.value != value:
            text += f" (overrides {earlier.rule}: {earlier.value!r})"
        new_decisions.append(
            Decision(setting=path, value=value, rule=rule, reason=text, source=Source.MEASURED)
        )
    return new, new_decisions


def _final_text(bench: BenchEvidence) -> str:
    measured = bench.final or bench.tuned
    if measured is None:
        return "not measured"
    return (
        f"{measured.speedup:.2f}x the baseline's speed (range {measured.low:.2f}-"
        f"{measured.high:.2f} over {measured.rounds} interleaved rounds)"
    )


def _note_not_dropped(profile: Profile, drop: SettingEffect, problem: str) -> Decision:
    from torch_autotune.profile import Decision as DecisionModel
    from torch_autotune.profile import Source

    path = next(iter(_knob_settings(drop.setting, TrainConfig())))[0]
    current = profile.decision(path)
    return DecisionModel(
        setting=path,
        value=current.value if current is not None else None,
        rule="M1",
        reason=f"{drop.reason}; but the baseline's value cannot be used here ({problem}), "
        "so it is kept",
        source=Source.MEASURED,
    )
