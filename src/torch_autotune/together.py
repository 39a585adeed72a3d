"""``tune()`` in a job of several ranks under torchrun: every rank trains every trial in
DistributedDataParallel, rank 0 decides, and every rank returns the one profile for the job.

``api.tune`` comes here when torchrun started this process in a world of more than one
(``launch.ranks_from_environment``). Rank 0 runs the probe (``probe.run.measure``) with a
``probe.ranks.Leader`` as its runner, so that each call reaches every rank and the outcomes are
combined; then it measures itself alone at the recommended batch, for the scaling efficiency,
builds the profile and hands it to the others, which followed its calls
(``probe.ranks.Follower``) until then. The waits between ranks are bounded by the budget and
``WAIT_MARGIN_S``.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch_autotune.errors import (
    AutotuneError,
    DoesNotFitError,
    LaunchError,
    RecomputeDiffersError,
    WorldSizeWarning,
    said_in_one_line,
)
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.invariants import device_accelerators
from torch_autotune.launch import Ranks, ranks_from_environment
from torch_autotune.probe.seam import Progress, Trials
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.workers_phase import ThreadsFor
from torch_autotune.probe.workloads import Workload
from torch_autotune.profile import Preferences, Profile, RanksRecord
from torch_autotune.settings import FsdpSettings
from torch_autotune.store import Lookup, ProfileStore

if TYPE_CHECKING:
    from torch_autotune.probe.run import ProbeResult

WAIT_MARGIN_S = 120.0
"""Beyond the budget, the longest a rank waits on another: a compile or a DataLoader's start on
one rank is not a failure; a rank killed outright is seen at once, its connections closed."""
ALONE_S = 5.0
"""The most rank 0 trains by itself for the one-rank rate (a point stops once steady)."""


def check_ranks(local_world_size: int, rules_only: Profile) -> None:
    """Refuse, in one line, ranks a node cannot run: more processes on a node than it has
    GPUs, where NCCL refuses two ranks on one GPU ("Duplicate GPU detected")."""
    topology = rules_only.topology
    gpus = len(device_accelerators(topology.device, rules_only.provenance.snapshot))
    if topology.device == "cuda" and local_world_size > gpus:
        raise LaunchError(
            f"{local_world_size} training processes on this node but {gpus} GPU(s): NCCL "
            "refuses two ranks on one GPU (one process drives one GPU); start one per GPU: "
            f"torchrun --nproc-per-node={gpus} (or autotune --nproc-per-node {gpus})"
        )


def tune_together(
    ranks: Ranks,
    workload: Workload,
    rules_only: Profile,
    *,
    build: Callable[..., Profile],
    budget_s: float,
    started: float,
    max_batch_size: int | None,
    progress: Progress,
    clock: Callable[[], float] = time.perf_counter,
    threads_for: ThreadsFor | None = None,
) -> Profile:
    """Probe ``workload`` on every rank of the job and return the job's profile, the same on
    every rank. ``build(measurements, evidence)`` makes the measured profile (the rules engine,
    as ``api.tune`` calls it).

    Long by design: rank 0's path and the others' share the group, the runner they build and
    the memory cap, which the closures here keep in one place.
    """
    from torch_autotune.probe.ddp import DdpRunner
    from torch_autotune.probe.group import joined
    from torch_autotune.probe.memory import memory_capped
    from torch_autotune.probe.ranks import Follower, Leader
    from torch_autotune.probe.run import measure
    from torch_autotune.probe.state import preserved
    from torch_autotune.probe.workloads.copies import parked

    check_ranks(ranks.local_world_size, rules_only)
    wait_s, preferences = budget_s + WAIT_MARGIN_S, rules_only.provenance.preferences
    with joined(ranks, rules_only.settings.device, timeout_s=wait_s) as group:

        def runner(chosen: Workload, settings: StepSettings) -> DdpRunner:
            return DdpRunner(chosen, settings, clock=clock, group=group)

        cap = memory_capped(rules_only.settings.device, preferences.memory_limit_bytes)
        if not ranks.leader:
            with preserved(), parked(workload.make_model), cap:
                profile: Profile = Follower(group, lambda s: runner(workload, s)).follow()
            return profile
        leaders: list[Leader] = []

        def trials(chosen: Workload, settings: StepSettings) -> Trials:
            made = runner(chosen, settings)
            leaders.append(Leader.first(group, made) if not leaders else leaders[-1].again(made))
            return leaders[-1]

        def probe(profile: Profile) -> ProbeResult:
            return measure(
                workload,
                profile,
                budget_s=budget_s,
                started=started,
                max_batch_size=max_batch_size,
                progress=progress,
                clock=clock,
                trials=trials,
                threads_for=threads_for,
            )

        with cap:  # every rank's device held to --memory-limit
            result, did_not_fit = _ddp_or_fsdp(probe, rules_only, ranks)
        progress("ranks", "rank 0 alone, for the scaling")
        with preserved(), parked(workload.make_model):
            record = _ranks_record(leaders[-1], result.evidence, rules_only, wait_s)
        profile = _job_profile(
            result, record.model_copy(update={"ddp_did_not_fit": did_not_fit}), build
        )
        leaders[-1].done(profile)
        return profile


def _job_profile(
    result: ProbeResult, record: RanksRecord, build: Callable[..., Profile]
) -> Profile:
    """The job's profile from what rank 0 measured and how the ranks probed together."""
    from torch_autotune import compose

    evidence = result.evidence.model_copy(update={"ranks": record})
    slower = _slower_together(record)
    if slower is not None:
        evidence = evidence.model_copy(update={"warnings": (*evidence.warnings, slower)})
    update: dict[str, object] = {"unused_parameters": record.unused_parameters}
    if record.ddp_did_not_fit is not None:
        reason = _fsdp_reason(record.ddp_did_not_fit, evidence, record.world_size)
        update["fsdp_reason"] = reason
    return build(compose.measurements(result).model_copy(update=update), evidence)


