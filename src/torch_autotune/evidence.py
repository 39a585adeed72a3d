"""What was measured on the machine: the probe's records and the bench's.

The ground floor of the data model, next to ``settings``: pydantic and the standard library
only. The probe fills ``Evidence`` (every trial of the batch-size search, the throughput
points, the DataLoader candidates, the compile measurement); ``autotune bench`` fills
``BenchEvidence`` (each arm's ``TrainConfig`` and throughput per round, each setting's
``Effect``). A profile carries both, so every measured setting can be traced to its numbers.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, model_validator

from torch_autotune.bounds import (
    BatchSize,
    Bytes,
    CpuCount,
    PrefetchFactor,
    Rounds,
    SettingInt,
    SmallCount,
    WorkerCount,
)
from torch_autotune.records import on_off
from torch_autotune.settings import RECORDS, StrictModel, settings_paths

BASELINE_BATCH_SIZE = 32

Dtype = Literal["float32", "float16", "bfloat16"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
Verdict = Literal["faster", "slower", "within noise", "too few rounds"]
Outcome = Literal["kept", "dropped", "kept (required)"]


# --- the bench ----------------------------------------------------------------------------------


class TrainConfig(StrictModel):
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
    settings: dict[str, bool | SettingInt | Annotated[str, Field(max_length=256)] | None] = Field(
        default_factory=dict,
        max_length=64,
        description="Settings the fields above do not name, by their dotted path in a profile's"
        " settings (absent: torch's default).",
    )

    @model_validator(mode="after")
    def _loader(self) -> TrainConfig:
        if self.prefetch_factor is not None and self.num_workers == 0:
            raise ValueError("prefetch_factor needs num_workers > 0 (torch refuses it otherwise)")
        unknown = sorted(set(self.settings) - settings_paths())
        if unknown:
            raise ValueError(f"settings names no setting a profile holds: {', '.join(unknown)}")
        return self

    def __hash__(self) -> int:  # the settings mapping is a dict: hash its items
        fields = tuple(v for k, v in self.__dict__.items() if k != "settings")
        return hash((fields, tuple(sorted(self.settings.items()))))

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
        for path, value in sorted(self.settings.items()):
            record = next((r for r in RECORDS if path in r.paths), None)
            label = record.label if record is not None else path
            parts.append(f"{label} {on_off(value) if isinstance(value, bool) else value}")
        return ", ".join(parts)


class Effect(StrictModel):
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


class ArmRecord(StrictModel):
    """One distinct config, what it stands for, and its throughput in each round."""

    names: tuple[str, ...] = Field(description="'baseline', 'tuned', 'tuned - compile', ...")
    config: TrainConfig
    samples_per_s: tuple[PositiveFloat | None, ...] = Field(
        description="One per round, in round order; None: the measurement failed."
    )
    error: str | None = Field(default=None, description="Why a measurement failed.")
    memory: dict[str, Annotated[str, Field(max_length=120)]] = Field(
        default_factory=dict,
        max_length=32,
        description="The settings that change how much memory a batch needs, as the arm ran "
        "them (``VariantRecord.settings``; empty in earlier files: not recorded).",
    )

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


class SettingEffect(StrictModel):
    """One ablated setting: its values, what it does alone and in the profile, the outcome."""

    setting: str
    baseline_value: str
    tuned_value: str
    on_alone: Effect | None = Field(description="Baseline with this setting vs baseline.")
    off_alone: Effect | None = Field(description="Profile vs profile without this setting.")
    outcome: Outcome
    reason: str


class BenchEvidence(StrictModel):
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


# --- the probe ----------------------------------------------------------------------------------

EAGER = "eager"
"""The probe's base variant: the rules-only profile's settings, without torch.compile."""
COMPILED = "compiled"
"""The probe's variant under torch.compile (the mode its ``CompileRecord`` names)."""

VariantName = Annotated[str, Field(min_length=1, max_length=120)]


class VariantRecord(StrictModel):
    """One way the probe trained (``probe.variants``): its name, as the records that ran with
    it give it, and the settings that change memory as it ran them (``memory_settings``)."""

    name: VariantName
    settings: dict[str, Annotated[str, Field(max_length=120)]] = Field(
        max_length=32,
        description="The settings that change how much memory a batch needs, by record name, "
        "as this variant ran them: the profile's batch is one that ran with the profile's.",
    )


class SearchTrialRecord(StrictModel):
    """One trial of the batch-size search, as the probe ran it."""

    batch_size: BatchSize
    fits: bool
    peak_memory_bytes: Bytes | None
    seconds: float | None = Field(ge=0, description="Wall time of the trial, warm-up included.")
    step: str = Field(description="Why this size: start, model, predict, verify, double, ...")
    warmup_s: float | None = Field(
        default=None, ge=0, description="The first step's cost beyond a steady step."
    )
    step_s: float | None = Field(default=None, ge=0, description="One steady training step.")
    predicted_s: float | None = Field(
        default=None, ge=0, description="What the time model predicted before the trial."
    )
    left_s: float | None = Field(
        default=None, ge=0, description="Seconds the phase had left when the trial was decided."
    )
    error: str | None = Field(
        default=None,
        description="What the step raised at this size (not out-of-memory): a model that cannot"
        " train on so few samples, such as BatchNorm on one.",
    )
    variant: VariantName = Field(default=EAGER, description="The probe's variant it ran with.")


