"""The numbers a snapshot, a profile or a bench record may hold: finite, and no larger than a
machine can have.

A count that validates is a count torch will be asked to use: ``cpu_threads: 1000000000``
validated once, and applying it aborted inside libgomp, which tried to allocate 216 GB for the
thread pool. So every count has an upper bound with a reason, and every model refuses
infinity and NaN (``STRICT``: a float that is not finite is never a measurement, a time or a
budget). The bounds are far above any real machine; they only stop what cannot run.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import ConfigDict, Field

__all__ = [
    "MAX_ACCELERATORS",
    "MAX_BATCH_SIZE",
    "MAX_BYTES",
    "MAX_COMPUTE_UNITS",
    "MAX_CPUS",
    "MAX_GLOBAL_BATCH",
    "MAX_GRAD_ACCUM_STEPS",
    "MAX_MEMORY_GIB",
    "MAX_PREFETCH_FACTOR",
    "MAX_ROUNDS",
    "MAX_SECONDS",
    "MAX_SMALL_COUNT",
    "MAX_WORKERS",
    "MIN_MEMORY_GIB",
    "SEED_MAX",
    "SEED_MIN",
    "STRICT",
    "AcceleratorIndex",
    "AccumSteps",
    "BatchSize",
    "Bytes",
    "ComputeUnits",
    "CpuCount",
    "PositiveBytes",
    "PrefetchFactor",
    "Rounds",
    "Seed",
    "SmallCount",
    "WorkerCount",
    "memory_limit_refused",
]

STRICT = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
"""The configuration of every model: immutable, unknown keys refused, inf and NaN refused.
Types are held exact where a file is read (``input_schema.validate_exactly``: ``"32"`` is not a
count there), not here: the code builds models from an enum or a tuple as well as from text."""

MAX_CPUS = 8192
"""CPUs, threads and processes: Linux's largest build (``CONFIG_NR_CPUS`` with ``MAXSMP`` on
x86-64) supports 8192 CPUs. Also bounds ``torch.set_num_threads`` and DDP ranks per node."""

MAX_WORKERS = MAX_CPUS
"""DataLoader workers: each is a process, one per CPU of the largest machine at most (the probe
measures no more workers than the CPUs usable)."""

MAX_BATCH_SIZE = 1 << 20
"""Samples in one step: 16x the probe's largest cap on a GPU (65536)."""

MAX_GLOBAL_BATCH = 1 << 24
"""A global batch to keep with gradient accumulation (``autotune --target-batch``): 16M
samples, above the largest published global batches (a few million tokens' worth)."""

MAX_GRAD_ACCUM_STEPS = MAX_GLOBAL_BATCH
"""Steps accumulated into one optimizer step: at most one per sample of the global batch."""

MAX_PREFETCH_FACTOR = 1024
"""Batches each DataLoader worker loads ahead (torch's default is 2); each is held in RAM."""

MAX_ACCELERATORS = 1024
"""GPUs one process sees: the largest nodes have 8 to 16, and a MIG slice count of 7 each."""

MAX_COMPUTE_UNITS = 4096
"""SMs (NVIDIA) or compute units (AMD) of one GPU: an H100 has 132, an MI300X 304."""

MAX_BYTES = 1 << 60
"""Bytes of memory (device, host, shared): 1 EiB; the largest hosts have tens of TiB."""

MAX_MEMORY_GIB = MAX_BYTES / 2**30
"""The most ``--memory-limit`` (``tune(memory_limit_gib=...)``) may be: ``MAX_BYTES``, in GiB.
The device's own memory bounds it further (``compose.memory_limit_problem``)."""

MIN_MEMORY_GIB = 0.01
"""The least ``--memory-limit`` (``tune(memory_limit_gib=...)``) may be, 10 MiB: the limits
are said to 0.01 GiB, and CUDA's caching allocator reserves 2 MiB at a time. From Python,
``tune(memory_limit_gib=1e-12)`` was taken as a cap of one byte and said as '9.3e-10 GiB'."""


def memory_limit_refused(gib: float) -> str | None:
    """The one line that refuses a memory limit of ``gib`` GiB, the same from the command line
    and from Python: not finite, below ``MIN_MEMORY_GIB`` or above ``MAX_MEMORY_GIB``; None
    where it is within them."""
    if not math.isfinite(gib):
        return f"--memory-limit {gib:g} is not a number of GiB; ask for {MIN_MEMORY_GIB:g} or more"
    if gib < MIN_MEMORY_GIB:
        return (
            f"--memory-limit {gib:g} is less than {MIN_MEMORY_GIB:g} GiB, the least it may be;"
            f" ask for {MIN_MEMORY_GIB:g} or more"
        )
    if gib > MAX_MEMORY_GIB:
        return (
            f"--memory-limit {gib:g} is more than {MAX_MEMORY_GIB:g} GiB, the most any device"
            f" may have; ask for less"
        )
    return None


MAX_ROUNDS = 1000
"""Interleaved bench rounds: 5 by default; 1000 rounds of every arm take hours."""

MAX_SECONDS = 7 * 24 * 3600.0
"""Seconds of a time budget, or of one bench arm in one round: a week. The defaults are 120 s,
180 s and 2 s; a finite but absurd time (``--seconds 1e300``) ran for ever, with a progress
estimate of 'inf s', where it was surely a typo."""

SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1
"""The seeds ``torch.manual_seed`` accepts."""

CpuCount = Annotated[int, Field(ge=1, le=MAX_CPUS)]
WorkerCount = Annotated[int, Field(ge=0, le=MAX_WORKERS)]
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)]
AccumSteps = Annotated[int, Field(ge=1, le=MAX_GRAD_ACCUM_STEPS)]
GlobalBatch = Annotated[int, Field(ge=1, le=MAX_GLOBAL_BATCH)]
PrefetchFactor = Annotated[int, Field(ge=1, le=MAX_PREFETCH_FACTOR)]
AcceleratorIndex = Annotated[int, Field(ge=0, lt=MAX_ACCELERATORS)]
ComputeUnits = Annotated[int, Field(ge=1, le=MAX_COMPUTE_UNITS)]
Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]
PositiveBytes = Annotated[int, Field(ge=1, le=MAX_BYTES)]
Rounds = Annotated[int, Field(ge=1, le=MAX_ROUNDS)]
Seed = Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)]
SettingInt = Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)]
"""A setting's integer held apart from ``Settings`` (a bench arm's): its own bound is checked
again when it is put into ``Settings``."""
SettingFloat = Annotated[float, Field(ge=0, le=1, strict=True)]
"""A setting's fraction held apart from ``Settings`` (compile's memory budget, in a bench arm):
its own bound is checked again when it is put into ``Settings``."""
BlockNames = Annotated[
    str,
    Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[A-Za-z_<][\w.<>]*(,[A-Za-z_<][\w.<>]*)*$",
    ),
]
"""The classes of a model's blocks, each by its module and name (``pkg.model.Block``), joined
by commas (a class made in a function has ``<locals>`` in its name): a workload's ``blocks``,
held in a profile as text."""
MAX_SMALL_COUNT = 1_000_000
SmallCount = Annotated[int, Field(ge=0, le=MAX_SMALL_COUNT)]
"""Bookkeeping counts (timed blocks, MIG instance ids, compute-capability digits)."""