def _slower_together(record: RanksRecord) -> str | None:
    """A warning where the ranks together trained fewer samples a second than rank 0 alone
    at the same batch and settings (0.13 of 2 x one rank on a 2-core CPU): there the job is
    slower than one process, whatever its settings."""
    together, alone = record.group_samples_per_s, record.one_rank_samples_per_s
    if together is None or alone is None or together >= alone:
        return None
    shared = " (its ranks share the CPU's cores)" if set(record.devices) == {"cpu"} else ""

    def rate(value: float) -> str:  # a slow model's rate below 1 is not "0"
        return f"{value:,.0f}" if value >= 100 else f"{value:.2g}"

    return (
        f"the {record.world_size} ranks together trained {rate(together)} samples/s, fewer than"
        f" rank 0 alone at the same batch ({rate(alone)} samples/s): on this machine one"
        f" process trains faster than this job{shared}"
    )


def _ddp_or_fsdp(
    probe: Callable[[Profile], ProbeResult], rules_only: Profile, ranks: Ranks
) -> tuple[ProbeResult, int | None]:
    """The probe in DDP; where not even its smallest batch trains, again sharded with FSDP2
    (rule DP4); (what it measured, the batch DDP did not train, or None)."""
    try:
        return probe(rules_only), None
    except DoesNotFitError as error:
        ddp = error
    settings = rules_only.settings.model_copy(update={"fsdp": FsdpSettings(enabled=True)})
    try:
        return probe(rules_only.model_copy(update={"settings": settings})), ddp.batch_size
    except DoesNotFitError as error:
        raise DoesNotFitError(
            f"{ddp.fact.partition(':')[0]} in DDP, nor sharded with FSDP2 over the "
            f"{ranks.world_size} ranks (batch {error.batch_size}): it runs out of memory",
            batch_size=error.batch_size,
            fix="use a smaller model, more ranks or larger devices",
        ) from None


def _fsdp_reason(did_not_fit: int, evidence: Any, world: int) -> str:
    """DP4's reason, with the numbers: what DDP could not train, what FSDP2 trained."""
    text = (
        f"DDP did not train batch {did_not_fit} on every rank (out of memory: DDP keeps a "
        f"whole copy of the model, its gradients and optimizer state on each); sharded over "
        f"the {world} ranks with FSDP2 the largest batch that trained was "
        f"{evidence.max_batch_size}"
    )
    ranks = evidence.ranks
    if ranks is not None and ranks.group_samples_per_s is not None:
        text += f", {ranks.group_samples_per_s:,.0f} samples/s together at {evidence.batch_size}"
    return text


