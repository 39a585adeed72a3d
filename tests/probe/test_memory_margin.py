"""K2's margin where memory limited the batch (issue 21): a tenth of the largest batch's samples
(a fifth where shapes vary), or, where that leaves fewer, a tenth of the memory, kept free at
the measured peak of a size that trained. On an H200 under 24 GiB, GPT-2 large trained at 5
with 14% of the memory free; the margin in samples alone left 4 (0.98 of the best), and
checkpointed, 16 with 19% free became 14, then 8 (K4's multiple)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.probe.fake_trials import recorded, tune_on
from torch_autotune.evidence import SearchTrialRecord
from torch_autotune.probe.points import candidates, room_in, top_candidate
from torch_autotune.probe.presets import preset
from torch_autotune.probe.search import apply_margin
from torch_autotune.probe.workloads import resolve_workload
from torch_autotune.profile import Profile, Source

GIB = 1 << 30
H200 = recorded("h200")


def _trial(size: int, peak: float | None, *, fits: bool = True) -> SearchTrialRecord:
    return SearchTrialRecord(
        batch_size=size,
        fits=fits,
        peak_memory_bytes=None if peak is None else int(peak * GIB),
        seconds=0.5 if fits else 0.0,
        step="search",
    )


# The H200's GPT-2 large search under 16 GiB, checkpointed: 6 trained at 13.7 GiB, 7 did not.
CHECKPOINTED_16 = [
    _trial(1, 11.0),
    _trial(2, 11.5),
    _trial(4, 12.6),
    _trial(8, None, fits=False),
    _trial(6, 13.7),
    _trial(7, None, fits=False),
]


def test_the_margin_is_kept_in_memory_where_a_size_left_it_free() -> None:
    room = room_in(CHECKPOINTED_16, 16 * GIB, "memory", True)
    assert room == (6, int(13.7 * GIB), 16 * GIB)
    assert top_candidate(6, "memory", True, room) == 6  # 10% of 6 samples would leave 5
    assert candidates(6, "memory", 8, True, room=room) == [6, 3, 1]
    assert candidates(6, "memory", 8, True) == [5, 2, 1]


def test_a_size_that_left_less_than_the_margin_is_no_room() -> None:
    plain = [_trial(1, 12.5), _trial(2, 14.6), _trial(3, None, fits=False)]  # 9% free at 2
    assert room_in(plain, 16 * GIB, "memory", True) == (1, int(12.5 * GIB), 16 * GIB)
    assert top_candidate(2, "memory", True, room_in(plain, 16 * GIB, "memory", True)) == 1
    varying = room_in(CHECKPOINTED_16, 16 * GIB, "memory", False)  # shapes vary: a fifth
    assert varying == (4, int(12.6 * GIB), 16 * GIB)
    assert top_candidate(6, "memory", False, varying) == 4


@pytest.mark.parametrize(
    ("limited_by", "limit", "records"),
    [
        ("host RAM", 16 * GIB, CHECKPOINTED_16),  # a process's peak is not the step's
        ("budget", 16 * GIB, CHECKPOINTED_16),  # no margin at all
        ("memory", None, CHECKPOINTED_16),  # the device's memory unknown
        ("memory", 16 * GIB, [_trial(4, None), _trial(6, None)]),  # no peak read
    ],
)
def test_no_room_without_the_devices_memory_and_a_peak(
    limited_by: str, limit: int | None, records: list[SearchTrialRecord]
) -> None:
    assert room_in(records, limit, limited_by, True) is None


@given(
    largest=st.integers(1, 5000),
    peaks=st.lists(st.tuples(st.integers(1, 5000), st.floats(0.01, 1.2)), max_size=12),
    fixed=st.booleans(),
)
def test_the_top_candidate_never_gives_up_the_margin(
    largest: int, peaks: list[tuple[int, float]], fixed: bool
) -> None:
    """Never above the largest that trained, never below the margin in samples; above it only
    at a size that trained with the margin's share of the memory free at its peak."""
    limit = 80 * GIB
    records = [_trial(min(size, largest), share * 80) for size, share in peaks]
    room = room_in(records, limit, "memory", fixed)
    top = top_candidate(largest, "memory", fixed, room)
    margin = 0.1 if fixed else 0.2
    assert apply_margin(largest, margin) <= top <= largest
    if top > apply_margin(largest, margin):
        assert room is not None
        assert top == room[0]
        ran = [r for r in records if r.batch_size == top and r.peak_memory_bytes == room[1]]
        assert ran
        assert room[1] <= (1 - margin) * limit


