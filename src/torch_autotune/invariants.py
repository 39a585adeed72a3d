"""The cross-field invariants of a profile: what no machine can apply, refused with the fix.

A hand-edited file that asks for bf16 on a V100 or persistent workers without workers is
refused with a message that names the problem, never applied. The checks read the settings,
the snapshot the profile was made from and the evidence, so they can be made on any machine;
the hardware thresholds are the rules' own (``torch_autotune.thresholds``), written once.

Advice is not an invariant: what runs but is slower (channels_last without AMP, pinned memory
without CUDA, max-autotune on a GPU too small for its GEMM autotuning) is the rules' to decide
(H1, the DataLoader's and compile's rules), with a reason; a hand-edited profile that asks for
it loads. Only what cannot run, or contradicts itself, is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torch_autotune.evidence import MEMORY_DEFAULTS, Evidence
from torch_autotune.hardware import Accelerator, Backend, HardwareSnapshot, Vendor
from torch_autotune.settings import THREAD_VARIABLES, Settings, memory_settings
from torch_autotune.thresholds import (
    BASELINE_THREADS_PER_CPU,
    BASELINE_WORKERS_PER_CPU,
    BF16_MIN_CC,
    COMPILE_MIN_TORCH,
    FP32_PRECISION_API_MIN_TORCH,
    MEMORY_BUDGET_MIN_TORCH,
    TF32_MIN_CC,
)


def torch_release(version: str | None) -> tuple[int, int] | None:
    """'2.8.0+cu128' -> (2, 8); None when unknown or unparsable."""
    if not version:
        return None
    parts = version.split("+", 1)[0].split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return None


def target_accelerators(settings: Settings, snapshot: HardwareSnapshot) -> list[Accelerator]:
    """The accelerators a profile's device setting trains on."""
    return device_accelerators(settings.device, snapshot)


def device_accelerators(device: str, snapshot: HardwareSnapshot) -> list[Accelerator]:
    """The accelerators of ``snapshot`` that ``device`` ('cuda', 'mps', 'cpu') trains on: for
    'cuda', the GPUs the installed torch drives, NVIDIA's under a CUDA build and AMD's under a
    ROCm build (which answers to 'cuda' too); a box with both trains on one kind only."""
    if device == "cuda":
        build = snapshot.software.torch_build
        wanted = {
            "cuda": {Backend.CUDA},
            "rocm": {Backend.ROCM},
        }.get(build, {Backend.CUDA, Backend.ROCM})
    elif device == "mps":
        wanted = {Backend.MPS}
    else:
        return []
    return [a for a in snapshot.accelerators if a.backend in wanted]


