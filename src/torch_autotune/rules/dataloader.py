"""DataLoader keyword arguments and CPU thread counts, from the CPUs this process may use.

Rules catalog F1-F12 (DataLoader), G1-G3 and G6 (threads), with surprises S7 (quotas), S21
(torch's default thread count) and S22 (persistent workers). Every count starts from
``host.cpus_usable``, which already honours container quotas and affinity masks (D8, S7), and is
divided among the training processes of the node (F1, G3).
"""

from __future__ import annotations

from collections.abc import Iterator

from torch_autotune.evidence import WORKERS_NO_DATASET, WORKERS_OUT_OF_TIME
from torch_autotune.hardware import Host
from torch_autotune.profile import Mode, Source
from torch_autotune.rules.context import Context, Finding
from torch_autotune.settings import THREAD_VARIABLES

MAX_GPU_WORKERS = 8
"""Ceiling of the rules' worker count for GPU training (F2: common heuristics stop at 8)."""

MAX_CPU_WORKERS = 4
"""Ceiling for CPU training, where workers take cores from the compute threads (G6)."""

CPUS_PER_CPU_WORKER = 4
"""CPU training: one worker per this many usable CPUs (heuristic, G6)."""

LOW_HOST_RAM_BYTES = 4 * 1024**3
"""Below this much available host RAM, pinned buffers risk starving the host (F6 warning)."""

_GUARDED_START_METHODS = ("spawn", "forkserver")
_MEASURE = "run autotune to measure"  # the heuristics' hint, where autotune did not measure


# --- describing the CPUs ------------------------------------------------------------------------


def _restriction(host: Host) -> str:
    """' (container quota 4 of the host's 64)' or '' when nothing restricts the CPUs."""
    limits = []
    if host.cpu_quota_cores is not None:
        limits.append(f"container quota {host.cpu_quota_cores:g}")
    logical = host.cpu_cores_logical
    if host.cpu_affinity_count is not None and logical and host.cpu_affinity_count < logical:
        limits.append(f"affinity mask of {host.cpu_affinity_count}")
    if not limits:
        return ""
    of = f" of the host's {logical}" if logical else ""
    return f" ({', '.join(limits)}{of})"


def cpu_budget(ctx: Context) -> str:
    """The CPUs each training process may keep busy, in words, e.g. '4 usable CPUs (...)'."""
    host, topology = ctx.snapshot.host, ctx.topology
    text = f"{host.cpus_usable} usable CPU(s){_restriction(host)}"
    processes = topology.processes_per_node
    if processes > 1:
        text += (
            f" shared by {processes} training processes: {topology.cpus_per_process} CPU(s) each"
        )
    return text


# --- DataLoader (F1-F12, S22) -------------------------------------------------------------------


_ONE_CPU = "which shares the one CPU with the training process, loading while the GPU computes"


