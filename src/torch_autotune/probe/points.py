"""Steady throughput points: which sizes to measure, how the phase's time is shared, the
fastest steady point, and how the recommended batch was chosen. No torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch_autotune.evidence import BatchChoice, ChosenBy, Confirmed, FedWhy
from torch_autotune.probe.budget import Budget, Skip
from torch_autotune.probe.guard import rounded_seconds
from torch_autotune.probe.seam import Progress, Trials
from torch_autotune.probe.search import apply_margin, round_down
from torch_autotune.probe.timemodel import TimeModel
from torch_autotune.probe.trials import MIN_BLOCKS, PointOutcome
from torch_autotune.profile import EAGER, SearchTrialRecord, ThroughputRecord

FASTEST_WITHIN = 0.03  # "the smallest size within a few percent of the best"
THROUGHPUT_POINTS = 3  # the top candidate and two halvings of it

# --- the throughput phase, and the points of every variant -----------------------------------


Room = tuple[int, int, int]
"""K2's margin kept in memory: (a size that trained, its peak bytes, the bytes trials may use)."""


def candidates(
    largest: int,
    limited_by: str,
    multiple: int,
    fixed_shapes: bool,
    *,
    floor: int = 1,
    room: Room | None = None,
) -> list[int]:
    """The sizes worth measuring, largest first: the top candidate (``top``), rounded to
    ``multiple`` (K4), and two halvings of it; none below ``floor``, the smallest size the
    model trains at."""
    top = max(floor, round_down(top_candidate(largest, limited_by, fixed_shapes, room), multiple))
    sizes = {max(floor, round_down(top >> shift, multiple)) for shift in range(THROUGHPUT_POINTS)}
    return sorted(sizes, reverse=True)


def top_candidate(largest: int, limited_by: str, fixed_shapes: bool, room: Room | None) -> int:
    """The largest batch that trained, less K2's margin where memory limited it: a tenth of
    its samples (a fifth where shapes vary), or, where that leaves fewer, the largest size
    whose measured peak left that share of the memory free (``room``)."""
    margin = margin_for(limited_by, fixed_shapes)
    if margin is None:
        return largest
    deciding = room_deciding(largest, limited_by, fixed_shapes, room)
    return deciding[0] if deciding is not None else apply_margin(largest, margin)


def room_deciding(
    largest: int, limited_by: str, fixed_shapes: bool, room: Room | None
) -> Room | None:
    """``room`` where its margin in memory leaves a larger top candidate than the margin in
    samples does (it sets the top, and the batch's reason gives it); None elsewhere."""
    margin = margin_for(limited_by, fixed_shapes)
    if margin is None or room is None or room[0] <= apply_margin(largest, margin):
        return None
    return room


def room_in(
    records: Sequence[SearchTrialRecord], limit: int | None, limited_by: str, fixed_shapes: bool
) -> Room | None:
    """The largest size that trained whose peak left K2's margin of the device's memory free
    (``limit``: the bytes the trials may use, the runner's ``memory_limit``: None on the CPU,
    where a process's peak is not the step's), where memory limited the search; None
    elsewhere, or where no size that trained left it. K2's evidence keeps its margin in
    memory (Accelerate: "90% of the memory ... 10% for the buffer"); taken in samples alone it
    cuts a small batch by far more (GPT-2 large under 24 GiB on an H200: 5 trained with 14% of
    the memory free at its peak, 10% of 5 samples left 4; checkpointed, 16 with 19% free
    became 14, then 8 rounded down to K4's multiple)."""
    margin = margin_for(limited_by, fixed_shapes)
    if margin is None or limited_by != "memory" or not limit:
        return None
    roomy = [
        (r.batch_size, r.peak_memory_bytes)
        for r in records
        if r.fits and r.peak_memory_bytes and r.peak_memory_bytes <= (1 - margin) * limit
    ]
    if not roomy:
        return None
    size, peak = max(roomy)
    return size, peak, limit


