"""What was measured on the machine: the probe's records and the bench's.

The ground floor of the data model, next to ``settings``: pydantic and the standard library
only. The probe fills ``Evidence`` (every trial of the batch-size search, the throughput
points, the DataLoader candidates, the compile measurement, how the ranks of a job probed
together); ``autotune bench`` fills ``BenchEvidence`` (``bench_record``: each arm's
``TrainConfig`` and throughput per round, each setting's ``Effect``). A profile carries both,
so every measured setting can be traced to its numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field

from torch_autotune.bench_record import (  # noqa: F401  # the old import paths still work
    BASELINE_BATCH_SIZE,
    ArmRecord,
    BenchEvidence,
    Effect,
    SettingEffect,
    TrainConfig,
)
from torch_autotune.bounds import (
    MAX_BYTES,
    MAX_CPUS,
    BatchSize,
    Bytes,
    CpuCount,
    SmallCount,
    WorkerCount,
)
from torch_autotune.settings import RECORDS, Settings, StrictModel

# --- the probe ----------------------------------------------------------------------------------

EAGER = "eager"
"""The probe's base variant: the rules-only profile's settings, without torch.compile."""
COMPILED = "compiled"
"""The probe's variant under torch.compile (the mode its ``CompileRecord`` names)."""
BUDGETED = "memory-budgeted"
"""The probe's variant under torch.compile with an activation memory budget (``compile``'s
``memory_budget``, as its records give it)."""

VariantName = Annotated[str, Field(min_length=1, max_length=120)]

WORKERS_OUT_OF_TIME = "not measured: the time budget ran out"
"""``Evidence.workers_reason`` where the run had no time left for the DataLoader's workers."""
WORKERS_NO_DATASET = "not measured: the workload tuned had no dataset, so no DataLoader"
"""``Evidence.workers_reason`` where the workload had none (objects with an example batch)."""


MEMORY_DEFAULTS = {r.name: r.show(Settings()) for r in RECORDS if r.memory}
"""How each setting that changes memory shows at torch's default (``settings.memory_settings``),
for a variant recorded before the setting existed."""


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


STEADY_BLOCKS = 3
"""A point is steady where this many timed blocks in a row agree (within 5%)."""


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
    def unsteady(self) -> str:
        """Why a point that is not steady is not: too few timed blocks ran in its time, or they
        differed (a record from before ``blocks`` was kept: 'noisy')."""
        if 0 < self.blocks < STEADY_BLOCKS:
            return f"only {self.blocks} timed block{'s' * (self.blocks > 1)} ran in its time"
        return "noisy" if not self.blocks else "its timed blocks differed by more than 5%"

    @property
    def compiled(self) -> bool:
        """It ran under torch.compile (the probe's compiled variant, with or without a memory
        budget)."""
        return self.variant in (COMPILED, BUDGETED)


class PhaseRecord(StrictModel):
    """How long one phase of the probe took."""

    name: str
    seconds: float = Field(ge=0)
    allowed_s: float | None = Field(default=None, ge=0, description="The phase's share.")


class OptimizerMemoryRecord(StrictModel):
    """The fused optimizer's step against torch's default (foreach), at the largest batch the
    search trained fused, where memory limited it (``probe.optimizer_memory``)."""

    batch_size: BatchSize
    fused_peak_bytes: Bytes | None = Field(description="The fused trial's peak at that batch.")
    foreach_fits: bool = Field(description="The foreach optimizer trained that batch too.")
    foreach_peak_bytes: Bytes | None = Field(description="Its peak, where it fit.")


class AllocatorRecord(StrictModel):
    """The caching allocator's setting against this process's, measured in a fresh process
    where memory limited the search (``probe.allocator_phase``), or why it was not
    (``measured`` False: J1's setting, kept with the reason)."""

    value: Annotated[str, Field(max_length=256)] = Field(description="J1's value.")
    fresh_has_it: bool = Field(description="The fresh process ran with it (this one without).")
    measured: bool = False
    kept: bool = True
    batch_size: BatchSize | None = Field(default=None, description="Where both points ran.")
    largest_with: BatchSize | None = None
    largest_without: BatchSize | None = None
    samples_per_s_with: float | None = Field(default=None, gt=0)
    samples_per_s_without: float | None = Field(default=None, gt=0)
    reason: Annotated[str, Field(max_length=2000)]


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


