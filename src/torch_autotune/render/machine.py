"""A snapshot, a profile and the difference of two profiles as text a person reads in a
terminal. No hardware, no decisions here."""

from __future__ import annotations

from rich import box
from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from torch_autotune.hardware import Accelerator, HardwareSnapshot
from torch_autotune.profile import Decision, Profile

_GIB = 1 << 30


def gib(value: int | None) -> str:
    """Bytes as GiB with one decimal, or '?' when unknown."""
    return "?" if value is None else f"{value / _GIB:.1f} GiB"


def _or(value: object, missing: str = "?") -> str:
    return missing if value is None else str(value)


def _accelerator_row(a: Accelerator) -> list[str]:
    cc = "-" if a.compute_capability is None else "{}.{}".format(*a.compute_capability)
    memory = gib(a.memory_total_bytes) + (" shared" if a.unified_memory else "")
    name = a.name
    if a.mig is not None and "MIG" not in name:
        name += f" MIG {a.mig.profile}"
    arch = a.architecture.value
    if a.backend.value != "cuda":
        arch += f" ({a.backend.value})"  # ROCm and MPS; CUDA is the unmarked case
    return [
        str(a.index),
        name,
        arch,
        cc,
        {True: "yes", False: "no", None: "?"}[a.tensor_cores],
        memory,
        gib(a.memory_free_bytes),
        _or(a.sm_count, "-" if a.backend.value == "mps" else "?"),
    ]