def margin_for(limited_by: str, fixed_shapes: bool) -> float | None:
    """Catalog K2: the share left as headroom where memory limited the largest batch (of its
    samples, or of the memory: ``top_candidate``), 10% for fixed shapes and 20% where they
    vary; None where memory did not limit it."""
    if limited_by not in ("memory", "host RAM"):
        return None
    return 0.1 if fixed_shapes else 0.2


def batch_choice(
    *,
    largest: int,
    limited_by: str,
    fixed_shapes: bool,
    top: int,
    multiple: int,
    best: ThroughputRecord | None,
    records: Sequence[ThroughputRecord],
    confirmed: Sequence[SearchTrialRecord],
    candidate: int,
    room: Room | None = None,
) -> BatchChoice:
    """How the recommended batch was chosen (``BatchChoice``), from what the run measured:
    ``best`` the fastest steady point (None: none was steady), ``records`` every point,
    ``confirmed`` the runs that confirmed ``candidate`` (empty: it was not run again). The
    best rate is the chosen variant's own points' (those ``best`` was chosen among), never a
    variant's the probe measured and did not keep (compile within the noise, measured at
    another batch: the summary called it the eager best). ``room``: the candidates' (their
    ``Room``), recorded where its margin in memory set the top candidate."""
    variant = EAGER if best is None else best.variant
    steady = [r for r in records if r.steady and r.variant == variant]
    peak = max(steady, key=lambda r: r.samples_per_s, default=None)
    if best is not None:
        chosen_by: ChosenBy = "fastest point"
        how: Confirmed = "its point"
    else:
        chosen_by = "largest point" if any(r.variant == EAGER for r in records) else "top candidate"
        how = "not run again"
        if confirmed and confirmed[-1].step == POINT_CONFIRMS:
            chosen_by = "fastest unsteady point"  # ``unsteady_choice``
            how = "its point"  # not steady, but it trained after the search with these settings
        elif confirmed:
            how = "ran again" if confirmed[-1].batch_size == candidate else "stepped down"
    return BatchChoice(
        chosen_by=chosen_by,
        largest=largest,
        top=top,
        margin=margin_for(limited_by, fixed_shapes),
        memory_room=room_deciding(largest, limited_by, fixed_shapes, room),
        limited_by=limited_by,
        multiple=multiple,
        variant=variant,
        samples_per_s=None if best is None else best.samples_per_s,
        best_samples_per_s=None if peak is None else peak.samples_per_s,
        best_batch_size=None if peak is None else peak.batch_size,
        confirmed=how,
    )


def fed_choice(choice: BatchChoice, why: FedWhy | None) -> BatchChoice:
    """``choice`` where the passes chose the batch (``probe.fed``, ``probe.own_threads``), for
    ``why``, what their batch reason gives: it ran in its pass, with these settings."""
    return choice.model_copy(update={"fed": True, "confirmed": "its fed pass", "fed_why": why})


def point_record(point: PointOutcome, *, variant: str = EAGER) -> ThroughputRecord | None:
    """The point as the evidence records it (None: it did not run to a rate)."""
    if not point.fits or not point.samples_per_s or not math.isfinite(point.samples_per_s):
        return None
    return ThroughputRecord(
        batch_size=point.batch_size,
        samples_per_s=point.samples_per_s,
        relative_spread=point.relative_spread if point.relative_spread is not None else 0.0,
        steady=point.steady,
        variant=variant,
        warmup_s=rounded_seconds(point.warmup_s),
        blocks=point.blocks,
        peak_memory_bytes=point.peak_memory_bytes,
    )


