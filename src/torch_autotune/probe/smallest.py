"""Where the batch-size search starts: the smallest batch the model trains at. No torch.

Most models train on one sample, and the search starts there. A model with BatchNorm in
training mode cannot: with one sample per channel (``BatchNorm1d`` on a batch of one, or
``BatchNorm2d`` on a 1x1 feature map, as a ResNet has on 32x32 images) torch raises
``ValueError: Expected more than 1 value per channel when training``. That is no bug of the
model's, and no reason to stop: when the first size raises an error of the user's code, the
probe tries twice, four and eight times that size, and bisects down to the smallest that
trains (below a size out of memory, too). The error counts as the user's only where no larger
size trains either; it is then raised as it was, with their traceback. Where the first size
raised BatchNorm's error (one value a channel), a larger size ran out of memory and none below
it trained, the model does not fit: ``DoesNotFitError`` for the size out of memory, which goes
on, as for any model that does not fit, to the retry with activation checkpointing and to the
plan. Any other error at every size below one out of memory stays the user's.
``--min-batch-size`` (``min_batch_size``) starts the search at a size the user names.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_autotune.errors import DoesNotFitError, raised_by_user_code
from torch_autotune.evidence import WorkloadDetails
from torch_autotune.probe.guard import SearchGuard, refused_record
from torch_autotune.probe.workloads import BUILTIN_WORKLOADS, Workload

GROWTH = (2, 4, 8)
"""Multiples of the first size tried after it raised, before the error counts as the user's."""

BATCHNORM = "Expected more than 1 value per channel when training"
"""What BatchNorm in training mode raises on one value a channel (``F.batch_norm``'s check)."""


@dataclass(frozen=True)
class Smallest:
    """The size the search starts at, and why it is not the size asked for (None: it is)."""

    size: int
    reason: str | None


def _error_text(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    text = text if len(text) <= 160 else text[:157] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _tries(guarded: SearchGuard, batch_size: int, step: str) -> bool | BaseException:
    """Whether ``batch_size`` trains (False: out of memory), or the error of the user's code
    it raised, recorded. Any other exception (a bug of ours, an AutotuneError) propagates."""
    try:
        return guarded.run_once(batch_size, step).fits
    except Exception as error:
        if not raised_by_user_code(error):
            raise
        guarded.refuse(refused_record(batch_size, step, error=_error_text(error)))
        return error


def smallest_batch(guarded: SearchGuard, start: int, cap: int, *, name: str) -> Smallest:
    """The smallest size from ``start`` up to ``cap`` that trains (see the module docstring);
    ``name``: the workload's, for the error.

    Runs ``start``; where it raises an error of the user's code, runs larger sizes until one
    trains, then bisects to the smallest that does. A larger size out of memory leaves the
    sizes between it and the last that raised, which are bisected for one that trains (a
    model that raises at 1 and 2 may still train at 3 where 4 is too big); where none does,
    ``DoesNotFitError`` for the smallest size out of memory. Out of memory at ``start`` leaves
    the answer to the search (it reports that nothing fits). Raises the first error again when
    no size up to eight times ``start`` (or ``cap``) trains or runs out of memory.
    """
    first = _tries(guarded, start, "start")
    if not isinstance(first, BaseException):
        return Smallest(start, None)
    failed = start
    for factor in GROWTH:
        size = min(start * factor, cap)
        if size <= failed:
            break
        outcome = _tries(guarded, size, "smallest")
        if isinstance(outcome, BaseException):
            failed = size
            continue
        if not outcome:  # out of memory above a size that raised: one in between may train
            failed, size, trains_there = _below_memory(guarded, failed, size)
            if not trains_there and BATCHNORM not in str(first):
                break  # an error at every size that fits: the user's, with their traceback
            if not trains_there:
                raise _does_not_fit(guarded, name, first, start=start, last=failed, too_big=size)
        trains = _bisect(guarded, failed, size)
        reason = (
            f"batch {start} raised {_error_text(first)}; batch {trains} trained, so the search"
            f" started at {trains} (--min-batch-size sets the start). An epoch's last batch"
            f" below {trains} raises it too: profile.dataloader_kwargs() sets drop_last=True"
        )
        return Smallest(trains, reason)
    raise first


def _does_not_fit(
    guarded: SearchGuard, name: str, first: BaseException, *, start: int, last: int, too_big: int
) -> DoesNotFitError:
    """Not even ``too_big`` fits, and every size tried below it raised: ``start`` first, with
    BatchNorm's error ``first``, ``last`` the largest, one below ``too_big``."""
    device = guarded.runner.settings.settings.device
    below = f"batch {start} cannot train BatchNorm ({_error_text(first)})"
    if last > start:
        below += f", and batch {last} raised an error too"
    return DoesNotFitError(
        f"the {name} workload does not train even at batch size {too_big} on {device}: it runs"
        f" out of memory, and {below}",
        batch_size=too_big,
    )


def _below_memory(guarded: SearchGuard, failed: int, too_big: int) -> tuple[int, int, bool]:
    """Bisects (failed, too_big), where ``failed`` raised and ``too_big`` ran out of memory:
    (the largest size known to raise, the size found above it, whether that one trains). It
    trains, or, where no size between trains, it is the smallest size out of memory, one
    above the largest that raised."""
    while too_big - failed > 1:
        middle = (failed + too_big) // 2
        outcome = _tries(guarded, middle, "smallest")
        if isinstance(outcome, BaseException):
            failed = middle
        elif outcome:
            return failed, middle, True
        else:
            too_big = middle
    return failed, too_big, False


def _bisect(guarded: SearchGuard, failed: int, trains: int) -> int:
    """The smallest size in (failed, trains] that trains: ``failed`` raised, ``trains`` ran."""
    while trains - failed > 1:
        middle = (failed + trains) // 2
        outcome = _tries(guarded, middle, "smallest")
        if outcome is True:
            trains = middle
        else:
            failed = middle
    return trains


def workload_details(workload: Workload, smallest: Smallest) -> WorkloadDetails:
    """What the probe made of ``workload`` (its own ``details``, or what a built-in or a
    ``Workload`` built by hand says of itself), with where the search started and why."""
    if workload.details is not None:
        found = workload.details()
    else:
        found = WorkloadDetails(
            source="built-in" if workload.name in BUILTIN_WORKLOADS else "factory",
            batch=workload.sample_shape or "?",
        )
    reason = smallest.reason
    if reason is None and smallest.size > 1:
        reason = f"asked for: the search started at {smallest.size}"
    return found.model_copy(update={"min_batch_size": smallest.size, "min_batch_reason": reason})