def _ranks_record(leader: Any, evidence: Any, rules_only: Profile, wait_s: float) -> RanksRecord:
    """How the ranks probed together: their devices, the group's rate at the recommended batch
    and rank 0's alone at the same batch and settings."""
    choice = evidence.batch_choice
    name = choice.variant if choice is not None else leader.name
    chosen = leader.family.get(name, leader)
    point = next(
        (
            r
            for r in evidence.throughput
            if r.batch_size == evidence.batch_size and r.variant == name and r.steady
        ),
        None,
    )
    alone = None
    if point is not None:
        solo = chosen.alone(evidence.batch_size, seconds=ALONE_S)  # None: sharded
        alone = solo.samples_per_s if solo and solo.fits and solo.samples_per_s else None
    topology = rules_only.topology
    assert topology.backend is not None  # several ranks: a process group
    return RanksRecord(
        world_size=topology.world_size,
        nodes=topology.nodes,
        backend=topology.backend,
        devices=tuple(leader.devices()),
        group_samples_per_s=point.samples_per_s if point is not None else None,
        one_rank_samples_per_s=alone,
        unused_parameters=leader.runner.unused_parameters,
        wait_s=wait_s,
    )


def job_preferences(ranks: Ranks | None, preferences: Preferences) -> Preferences:
    """The preferences of a job torchrun started: its processes per node and nodes, as
    torchrun started them. ``LaunchError`` where the user asked for others: a profile
    measured by 2 ranks was saved as a job of 4, or failed an assertion after the probe."""
    if ranks is None:
        return preferences
    given, started = preferences.processes_per_node, ranks.local_world_size
    if given is not None and given != started:
        raise LaunchError(
            f"--processes-per-node {given}, but torchrun started {started} on this node: the"
            f" job's ranks measure the job they are; leave it out, or start {given}"
        )
    update: dict[str, int] = {}
    if preferences.processes_per_node is None:
        update["processes_per_node"] = ranks.local_world_size
    if preferences.nodes is None:
        update["nodes"] = ranks.nodes
    return preferences.model_copy(update=update)


__all__ = [
    "JobEnd",
    "check_ranks",
    "job_preferences",
    "lookup",
    "probe",
    "ranks_or_none",
    "start_ranks",
    "tune_together",
]


@dataclass(frozen=True)
class JobEnd:
    """How a job of ranks started here ended: its exit code, and where a rank was ended by a
    signal (it could say nothing itself), which rank and which signal."""

    exit_code: int
    rank: int | None = None
    local_rank: int | None = None
    signal: str | None = None


def start_ranks(arguments: list[str], *, nproc_per_node: int) -> JobEnd:
    """Run ``python -m torch_autotune arguments`` as ``nproc_per_node`` ranks on this node
    through torch.distributed.run: the c10d rendezvous on a free local port (several jobs can
    share a host), no restarts (a restarted probe would measure a half-torn-down job)."""
    from torch_autotune.probe.ranks import run_ranks

    code, dead = run_ranks(arguments, nproc_per_node=nproc_per_node)
    if dead is None:
        return JobEnd(code)
    return JobEnd(code, rank=dead[0], local_rank=dead[1], signal=dead[2])


def ranks_or_none() -> Ranks | None:
    """This process's ranks where torchrun started it; None outside torchrun, and where its
    variables are not as torchrun sets them (``recommend()`` never stops a script over them:
    ``tune()`` says what is wrong)."""
    try:
        return ranks_from_environment(os.environ)
    except LaunchError:
        return None


def lookup(
    store: ProfileStore,
    snapshot: HardwareSnapshot,
    writer: str | None,
    workload: str | None,
    ranks: Ranks | None,
    *,
    mode: str = "",
) -> Lookup:
    """``store.lookup`` (in ``mode``) for the job this process belongs to: the profile of its
    world size; where only one process's is stored, that one, with a ``WorldSizeWarning``."""
    world = ranks.world_size if ranks is not None else 1
    found = store.lookup(snapshot, writer, workload, world, mode=mode)
    if found.profile is not None or world == 1:
        return found
    alone = store.lookup(snapshot, writer, workload, mode=mode)
    if alone.profile is not None:
        warnings.warn(
            WorldSizeWarning(
                f"no profile for a job of {world} ranks is stored, so this is the profile of "
                f"one process: its batch ran without DDP, which needs more memory a rank; run "
                f"autotune under torchrun (or autotune --nproc-per-node "
                f"{ranks.local_world_size if ranks else world}) to measure the job"
            ),
            stacklevel=4,
        )
    return alone