def _accelerators(snapshot: HardwareSnapshot) -> Table | Text:
    if not snapshot.accelerators:
        return Text("No GPU this process can use: training runs on the CPU.")
    # TC: Tensor Cores (NVIDIA) or matrix cores (AMD), the units AMP needs to pay off.
    table = Table(title="Accelerators", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("#", "name", "arch", "cc", "TC", "memory", "free", "SMs"):
        right = column in ("#", "SMs", "memory", "free")
        table.add_column(column, justify="right" if right else "left", no_wrap=column != "name")
    for accelerator in snapshot.accelerators:
        table.add_row(*_accelerator_row(accelerator))
    return table


def facts_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    return table


def _host(snapshot: HardwareSnapshot) -> Table:
    h = snapshot.host
    system = f"{h.os_name} {_or(h.os_version, '')}".strip()
    if h.wsl:
        system += " (WSL)"
    if h.libc:
        system += f", {h.libc}"
    quota = "none" if h.cpu_quota_cores is None else f"{h.cpu_quota_cores:g}"
    ram = f"{gib(h.memory_total_bytes)} total, {gib(h.memory_available_bytes)} available"
    if h.memory_limit_bytes is not None:
        ram += f", container limit {gib(h.memory_limit_bytes)}"
    rows = [
        ("system", system),
        ("CPU", f"{_or(h.cpu_model)} ({h.cpu_architecture})"),
        (
            "CPUs usable",
            f"{h.cpus_usable}  (logical {_or(h.cpu_cores_logical)}, physical "
            f"{_or(h.cpu_cores_physical)}, affinity {_or(h.cpu_affinity_count)}, quota {quota})",
        ),
        ("RAM", ram),
    ]
    if h.shm_total_bytes is not None:
        rows.append(("/dev/shm", f"{gib(h.shm_total_bytes)} ({gib(h.shm_free_bytes)} free)"))
    return facts_table("Host", rows)


def _software(snapshot: HardwareSnapshot) -> Table:
    s = snapshot.software
    build = {
        "cuda": f"CUDA {s.torch_cuda_version} build",
        "rocm": f"ROCm/HIP {s.torch_hip_version} build",
        "cpu": "CPU-only build",
        "absent": "not installed",
    }[s.torch_build]
    torch = "not installed" if s.torch_version is None else f"{s.torch_version} ({build})"
    if s.torch_cuda_arch_list is None:
        kernels = "unknown (run 'autotune detect --deep')"
    elif not s.torch_cuda_arch_list:
        kernels = "none (no GPU kernels in this build)"
    else:
        kernels = " ".join(s.torch_cuda_arch_list)
        if s.torch_cuda_arch_list_source == "release-table":
            kernels += "  (from PyTorch's build matrix)"
    python = f"{s.python_version} ({s.python_implementation}"
    python += ", free-threaded" if not s.python_gil_enabled else ""
    python += f", start method {s.multiprocessing_start_method})"
    rows = [("python", python), ("torch", torch), ("GPU kernels", kernels)]
    if s.torch_build in ("cuda", "rocm") or s.nvidia_driver_version:
        rows += [
            ("cuDNN", _or(s.cudnn_version, "-")),
            ("driver", f"{_or(s.nvidia_driver_version, '-')} (CUDA {_or(s.cuda_driver_version)})"),
        ]
    triton = "no" if not s.triton_available else f"yes {_or(s.triton_version, '')}".strip()
    rows.append(("triton", triton))
    if s.torch_num_threads is not None:
        rows.append(("torch threads", str(s.torch_num_threads)))
    return facts_table("Software", rows)


def took(seconds: float) -> str:
    """A detection's time as a person reads it: a fast one takes milliseconds, and "0.00 s"
    reads as a clock that did not run."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 0.0005:
        return f"{seconds * 1000:.0f} ms"
    return "under 1 ms"


def render_snapshot(snapshot: HardwareSnapshot, console: Console) -> None:
    """Print a readable summary of a snapshot."""
    console.print(
        Text(
            f"torch-autotune {snapshot.tool_version}: {snapshot.detection_depth} detection "
            f"in {took(snapshot.detection_seconds)}",
            style="bold",
        )
    )
    parts: list[Table | Text] = [_accelerators(snapshot), _host(snapshot), _software(snapshot)]
    if snapshot.warnings:
        warnings = Table(title="Could not read", title_justify="left", show_header=False, box=None)
        warnings.add_column(style="yellow")
        warnings.add_column()
        for warning in snapshot.warnings:
            warnings.add_row(warning.field, warning.reason)
        parts.append(warnings)
    console.print(Group(*parts))


def plain_value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def render_profile(
    profile: Profile,
    console: Console,
    *,
    title: str | None = None,
    measured_on: str = "this machine",
) -> None:
    """Print a profile: every setting with its value, the rule that chose it, and why.
    ``measured_on``: where a measured profile was measured, in words."""
    snapshot = profile.provenance.snapshot
    gpus = ", ".join(sorted({a.name for a in snapshot.accelerators})) or "no GPU"
    measured = f"measured on {measured_on}" if profile.measured else "rules only, not measured"
    if profile.evidence is not None:
        measured += f" with the {profile.evidence.workload} workload"
    console.print(
        Text(
            title
            or f"Profile for {gpus} ({profile.settings.device}), mode {profile.mode.value}: "
            f"{measured}",
            style="bold",
        )
    )
    final: dict[str, Decision] = {}
    for decision in profile.decisions:
        final[decision.setting] = decision  # the last decision for a setting is the one in force
    for decision in final.values():
        line = Text()
        line.append(decision.setting, style="bold")
        line.append(" = ")
        line.append(plain_value(decision.value), style="cyan")
        if decision.source.value == "measured":
            line.append(" (measured)", style="green")
        line.append(f"  [{decision.rule}]", style="dim")
        console.print(line)
        console.print(Padding(Text(decision.reason), (0, 0, 0, 4), expand=False))
    for note in profile.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    console.print(
        Text(
            f"fingerprint {profile.provenance.fingerprint}, torch "
            f"{profile.provenance.torch_version}, made {profile.provenance.created_at:%Y-%m-%d}",
            style="dim",
        )
    )


def render_diff(rows: list[tuple[str, object, object]], console: Console) -> None:
    """Print the settings two profiles disagree on."""
    if not rows:
        console.print("The two profiles have the same settings.")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("setting", "first", "second"):
        table.add_column(column)
    for setting, first, second in rows:
        table.add_row(setting, plain_value(first), plain_value(second))
    console.print(table)