class ThroughputRecord(StrictModel):
    """Training throughput measured at one batch size."""

    batch_size: BatchSize
    samples_per_s: float = Field(gt=0)
    relative_spread: float = Field(ge=0, description="(max - min) / median of the repeats.")
    steady: bool = Field(
        default=True,
        description="The last timed blocks agreed within 5%; noisy points are not chosen.",
    )
    variant: VariantName = Field(default=EAGER, description="The probe's variant it ran with.")
    warmup_s: float | None = Field(
        default=None, ge=0, description="The first step's cost beyond a steady step."
    )
    blocks: SmallCount = Field(default=0, description="Timed blocks of steps.")
    peak_memory_bytes: Bytes | None = Field(
        default=None, description="Allocator peak during the point, when known."
    )

    @property
    def compiled(self) -> bool:
        """It ran under torch.compile (the probe's compiled variant)."""
        return self.variant == COMPILED


class PhaseRecord(StrictModel):
    """How long one phase of the probe took."""

    name: str
    seconds: float = Field(ge=0)
    allowed_s: float | None = Field(default=None, ge=0, description="The phase's share.")


class CompileRecord(StrictModel):
    """torch.compile measured against eager training, or why it was not."""

    mode: str
    measured: bool
    kept: bool
    reason: str
    predicted_s: float | None = Field(default=None, ge=0, description="Compile time expected.")
    compile_s: float | None = Field(default=None, ge=0, description="Compile time paid.")
    batch_size: BatchSize | None = None
    eager_samples_per_s: float | None = Field(default=None, gt=0)
    compiled_samples_per_s: float | None = Field(default=None, gt=0)
    payoff_minutes: float | None = Field(
        default=None, ge=0, description="Training time after which the compile has paid off."
    )


class LoaderRecord(StrictModel):
    """DataLoader throughput with one worker count."""

    num_workers: WorkerCount
    samples_per_s: float | None = Field(gt=0, description="None: the candidate failed.")
    error: str | None = None


ChosenBy = Literal["fastest point", "largest point", "top candidate"]
Confirmed = Literal["its point", "ran again", "stepped down", "not run again", "its fed pass"]


class BatchChoice(StrictModel):
    """How the probe chose the batch it recommends: the facts the batch decision and the
    summary are written from, so that neither says more than was done.

    ``chosen_by``: ``fastest point``, the smallest steady point within 3% of the best steady
    rate; ``largest point``, none was steady, so the largest size a point measured; ``top
    candidate``, no point ran. ``fed``: loading limits training, and the batch is the smallest
    within 2% of the best rate fed by the DataLoader (``Evidence.fed_reason``). The top
    candidate is the largest batch that trained (in the search of the chosen point's
    ``variant``), less ``margin`` where memory limited it (K2), rounded down to ``multiple``
    (K4). ``confirmed``: ``its point``, its steady point ran after the search with the final
    settings; ``ran again``; ``stepped down``, a smaller size ran instead; ``not run again``,
    the budget was spent (it ran once, with these settings); ``its fed pass``.
    """

    chosen_by: ChosenBy
    largest: BatchSize = Field(description="The largest batch that trained in the search.")
    top: BatchSize = Field(description="The top candidate: largest, less margin, rounded.")
    margin: float | None = Field(
        default=None, ge=0, lt=1, description="Taken off the largest (None: not memory-bound)."
    )
    multiple: BatchSize = Field(default=1, description="Sizes rounded down to a multiple.")
    variant: VariantName = Field(default=EAGER, description="The chosen point's variant.")
    samples_per_s: float | None = Field(default=None, gt=0, description="The chosen point's.")
    best_samples_per_s: float | None = Field(
        default=None, gt=0, description="The best steady rate measured (at best_batch_size)."
    )
    best_batch_size: BatchSize | None = None
    confirmed: Confirmed
    fed: bool = Field(
        default=False, description="Loading limits training: the fed passes chose the batch."
    )

    @property
    def compiled(self) -> bool:
        """The chosen point ran under torch.compile (the probe's compiled variant)."""
        return self.variant == COMPILED


class FedRecord(StrictModel):
    """Training fed by its DataLoader: one worker count at one batch size, loading and the
    training step measured together, as training runs them (on a CPU they share the cores)."""

    num_workers: WorkerCount
    batch_size: BatchSize
    cpu_threads: CpuCount | None = Field(
        default=None,
        description="torch's threads in the pass, as the profile sets them with "
        "this worker count (None: the process's own).",
    )
    samples_per_s: float | None = Field(gt=0, description="None: the pass failed.")
    seconds: float | None = Field(default=None, ge=0, description="Wall time of the pass.")
    variant: VariantName = Field(default=EAGER, description="The probe's variant it ran with.")
    error: str | None = None