def _gpt2_large(limit_gib: int) -> Profile:
    """GPT-2 large on the recorded H200 under ``limit_gib``, balanced, 90 s: as the memory
    regime's benchmark tuned it there."""
    workload = dataclasses.replace(resolve_workload("gpt2-large"), dataset=None)
    machine = preset(f"h200-gpt2-large-{limit_gib}gib")
    return tune_on(
        machine, workload, H200, mode="balanced", budget_s=90, memory_limit_gib=limit_gib
    )


def test_under_24_gib_the_largest_batch_that_left_a_tenth_free_is_measured() -> None:
    profile = _gpt2_large(24)
    evidence = profile.evidence
    assert evidence is not None
    choice = evidence.batch_choice
    assert choice is not None
    assert (evidence.max_batch_size, choice.largest) == (5, 5)
    assert profile.settings.batch.batch_size == 5  # the margin in samples alone: 4
    assert choice.memory_room is not None
    size, peak, limit = choice.memory_room
    assert (size, limit) == (5, 24 * GIB)
    assert peak <= 0.9 * limit
    decision = profile.decision("batch.batch_size")
    assert decision is not None
    assert (
        f"(K2) kept in memory: batch 5 peaked at {peak / GIB:.1f} GiB of the 24.0 GiB training"
        f" could use, {1 - peak / limit:.0%} free" in decision.reason
    )
    checkpointed = {r.batch_size for r in evidence.throughput if r.variant == "checkpointed"}
    assert 16 in checkpointed  # its own largest, 16 (19% free); in samples alone 14, then 8


def test_under_16_gib_checkpointing_trains_the_larger_batch() -> None:
    """2 trained without checkpointing with 9% of the memory free: the margin leaves 1, and
    checkpointed batches, measured against it, are kept."""
    profile = _gpt2_large(16)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.max_batch_size == 2
    assert profile.settings.activation_checkpointing
    batch = profile.settings.batch.batch_size
    assert batch is not None
    assert batch > 2
    decision = profile.decision("activation_checkpointing")
    assert decision is not None
    assert decision.source is Source.MEASURED
    assert "the largest batch was 6 with it and 2 without" in decision.reason


def test_the_claims_checker_finds_a_room_the_trials_do_not_bear_out() -> None:
    from tests.test_claims import disagreements

    profile = _gpt2_large(24)
    assert disagreements(profile) == []
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.batch_choice is not None
    assert evidence.batch_choice.memory_room is not None
    size, peak, limit = evidence.batch_choice.memory_room
    for room, found in [
        ((size, peak + GIB, limit), "no trial of 5 trained at a peak"),
        ((size, peak, peak), "leaves no margin"),
    ]:
        choice = evidence.batch_choice.model_copy(update={"memory_room": room})
        wrong = profile.model_copy(
            update={"evidence": evidence.model_copy(update={"batch_choice": choice})}
        )
        assert any(found in d for d in disagreements(wrong)), disagreements(wrong)


def test_the_reason_names_the_batch_chosen_and_the_room_apart() -> None:
    """A smaller size chosen within 3% of the room's: the reason opens with the chosen one."""
    from torch_autotune.evidence import BatchChoice
    from torch_autotune.rules.optimizer import batch_reason

    choice = BatchChoice(
        chosen_by="fastest point",
        largest=250,
        top=250,
        margin=0.1,
        memory_room=(250, int(2.2 * GIB), int(6.3 * GIB)),
        limited_by="memory",
        variant="eager",
        samples_per_s=169.0,
        best_samples_per_s=170.0,
        best_batch_size=250,
        confirmed="its point",
    )
    reason = batch_reason(62, choice)
    assert reason.startswith("62: the fastest steady batch measured here (169 samples/s; the best")
    assert "kept in memory: batch 250 peaked at 2.2 GiB of the 6.3 GiB training could use" in reason


def test_checkpointing_is_planned_with_the_models_it_builds() -> None:
    """Its check and its own variant each build a model (10 s each for GPT-2 large here, as
    the base's build took): where 40 s cannot hold them, it is not started, and says so; it
    once spent them and finished no step."""
    workload = dataclasses.replace(resolve_workload("gpt2-large"), dataset=None)
    machine = preset("h200-gpt2-large-16gib")
    profile = tune_on(machine, workload, H200, mode="balanced", budget_s=40, memory_limit_gib=16)
    decision = profile.decision("activation_checkpointing")
    assert decision is not None
    assert decision.reason.startswith(
        "off: not measured: activation checkpointing was predicted to take about 20 s to build"
        " and warm up"
    )
    assert profile.evidence is not None
    assert profile.evidence.elapsed_s <= 30  # the base's search and point; no model built again
