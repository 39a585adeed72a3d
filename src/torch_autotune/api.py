"""The front door: ``detect()``, ``recommend()``, ``tune()`` and ``bench()``, and the few
questions the ``autotune`` command asks of the library.

This is the one place that wires the parts together. Detection (``torch_autotune.detect``)
describes the machine; the rules engine (``rules.engine``, pure) turns the description into a
profile; the probe (``probe.run``) and the bench's runner (``probe.ablation``) only measure;
``compose`` turns what they measured back into a profile; the store (``store``) keeps it. The
host id of the provenance is read here, not in the engine. The command line parses, calls
these functions and renders what they return.

Importing this module is cheap: no torch, no hardware. ``tune()`` and ``bench()`` import the
probe, and with it torch, when they run.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch_autotune import compose, fallback, together
from torch_autotune.bench import TrainConfig
from torch_autotune.detect import Machine
from torch_autotune.detect import detect as detect_machine
from torch_autotune.detect import host as detect_host
from torch_autotune.detect.torch_env import with_threads_here
from torch_autotune.errors import (
    MemoryLimitError,
    StaleProfileWarning,
    StoredProfileWarning,
    StoreError,
    UnusableGpuWarning,
)
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.invariants import check_cpu_counts
from torch_autotune.launch import ranks_from_environment
from torch_autotune.probe.ablation import DEFAULT_ROUNDS, DEFAULT_SECONDS, Measure
from torch_autotune.probe.interrupts import import_torch
from torch_autotune.profile import Evidence, Mode, Preferences, Profile, fingerprint
from torch_autotune.remeasure import measure_again
from torch_autotune.store import Lookup, ProfileStore, machine_id

if TYPE_CHECKING:
    from torch_autotune.probe.seam import Progress, Trials
    from torch_autotune.probe.trials import StepSettings
    from torch_autotune.probe.workloads import Workload


def detect(machine: Machine | None = None, *, deep: bool = False) -> HardwareSnapshot:
    """Describe a machine: this one by default, or the one ``machine`` stands for.

    Fast by default (NVML, the OS and package metadata; torch is not imported and no CUDA
    context is created). ``deep=True`` imports torch to fill what those sources cannot answer.
    Never raises for odd hardware: unreadable fields are None with a warning in the snapshot.
    """
    return detect_machine(machine, deep=deep)


def recommend(
    mode: Mode | str | None = None,
    *,
    workload: str | None = None,
    store: str | Path | None = None,
    machine: Machine | None = None,
) -> Profile:
    """This machine's profile: the stored one when it is fresh, else a rules-only profile.

    ``workload`` names the workload the profile was measured on (``"resnet50"``,
    ``"mypkg.models:make_workload"``, as given to ``autotune -m``). Without it, the profile
    saved last on this machine comes back: the one measured on the last workload ``autotune``
    or ``autotune bench`` ran, as earlier versions did, which is the right one for a user who
    measures their own model. With several workloads measured, name the one you train.

    ``mode`` asks for a mode ("speed", "balanced", "reproducible"; any other is a ValueError
    that lists them); a stored profile of another mode is not returned. Where the store holds
    no profile of the ``workload`` or the ``mode`` asked for, the rules-only profile comes back
    (``profile.measured`` is False) with a ``RulesOnlyWarning`` that names what the store holds
    ("perhaps you meant ..."). A stored profile whose machine changed since is never used: a
    ``StaleProfileWarning`` says what changed and how to measure again, and the rules-only
    profile comes back instead. A stored profile that is corrupt
    or was made for another machine is never used either: a ``StoredProfileWarning`` names
    the file and the fix, and the rules-only profile comes back, so a training script goes on.
    A stored profile that cannot be read (its permissions, a directory in its place) is
    treated the same way: ``recommend()`` never stops a training script over the store.
    A GPU the installed torch cannot run (no kernels for its architecture) gives a CPU profile
    and an ``UnusableGpuWarning`` that names the torch build that would run it. Importing
    torch and starting CUDA are left to the caller. The path is a fast detection, the
    machine's fingerprint and one JSON file from the store; only without a fresh stored
    profile does the rules engine run.
    """
    return profile_for(detect(machine), mode, workload=workload, store=store, writer=machine_id())


def profile_for(
    snapshot: HardwareSnapshot,
    mode: Mode | str | None = None,
    *,
    workload: str | None = None,
    store: str | Path | None = None,
    writer: str | None = None,
) -> Profile:
    """``recommend()`` for a detected ``snapshot``: stored if fresh, else rules only.

    ``writer`` is the machine id whose stale profiles are reported (``machine_id()`` for this
    machine); None for a recorded snapshot of another machine, whose history this store
    cannot know, so nothing is called stale. A rules-only profile says this host wrote it.
    """
    wanted = fallback.mode_asked(mode)
    ranks = together.ranks_or_none()  # under torchrun: the profile of its world size
    try:
        found = ProfileStore(store)
        mode_value = "" if wanted is None else wanted.value
        lookup = together.lookup(found, snapshot, writer, workload, ranks, mode=mode_value)
    except StoreError as error:  # a corrupt or foreign profile, or one that cannot be read
        warnings.warn(StoredProfileWarning(error), stacklevel=3)
        lookup = Lookup(None, None, "unusable")  # said: no second warning below
    if lookup.profile is not None and wanted in (None, lookup.profile.mode):
        _warn_if_gpu_unused(lookup.profile)
        return lookup.profile
    if lookup.stale is not None:
        what = "the stored profile" if workload is None else f"the profile stored for {workload}"
        evidence = lookup.stale.evidence  # the workload it was measured on is measured again
        again = measure_again(workload or (evidence.workload if evidence else None), lookup.stale)
        warnings.warn(
            StaleProfileWarning(
                f"{what} was made before this machine changed ({lookup.stale_reason}); using"
                f" rules only: {again}"
            ),
            stacklevel=3,
        )
    preferences = together.job_preferences(ranks, Preferences(mode=wanted or Mode.SPEED))
    profile = rules_profile(snapshot, preferences)
    if lookup.stale_reason is None:  # else said above; here, why not what was asked for
        fallback.warn_if_asked_for(store, profile, workload, wanted)
    _warn_if_gpu_unused(profile)
    return profile


def unused_gpu_reason(profile: Profile) -> str | None:
    """Why ``profile`` trains on the CPU although its machine has a GPU (rules catalog E1:
    torch ships no kernels for the GPU, or is a CPU build), in one line; None otherwise."""
    decision = profile.decision("device")
    if decision is None or decision.rule != "E1":
        return None
    reason = decision.reason.removeprefix("No GPU profile: ").rstrip(".")
    return f"training on the CPU although this machine has a GPU: {reason}"


def _warn_if_gpu_unused(profile: Profile) -> None:
    reason = unused_gpu_reason(profile)
    if reason is not None:
        warnings.warn(UnusableGpuWarning(reason), stacklevel=4)


def rules_profile(
    snapshot: HardwareSnapshot, preferences: Preferences, *, host_id: str | None = None
) -> Profile:
    """The profile the rules give for ``snapshot`` and ``preferences``, nothing measured
    (``autotune recommend``). ``host_id`` defaults to this host's id."""
    from torch_autotune.rules.engine import build_profile

    host = machine_id() if host_id is None else host_id
    return build_profile(snapshot, preferences=preferences, host_id=host)