def _workers(ctx: Context) -> tuple[int, str, str, Source]:
    """(num_workers, catalog id, why, source) for the DataLoader."""
    host = ctx.snapshot.host
    chosen = ctx.preferences.num_workers
    if chosen is not None:
        return (chosen, "F2", f"{chosen} worker(s): set by the user", Source.USER)
    measured = ctx.measurements.num_workers if ctx.measurements is not None else None
    if measured is not None:
        how = ctx.measurements.workers_reason if ctx.measurements is not None else None
        return (
            measured,
            "F2",
            how
            or f"{measured} worker(s), measured by the probe on this machine as the count that "
            f"fed training fastest ({cpu_budget(ctx)})",
            Source.MEASURED,
        )
    if host.os_name == "windows":
        return (
            0,
            "F9",
            "0 workers on Windows: every worker is a new interpreter (spawn) that re-imports the "
            "script and unpickles the dataset, seconds each and nearly one after another (F4), "
            'and needs the entry point under `if __name__ == "__main__":`. Loading in the '
            f"main process is the safe default; with {cpu_budget(ctx)}, set num_workers "
            "yourself (with persistent_workers) if loading is the bottleneck",
            Source.INFERRED,
        )
    cpus = ctx.topology.cpus_per_process
    if ctx.device in ("cuda", "mps"):
        workers = min(max(1, cpus - 1), MAX_GPU_WORKERS)
        left = "leaving a CPU for the training process" if cpus > 1 else _ONE_CPU
        return (
            workers,
            "F2",
            f"GPU training, {cpu_budget(ctx)}; min(max(1, {cpus} - 1), {MAX_GPU_WORKERS}) "
            f"= {workers} worker(s), {left} (a rule of thumb: {_MEASURE})",
            Source.INFERRED,
        )
    if cpus <= 2:
        return (
            0,
            "G6",
            f"CPU training with {cpu_budget(ctx)}: the model computes on these CPUs, and a "
            "worker would take one of the few there are; loading in the main process",
            Source.INFERRED,
        )
    workers = min(MAX_CPU_WORKERS, max(1, cpus // CPUS_PER_CPU_WORKER))
    return (
        workers,
        "G6",
        f"CPU training with {cpu_budget(ctx)}: workers compete with torch's compute threads for "
        f"the same CPUs, so a small count, one per {CPUS_PER_CPU_WORKER} CPUs (at most "
        f"{MAX_CPU_WORKERS}): {workers} worker(s), the rest for compute (a heuristic: {_MEASURE})",
        Source.INFERRED,
    )


def _spawn_note(ctx: Context, workers: int) -> str:
    """F9, S8: what a spawn/forkserver start method asks of the training script."""
    method = ctx.snapshot.software.multiprocessing_start_method
    if workers == 0 or method not in _GUARDED_START_METHODS:
        return ""
    return (
        f". Workers start with '{method}': put the training entry point under "
        '`if __name__ == "__main__":` and define the Dataset, collate_fn and worker_init_fn at '
        "module top level (picklable: no lambdas or closures)"
    )


def _host_ram_available(host: Host) -> int | None:
    """RAM new work can get: psutil's 'available', capped by a container limit."""
    values = [v for v in (host.memory_available_bytes, host.memory_limit_bytes) if v is not None]
    return min(values) if values else None


def _pin_memory(ctx: Context) -> Finding:
    setting = "dataloader.pin_memory"
    if ctx.device != "cuda":
        rule = "N4" if ctx.device == "mps" else "F7"
        return Finding(
            setting,
            False,
            rule,
            f"device is '{ctx.device}': pinned (page-locked) memory only speeds up copies to a "
            "CUDA/ROCm GPU; elsewhere torch warns or ignores it",
        )
    available = _host_ram_available(ctx.snapshot.host)
    if available is not None and available < LOW_HOST_RAM_BYTES:
        return Finding(
            setting,
            False,
            "F6",
            f"only {available / 1024**3:.1f} GiB of host RAM available (under "
            f"{LOW_HOST_RAM_BYTES // 1024**3} GiB): page-locked buffers cannot be swapped and "
            "could starve the host, so copies to the GPU stay unpinned (slower)",
        )
    return Finding(
        setting,
        True,
        "F6",
        "CUDA/ROCm GPU: copies from pinned (page-locked) host memory are much faster and can "
        "overlap compute; move batches with .to(device, non_blocking=True). Pinned buffers "
        "take host RAM that cannot be swapped",
    )


def _persistent_workers(ctx: Context, workers: int) -> Finding:
    setting = "dataloader.persistent_workers"
    method = ctx.snapshot.software.multiprocessing_start_method
    if workers == 0:
        return Finding(
            setting, False, "F3", "no workers to keep: torch refuses it with num_workers=0"
        )
    if method == "fork":
        return Finding(
            setting,
            False,
            "S22",
            "workers start with 'fork', which is cheap, so keeping them between epochs gains "
            "little while their RAM stays allocated and dataset state carries over; set it "
            "if your workers are slow to start",
        )
    return Finding(
        setting,
        True,
        "F4",
        f"workers start with '{method}': each one starts a new interpreter and unpickles the "
        "dataset, seconds per worker, so they are kept alive between epochs instead. Their RAM "
        "stays allocated and dataset state carries over from one epoch to the next",
    )


def _prefetch_factor(workers: int) -> Finding:
    if workers == 0:
        return Finding(
            "dataloader.prefetch_factor",
            None,
            "F3",
            "torch's default: without workers nothing is prefetched, and torch refuses any "
            "other value",
        )
    return Finding(
        "dataloader.prefetch_factor",
        None,
        "F5",
        f"torch's default: 2 batches ahead per worker, {2 * workers} in all; raise it only "
        "when loading is I/O-bound, at the cost of host (and pinned) RAM",
    )


def _seed_workers(ctx: Context) -> Finding:
    if ctx.mode is Mode.REPRODUCIBLE:
        return Finding(
            "dataloader.seed_workers",
            True,
            "F12",
            "reproducible mode: every worker seeds numpy and random from a seeded "
            "torch.Generator (worker_init_fn), otherwise workers repeat or vary their "
            "augmentations; the generator also fixes the shuffle order",
        )
    return Finding(
        "dataloader.seed_workers",
        False,
        "F12",
        f"{ctx.mode.value} mode does not ask for repeatable data order or augmentations",
    )


def dataloader(ctx: Context) -> Iterator[Finding]:
    """F1-F12, S22: DataLoader workers, pinning, persistence, prefetch and seeding."""
    workers, rule, why, source = _workers(ctx)
    said = ctx.measurements.workers_reason if ctx.measurements is not None else None
    if said == WORKERS_OUT_OF_TIME:
        why += "; autotune ran out of time before measuring them (--budget gives it more)"
    elif said == WORKERS_NO_DATASET and source is Source.INFERRED:  # no "run autotune" then
        why = why.replace(_MEASURE, "the workload tuned had no dataset to measure them on")
    yield Finding("dataloader.num_workers", workers, rule, why + _spawn_note(ctx, workers), source)
    yield _pin_memory(ctx)
    yield _persistent_workers(ctx, workers)
    yield _prefetch_factor(workers)
    yield _seed_workers(ctx)


# --- CPU threads (G1-G3, G6, S21) ---------------------------------------------------------------


def _torch_default_threads(host: Host) -> int | None:
    """What torch's intra-op pool sizes itself to: usually the physical cores (G1, S21)."""
    return host.cpu_cores_physical or host.cpu_cores_logical


def _default_text(host: Host) -> str:
    default = _torch_default_threads(host)
    if default is None:
        return "the host's core count is unknown"
    kind = "physical" if host.cpu_cores_physical else "logical"
    return f"torch's default pool is sized for the host's {default} {kind} cores"


def _pool(ctx: Context) -> tuple[int | None, str]:
    """torch's intra-op pool, and the words for it: the count the process that read the
    machine had where it was not torch's default (``tune`` reads its own: a script's
    torch.set_num_threads(8) on 2 CPUs trains at 8, not at the default the cores give), else
    the default (G1, S21)."""
    host, here = ctx.snapshot.host, ctx.snapshot.software.torch_num_threads
    default = _torch_default_threads(host)
    if here is None or here == default:
        return default, _default_text(host)
    return here, (
        f"torch's pool has {here} thread{'s' * (here != 1)} in the process that read the "
        f"machine (torch.get_num_threads(), against a default of {default or 'unknown'}: "
        "OMP_NUM_THREADS, torch.set_num_threads or the CPUs it may run on change it), the "
        "count a script that sets none trains at"
    )


def _cpu_training_threads(ctx: Context) -> tuple[int | None, str, str]:
    """G6 (and G2/G3): compute threads on the CPUs the DataLoader workers leave free."""
    host = ctx.snapshot.host
    default, pool = _pool(ctx)
    workers = int(ctx.get("dataloader.num_workers"))
    topology = ctx.topology
    left = topology.cpus_per_process - workers
    want = max(1, left)
    budget = f"{cpu_budget(ctx)}, less {workers} DataLoader worker(s): {want} thread(s) for compute"
    if left < 1:
        budget = (
            f"{cpu_budget(ctx)}, all taken by {workers} DataLoader worker(s): 1 thread for "
            "compute, the fewest"
        )
    if default is not None and want >= default:
        return (
            None,
            "G1",
            f"left to torch: {pool}, which fits in {budget}",
        )
    if topology.processes_per_node > 1:
        rule = "G3"
    elif default is None or host.cpus_usable < default:
        rule = "G2"  # a quota or affinity mask, not the workers, is what makes it too many
    else:
        rule = "G6"
    return want, rule, f"{budget}; {pool} and would oversubscribe the CPUs"


def _gpu_training_threads(ctx: Context) -> tuple[int | None, str, str]:
    """G2/G3: the GPU computes; threads are only capped where the CPUs per process are fewer."""
    default, pool = _pool(ctx)
    topology = ctx.topology
    want = topology.cpus_per_process
    ranks = topology.processes_per_node > 1
    if default is not None and want >= default:
        note = "; torchrun sets OMP_NUM_THREADS=1 per rank when it is unset (G3)" if ranks else ""
        return (
            None,
            "G1",
            f"left to torch: {pool}, within {cpu_budget(ctx)}{note}",
        )
    return (
        want,
        "G3" if ranks else "G2",
        f"{cpu_budget(ctx)}: {want} thread(s) per process; {pool}, more than this process may "
        "use, which oversubscribes the CPUs and gets throttled",
    )


def cpu_threads(ctx: Context) -> Iterator[Finding]:
    """G1-G3, G6: torch.set_num_threads and the OpenMP/MKL variables, from the usable CPUs.

    Reads ``dataloader.num_workers``, so the dataloader rule must run first.
    """
    measured = ctx.measurements
    if ctx.device == "cpu" and measured is not None and measured.threads_reason is not None:
        threads, rule, why = measured.cpu_threads, "G6", measured.threads_reason
        yield Finding("cpu_threads", threads, rule, why, Source.MEASURED)
    else:
        threads, rule, why = (
            _cpu_training_threads(ctx) if ctx.device == "cpu" else _gpu_training_threads(ctx)
        )
        yield Finding("cpu_threads", threads, rule, why)
    for variable in THREAD_VARIABLES:
        if threads is None:
            yield Finding(
                f"environment.{variable}",
                None,
                rule,
                "not set: torch's default thread count is kept (see cpu_threads)",
            )
        else:
            yield Finding(
                f"environment.{variable}",
                str(threads),
                rule,
                f"{threads}, as cpu_threads: exported before torch and numpy are imported, so "
                "the OpenMP/MKL pools start at that size (MKL can ignore OMP_NUM_THREADS, hence "
                "torch.set_num_threads as well, S21)",
            )
