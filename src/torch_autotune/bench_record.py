"""What ``autotune bench`` measured: the config each arm trains with (``TrainConfig``), each
arm's throughput per round, each setting's ``Effect``, all of it in ``BenchEvidence``.

The ground floor of the data model, beside ``evidence`` (which holds it in the profile):
pydantic and the standard library only.
"""

from __future__ import annotations

import json
import statistics
from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, ValidationError, model_validator

from torch_autotune.bounds import (
    BatchSize,
    CpuCount,
    PrefetchFactor,
    Rounds,
    SettingFloat,
    SettingInt,
    WorkerCount,
)
from torch_autotune.records import on_off
from torch_autotune.settings import RECORDS, Settings, StrictModel, settings_paths

BASELINE_BATCH_SIZE = 32
BASELINE_ITSELF = "the profile trains as the baseline does in every setting the bench ablated"
"""What the bench's summary and charts say where it dropped every setting
(``BenchEvidence.final_is_baseline``), in place of a measurement of the baseline against
itself."""

Dtype = Literal["float32", "float16", "bfloat16"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
Verdict = Literal["faster", "slower", "within noise", "too few rounds"]
Outcome = Literal["kept", "dropped", "kept (required)"]


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
    settings: dict[
        str, bool | SettingInt | SettingFloat | Annotated[str, Field(max_length=256)] | None
    ] = Field(
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
        wrong = [_wrong_type(path, value) for path, value in sorted(self.settings.items())]
        if any(wrong):
            raise ValueError("; ".join(w for w in wrong if w))
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
        default=None,
        description="The profile after the drops vs baseline (None: no drops, or every setting"
        " dropped: ``final_is_baseline``).",
    )
    final_is_baseline: bool = Field(
        default=False,
        description="Every setting the bench ablated was dropped: the profile is left with the"
        " baseline's own config in all of them, which no arm compares with itself (False in"
        " earlier files, which measured it as 1.00x the baseline).",
    )
    reverted: bool = Field(default=False, description="Everything went back to the baseline.")
    not_ablated: tuple[str, ...] = ()
    elapsed_s: float = Field(ge=0)

    @model_validator(mode="after")
    def _final(self) -> BenchEvidence:
        if self.final_is_baseline and self.final is not None:
            raise ValueError("final_is_baseline: the baseline is not measured against itself")
        return self

    def ran(self) -> set[int]:
        """Batch sizes that trained in some arm."""
        return {arm.config.batch_size for arm in self.arms if any(v for v in arm.samples_per_s)}


def _wrong_type(path: str, value: object) -> str | None:
    """Why ``value`` is not of the type of the setting at ``path`` as written (``1`` for a
    switch, ``true`` for a count, ``"8"`` for a number), None where it is: the mapping takes
    any of a setting's types, and a lax check turned ``compile.enabled: 1`` into ``true``. Only
    the value's own type is held here; what it means beside the other settings is the arm's."""
    data = Settings().model_dump(mode="json")
    *parents, leaf = path.split(".")
    node = data
    for part in parents:
        node = node[part]
    node[leaf] = value
    try:
        Settings.model_validate_json(json.dumps(data), strict=True)
    except ValidationError as exc:
        parts = tuple(path.split("."))
        for error in exc.errors():
            if tuple(error["loc"][: len(parts)]) == parts and error["type"].endswith("_type"):
                why = error["msg"].lower()
                return f"settings {path}: {json.dumps(value)} is not of its type ({why})"
    return None