def tune(
    workload: Any = None,
    *,
    model: Any = None,
    optimizer: Any = None,
    dataset: Any = None,
    loader: Any = None,
    example_batch: Any = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    loss_fn: Callable[..., Any] | None = None,
    train_step: Callable[[Any, Any], Any] | None = None,
    datamodule: Any = None,
    blocks: Any = None,
    name: str | None = None,
    min_batch_size: int | None = None,
    snapshot: HardwareSnapshot | None = None,
    mode: Mode | str = Mode.SPEED,
    budget_s: float | None = None,
    max_batch_size: int | None = None,
    target_global_batch: int | None = None,
    fixed_shapes: bool = True,
    num_workers: int | None = None,
    processes_per_node: int | None = None,
    memory_limit_gib: float | None = None,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.perf_counter,
    trials: Callable[[Workload, StepSettings], Trials] | None = None,
) -> Profile:
    """Probe this machine with a workload and return the measured profile (not saved:
    ``save(profile)`` keeps it).

    ``workload``: a built-in name ("conv", "resnet50", "transformer", "gpt2", "mlp"),
    "package.module:factory", a factory function, a dict of the objects below, or an object
    that trains as it is (a Hugging Face ``Trainer``, a ``LightningModule``); by default the
    built-in sized for the device the rules choose. Or the objects themselves: ``model``,
    ``optimizer`` (an optimizer, rebuilt over each copy of the model the probe trains, or a
    factory ``params -> optimizer``), ``dataset`` or ``loader`` (a DataLoader, taken apart) or
    ``example_batch``, and optionally ``collate_fn``, ``loss_fn`` or ``train_step(model,
    batch) -> loss``; ``datamodule``: a ``LightningDataModule`` whose ``train_dataloader()``
    is the data (``tune(module, datamodule=dm)`` trains a ``LightningModule`` through its own
    ``training_step`` and ``configure_optimizers``); ``blocks``: the classes of the model's
    repeated blocks (a module class or a list of them), what activation checkpointing
    recomputes and FSDP2 shards, where the ones found in its module tree are not (the profile
    keeps their names); ``name`` names them in the store (default: the model's class).
    ``min_batch_size`` is where the search starts. ``snapshot`` describes the machine instead
    of detecting it. ``budget_s`` bounds the whole run, detection included (default 120 s,
    180 s where torch.compile is measured). ``processes_per_node``: the training processes
    the profile is for (DDP ranks, torchrun's ``--nproc-per-node``; default one per GPU, one
    on the CPU): they share the CPUs, the workers are measured per process and the global
    batch is spread over them (``Profile.topology``). ``memory_limit_gib``: the device memory
    the probe may use, as on a smaller or shared GPU (the allocator's per-process fraction; on
    the CPU, the host RAM it may fill), recorded in the profile; more than the device has, or
    any on MPS, raises ``MemoryLimitError`` (a ValueError). The user's model, optimizer
    state, RNG and torch's global flags are as before when this returns or raises.
    ``trials`` replaces the real training steps and ``clock`` the timer (tests drive the
    orchestration with recorded timings through them).

    Long by design: the signature is the public API's, a keyword argument a line.
    """
    compose.check_tune_arguments(
        budget_s,
        max_batch_size,
        target_global_batch,
        num_workers,
        min_batch_size,
        processes_per_node=processes_per_node,
        memory_limit_gib=memory_limit_gib,
    )
    check_cpu_counts({"num_workers": num_workers}, detect_host.cpus_usable_here)
    if trials is None:
        import_torch()
    from torch_autotune.probe.budget import default_budget_s
    from torch_autotune.rules.context import Measurements
    from torch_autotune.rules.engine import build_profile

    objects = {"model": model, "optimizer": optimizer, "dataset": dataset, "loader": loader}
    objects |= {"example_batch": example_batch, "collate_fn": collate_fn, "loss_fn": loss_fn}
    objects |= {"train_step": train_step, "datamodule": datamodule}
    report = progress or (lambda _phase, _what: None)
    started = clock()
    report("detect", "this machine")
    machine = snapshot or detect()
    if snapshot is not None:  # the profile is held to the machine it describes as well
        check_cpu_counts({"num_workers": num_workers}, lambda: snapshot.host.cpus_usable)
    if trials is None:  # the steps run in this process, at its threads (torch's pool or not)
        machine = with_threads_here(machine)
    host = machine_id()
    options = {"name": name, "min_batch_size": min_batch_size, "blocks": blocks}
    chosen = _workload(workload, machine, host, objects, **options)
    ranks = None if trials is not None else ranks_from_environment(os.environ)
    preferences = together.job_preferences(
        ranks,
        compose.preferences(
            chosen,
            Mode(mode),
            fixed_shapes,
            num_workers,
            target_global_batch,
            processes_per_node=processes_per_node,
            memory_limit_gib=memory_limit_gib,
            max_batch_size=max_batch_size,
        ),
    )
    rules_only = build_profile(machine, preferences=preferences, host_id=host)
    too_much = compose.memory_limit_problem(rules_only)
    if too_much is not None:
        raise MemoryLimitError(too_much)
    kept = compose.workload_target(preferences, chosen, rules_only.topology.world_size)
    if kept is not preferences:  # the global batch a Trainer accumulates to is the target
        preferences, rules_only = kept, build_profile(machine, preferences=kept, host_id=host)
    chosen = chosen.per_rank(rules_only.topology.world_size)
    total = budget_s if budget_s is not None else default_budget_s(rules_only)
    report("budget", f"{total:g} s")

    def threads_for(workers: int) -> int | None:  # the threads the rules set beside them
        measured = Measurements(num_workers=workers)
        return build_profile(machine, measured, preferences, host_id=host).settings.cpu_threads

    def build(measured: Measurements, evidence: Evidence) -> Profile:
        return build_profile(machine, measured, preferences, evidence=evidence, host_id=host)

    return together.probe(
        ranks,
        chosen,
        rules_only,
        build=build,
        budget_s=total,
        started=started,
        max_batch_size=compose.largest_asked(
            max_batch_size,
            preferences.target_global_batch,
            rules_only.topology.world_size,
            chosen.min_batch_size,
            rules_only.topology.batch_multiple,
        ),
        progress=report,
        clock=clock,
        trials=trials,
        threads_for=threads_for,
    )


