"""Turn snapshots into text a person reads in a terminal. No hardware, no decisions here."""

from __future__ import annotations

import errno
import io
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO, cast

from rich import box
from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from torch_autotune.bench import BenchEvidence, Effect
from torch_autotune.hardware import Accelerator, HardwareSnapshot
from torch_autotune.profile import CompileRecord, Decision, Evidence, Profile

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


def _facts(title: str, rows: list[tuple[str, str]]) -> Table:
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
    return _facts("Host", rows)


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
    return _facts("Software", rows)


def render_snapshot(snapshot: HardwareSnapshot, console: Console) -> None:
    """Print a readable summary of a snapshot."""
    console.print(
        Text(
            f"torch-autotune {snapshot.tool_version}: {snapshot.detection_depth} detection "
            f"in {snapshot.detection_seconds:.2f} s",
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


def _value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def render_profile(profile: Profile, console: Console, *, title: str | None = None) -> None:
    """Print a profile: every setting with its value, the rule that chose it, and why."""
    snapshot = profile.provenance.snapshot
    gpus = ", ".join(sorted({a.name for a in snapshot.accelerators})) or "no GPU"
    measured = "measured on this machine" if profile.measured else "rules only, not measured"
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
        line.append(_value(decision.value), style="cyan")
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
        table.add_row(setting, _value(first), _value(second))
    console.print(table)


UNWRAPPED_WIDTH = 4096
"""The width of a console that is not a terminal: wide enough that no line is wrapped."""


def make_console(*, stderr: bool = False, environ: Mapping[str, str] | None = None) -> Console:
    """A console for the command's output: rich's own on a terminal. Anywhere else (a pipe, a
    log file, CI) rich would wrap every line at 80 columns and pad lines with spaces; this one
    keeps each line whole, unless ``COLUMNS`` in ``environ`` asks for a width, and ends it at
    its last character."""
    console = _Console(stderr=stderr, highlight=False)  # writes to sys.stdout/err at print time
    if is_terminal(console):
        return console
    env = os.environ if environ is None else environ
    width = None if env.get("COLUMNS") else UNWRAPPED_WIDTH
    lines = cast("TextIO", _TrimmedLines(stderr))  # rich writes, flushes, asks isatty/encoding
    return _Console(file=lines, width=width, highlight=False)


class _Console(Console):
    """rich's Console, but a closed pipe is the command's to handle (quietly, exit 141): rich's
    own handling exits 1 on its own."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


class _TrimmedLines(io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr``, looked up at every write as rich does, with the spaces
    that end each line (a table's padding) left out."""

    _TRAILING = re.compile(r"[ \t]+(?=\n)")

    def __init__(self, stderr: bool) -> None:
        self.stderr = stderr

    @property
    def stream(self) -> TextIO:
        return sys.stderr if self.stderr else sys.stdout

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        self.stream.write(self._TRAILING.sub("", text))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


def is_terminal(console: Console) -> bool:
    """Whether a person watches ``console`` live: a terminal that can redraw a line."""
    return console.is_terminal and not console.is_dumb_terminal


@contextmanager
def progress_reporter(
    budget_s: float,
    console: Console | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[Callable[[str, str], None]]:
    """A progress callback that shows each phase and what it tries, against the time budget.

    On a terminal, a progress bar that is gone when the run ends. Anywhere else (CI, nohup, a
    log file), where a bar shows nothing, one plain line per call on ``console`` (default:
    stderr), such as ``autotune: [12.3 s of 120 s] search: batch 64``: one for each phase
    and each trial, so that a log says where the time went.
    """
    console = console or make_console(stderr=True)
    if not is_terminal(console):
        yield _plain_reporter(budget_s, console, clock)
        return
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        TextColumn("of {task.total:.0f} s budget"),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("starting", total=budget_s)
        started = clock()

        def report(phase: str, what: str) -> None:
            total = _budget_told(phase, what)
            if total is not None:
                progress.update(task, total=total)
            progress.update(task, description=f"{phase}: {what}", completed=clock() - started)

        yield report


def _budget_told(phase: str, what: str) -> float | None:
    """The budget ``tune()`` chose, from its ``("budget", "180 s")`` report; None otherwise."""
    if phase != "budget":
        return None
    try:
        return float(what.removesuffix(" s"))
    except ValueError:
        return None


def _plain_reporter(
    budget_s: float, console: Console, clock: Callable[[], float]
) -> Callable[[str, str], None]:
    """One line per call (a call that repeats the one before is left out)."""
    started = clock()
    last: list[tuple[str, str]] = []
    total = [budget_s]

    def report(phase: str, what: str) -> None:
        if last == [(phase, what)]:
            return
        last[:] = [(phase, what)]
        told = _budget_told(phase, what)
        total[0] = total[0] if told is None else told
        line = f"autotune: [{clock() - started:.1f} s of {total[0]:.0f} s] {phase}: {what}"
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    return report


def render_run(profile: Profile, console: Console, saved: Path | None) -> None:
    """The summary of a full run: machine, decisions, batch sizes, throughput, workers."""
    evidence = profile.evidence
    snapshot = profile.provenance.snapshot
    gpus = ", ".join(sorted({a.name for a in snapshot.accelerators})) or "no GPU"
    facts = [
        (
            "machine",
            f"{gpus}; {snapshot.host.cpus_usable} usable CPUs; torch "
            f"{snapshot.software.torch_version}",
        ),
        ("device", profile.settings.device),
    ]
    if evidence is not None:
        limit = f"{evidence.max_batch_size} (limited by {evidence.limited_by}"
        limit += f": {evidence.limit_reason})" if evidence.limit_reason else ")"
        facts += [
            ("workload", evidence.workload),
            ("largest batch", limit),
            ("fastest batch", str(evidence.fastest_batch_size)),
            ("recommended", f"{evidence.batch_size} (ran again before it was recommended)"),
            ("run time", _run_time(evidence)),
        ]
        if evidence.compile is not None:
            facts.append(("torch.compile", _compile_text(evidence.compile)))
    s = profile.settings
    facts += [
        ("precision", s.precision.dtype + (" + GradScaler" if s.precision.grad_scaler else "")),
        ("TF32", _value(s.matmul.tf32)),
        ("compile", str(s.compile.mode) if s.compile.enabled else "off"),
        ("memory format", s.memory_format),
        (
            "DataLoader",
            f"{s.dataloader.num_workers} workers, pin_memory {_value(s.dataloader.pin_memory)}",
        ),
    ]
    console.print(_facts("torch-autotune: measured profile", facts))
    if evidence is not None and evidence.throughput:
        table = Table(title="Throughput", title_justify="left", box=box.SIMPLE_HEAD)
        for column in ("batch", "samples/s", "spread", "note"):
            table.add_column(column, justify="right" if column != "note" else "left")
        for record in evidence.throughput:
            notes = ["compiled" if record.compiled else "eager"]
            if not record.steady:
                notes.append("noisy: not used to choose")
            table.add_row(
                str(record.batch_size),
                f"{record.samples_per_s:.1f}",
                f"{record.relative_spread * 100:.0f}%",
                ", ".join(notes),
            )
        console.print(table)
    if evidence is not None and evidence.loader:
        table = Table(title="DataLoader workers", title_justify="left", box=box.SIMPLE_HEAD)
        for column in ("workers", "samples/s", "note"):
            table.add_column(column, justify="right" if column != "note" else "left")
        for loader in evidence.loader:
            rate = "-" if loader.samples_per_s is None else f"{loader.samples_per_s:.1f}"
            table.add_row(str(loader.num_workers), rate, loader.error or "")
        console.print(table)
    for warning in evidence.warnings if evidence is not None else ():
        console.print(Text(f"warning: {warning}", style="yellow"))
    if saved is not None:
        console.print(saved_note(profile, saved))


def saved_note(profile: Profile, saved: Path) -> str:
    """Where a profile was stored and the call that returns it."""
    if profile.evidence is None:
        return f"saved to {saved}; torch_autotune.recommend() returns it on this machine"
    return (
        f"saved to {saved}; torch_autotune.recommend(workload={profile.evidence.workload!r}) "
        "returns it on this machine, and so does recommend() until another profile is saved"
    )


def _run_time(evidence: Evidence) -> str:
    """'41.2 s of 120 s budget (search 12.0 s, throughput 20.1 s, ...)'."""
    text = f"{evidence.elapsed_s:.1f} s of {evidence.budget_s:.0f} s budget"
    if evidence.phases:
        text += " (" + ", ".join(f"{p.name} {p.seconds:.1f} s" for p in evidence.phases) + ")"
    return text


def _compile_text(record: CompileRecord) -> str:
    if not record.measured:
        return f"not measured ({record.reason}); decided by the rules"
    return record.reason


def _effect_cell(effect: Effect | None) -> Text:
    if effect is None:
        return Text("not measured", style="dim")
    style = {"faster": "green", "slower": "red"}.get(effect.verdict, "")
    return Text(
        f"{effect.speedup:.2f}x ({effect.low:.2f}-{effect.high:.2f}) {effect.verdict}", style=style
    )


def bench_summary(bench: BenchEvidence) -> str:
    """One sentence: is the profile faster than the baseline, by how much, what was dropped."""
    dropped = [s.setting for s in bench.settings if s.outcome == "dropped"]
    tuned = bench.tuned
    if tuned is None:
        return "The profile and the baseline could not both be measured: no comparison."
    text = (
        f"The profile as tuned trains at {tuned.speedup:.2f}x the baseline's speed "
        f"(range {tuned.low:.2f}-{tuned.high:.2f} over {tuned.rounds} rounds: {tuned.verdict})."
    )
    if dropped:
        text += f" Dropped as measured slower: {', '.join(dropped)}."
        if bench.final is not None:
            text += (
                f" Without them: {bench.final.speedup:.2f}x the baseline "
                f"(range {bench.final.low:.2f}-{bench.final.high:.2f}: {bench.final.verdict})."
            )
    else:
        text += " No setting measured slower than without it."
    if bench.reverted:
        text += (
            " The profile was still slower than the baseline, so every setting the bench "
            "switched went back to the baseline's value."
        )
    return text


def render_bench(profile: Profile, console: Console) -> None:
    """The bench: every arm's throughput, each setting's effect alone and in the profile."""
    evidence = profile.evidence
    bench = evidence.bench if evidence is not None else None
    if bench is None:
        console.print("This profile has no bench results: run 'autotune bench'.")
        return
    snapshot = profile.provenance.snapshot
    gpus = ", ".join(sorted({a.name for a in snapshot.accelerators})) or snapshot.host.cpu_model
    console.print(
        Text(
            f"autotune bench: {bench.workload} on {bench.device} ({gpus}, torch "
            f"{snapshot.software.torch_version}), {bench.rounds} interleaved rounds of "
            f"{bench.seconds_per_measurement:g} s per arm",
            style="bold",
        )
    )
    arms = Table(box=box.SIMPLE_HEAD, title="Arms", title_justify="left")
    for column, justify in (("arm", "left"), ("trains with", "left"), ("samples/s", "right")):
        arms.add_column(column, justify=justify)  # type: ignore[arg-type]
    arms.add_column("spread", justify="right")
    for arm in bench.arms:
        median, spread = arm.median, arm.spread
        arms.add_row(
            "\n".join(arm.names),
            arm.config.describe(),
            "failed" if median is None else f"{median:.1f}",
            arm.error or ("-" if spread is None else f"{spread * 100:.0f}%"),
        )
    console.print(arms)
    if bench.settings:
        table = Table(
            box=box.SIMPLE_HEAD,
            title="Each setting: speedup on alone (vs baseline) and off alone (vs the profile)",
            title_justify="left",
        )
        for column in ("setting", "baseline -> profile", "on alone", "in the profile", "outcome"):
            table.add_column(column)
        for s in bench.settings:
            outcome = Text(s.outcome, style="red" if s.outcome == "dropped" else "")
            table.add_row(
                s.setting,
                f"{s.baseline_value} -> {s.tuned_value}",
                _effect_cell(s.on_alone),
                _effect_cell(s.off_alone),
                outcome,
            )
        console.print(table)
    else:
        console.print("The profile trains exactly as the baseline does: nothing to ablate.")
    for note in bench.not_ablated:
        console.print(Text(f"not ablated: {note}", style="dim"))
    console.print(Text(bench_summary(bench), style="bold"))