ChosenBy = Literal["fastest point", "fastest unsteady point", "largest point", "top candidate"]
Confirmed = Literal["its point", "ran again", "stepped down", "not run again", "its fed pass"]
FedWhy = Literal["below the step", "fewer threads", "step not timed"]


class BatchChoice(StrictModel):
    """How the probe chose the batch it recommends: the facts the batch decision and the
    summary are written from, so that neither says more than was done.

    ``chosen_by``: ``fastest point``, the smallest steady point within 3% of the best steady
    rate; ``fastest unsteady point``, none was steady, so the size whose point ran fastest
    (smaller within 3%); ``largest point`` (earlier releases, and where a variant's settings
    are kept), none was steady, so the largest size a point measured; ``top candidate``, no
    point ran. The top candidate is the largest batch that trained (in the search of the
    chosen point's ``variant``), less ``margin`` where memory limited it (K2: of its samples,
    or of the memory where ``memory_room`` names a size whose peak left it free), rounded down
    to ``multiple`` (K4). ``confirmed``: ``its point``, its steady point ran after the search
    with the final settings; ``ran again``; ``stepped down``, a smaller size ran instead;
    ``not run again``, it would not fit in the time budget left (it ran once, with these
    settings); ``its fed pass``: the passes chose it (``fed``, ``fed_why``), the smallest
    within 2% of their best rate (``Evidence.fed_reason``).
    """

    chosen_by: ChosenBy
    largest: BatchSize = Field(description="The largest batch that trained in the search.")
    top: BatchSize = Field(description="The top candidate: largest, less margin, rounded.")
    margin: float | None = Field(
        default=None, ge=0, lt=1, description="Taken off the largest (None: not memory-bound)."
    )
    memory_room: tuple[BatchSize, Bytes, Bytes] | None = Field(
        default=None,
        description="Where K2's margin was kept in memory: the size whose peak left it free, "
        "that peak and the bytes the trials could use (None: kept in samples, or no margin).",
    )
    limited_by: str | None = Field(
        default=None,
        max_length=40,
        description="What limited the search the largest came from: the chosen variant's own, "
        "which may stop below the base's (None in files written before it was recorded).",
    )
    multiple: BatchSize = Field(default=1, description="Sizes rounded down to a multiple.")
    variant: VariantName = Field(default=EAGER, description="The chosen point's variant.")
    samples_per_s: float | None = Field(default=None, gt=0, description="The chosen point's.")
    best_samples_per_s: float | None = Field(
        default=None, gt=0, description="The best steady rate measured (at best_batch_size)."
    )
    best_batch_size: BatchSize | None = None
    confirmed: Confirmed
    fed: bool = Field(default=False, description="The passes chose the batch (fed_why).")
    fed_why: FedWhy | None = Field(
        default=None,
        description="Why the passes chose it: fed by the DataLoader below the step alone beyond"
        " 2%; at fewer threads than the step's points ran at (probe.fed, probe.own_threads),"
        " where the batch ran again; no step alone timed there (None: not fed, or unrecorded).",
    )

    @property
    def compiled(self) -> bool:
        """The chosen point ran under torch.compile (the probe's compiled variant, with or
        without a memory budget)."""
        return self.variant in (COMPILED, BUDGETED)


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
    round: int = Field(default=1, ge=1, le=2, description="2: run again to confirm (probe.fed).")
    dataloader: bool = Field(default=True, description="False: own batches (probe.own_threads).")


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
        default=(), description="The data module's arguments for the tuned DataLoader settings."
    )
    batch_sampler: str | None = Field(default=None, description="The user's batch_sampler class.")

    @property
    def raised_below(self) -> bool:
        """The search started above 1 because a smaller batch raised (not as asked)."""
        reason = self.min_batch_reason or ""
        return self.min_batch_size > 1 and reason.startswith("batch ") and " raised " in reason