def _cc_text(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


@dataclass(frozen=True)
class _Scope:
    """What the invariant checks look at."""

    settings: Settings
    targets: list[Accelerator]
    nvidia: list[Accelerator]
    torch_version: str | None

    @property
    def release(self) -> tuple[int, int] | None:
        return torch_release(self.torch_version)

    def nvidia_below(self, cc: tuple[int, int]) -> list[str]:
        return [
            a.name for a in self.nvidia if a.compute_capability is None or a.compute_capability < cc
        ]


def _dataloader_problems(scope: _Scope) -> list[str]:
    dl = scope.settings.dataloader
    problems = []
    if dl.num_workers == 0 and dl.persistent_workers:
        problems.append(
            "settings.dataloader.persistent_workers: needs num_workers > 0 "
            "(set persistent_workers: false)"
        )
    if dl.num_workers == 0 and dl.prefetch_factor is not None:
        problems.append(
            "settings.dataloader.prefetch_factor: needs num_workers > 0 (set prefetch_factor: null)"
        )
    return problems


def _precision_problems(scope: _Scope) -> list[str]:
    p, device = scope.settings.precision, scope.settings.device
    problems = []
    if p.grad_scaler and p.dtype == "bfloat16":
        problems.append(
            "settings.precision.grad_scaler: bf16 needs no loss scaling, and GradScaler fails "
            "on bf16 gradients (set grad_scaler: false)"
        )
    if p.grad_scaler and not p.autocast:
        problems.append("settings.precision.grad_scaler: only with autocast (set it false)")
    if p.autocast == (p.dtype == "float32"):
        problems.append(
            "settings.precision: autocast and dtype disagree (autocast true needs float16 or "
            "bfloat16; float32 needs autocast false)"
        )
    if p.dtype == "float16" and device == "cuda" and not p.grad_scaler:
        problems.append(
            "settings.precision.grad_scaler: fp16 on a GPU needs a GradScaler, or small "
            "gradients underflow to zero (set grad_scaler: true)"
        )
    emulated = scope.nvidia_below(BF16_MIN_CC)
    if p.dtype == "bfloat16" and emulated:
        problems.append(
            f"settings.precision.dtype: bfloat16 needs compute capability "
            f"{_cc_text(BF16_MIN_CC)} or newer; {', '.join(emulated)} would only emulate it "
            "(use float16)"
        )
    return problems


def _matmul_problems(scope: _Scope) -> list[str]:
    m, device = scope.settings.matmul, scope.settings.device
    problems = []
    all_nvidia = bool(scope.nvidia) and len(scope.nvidia) == len(scope.targets)
    if m.tf32 and (device != "cuda" or not all_nvidia or scope.nvidia_below(TF32_MIN_CC)):
        problems.append(
            f"settings.matmul.tf32: TF32 exists only on NVIDIA Ampere (cc {_cc_text(TF32_MIN_CC)})"
            " and newer (set tf32: false)"
        )
    if m.api is not None and scope.release is not None:
        wanted = "fp32_precision" if scope.release >= FP32_PRECISION_API_MIN_TORCH else "allow_tf32"
        if m.api != wanted:
            problems.append(
                f"settings.matmul.api: torch {scope.torch_version} uses '{wanted}', not "
                f"'{m.api}' (mixing the two raises in torch)"
            )
    if m.tf32 and m.api is None:
        problems.append("settings.matmul.api: TF32 on needs the API to set it with")
    return problems


def _compile_problems(scope: _Scope) -> list[str]:
    c, b = scope.settings.compile, scope.settings.backends
    problems = []
    if c.enabled and scope.release is not None and scope.release < COMPILE_MIN_TORCH:
        problems.append(
            f"settings.compile.enabled: torch.compile needs torch {_cc_text(COMPILE_MIN_TORCH)} "
            f"or newer, this is {scope.torch_version} (set enabled: false)"
        )
    if c.enabled != (c.mode is not None):
        problems.append("settings.compile.mode: set exactly when compile is enabled")
    if c.memory_budget is not None and not c.enabled:
        problems.append(
            "settings.compile.memory_budget: only compiled graphs read it, and compile is off "
            "(remove memory_budget, or enable compile)"
        )
    old = scope.release is not None and scope.release < MEMORY_BUDGET_MIN_TORCH
    if c.memory_budget is not None and old:
        problems.append(
            f"settings.compile.memory_budget: torch {_cc_text(MEMORY_BUDGET_MIN_TORCH)} added "
            f"it, this is {scope.torch_version} (remove memory_budget)"
        )
    if b.deterministic_algorithms and b.cudnn_benchmark:
        problems.append(
            "settings.backends.cudnn_benchmark: the autotuner picks algorithms by timing, "
            "which deterministic mode forbids (set cudnn_benchmark: false)"
        )
    return problems


def settings_problems(
    settings: Settings,
    snapshot: HardwareSnapshot,
    torch_version: str | None,
    share: tuple[int, int] | None = None,
) -> list[str]:
    """What in ``settings`` cannot run on the machine of ``snapshot`` with this torch, as
    'where: what is wrong (how to fix)'; ``share``: (the CPUs of each training process, the
    processes), where the profile's topology gives them (default: the machine's, one)."""
    targets = target_accelerators(settings, snapshot)
    scope = _Scope(
        settings=settings,
        targets=targets,
        nvidia=[a for a in targets if a.vendor is Vendor.NVIDIA],
        torch_version=torch_version,
    )
    problems: list[str] = []
    if settings.device in ("cuda", "mps") and not targets:
        problems.append(
            f"settings.device: '{settings.device}' but the snapshot has no such accelerator"
        )
    for check in (_dataloader_problems, _precision_problems, _matmul_problems, _compile_problems):
        problems += check(scope)
    problems += environment_problems(settings)
    cpus, processes = share or (snapshot.host.cpus_usable, 1)
    return problems + count_problems(settings, cpus, processes)


WORKSPACE_CONFIGS = (":4096:8", ":16:8")
"""The BLAS workspace settings torch documents for deterministic GEMMs (cuBLAS, and hipBLAS on
ROCm, read the same form); torch's deterministic mode raises on any other."""


def environment_problems(settings: Settings) -> list[str]:
    """The variables of ``settings.environment`` whose values the program reading them cannot
    use, as 'where: what is wrong (how to fix)': a thread count that is no positive whole
    number or differs from ``cpu_threads`` (the rules write them equal), a BLAS workspace
    other than torch's two, an allocator setting that is no comma-separated 'key:value' list."""
    problems = []
    for name, value in sorted(settings.environment.items()):
        where = f"settings.environment.{name}: {value!r}"
        if name in THREAD_VARIABLES:
            threads = settings.cpu_threads
            same = f"set it to cpu_threads, '{threads}'" if threads is not None else None
            if not (value.isascii() and value.isdigit() and int(value) > 0):
                fix = same or "set it to the CPU threads a process uses, such as '4', or remove it"
                problems.append(f"{where} is not a positive whole number ({fix})")
            elif threads is not None and int(value) != threads:
                problems.append(f"{where} differs from cpu_threads {threads} ({same})")
        elif name in ("CUBLAS_WORKSPACE_CONFIG", "HIPBLAS_WORKSPACE_CONFIG"):
            if value not in WORKSPACE_CONFIGS:
                problems.append(
                    f"{where} is not a workspace torch's deterministic mode accepts (set it to "
                    "':4096:8', or ':16:8' for less memory)"
                )
        elif not _key_value_list(value):  # the allocator's PYTORCH_CUDA_ALLOC_CONF
            problems.append(
                f"{where} is not a comma-separated list of key:value pairs (write it as "
                "torch's allocator reads it, such as 'expandable_segments:True')"
            )
    return problems


def _key_value_list(value: str) -> bool:
    """Whether ``value`` is 'key:value[,key:value...]' as torch's allocator reads it, a value
    of roundup_power2_divisions a bracketed list ('[256:1,>:2]') with commas of its own."""
    parts, depth, start = [], 0, 0
    for at, char in enumerate(value):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0:
            return False
        if char == "," and depth == 0:
            parts.append(value[start:at])
            start = at + 1
    parts.append(value[start:])
    if depth != 0:
        return False
    for part in parts:
        key, colon, setting = part.partition(":")
        if not (colon and key.strip().isidentifier() and setting.strip()):
            return False
    return True


COUNT_PATHS = {
    "num_workers": "settings.dataloader.num_workers",
    "cpu_threads": "settings.cpu_threads",
}
"""Where a profile holds each count ``too_many`` bounds, by its name."""


def cpu_counts(settings: Settings) -> dict[str, int | None]:
    """The counts of ``settings`` that ``too_many`` bounds ('num_workers', 'cpu_threads'; None:
    torch's default), as ``check_cpu_counts`` takes them."""
    return {"num_workers": settings.dataloader.num_workers, "cpu_threads": settings.cpu_threads}


def count_problems(settings: Settings, cpus: int, processes: int = 1) -> list[str]:
    """The DataLoader workers or CPU threads of ``settings`` that the machine the profile was
    made for, with ``cpus`` usable CPUs for each of its ``processes`` (``Topology``), cannot
    run (``too_many``): a hand-edited ``num_workers: 100`` on 2 CPUs validated, and its bench
    made no progress in 200 s; 256 threads in each of 8 processes on 256 CPUs did too.

    The machine is the one the profile records, not the one that reads it: a profile made
    for a 64-CPU box (``autotune recommend --snapshot``) with 16 workers is sound, and is
    refused only where it is used on fewer CPUs (``autotune bench --profile``, ``apply()``)."""
    machine = "the machine it was made for"
    if processes > 1:
        machine = f"each of the {processes} processes of {machine}"
    found = (
        too_many(name, asked, f"{COUNT_PATHS[name]}:", cpus, machine=machine)
        for name, asked in cpu_counts(settings).items()
        if asked is not None
    )
    return [problem for problem in found if problem is not None]


def check_cpu_counts(
    counts: Mapping[str, int | None],
    cpus: Callable[[], int],
    named: Callable[[str], str] = str,
) -> None:
    """ValueError with ``too_many``'s line for the first of ``counts`` ('num_workers',
    'cpu_threads': the count asked, None for none) that this machine cannot run, ``named`` as
    the input names it. ``cpus()``, the CPUs usable here, is read only where a count is asked:
    the command line's ``--workers``, baseline file and ``bench --profile``,
    ``tune(num_workers=...)``, ``bench(profile, baseline=...)`` and ``Profile.apply()`` all
    hold these bounds, with the same line (a profile file, against the machine it was made
    for: ``count_problems``)."""
    for name, asked in counts.items():
        if asked is None:
            continue
        problem = too_many(name, asked, named(name), cpus())
        if problem is not None:
            raise ValueError(problem)


def too_many(
    name: str, asked: int, named: str, cpus: int, *, machine: str = "this machine"
) -> str | None:
    """The one line that refuses ``asked`` DataLoader workers (``name`` 'num_workers') or CPU
    threads ('cpu_threads'), ``named`` as the input names it, where ``cpus`` usable CPUs of
    ``machine`` cannot run so many: ``thresholds.BASELINE_WORKERS_PER_CPU`` workers, or
    ``BASELINE_THREADS_PER_CPU`` threads, a usable CPU. None where they can."""
    if name == "num_workers":
        per_cpu, what, why = (
            BASELINE_WORKERS_PER_CPU,
            "DataLoader workers",
            "for a loader that waits on storage",
        )
    else:
        per_cpu, what, why = (
            BASELINE_THREADS_PER_CPU,
            "CPU threads",
            "more would take turns on them, slower",
        )
    most = per_cpu * cpus
    if asked <= most:
        return None
    return (
        f"{named} {asked} is more than {machine} can run: {cpus} usable CPU"
        f"{'s' if cpus > 1 else ''}, at most {most} {what} ({per_cpu} a CPU, {why}); ask for "
        f"{most} or fewer"
    )


def batch_problems(settings: Settings, evidence: Evidence | None) -> list[str]:
    """A measured batch size must be one that ran, with the profile's values of the settings
    that change memory (``memory_settings``): never hand out a size that did not.

    The probe's records name the variant they ran with, and the evidence keeps each variant's
    settings; the bench's arms hold theirs. Where the rules keep torch.compile but the probe
    could not measure it (its compile did not fit the budget: ``evidence.compile`` says so, and
    so do the batch's reason and the summary), compile is left out of the comparison: the
    batch ran eager, and the profile says that is all it knows."""
    batch = settings.batch.batch_size
    if batch is None:
        return []
    wanted = memory_settings(settings)
    if evidence is not None and evidence.compile is not None and not evidence.compile.measured:
        wanted.pop("compile", None)
    if evidence is None or batch not in evidence.ran():
        return [
            f"settings.batch.batch_size: {batch} is not a size the probe ran on this machine "
            "(run 'autotune' to measure, or set batch_size: null)"
        ]
    if batch not in evidence.ran(wanted) | _bench_ran(evidence, wanted):
        ran = ", ".join(f"{k} {v}" for k, v in wanted.items())
        return [
            f"settings.batch.batch_size: {batch} ran on this machine, but never with these "
            f"settings that change how much memory a batch needs ({ran}); run 'autotune' to "
            "measure it with them, or set batch_size: null"
        ]
    return []


def _bench_ran(evidence: Evidence, wanted: dict[str, str]) -> set[int]:
    """Batch sizes a bench arm trained with ``wanted``; an arm of an earlier file, which did
    not record its settings, counts."""
    if evidence.bench is None:
        return set()
    return {
        arm.config.batch_size
        for arm in evidence.bench.arms
        if any(arm.samples_per_s)
        and (
            not arm.memory
            or all(arm.memory.get(k, MEMORY_DEFAULTS.get(k)) == v for k, v in wanted.items())
        )
    }