def _workload(
    workload: Any, machine: HardwareSnapshot, host: str, objects: dict[str, Any], **options: Any
) -> Workload:
    """The workload asked for, in any of its forms (``resolve_workload``, with ``options``:
    its name, smallest batch and blocks); by default the built-in sized for the device the
    rules choose."""
    from torch_autotune.probe.workloads import resolve_workload
    from torch_autotune.rules.engine import build_profile

    given = {key: value for key, value in objects.items() if value is not None}
    device = None
    if workload is None and not given:
        device = build_profile(machine, host_id=host).settings.device
    return resolve_workload(workload, device=device, objects=given, **options)


def bench(
    profile: Profile | None = None,
    workload: Any = None,
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
    ``workload``: default the one the profile was measured on; any form ``tune()`` takes (a
    profile measured on objects needs them again: a dict of them). ``baseline``: default fp32,
    batch 32, no workers, no pinning, eager, torch's default backends; it is held to this
    machine's CPUs, and so is the profile where the real loop trains it (a ValueError, the
    line ``autotune bench`` prints). Every arm runs once per round, ``rounds`` rounds, each
    measurement at least ``seconds`` long after its warm-up. ``measure`` replaces the real
    training loop: (config, seconds) -> samples/s.
    """
    from torch_autotune.bench import apply_bench

    here = profile if measure is None else None  # it trains here: held to this machine's CPUs
    compose.check_bench_arguments(rounds, seconds, baseline, detect_host.cpus_usable_here, here)
    if measure is None:
        import_torch()
    started = clock()
    from torch_autotune.probe.ablation import run_arms
    from torch_autotune.probe.workloads.resolve import (
        measured_on,
        objects_name,
        resolve_workload,
        workload_of,
    )

    given = None if workload is None else resolve_workload(workload, name=objects_name(profile))
    if profile is None:
        profile = tune(given, budget_s=budget_s, progress=progress, clock=clock)
    measured_on(profile)  # a rules-only profile cannot be benched
    chosen = given or workload_of(profile)
    plan, not_ablated = compose.bench_plan(
        profile, baseline, has_dataset=chosen.dataset is not None, workload=chosen.name
    )
    if progress is not None:  # what is left, from the arms planned (a guess before they were)
        arms_s = compose.arms_estimate_s(len(plan.configs), rounds, seconds)
        progress("estimate", f"{arms_s:.0f} s for {len(plan.configs)} arms x {rounds} rounds")
    results = run_arms(
        plan,
        chosen,
        profile.settings,
        mode=profile.mode.value,
        rounds=rounds,
        seconds=seconds,
        progress=progress,
        measure=measure,
        clock=clock,
        memory_limit_bytes=profile.provenance.preferences.memory_limit_bytes,
        evidence=profile.evidence,
    )
    evidence = compose.bench_evidence(
        results, workload=chosen.name, device=profile.settings.device, rounds=rounds,
        seconds=seconds, not_ablated=not_ablated, elapsed_s=clock() - started,
    )  # fmt: skip
    return apply_bench(profile, plan, evidence)


# --- what the command line asks ---------------------------------------------------------------


def default_tune_budget_s() -> float:
    """The longest default budget of a run (where torch.compile is measured), for a progress
    bar drawn before the rules have said whether it is."""
    from torch_autotune.probe.budget import DEFAULT_COMPILE_BUDGET_S

    return DEFAULT_COMPILE_BUDGET_S


def host_id() -> str:
    """This host's machine id (a hash of its host name), as profiles and the store record it."""
    return machine_id()