def probe(
    ranks: Ranks | None,
    workload: Workload,
    rules_only: Profile,
    *,
    build: Callable[..., Profile],
    budget_s: float,
    started: float,
    max_batch_size: int | None,
    progress: Progress,
    clock: Callable[[], float],
    trials: Callable[[Workload, StepSettings], Trials] | None,
    threads_for: ThreadsFor | None,
) -> Profile:
    """The measured profile of one process, or of the job torchrun started (``tune_together``);
    where not even the smallest batch fits one GPU, the error gives the plan
    (``probe.fit_plan``: what it needs, what was tried, and what is left)."""
    from torch_autotune import compose
    from torch_autotune.probe.fit_plan import with_plan
    from torch_autotune.probe.run import measure

    if ranks is not None and ranks.world_size > 1:  # torchrun's ranks: they probe together
        return tune_together(
            ranks,
            workload,
            rules_only,
            build=build,
            budget_s=budget_s,
            started=started,
            max_batch_size=max_batch_size,
            progress=progress,
            clock=clock,
            threads_for=threads_for,
        )

    def run(profile: Profile) -> ProbeResult:
        return measure(
            workload,
            profile,
            budget_s=budget_s,
            started=started,
            max_batch_size=max_batch_size,
            progress=progress,
            clock=clock,
            trials=trials,
            threads_for=threads_for,
        )

    try:
        result = run(rules_only)
    except DoesNotFitError as error:
        checkpointed = _with_checkpointing(run, rules_only, error)
        if isinstance(checkpointed, DoesNotFitError):
            raise with_plan(checkpointed, workload, rules_only, progress) from None
        result, reason = checkpointed
        measured = compose.measurements(result).model_copy(update={"checkpointing_reason": reason})
        return build(measured, result.evidence)
    return build(compose.measurements(result), result.evidence)


def _with_checkpointing(
    run: Callable[[Profile], ProbeResult], rules_only: Profile, error: DoesNotFitError
) -> tuple[ProbeResult, str] | DoesNotFitError:
    """Where not even the smallest batch trains, the probe again with activation checkpointing
    (rule L2): (what it measured, why it is kept); else ``error``, saying what became of
    checkpointing (the model cannot be checkpointed: ``wrapping.NotCheckpointable``; it does
    not fit either; or the checkpointed run raised, where the plain one ran out of memory and
    raised nothing: an error of the model checkpointed, said in one line; or its recompute,
    checked first, is not the plain step: ``RecomputeDiffersError``). Errors of ours
    (``AutotuneError``) and Ctrl-C go on."""
    from torch_autotune.probe.checkpoint_phase import checked_text, with_plain_search
    from torch_autotune.wrapping import NotCheckpointable

    if rules_only.settings.activation_checkpointing:
        return error
    settings = rules_only.settings.model_copy(update={"activation_checkpointing": True})
    try:
        result = run(rules_only.model_copy(update={"settings": settings}))
    except NotCheckpointable as refused:
        return DoesNotFitError(
            f"{error.fact}; activation checkpointing was not tried: {refused}",
            batch_size=error.batch_size,
            over_cap=error.over_cap,
        )
    except RecomputeDiffersError as wrong:
        return DoesNotFitError(
            f"{error.fact}; activation checkpointing was tried, and {wrong}",
            batch_size=error.batch_size,
            over_cap=error.over_cap,
        )
    except DoesNotFitError as again:
        return DoesNotFitError(
            f"{error.fact}; with activation checkpointing, not even batch {again.batch_size}"
            " trained",
            batch_size=again.batch_size,
            over_cap=again.over_cap,
        )
    except AutotuneError:
        raise  # ours (a rank that failed, an interrupt): the run's to handle
    except Exception as failed:  # only checkpointed: the plain step ran out of memory instead
        return DoesNotFitError(
            f"{error.fact}; activation checkpointing was tried, and the checkpointed step raised"
            f" {said_in_one_line(failed)}",
            batch_size=error.batch_size,
            over_cap=error.over_cap,
        )
    checked = checked_text(*(result.recompute_checked or (None, error.batch_size)))
    short_of = (
        (error.took or "it took more than --memory-limit") if error.over_cap else "out of memory"
    )
    reason = (
        f"not even batch {error.batch_size} trained without it ({short_of}); with each "
        "repeated block's forward recomputed in backward, the largest batch that trained was "
        f"{result.evidence.max_batch_size}; {checked}"
    )
    evidence = with_plain_search(result.evidence, error.trials, rules_only.settings)
    return dataclasses.replace(result, evidence=evidence), reason