def measure_points(
    runner: Trials,
    sizes: Sequence[int],
    budget: Budget,
    progress: Progress,
    model: TimeModel,
    *,
    variant: str = EAGER,
    phase: str = "throughput",
) -> list[ThroughputRecord | int]:
    """A point per size, largest first, sharing the phase's time evenly; an int: that size
    did not fit in memory. A size whose shortest point (warm-up and three steps, predicted)
    does not fit in what is left of the phase is skipped; a smaller one may still fit. A
    point's later blocks stop at its share, its first one only at the phase's end
    (``Trials.point``'s ``deadline``): a warm-up that spent the share (the cuDNN autotuner)
    still times a block, and steps slower than predicted (a busy CPU) end by the phase's end,
    unsteady; where the warm-up alone ran to it, no step is timed, and the point is left out
    for time with the seconds it took (where that warm-up paid a cost of its own, one step is,
    ``trials.one_off_warmup``). ``variant``: the variant ``runner`` trains, which the records
    name.

    The search trains with the cuDNN autotuner off, so its warm-ups say nothing of the
    autotuner's, which every new shape of a point pays (8.1 s for ResNet-50 on an H100, with
    steps of 0.1-0.2 s): from the third point on, the least that the points before paid beyond
    the search's prediction is predicted for the next. Not from the second: the first point of
    a compiled variant pays the compile, once."""
    results: list[ThroughputRecord | int] = []
    costs = [point_cost(model, size) for size in sizes]
    beyond: list[float] = []  # each point's warm-up beyond the search's prediction of it
    for i, size in enumerate(sizes):
        left = budget.left()
        share = left * costs[i] / sum(costs[i:]) if sum(costs[i:]) > 0 else left / len(sizes)
        shortest = model.predict(size, 3)
        need = shortest.seconds if shortest is not None else 0.0
        need += min(beyond) if len(beyond) >= 2 else 0.0  # see the docstring
        if need > left or left <= 0:
            budget.skip(f"the {phase} point at batch {size}", need)
            continue
        progress(phase, f"batch {size}")
        point = runner.point(size, until=budget.now() + max(share, need), deadline=budget.deadline)
        if shortest is not None and point.warmup_s is not None:
            beyond.append(max(0.0, point.warmup_s - shortest.warmup_s))
        record = point_record(point, variant=variant)
        if record is None and point.fits:  # its warm-up ran to the phase's end: no step timed
            cut = "taken by a first step that ran past the phase's end"
            budget.skip(f"the {phase} point at batch {size}", point.seconds, basis=cut)
            continue
        results.append(size if record is None else record)
    return results


def affordable(
    sizes: Sequence[int], model: TimeModel, budget: Budget, device: str
) -> tuple[list[int], Skip | None]:
    """The candidates whose points the throughput phase measures, and the record of those
    left out (``budget.skip``; ``dropped_note`` says so once the points ran).

    On a CPU, where the shortest points of them all (a warm-up and three steps each,
    predicted) do not fit in what is left of the phase, the largest are left out until the
    rest fit: a CPU's throughput stops growing at small batches (the conv net: 238, 292 and
    371 samples/s at 512, 256 and 128 on a 2-core CPU), so the largest is the least likely to
    be the fastest, and its point alone took 23 s of a 26 s phase on a busy one, leaving one
    unsteady point and no comparison. On a GPU, where the largest is often the fastest, every
    size stays (``measure_points`` skips what does not fit, largest first)."""
    kept = list(sizes)
    if device != "cpu":
        return kept, None

    def need(size: int) -> float:
        shortest = model.predict(size, 3)
        return shortest.seconds if shortest is not None else 0.0

    every = sum(need(size) for size in kept)
    while len(kept) > 1 and sum(need(size) for size in kept) > budget.left():
        kept.pop(0)
    if len(kept) == len(sizes):
        return kept, None
    return kept, budget.skip("the shortest points of every candidate", every, warned=True)