class WorkloadDetails(StrictModel):
    """What the probe made of the workload it trained: where it came from, how a batch
    reaches the model, where the loss comes from, and what was adapted on the way."""

    source: Literal["built-in", "factory", "objects"] = Field(
        description="A built-in workload, a factory's result, or objects given to tune()."
    )
    framework: str | None = Field(
        default=None, description="'transformers', 'transformers Trainer', 'lightning', or None."
    )
    model: str | None = Field(default=None, description="The model's class, where given as one.")
    optimizer: str | None = Field(default=None, description="The optimizer's class.")
    batch: str = Field(description="One sample of a batch, as collated.")
    call: str | None = Field(default=None, description="How the model is called on a batch.")
    loss: str | None = Field(default=None, description="Where the loss comes from.")
    min_batch_size: BatchSize = Field(default=1, description="The smallest batch searched.")
    min_batch_reason: str | None = Field(
        default=None, description="Why the search started above 1 (the user, or an error)."
    )
    variable_shapes: bool = Field(default=False, description="Samples differ in shape.")
    notes: tuple[str, ...] = Field(default=(), description="What was adapted, in words.")
    loader_arguments: tuple[str, ...] = Field(
        default=(),
        description="Arguments of the user's data module that take the tuned DataLoader "
        "settings (batch_size, num_workers, ...), for the exports.",
    )


class Evidence(StrictModel):
    """What the probe ran and measured on the machine: the basis of every measured setting."""

    workload: str
    device: str
    max_batch_size: BatchSize = Field(description="Largest batch that trained.")
    fastest_batch_size: BatchSize = Field(description="Smallest batch within 3% of the best.")
    batch_size: BatchSize = Field(description="Recommended: margin, rounding, run once more.")
    limited_by: str = Field(description="memory, cap, host RAM, time, or budget")
    limit_reason: str | None = Field(
        default=None, description="What stopped the search, with the numbers."
    )
    search: tuple[SearchTrialRecord, ...]
    throughput: tuple[ThroughputRecord, ...]
    loader: tuple[LoaderRecord, ...] = ()
    workers_reason: str | None = None
    fed: tuple[FedRecord, ...] = Field(
        default=(),
        description="Training fed by the DataLoader, worker counts and batch sizes measured "
        "with loading and the step together (where loading limits training, or on a CPU).",
    )
    fed_reason: str | None = Field(
        default=None,
        description="How the batch was chosen from the rates of loading and training together,"
        " with the numbers (None: from the training step alone).",
    )
    budget_s: float = Field(gt=0)
    elapsed_s: float = Field(ge=0)
    memory_limit_bytes: Bytes | None = Field(
        default=None, description="Bytes the trials could use on the device (None: unknown)."
    )
    bench: BenchEvidence | None = Field(
        default=None, description="autotune bench: baseline, tuned and each setting's effect."
    )
    phases: tuple[PhaseRecord, ...] = Field(default=(), description="Time per phase.")
    compile: CompileRecord | None = Field(
        default=None, description="torch.compile measured (speed mode, where it can run)."
    )
    warnings: tuple[str, ...] = Field(default=(), description="What the user should know.")
    details: WorkloadDetails | None = Field(
        default=None, description="What the probe made of the workload (None in earlier releases)."
    )
    batch_choice: BatchChoice | None = Field(
        default=None, description="How the batch was chosen (None in earlier releases)."
    )

    variants: tuple[VariantRecord, ...] = Field(
        default=(),
        max_length=16,
        description="The probe's variants, with the settings each ran with (empty in files of"
        " schema 1, which did not record them).",
    )

    def ran(self, memory: Mapping[str, str] | None = None) -> set[int]:
        """Batch sizes that trained here: search trials that fit, steady points, passes fed by
        the DataLoader, the bench's arms. ``memory``: only the probe's runs with these values of
        settings that change memory (``memory_settings``, or some of them); ``invariants``
        reads the arms. A file with no variants recorded (schema 1) counts every run."""
        wanted = dict(memory or {})
        held = [v for v in self.variants if all(v.settings.get(k) == x for k, x in wanted.items())]
        names = {v.name for v in held}
        if memory is None or not self.variants:
            names = {t.variant for t in self.search} | {t.variant for t in self.throughput}
            names |= {t.variant for t in self.fed}
        ran = {t.batch_size for t in self.search if t.fits and t.variant in names}
        ran |= {t.batch_size for t in self.throughput if t.variant in names}
        ran |= {
            t.batch_size for t in self.fed if t.samples_per_s is not None and t.variant in names
        }
        if self.bench is not None and memory is None:
            ran |= self.bench.ran()  # the bench trains its baseline batch size too
        return ran
