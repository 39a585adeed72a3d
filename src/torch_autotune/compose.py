"""The pure steps of ``torch_autotune.api``: from what was measured to a profile, and what the
command line asks about profiles. No hardware, no store, no torch.

``api`` calls these in order; they are here so that the front door reads as the wiring alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch_autotune import knobs
from torch_autotune.bench import (
    BenchEvidence,
    Plan,
    TrainConfig,
    plan_arms,
    tuned_config,
)
from torch_autotune.bounds import (
    MAX_BATCH_SIZE,
    MAX_BYTES,
    MAX_CPUS,
    MAX_GLOBAL_BATCH,
    MAX_ROUNDS,
    MAX_SECONDS,
    MAX_WORKERS,
    memory_limit_refused,
)
from torch_autotune.errors import MemoryLimitError
from torch_autotune.invariants import check_cpu_counts, cpu_counts, device_accelerators
from torch_autotune.profile import Mode, Preferences, Profile
from torch_autotune.settings import RECORD_BY_NAME, memory_settings, torch_defaults

if TYPE_CHECKING:
    from torch_autotune.probe.ablation import ArmResults
    from torch_autotune.probe.run import ProbeResult
    from torch_autotune.probe.workloads import Workload
    from torch_autotune.rules.context import Measurements

ARM_WARMUP_S = 1.0
"""A guess at one arm's warm-up beyond its measured seconds, for the bench's time estimate."""
TUNE_FIRST_ARMS = 4
"""Arms the estimate assumes when the bench tunes first and cannot plan its arms yet."""

_LOADER_FIELDS = ("num_workers", "prefetch_factor", "pin_memory")


def check_tune_arguments(
    budget_s: float | None,
    max_batch_size: int | None,
    target_global_batch: int | None,
    num_workers: int | None,
    min_batch_size: int | None = None,
    *,
    processes_per_node: int | None = None,
    memory_limit_gib: float | None = None,
) -> None:
    """ValueError for a number no run can use: a budget that is not finite and positive, a
    count that is not an int or is outside what a machine can have (``torch_autotune.bounds``),
    a memory limit outside ``bounds.memory_limit_refused``'s (``MemoryLimitError``, with the
    CLI's line), a smallest batch above the largest."""
    if budget_s is not None and not (math.isfinite(budget_s) and 0 < budget_s <= MAX_SECONDS):
        raise ValueError(
            f"budget_s must be a number of seconds > 0 and at most {MAX_SECONDS:g}, got {budget_s}"
        )
    if memory_limit_gib is not None:
        if isinstance(memory_limit_gib, bool) or not isinstance(memory_limit_gib, (int, float)):
            raise ValueError(f"memory_limit_gib must be a number of GiB, got {memory_limit_gib!r}")
        refused = memory_limit_refused(memory_limit_gib)  # the CLI's line, bound for bound
        if refused is not None:
            raise MemoryLimitError(refused)
    for name, value, low, high in (
        ("max_batch_size", max_batch_size, 1, MAX_BATCH_SIZE),
        ("min_batch_size", min_batch_size, 1, MAX_BATCH_SIZE),
        ("target_global_batch", target_global_batch, 1, MAX_GLOBAL_BATCH),
        ("num_workers", num_workers, 0, MAX_WORKERS),
        ("processes_per_node", processes_per_node, 1, MAX_CPUS),
    ):
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an int, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    if (min_batch_size or 0) > (max_batch_size or MAX_BATCH_SIZE):
        raise ValueError(
            f"min_batch_size ({min_batch_size}) must be at most max_batch_size ({max_batch_size})"
        )


def preferences(
    workload: Workload,
    mode: Mode,
    fixed_shapes: bool,
    num_workers: int | None,
    target_global_batch: int | None,
    *,
    processes_per_node: int | None = None,
    memory_limit_gib: float | None = None,
    max_batch_size: int | None = None,
) -> Preferences:
    """What the rules are told about ``workload`` and what the user asked for: its kind, its
    optimizer (and what builds it fused, where something does), whether its shapes are fixed
    (asked by the user, and seen in its data), the workers, the global batch, the largest batch
    to try, the training processes per node, the device memory to use and the classes of its
    blocks, where it names them."""
    limit = None if memory_limit_gib is None else max(1, int(memory_limit_gib * 2**30))
    return Preferences(
        memory_limit_bytes=limit,
        mode=mode,
        model_kind=workload.kind,
        fixed_shapes=fixed_shapes and not workload.variable_shapes,
        optimizer=workload.optimizer,
        optimizer_fused_by=workload.fused_by,
        num_workers=num_workers,
        target_global_batch=target_global_batch,
        max_batch_size=max_batch_size,
        processes_per_node=processes_per_node,
        blocks=",".join(workload.blocks) or None,
    )