def dropped_note(skip: Skip, dropped: Sequence[int], records: Sequence[ThroughputRecord]) -> str:
    """What the CPU's candidates left out by ``affordable`` (``dropped``, its ``skip``) leave
    the user, after the throughput phase: which batches its points measured (``records``).
    That a CPU's throughput stops growing at small batches is a rule of thumb (a small LM on
    this 2-core CPU at 1 thread ran 61, 98 and 117 samples/s at 2, 8 and 32), said as one;
    as measured only where this run's steady points show it, the smallest as fast as the
    largest beside it."""
    named = " and ".join(map(str, dropped))
    named = f"batch {named} was" if len(dropped) == 1 else f"batches {named} were"
    ran = sorted({r.batch_size for r in records}, reverse=True)
    measured = (
        f"the smaller ones were measured ({', '.join(map(str, ran))})"
        if ran
        else "no smaller one was measured either"
    )
    steady = sorted((r for r in records if r.steady), key=lambda r: r.batch_size)
    rule = "a rule of thumb, not measured in this run"
    if len(steady) >= 2 and steady[0].samples_per_s >= steady[-1].samples_per_s:
        low, high = steady[0], steady[-1]
        rule = (
            f"as this run's steady points did: {low.samples_per_s:,.1f} samples/s at"
            f" {low.batch_size}, {high.samples_per_s:,.1f} at {high.batch_size}"
        )
    return (
        f"{named} not measured for throughput: {skip.words()} did not fit in the phase, so the"
        f" largest candidates were left out for time, as on a CPU a smaller batch often trains"
        f" as fast ({rule}); {measured}"
    )


EXTRA_HALVINGS = 3  # further halvings while the smallest size is faster beyond noise


