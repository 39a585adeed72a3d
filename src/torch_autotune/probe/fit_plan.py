"""A model that does not fit one GPU at its smallest batch: what it needs, what was tried, and
what is left with the memory each way would need a GPU.

``DoesNotFitError`` says what the probe measured (not even batch N trained) and what it tried
(activation checkpointing, measured); ``with_plan`` adds the estimate of what one step at that
batch holds, by kind (``probe.estimate.step_breakdown``: fake tensors, nothing allocated), and
of each way that is left, each a GPU's share of one step:

- sharded with FSDP2 over this node's GPUs, or 2, 4 and 8 (``probe.estimate.fsdp_peak_bytes``);
- an 8-bit optimizer (bitsandbytes): its state in a byte a value where Adam's is four;
- the optimizer's state in host memory (DeepSpeed's ZeRO-Offload; FSDP2's ``CPUOffloadPolicy``
  moves the parameters too), where the host has the room;
- a shorter sequence, for a batch of token sequences: half, then a quarter, of its length;
- where none of these fits alone: sharding and the optimizer's ways again, each with
  activation checkpointing as well (the estimates wrap the blocks as ``prepare_model`` does),
  unless the model cannot be checkpointed.

An estimate counts tensors only (no CUDA context, no allocator rounding or fragmentation), and
the step it counts did not fit: a way is said to fit where it needs at most ``SHARD_FIT`` of the
GPU's memory (of ``--memory-limit``, where given) and, where the whole step's estimate came out
under the GPU's memory though the step ran out of it, at most that share of the estimate, so
that what the estimate misses for this model is missed for the way too. No torch here: the
estimates are ``probe.estimate``'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from torch_autotune.errors import DoesNotFitError
from torch_autotune.invariants import device_accelerators
from torch_autotune.probe.seam import Progress
from torch_autotune.probe.trials import StepSettings

if TYPE_CHECKING:
    from torch_autotune.probe.estimate import Breakdown
    from torch_autotune.probe.workloads import Workload
    from torch_autotune.profile import Profile

__all__ = ["SHARD_FIT", "Way", "with_plan"]

SHARD_FIT = 0.85
"""An estimate counts only tensors: a way is said to fit where it needs at most this share of
the GPU's memory (the CUDA context, NCCL's buffers and the allocator take the rest)."""

EIGHT_BIT = 0.25
"""An 8-bit optimizer's state against a 32-bit one's (bitsandbytes' block-wise quantisation
adds one float a block of 2,048 values: nothing at this precision)."""


NO_GAIN = 0.95
"""Half the sequence needing more than this share of the whole step: a quarter is not tried."""


@dataclass(frozen=True)
class Way:
    """One way that is left: what it is, the memory a GPU would need (an estimate; None where
    it could not be made), whether that fits, and how to take it."""

    what: str
    need_bytes: int | None
    fits: bool | None  # None: the GPU's memory is not known, so no verdict
    how: str = ""

    def line(self) -> str:
        need = "not estimated" if self.need_bytes is None else f"about {_gib(self.need_bytes)}"
        said = f"  - {self.what}: {need} a GPU (estimated)"
        if self.need_bytes is not None and self.fits is not None:
            said += ", fits" if self.fits else ", does not fit"
        return f"{said}; {self.how}" if self.how else said


def with_plan(
    error: DoesNotFitError,
    workload: Workload,
    rules_only: Profile,
    progress: Progress | None = None,
) -> DoesNotFitError:
    """``error`` (one GPU: not even its smallest batch fits) with the plan (module docstring);
    as it was on the CPU and MPS, or where nothing could be estimated. ``progress`` hears of
    each estimate (seconds each on a CPU for a billion parameters)."""
    from torch_autotune.probe.estimate import step_breakdown
    from torch_autotune.probe.state import preserved

    snapshot = rules_only.provenance.snapshot
    targets = device_accelerators(rules_only.settings.device, snapshot)
    if rules_only.settings.device != "cuda" or not targets:
        return error
    settings = StepSettings.from_profile(rules_only)
    memory, said_memory = _memory(rules_only, min(a.memory_total_bytes or 0 for a in targets))
    batch = error.batch_size
    host_free = snapshot.host.memory_available_bytes
    say = progress or (lambda _phase, _what: None)
    say("plan", f"what a step of batch {batch} needs (an estimate)")
    with preserved():  # the user's model and data draw from the RNG: put back
        needed = step_breakdown(workload, settings, batch_size=batch)
        bound = _bound(memory, needed)
        ways = [
            *_sharded(workload, settings, batch, len(targets), bound, say=say),
            *_optimizer_ways(needed, bound, host_free),
            *_shorter(workload, settings, batch, bound, needed, say=say),
        ]
        pairs: list[Way] = []
        if bound is not None and not any(way.fits for way in ways):  # each with checkpointing
            gpus = len(targets)
            pairs = _recomputing(
                workload, settings, batch, gpus, bound=bound, host_free=host_free, say=say
            )
    if needed is None and not any(w.need_bytes is not None for w in ways):
        return error
    lines = [_needed_line(needed, batch, said_memory, memory)]
    if ways:
        lines.append(f"What is left, each one step at batch {batch}:")
        lines.extend(way.line() for way in ways)
    if bound is not None and not any(way.fits for way in ways):
        lines.extend(_together(pairs, batch))
    return DoesNotFitError(error.fact, batch_size=batch, plan="\n".join(lines))


def _memory(rules_only: Profile, total: int) -> tuple[int, str]:
    """The memory a way must fit in (``--memory-limit``'s where given), and how to say it."""
    limit = rules_only.provenance.preferences.memory_limit_bytes
    if limit is not None and (not total or limit < total):
        return limit, f"--memory-limit holds this GPU to {_gib(limit)}"
    return total, f"this GPU has {_gib(total)}" if total else "this GPU's memory is not known"


def _bound(memory: int, needed: Breakdown | None) -> int | None:
    """The most a way may need to be said to fit (module docstring); where the GPU's memory
    is not known, the share of the estimate alone (it ran out of whatever it had), or None
    without an estimate either."""
    if needed is not None and needed.total > 0 and (not memory or needed.total < memory):
        return int(SHARD_FIT * needed.total)
    return int(SHARD_FIT * memory) if memory else None


def _needed_line(needed: Breakdown | None, batch: int, said_memory: str, memory: int) -> str:
    if needed is None:
        return f"What batch {batch} needs could not be estimated; {said_memory}."
    text = (
        f"Batch {batch} needs about {_gib(needed.total)} of tensors in a step (estimated, with"
        f" fake tensors: parameters {_gib(needed.parameters)}, gradients "
        f"{_gib(needed.gradients)}, optimizer state {_gib(needed.optimizer)}, activations "
        f"{_gib(needed.activations)}); {said_memory}"
    )
    if needed.total < memory:  # yet it ran out: say what the estimate does not count
        text += (
            "; it ran out all the same: the CUDA context, cuBLAS and cuDNN workspaces and the "
            "allocator's rounding are not counted, so a way must come well under the estimate"
        )
    return f"{text}."


def _sharded(
    workload: Workload,
    settings: StepSettings,
    batch: int,
    gpus: int,
    bound: int | None,
    *,
    say: Progress,
    also: str = "",
) -> list[Way]:
    """FSDP2 over this node's GPUs (or 2, 4 and 8 where it has one), each world's estimate
    (``also``: what the settings add, in the progress lines)."""
    from torch_autotune.probe.estimate import fsdp_peak_bytes

    worlds = [gpus, 2 * gpus, 4 * gpus] if gpus > 1 else [2, 4, 8]
    ways = []
    for world in worlds:
        say("plan", f"sharded over {world} GPUs{also} (an estimate)")
        need = fsdp_peak_bytes(workload, settings, world_size=world, batch_size=batch)
        fits = _fits(need, bound)
        how = f"autotune --nproc-per-node {world} measures it" if fits and world <= gpus else ""
        if fits and world > gpus:
            how = f"on {world} GPUs like this one, autotune --nproc-per-node {world} measures it"
        ways.append(Way(f"sharded with FSDP2 over {world} GPUs", need, fits, how))
    return ways


def _recomputing(
    workload: Workload,
    settings: StepSettings,
    batch: int,
    gpus: int,
    *,
    bound: int,
    host_free: int | None,
    say: Progress,
) -> list[Way]:
    """Where no way fits alone: each of sharding and the optimizer's ways with activation
    checkpointing as well, from estimates of the checkpointed step; none where the model cannot
    be checkpointed (its estimate is None)."""
    from torch_autotune.probe.checkpoint_phase import checkpointed
    from torch_autotune.probe.estimate import step_breakdown

    recompute = settings.with_variant(checkpointed())
    say("plan", "with activation checkpointing (an estimate)")
    needed = step_breakdown(workload, recompute, batch_size=batch)
    if needed is None:
        return []
    also = ", with activation checkpointing"
    ways = [
        *_sharded(workload, recompute, batch, gpus, bound, say=say, also=also),
        *_optimizer_ways(needed, bound, host_free),
    ]
    return [replace(way, what=f"activation checkpointing and {way.what}") for way in ways]


def _together(pairs: list[Way], batch: int) -> list[str]:
    """What the plan says where no way fits alone: the ways with checkpointing as well."""
    if not pairs:
        return ["None fits alone: take two together, or a larger GPU."]
    lines = [
        f"None fits alone. With activation checkpointing as well, each one step at batch {batch}:"
    ]
    lines.extend(way.line() for way in pairs)
    if not any(way.fits for way in pairs):
        lines.append("None fits with it either: more GPUs, or a larger one.")
    return lines


def _optimizer_ways(
    needed: Breakdown | None, bound: int | None, host_free: int | None
) -> list[Way]:
    """An 8-bit optimizer, and the optimizer's state in host memory, from the breakdown."""
    if needed is None or needed.optimizer == 0:
        return []
    state = needed.optimizer
    eight_bit = needed.total - state + int(EIGHT_BIT * state)
    offloaded = needed.total - state
    ways = [
        Way(
            "an 8-bit optimizer (bitsandbytes' AdamW8bit, or the 8-bit form of yours)",
            eight_bit,
            _fits(eight_bit, bound),
            "its state in a byte a value instead of four",
        )
    ]
    room = host_free is None or state <= host_free
    host = (
        f"needs {_gib(state)} of host memory"
        + ("" if host_free is None else f", {_gib(host_free)} free here")
        + ("" if room else ": not enough")
    )
    ways.append(
        Way(
            "the optimizer's state in host memory (DeepSpeed ZeRO-Offload; FSDP2's "
            "CPUOffloadPolicy moves the parameters too)",
            offloaded,
            None if bound is None else offloaded <= bound and room,
            f"{host}; each step waits on the host's optimizer",
        )
    )
    return ways


def _shorter(
    workload: Workload,
    settings: StepSettings,
    batch: int,
    bound: int | None,
    needed: Breakdown | None,
    *,
    say: Progress,
) -> list[Way]:
    """For a batch of token sequences: the step at half its length, and at a quarter where
    half does not fit but needs less than the whole (the peak may be the optimizer's step,
    which no sequence changes)."""
    from torch_autotune.probe.estimate import sequence_length, step_breakdown

    try:
        length = sequence_length(workload.make_batch(1))
    except Exception:  # the batch was built for the estimate already: its absence is said
        return []
    if length is None or length < 4:
        return []
    ways = []
    for shorter in (length // 2, length // 4):
        say("plan", f"sequences of {shorter} tokens (an estimate)")
        step = step_breakdown(
            workload,
            settings,
            batch_size=batch,
            reshape=functools.partial(_cut, length=shorter),
        )
        need = None if step is None else step.total
        fits = _fits(need, bound)
        ways.append(
            Way(
                f"sequences of {shorter} tokens instead of {length}",
                need,
                fits,
                "the model sees less context a sample",
            )
        )
        if fits or need is None or (needed is not None and need >= NO_GAIN * needed.total):
            break
    return ways


def _fits(need: int | None, bound: int | None) -> bool | None:
    """Whether ``need`` comes within ``bound``; None where the GPU's memory is not known."""
    if bound is None:
        return None
    return need is not None and need <= bound


def _cut(batch: Any, *, length: int) -> Any:
    from torch_autotune.probe.estimate import shorter_sequence

    return shorter_sequence(batch, length)


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"