def workload_target(preferences: Preferences, workload: Workload, processes: int) -> Preferences:
    """``preferences`` with the global batch ``workload`` trains as the target of accumulation
    (rule L1), where the user asked for none and the workload fixes its samples per optimizer
    step (``Workload.update_samples``: a Trainer's per_device_train_batch_size x
    gradient_accumulation_steps), over each of the job's ``processes``, as the Trainer's
    arguments are per device; what set it in words (``target_global_batch_from``). One above
    ``MAX_GLOBAL_BATCH`` is no target a profile holds: it is not kept, and the words, with the
    global batch they make, are recorded alone, so that rule L1 says why there is none."""
    update = workload.update_samples
    if preferences.target_global_batch is not None or update is None:
        return preferences
    samples, words = update
    target = samples * processes
    spread = f" x {processes} processes" if processes > 1 else ""
    if target > MAX_GLOBAL_BATCH:
        made = f"{words}{spread} = a global batch of {target:,}"
        return preferences.model_copy(update={"target_global_batch_from": made})
    return preferences.model_copy(
        update={"target_global_batch": target, "target_global_batch_from": f"{words}{spread}"}
    )


def largest_asked(
    max_batch_size: int | None, target: int | None, processes: int, smallest: int, multiple: int
) -> int | None:
    """The largest batch a process may try: ``--max-batch-size``, and no more than its share of
    the target global batch (``--target-batch`` over the job's processes, rounded up to whole
    samples and to the batch's ``multiple``, at least the workload's ``smallest``), which
    accumulation then makes up. A larger batch trains a larger global batch than asked; a
    share rounded down would need a second accumulation step, nearly twice the target (100
    over 3 processes: 33 x 2 x 3 = 198, where 34 x 1 x 3 = 102)."""
    share = None if target is None else max(smallest, -(-target // max(1, processes)))
    if share is not None and share >= multiple > 1:  # below the multiple, K4 keeps the size
        share = -(-share // multiple) * multiple
    asked = [size for size in (max_batch_size, share) if size is not None]
    return min(asked) if asked else None


def memory_limit_problem(rules_only: Profile) -> str | None:
    """The one line that refuses the ``--memory-limit`` of ``rules_only``'s preferences where it
    is more than the device it trains on has (host RAM on the CPU, within a container's limit;
    the smallest of the GPUs on a GPU, where every rank is held to it), or on MPS, where
    nothing holds it; None where it is not, or where the snapshot does not say (a Jetson's GPU
    shares the host's RAM)."""
    asked = rules_only.provenance.preferences.memory_limit_bytes
    snapshot, device = rules_only.provenance.snapshot, rules_only.settings.device
    if asked is None:
        return None
    if device == "cuda":
        gpus = [a for a in device_accelerators(device, snapshot) if a.memory_total_bytes]
        if not gpus:
            return None
        smallest = min(gpus, key=lambda a: a.memory_total_bytes or 0)
        has, what = smallest.memory_total_bytes or 0, f"the {smallest.name}'s memory"
    elif device == "cpu":
        host = snapshot.host
        has = min(v for v in (host.memory_total_bytes, host.memory_limit_bytes, MAX_BYTES) if v)
        what = "this machine's host RAM"
        if host.memory_limit_bytes is not None and has == host.memory_limit_bytes:
            what = "the host RAM this container may use (its memory limit)"
    else:  # MPS: neither the allocator's fraction nor the CPU's trial cap is set there
        return (
            f"--memory-limit {asked / 2**30:g}: the probe trains on MPS, where it holds no "
            "limit (only a CUDA GPU's allocator, or host RAM on the CPU); leave it out"
        )
    most = math.floor(has / 2**30 * 100) / 100
    if asked <= has:
        return None
    return (
        f"--memory-limit {asked / 2**30:g} is more than {what}, {most:g} GiB:"
        f" the probe trains on the {'GPU' if device == 'cuda' else 'CPU'}, and no limit above "
        f"what it has can hold; ask for {most:g} or less"
    )


def check_bench_arguments(
    rounds: int,
    seconds: float,
    baseline: TrainConfig | None = None,
    cpus: Callable[[], int] | None = None,
    profile: Profile | None = None,
) -> None:
    """ValueError for rounds outside [1, MAX_ROUNDS] or seconds outside (0, MAX_SECONDS], or a
    ``baseline`` or ``profile`` asking for more workers or threads than ``cpus()`` usable CPUs
    can run (``check_cpu_counts``: the bounds of a baseline file). The bench trains both here,
    so a profile made for a larger machine is held to this one's."""
    if not 1 <= rounds <= MAX_ROUNDS or not (math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        raise ValueError(
            f"rounds must be in [1, {MAX_ROUNDS}] and seconds > 0 and at most {MAX_SECONDS:g}, "
            f"got {rounds} and {seconds}"
        )
    if baseline is not None and cpus is not None:
        counts = {"num_workers": baseline.num_workers, "cpu_threads": baseline.cpu_threads}
        check_cpu_counts(counts, cpus, lambda name: f"baseline: {name}")
    if profile is not None and cpus is not None:
        check_cpu_counts(cpu_counts(profile.settings), cpus, lambda name: f"profile: {name}")


def measurements(result: ProbeResult) -> Measurements:
    """What the rules engine takes from a probe run: the batch size and how it was chosen, the
    worker count and the compile decision. The gradient accumulation that keeps a target
    global batch is the batch rule's (L1), over the processes of the profile's topology."""
    from torch_autotune.rules.context import Measurements

    evidence = result.evidence
    compile_record = evidence.compile
    return Measurements(
        batch_size=evidence.batch_size,
        num_workers=result.num_workers,
        workers_reason=evidence.workers_reason,  # also why they were not measured
        batch_reason=evidence.fed_reason,
        compile_enabled=(
            compile_record.kept if compile_record is not None and compile_record.measured else None
        ),
        compile_reason=None if compile_record is None else compile_record.reason,
        batch_choice=evidence.batch_choice,
        checkpointing_reason=result.checkpointing_reason,
        checkpointing_note=result.checkpointing_note,
        memory_budget=result.memory_budget,
        memory_budget_reason=result.memory_budget_reason,
        optimizer_memory=evidence.optimizer_memory,
        allocator=evidence.allocator,
        cpu_threads=None if result.threads is None else result.threads.threads,
        threads_reason=None if result.threads is None else result.threads.reason,
    )


def bench_plan(
    profile: Profile, baseline: TrainConfig | None, *, has_dataset: bool, workload: str
) -> tuple[Plan, tuple[str, ...]]:
    """The bench's arms for ``profile`` against ``baseline`` (default: ``TrainConfig()``), and
    what the bench does not ablate. A workload without a dataset keeps the baseline's
    DataLoader settings in every arm: there is nothing to load. A workload whose optimizer is
    built fused (``Preferences.optimizer_fused_by``) trains fused in every arm, the baseline's
    too: no arm is said to run without it."""
    base = baseline or TrainConfig()
    not_ablated = list(knobs.not_ablated(profile.settings))
    fixed = profile.provenance.preferences.optimizer_fused_by
    if fixed is not None:  # every arm's optimizer is built fused: none runs without it
        base = base.model_copy(update={"fused_optimizer": True})
        not_ablated.append(f"fused optimizer: fixed by {fixed}, which trains every arm fused")
    tuned = tuned_config(profile, base)
    if not has_dataset:
        tuned = tuned.model_copy(update={f: getattr(base, f) for f in _LOADER_FIELDS})
        not_ablated.append(
            f"DataLoader settings: the {workload} workload has no dataset to load from"
        )
    off_batch, required = _recompute_off(profile)
    return plan_arms(base, tuned, off_batch=off_batch, required=required), tuple(not_ablated)


RECOMPUTE_SETTINGS = ("activation_checkpointing", "compile_memory_budget")
"""The settings that trade memory for recompute (rule L2): kept where they fit a larger batch
that trains faster, so off, they train the batch that fit without them."""


def _recompute_off(profile: Profile) -> tuple[dict[str, int], dict[str, str]]:
    """How the bench switches off a setting of ``RECOMPUTE_SETTINGS`` the profile keeps: at the
    batch of the fastest steady point the probe ran without it and with the profile's other
    settings that change memory (``off_batch``); where none ran, it cannot be switched off
    (``required``, with the profile's reason: not even the smallest batch trained). Compile
    goes off with its memory budget (``couples``), so it too takes the batch that ran eager."""
    off_batch: dict[str, int] = {}
    required: dict[str, str] = {}
    if profile.evidence is None:
        return off_batch, required
    for name in RECOMPUTE_SETTINGS:
        record = RECORD_BY_NAME[name]
        if record.changed is None or not record.changed(profile.settings):
            continue
        batch = _fastest_without(profile, (name,))
        if batch is not None:
            off_batch[name] = batch
            continue
        decision = profile.decision(record.paths[0])
        why = decision.reason.removeprefix("on: ") if decision is not None else "it is on"
        required[name] = f"no batch trained without it here ({why})"
    if "compile_memory_budget" in off_batch | required:
        eager = _fastest_without(profile, ("compile", "compile_memory_budget"))
        off_batch.update({} if eager is None else {"compile": eager})
    return off_batch, required


def _fastest_without(profile: Profile, names: tuple[str, ...]) -> int | None:
    """The batch of the fastest steady point the probe ran with ``names`` at torch's default
    and the profile's other settings that change memory (None: no such point ran)."""
    assert profile.evidence is not None
    defaults = memory_settings(torch_defaults(profile.settings.device))
    wanted = {**memory_settings(profile.settings), **{n: defaults[n] for n in names}}
    ran = {
        v.name
        for v in profile.evidence.variants
        if all(v.settings.get(k, defaults[k]) == shown for k, shown in wanted.items())
    }
    points = [t for t in profile.evidence.throughput if t.variant in ran and t.steady]
    return max(points, key=lambda t: t.samples_per_s).batch_size if points else None


def bench_evidence(
    results: ArmResults,
    *,
    workload: str,
    device: str,
    rounds: int,
    seconds: float,
    not_ablated: tuple[str, ...],
    elapsed_s: float,
) -> BenchEvidence:
    """The bench's evidence from what its rounds measured. The profile counts as reverted when
    it is, after its drops, still slower than the baseline (rule M2); where every setting was
    dropped (rule M1), it is the baseline already, and nothing is left to revert."""
    overall = None if results.final_is_baseline else results.final or results.tuned
    return BenchEvidence(
        workload=workload,
        device=device,
        rounds=rounds,
        seconds_per_measurement=seconds,
        arms=results.records,
        tuned=results.tuned,
        settings=results.settings,
        final=results.final,
        final_is_baseline=results.final_is_baseline,
        reverted=overall is not None and overall.verdict == "slower",
        not_ablated=not_ablated,
        elapsed_s=round(max(0.0, elapsed_s), 3),
    )


def arms_estimate_s(arms: int, rounds: int, seconds: float) -> float:
    """Seconds ``arms`` arms should take over ``rounds`` rounds: each measured ``seconds``, plus
    a guess at its start (``ARM_WARMUP_S``)."""
    return float(arms * rounds * (seconds + ARM_WARMUP_S))


def bench_estimate(
    profile: Profile | None,
    rounds: int,
    seconds: float,
    tune_budget_s: float,
    baseline: TrainConfig | None = None,
) -> tuple[float, str]:
    """Seconds a bench should take, for a progress bar, and how that is made, in words: 'about
    45 s: 3 arms x 5 rounds x (2 s + about 1 s to start each)'; where there is no measured
    profile yet, the tuning's budget first, and the arms guessed (``TUNE_FIRST_ARMS``) until
    the profile it measures says how many."""
    arms = (
        TUNE_FIRST_ARMS
        if profile is None
        else len(plan_arms(baseline or TrainConfig(), tuned_config(profile, baseline)).configs)
    )
    arms_s = arms_estimate_s(arms, rounds, seconds)
    plural = "s" if rounds != 1 else ""
    how = (
        f"{'about ' if profile is None else ''}{arms} arms x {rounds} round{plural} x"
        f" ({seconds:g} s + about {ARM_WARMUP_S:g} s to start each)"
    )
    if profile is None:
        total = tune_budget_s + arms_s
        return total, f"about {total:.0f} s: tuning first (budget {tune_budget_s:g} s), then {how}"
    return arms_s, f"about {arms_s:.0f} s: {how}"


def settings_diff(first: Profile, second: Profile) -> list[tuple[str, Any, Any]]:
    """The settings two profiles disagree on: (dotted setting, first's value, second's value),
    sorted by setting; a setting one of them lacks has the value None there."""
    a, b = _flatten(first.settings.model_dump()), _flatten(second.settings.model_dump())
    return [
        (key, a.get(key), b.get(key)) for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)
    ]


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