def halvings_below(
    runner: Trials,
    measured: Sequence[ThroughputRecord | int],
    *,
    budget: Budget,
    progress: Progress,
    model: TimeModel,
    multiple: int,
    floor: int,
) -> list[ThroughputRecord | int]:
    """Halvings below the smallest candidate while each is faster than the size above it
    beyond noise (on this 2-core CPU the small conv net ran 238, 292 and 371 samples/s at
    512, 256 and 128), up to ``EXTRA_HALVINGS`` of them, none below ``floor``, in the
    throughput phase's time. On a plateau this stops at once, so two runs do not drift to ever
    smaller sizes."""
    extra: list[ThroughputRecord | int] = []
    points = sorted(
        (r for r in measured if isinstance(r, ThroughputRecord) and r.steady),
        key=lambda r: r.batch_size,
    )
    for _ in range(EXTRA_HALVINGS):
        # go on while the smallest steady size beats the next larger beyond noise
        if len(points) < 2 or points[0].batch_size < 2 * multiple:
            break
        if points[0].samples_per_s <= points[1].samples_per_s * (1 + FASTEST_WITHIN):
            break
        size = round_down(points[0].batch_size // 2, multiple)
        if size < floor:
            break
        more = measure_points(runner, [size], budget, progress, model)
        extra += more
        new = [r for r in more if isinstance(r, ThroughputRecord) and r.steady]
        if not new:
            break  # no time left for it, or it did not settle
        points.insert(0, new[0])
    return extra


POINT_CONFIRMS = "confirm (its throughput point)"
"""The step of a confirmation that is the recommended size's throughput point."""


def confirmation(point: ThroughputRecord) -> SearchTrialRecord:
    """The throughput point of the recommended size, as the run that confirms it: steady,
    or, where none was, ``unsteady_choice``'s, which ran with the final settings."""
    return SearchTrialRecord(
        batch_size=point.batch_size,
        fits=True,
        peak_memory_bytes=point.peak_memory_bytes,
        seconds=None,
        step=POINT_CONFIRMS,
        warmup_s=point.warmup_s,
        variant=point.variant,
    )


def unconfirmed(budget: Budget, candidate: int, predicted_s: float, *, kept_s: float) -> str | None:
    """Where running ``candidate`` once more, predicted to take ``predicted_s``, does not fit
    in the time left in the run less the ``kept_s`` seconds kept for the DataLoader's workers,
    the warning that it was not (recorded on ``budget``); None where it fits. The caller keeps
    the run it had with these settings instead (it ran once)."""
    kept = min(kept_s, budget.left_in_run())
    if predicted_s <= budget.left_in_run() - kept:
        return None
    skip = budget.skip(f"running batch {candidate} again", predicted_s, kept_s=kept, warned=True)
    return (
        f"batch {candidate} was not run a second time: {skip.words()} did not fit (it ran once"
        " with these settings)"
    )


def unsteady_choice(records: Sequence[ThroughputRecord]) -> ThroughputRecord | None:
    """Where no point was steady, the point of the base settings (``EAGER``) that ran fastest,
    the smallest within ``FASTEST_WITHIN`` of it: it trained after the search with them, so
    running it once more confirms nothing (on a busy 2-core CPU, batch 512 again took 16 s of
    a 30 s budget). Noisy, but what was measured: the largest instead handed out 512 where 128
    had run at 321 samples/s and 512 at 254, 0.84-0.91x of a plain batch 32."""
    points = [r for r in records if r.variant == EAGER]
    if not points:
        return None
    best = max(r.samples_per_s for r in points)
    near = [r for r in points if r.samples_per_s >= best * (1 - FASTEST_WITHIN)]
    return min(near, key=lambda r: r.batch_size)


def throughput_warnings(
    measured: Sequence[ThroughputRecord | int],
    *,
    dropped: Sequence[int],
    affordable_skip: Skip | None,
    skips: Sequence[Skip],
) -> list[str]:
    """What the throughput phase tells the user: sizes that ran in the search but not with the
    cuDNN autotuner on (``measured``'s ints), the CPU's ``dropped`` candidates (``affordable``),
    and where no point was steady, why (``skips``: what the phase left out for time)."""
    records = [r for r in measured if isinstance(r, ThroughputRecord)]
    too_big = [r for r in measured if isinstance(r, int)]
    said: list[str] = []
    if too_big:
        said.append(
            f"batch {', '.join(map(str, too_big))} ran in the search but not with the cuDNN"
            " autotuner on (its workspaces need more memory); smaller sizes were measured"
        )
    if affordable_skip is not None:
        said.append(dropped_note(affordable_skip, dropped, records))
    if fastest(records) is None:
        said.append(unmeasured_warning(records, skips))
    return said


def unmeasured_warning(records: Sequence[ThroughputRecord], skips: Sequence[Skip] = ()) -> str:
    """What a run with no steady point says: why none was, or that none ran, and where the
    time left was too short for a point (``skips``, which this names), to give it more."""
    if not records:
        if not skips:
            return (
                "no throughput point ran: the batch is the top candidate of the search, not"
                " chosen for its speed"
            )
        for skip in skips:
            skip.warned = True
        return (
            f"no throughput point ran: {'; '.join(s.words() for s in skips)} did not fit;"
            " the batch is the top candidate of the search, not chosen for its speed; give"
            " autotune more time (--budget)"
        )
    why = "; ".join(f"{r.unsteady} at {r.batch_size}" for r in records)
    return (
        f"no throughput point was steady ({why}): the step's fastest batch is not known, and the"
        " size whose point ran fastest in noisy timings stands for it; run autotune again,"
        " quieter or longer"
    )


def point_cost(model: TimeModel, size: int) -> float:
    """The predicted seconds of a steady point at ``size``: what its share is weighed by."""
    predicted = model.predict(size, 1 + MIN_BLOCKS)
    return predicted.seconds if predicted is not None else 0.0


def fastest(records: Sequence[ThroughputRecord]) -> ThroughputRecord | None:
    """The smallest steady point within ``FASTEST_WITHIN`` of the best steady rate."""
    steady = [r for r in records if r.steady]
    if not steady:
        return None
    best = max(r.samples_per_s for r in steady)
    near = [r for r in steady if r.samples_per_s >= best * (1 - FASTEST_WITHIN)]
    return min(near, key=lambda r: r.batch_size)