class RanksRecord(StrictModel):
    """How the ranks of a job torchrun started probed together (``probe.ranks``): every rank
    trained every trial in DistributedDataParallel, a size fit only where it fit on each, and
    rank 0 decided. The throughput points are the group's: every rank's samples together."""

    world_size: Annotated[int, Field(ge=2, le=MAX_CPUS)]
    nodes: Annotated[int, Field(ge=1, le=MAX_CPUS)]
    backend: Literal["nccl", "gloo"]
    devices: tuple[Annotated[str, Field(max_length=200)], ...] = Field(
        max_length=MAX_CPUS, description="What each rank trained on, in rank order."
    )
    group_samples_per_s: float | None = Field(
        default=None, gt=0, description="The recommended batch's point: every rank together."
    )
    one_rank_samples_per_s: float | None = Field(
        default=None,
        gt=0,
        description="Rank 0 alone at the same batch and settings, its gradients not all-reduced.",
    )
    unused_parameters: Annotated[int, Field(ge=0, le=MAX_BYTES)] | None = Field(
        default=None, description="Parameters the model's first step left without a gradient."
    )
    wait_s: float = Field(gt=0, description="The longest any rank waits on another.")
    ddp_did_not_fit: BatchSize | None = Field(
        default=None,
        description="The batch DDP did not train on every rank, where FSDP2 sharded the model.",
    )

    @property
    def scaling_efficiency(self) -> float | None:
        """The group's rate over world_size times one rank's: 1.0 scales perfectly."""
        if self.group_samples_per_s is None or self.one_rank_samples_per_s is None:
            return None
        return self.group_samples_per_s / (self.world_size * self.one_rank_samples_per_s)


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
    allocator: AllocatorRecord | None = Field(
        default=None,
        description="The allocator's setting (J1) measured in a fresh process, or why not.",
    )
    optimizer_memory: OptimizerMemoryRecord | None = Field(
        default=None,
        description="The fused optimizer against foreach at the largest batch, where memory"
        " limited the search and the optimizer is fused.",
    )
    warnings: tuple[str, ...] = Field(default=(), description="What the user should know.")
    details: WorkloadDetails | None = Field(
        default=None, description="What the probe made of the workload (None in earlier releases)."
    )
    batch_choice: BatchChoice | None = Field(
        default=None, description="How the batch was chosen (None in earlier releases)."
    )

    ranks: RanksRecord | None = Field(
        default=None, description="Where several ranks probed together (None: one process)."
    )
    variants: tuple[VariantRecord, ...] = Field(
        default=(),
        max_length=16,
        description="The probe's variants, with the settings each ran with (empty in files of"
        " schema 1, which did not record them).",
    )

    def kind_of(self, variant: str) -> str:
        """What a point or trial of ``variant`` trained as: "checkpointed" where it ran with
        activation checkpointing (the checkpointed variant, or the base of a model that fit
        only with it: its recorded settings say so), else "compiled" or "eager"; a
        measurement of another kind by its name ("foreach")."""
        name = variant.partition(",")[0]  # "eager, cuDNN autotuner off": a search of eager
        if name not in (EAGER, COMPILED, "checkpointed"):
            return name  # a measurement of its own (the foreach optimizer's trial)
        record = next((v for v in self.variants if v.name == variant), None)
        if record is not None and record.settings.get("activation_checkpointing") == "on":
            return "checkpointed"
        return name

    def ran(self, memory: Mapping[str, str] | None = None) -> set[int]:
        """Batch sizes that trained here: search trials that fit, steady points, passes fed by
        the DataLoader, the bench's arms. ``memory``: only the probe's runs with these values of
        settings that change memory (``memory_settings``, or some of them); ``invariants``
        reads the arms. A file with no variants recorded (schema 1) counts every run; a setting
        a variant did not record (one added to the records since, as FSDP2 was) ran at its
        default."""
        wanted = dict(memory or {})
        held = [
            v
            for v in self.variants
            if all(v.settings.get(k, MEMORY_DEFAULTS.get(k)) == x for k, x in wanted.items())
        ]
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