def save(profile: Profile, store: str | Path | None = None, *, force: bool = False) -> Path:
    """Store ``profile`` for its machine (and its workload, when measured); return the file.

    ``recommend(workload=profile.evidence.workload)`` returns it on this machine, and so does
    ``recommend()`` until another profile is saved; a profile from ``tune()`` on objects is
    stored under its workload's name (the model's class, or ``name=``). The file returned is
    the profile as JSON, which ``autotune export --profile FILE`` reads. ``store``: the store's
    directory (default as ``recommend()``'s). A rules-only profile replaces a measured one only
    with ``force`` (``MeasuredProfileExistsError`` otherwise)."""
    return ProfileStore(store).save(profile, force=force)


def stored_measured(store: str | Path | None, workload: str | None) -> Profile | None:
    """The stored profile measured on ``workload`` for this machine (default: the machine's
    profile saved last), or None when there is none or it was not measured."""
    stored = ProfileStore(store).load(fingerprint(detect()), workload)
    return stored if stored is not None and stored.evidence is not None else None


def bench_estimate(
    profile: Profile | None,
    rounds: int,
    seconds: float,
    budget_s: float | None,
    baseline: TrainConfig | None = None,
) -> tuple[float, str]:
    """Seconds ``bench(profile, rounds=..., seconds=...)`` should take, for a progress bar, and
    how that is made, in words; with no measured profile, the tuning it does first
    (``budget_s`` or the longest default)."""
    tune_s = budget_s if budget_s is not None else default_tune_budget_s()
    return compose.bench_estimate(profile, rounds, seconds, tune_s, baseline)


def settings_diff(first: Profile, second: Profile) -> list[tuple[str, Any, Any]]:
    """The settings two profiles disagree on: (dotted setting, first's value, second's)."""
    return compose.settings_diff(first, second)
