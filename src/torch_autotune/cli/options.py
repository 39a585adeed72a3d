"""Every option of ``autotune``, declared once.

An option that several commands share is one function here: its flags, destination, type,
default and environment variable are written once. Where a command gives the option a meaning
of its own (``-m`` picks what to probe for ``autotune``, and which stored profile for
``show``), the command passes its own help text.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import click

from torch_autotune.bounds import (
    MAX_BATCH_SIZE,
    MAX_CPUS,
    MAX_GLOBAL_BATCH,
    MAX_ROUNDS,
    MAX_SECONDS,
    MAX_WORKERS,
    memory_limit_refused,
)
from torch_autotune.errors import EXIT_STORE, StoreError
from torch_autotune.files import check_writable
from torch_autotune.probe.ablation import DEFAULT_ROUNDS, DEFAULT_SECONDS

F = TypeVar("F", bound=Callable[..., Any])


class Decorator(Protocol):
    """What ``click.option(...)`` returns: it adds the option to a command function."""

    def __call__(self, function: F, /) -> F: ...


MODES = ("speed", "balanced", "reproducible")


class InputFile(click.Path):
    """A file to read ('-': standard input). Click checks nothing: the loader that reads it
    reports a missing, unreadable or invalid file as an InputFileError (exit 3, one line),
    where click's own checks would make it a usage error (exit 2)."""

    def __init__(self) -> None:
        super().__init__(path_type=Path, allow_dash=True, readable=False)
        self.name = "file"


class Directory(click.Path):
    """The profile store's directory; the store reports what is wrong with it (exit 4)."""

    def __init__(self) -> None:
        super().__init__(path_type=Path, readable=False)
        self.name = "directory"


class Finite(click.FloatRange):
    """A number in a range, and finite: click's FloatRange lets 'inf' through where there is
    no maximum, and 'nan' through every bound (a comparison with NaN is always false)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class MemoryLimit(click.FloatRange):
    """``--memory-limit``'s GiB, within ``bounds.memory_limit_refused``'s bounds: refused with
    its line, the one ``tune(memory_limit_gib=...)`` raises (exit 2)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        refused = memory_limit_refused(number)
        if refused is not None:
            raise click.UsageError(refused, ctx)
        return number


class UnwritableOutput(click.BadParameter):
    """An output file that cannot be written: exit code 4, as the README's table says for
    ``-o`` and ``--plot``, not click's 2 for a bad argument."""

    exit_code = EXIT_STORE


class OutputFile(click.Path):
    """A file torch-autotune writes: a regular file atomically, a pipe or device in place
    (``files.write_atomically``). A directory, a file this user may not write, a directory
    that does not exist or that this user cannot write in (``files.check_writable``) is
    refused while the arguments are read, before anything is measured, with exit code 4 (an
    output that cannot be written); a failure found only when writing (a full disk) is
    reported by the write itself."""

    def __init__(self) -> None:
        super().__init__(path_type=Path)  # click's dir_okay=False check would exit 2
        self.name = "file"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = Path(os.fsdecode(super().convert(value, param, ctx)))
        if os.path.isdir(path):
            raise UnwritableOutput(
                f"{value} is a directory; name the file to write inside it", ctx, param
            )
        try:
            check_writable(path, make_parents=False)
        except StoreError as exc:
            raise UnwritableOutput(str(exc), ctx, param) from None
        return path


OUTPUT_FILE = OutputFile()
"""A file torch-autotune writes (atomically)."""


def model(help: str) -> Decorator:
    """``-m/--model NAME|package.module:factory``: a workload, built-in or the user's."""
    return click.option(
        "-m",
        "--model",
        "workload",
        default=None,
        metavar="NAME|package.module:factory",
        help=help,
    )


def budget(help: str) -> Decorator:
    """``--budget S``: seconds for a whole probe run."""
    return click.option("--budget", type=Finite(min=1, max=MAX_SECONDS), default=None, help=help)


def mode(default: str | None) -> Decorator:
    """``--mode``: speed, balanced or reproducible (None: whichever mode is stored)."""
    return click.option(
        "--mode",
        type=click.Choice(MODES),
        default=default,
        show_default=default is not None,
        help="speed (default): fastest; balanced: no torch.compile start-up cost; "
        "reproducible: deterministic kernels, TF32 off, seeded workers.",
    )


def variable_shapes() -> Decorator:
    """``--variable-shapes``: the input shapes change from batch to batch."""
    return click.option(
        "--variable-shapes", is_flag=True, help="Input shapes change from batch to batch."
    )


def store() -> Decorator:
    """``--store DIR``: the profile store (``TORCH_AUTOTUNE_HOME``, else the user config
    directory)."""
    return click.option(
        "--store",
        "store",
        type=Directory(),
        envvar="TORCH_AUTOTUNE_HOME",
        help="Profile store directory [env TORCH_AUTOTUNE_HOME; default: the user config dir].",
    )


def snapshot(help: str) -> Decorator:
    """``--snapshot FILE``: a machine recorded by ``autotune detect --json`` ('-': stdin)."""
    return click.option("--snapshot", "snapshot_file", type=InputFile(), help=help)


def profile_file(help: str) -> Decorator:
    """``--profile FILE``: a profile file instead of the stored profile ('-': stdin)."""
    return click.option("--profile", "profile_file", type=InputFile(), help=help)


def plot(help: str) -> Decorator:
    """``--plot FILE``: draw the charts into a PNG file."""
    return click.option("--plot", "plot_file", type=OUTPUT_FILE, help=help)


def output(help: str) -> Decorator:
    """``-o/--output FILE``: write a file (atomically)."""
    return click.option("-o", "--output", type=OUTPUT_FILE, help=help)


def as_json(help: str) -> Decorator:
    """``--json``: print JSON for a program to read."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def no_save(help: str) -> Decorator:
    """``--no-save``: leave the store alone."""
    return click.option("--no-save", is_flag=True, help=help)


def stored_model() -> Decorator:
    """``-m/--model`` where it picks a stored profile (show, export, report)."""
    return model(
        "The profile measured on this workload (as given to 'autotune -m'); default: the "
        "profile saved last on this machine."
    )


def recorded_snapshot() -> Decorator:
    """``--snapshot`` where a command reasons about a recorded machine instead of this one."""
    return snapshot(
        "Reason about the machine recorded in FILE (from 'autotune detect --json'; '-' reads "
        "standard input)."
    )


def max_batch_size() -> Decorator:
    """``--max-batch-size N``: the largest batch the probe tries."""
    return click.option(
        "--max-batch-size",
        type=click.IntRange(1, MAX_BATCH_SIZE),
        help="Never try a larger batch (default: 512 on the CPU, 65536 on a GPU).",
    )


def min_batch_size() -> Decorator:
    """``--min-batch-size N``: the batch the search starts at."""
    return click.option(
        "--min-batch-size",
        type=click.IntRange(1, MAX_BATCH_SIZE),
        help="Start the search at this batch and try none smaller (default 1; a model that "
        "cannot train on one sample, as BatchNorm in training mode cannot, is searched from "
        "the smallest size it trains at anyway).",
    )


def check_batch_range(ctx: click.Context, smallest: int | None, largest: int | None) -> None:
    """A usage error (exit 2) where ``--min-batch-size`` is above ``--max-batch-size``: no
    batch can be searched, whatever the workload (it read as the workload's fault, exit 5)."""
    if smallest is not None and largest is not None and smallest > largest:
        raise click.UsageError(
            f"--min-batch-size {smallest} is above --max-batch-size {largest}; give a smallest "
            "batch at or below the largest",
            ctx,
        )


def check_none_before(ctx: click.Context, command: str) -> None:
    """A usage error (exit 2) where an option of ``autotune`` itself comes before ``command``
    (``autotune --workers 9 bench``): it is an option of the run without a command, which
    ``command`` does not start, and click parsed it and went on, so it was ignored in silence.
    The line names the option as it was typed and where it goes: after the command where the
    command takes it too, else nowhere (the command has no such option)."""
    given = [
        p
        for p in ctx.command.params
        if isinstance(p, click.Option)
        and p.name is not None
        and ctx.get_parameter_source(p.name) is click.core.ParameterSource.COMMANDLINE
    ]
    if not given:
        return
    typed = _as_typed(given[0], getattr(ctx.command, "arguments", []))
    sub = ctx.command.get_command(ctx, command) if isinstance(ctx.command, click.Group) else None
    if sub is not None and any(typed in p.opts for p in sub.params):
        where = f"give it after the command: 'autotune {command} {typed} ...'"
    else:
        where = f"'{command}' takes no {typed}, so leave it out"
    raise click.UsageError(
        f"{typed} before '{command}' is an option of autotune without a command, which"
        f" '{command}' would ignore; {where}",
        ctx,
    )


def _as_typed(option: click.Option, arguments: list[str]) -> str:
    """How ``option`` was written on the command line (``-m`` or ``--model``), read from the
    ``arguments``; its longest name where they do not show it."""
    for argument in arguments:
        for name in option.opts:
            if argument == name or argument.startswith(f"{name}="):
                return name
    return max(option.opts, key=len)


def target_batch() -> Decorator:
    """``--target-batch N``: the global batch gradient accumulation keeps."""
    return click.option(
        "--target-batch",
        type=click.IntRange(1, MAX_GLOBAL_BATCH),
        help="Global batch to keep: gradient accumulation makes up what does not fit.",
    )


def workers() -> Decorator:
    """``--workers N``: DataLoader workers to use instead of measuring."""
    return click.option(
        "--workers",
        type=click.IntRange(0, MAX_WORKERS),
        help="Use this many DataLoader workers instead of measuring (Windows measures none).",
    )


def processes_per_node() -> Decorator:
    """``--processes-per-node N``: the training processes (DDP ranks) the profile is for."""
    return click.option(
        "--processes-per-node",
        type=click.IntRange(1, MAX_CPUS),
        help="Training processes on this node, as torchrun --nproc-per-node starts them "
        "(default: one per GPU, one on the CPU): they share the CPUs, the global batch is "
        "spread over them, and the exports launch that many.",
    )


def memory_limit() -> Decorator:
    """``--memory-limit GIB``: the device memory the probe may use."""
    return click.option(
        "--memory-limit",
        type=MemoryLimit(),
        metavar="GIB",
        help="Tune as on a GPU with this many GiB (the allocator's per-process fraction; on the "
        "CPU, the host RAM the probe may fill): for a smaller or shared GPU. Recorded in the "
        "profile.",
    )


def launch() -> Decorator:
    """``--nproc-per-node N``, ``--nnodes M``, ``--rdzv-endpoint HOST:PORT``: the job's ranks."""
    options = (
        click.option(
            "--nproc-per-node",
            type=click.IntRange(1, MAX_CPUS),
            help="Start N ranks on this node through torch.distributed.run (one per GPU) and "
            "tune them together: one profile for the job, saved by rank 0.",
        ),
        click.option(
            "--nnodes",
            type=click.IntRange(1, MAX_CPUS),
            default=1,
            show_default=True,
            help="Nodes of the job: above 1, print the torchrun line every node runs (with "
            "--nproc-per-node) instead of starting anything.",
        ),
        click.option(
            "--rdzv-endpoint",
            metavar="HOST:PORT",
            help="Where the nodes meet (c10d rendezvous), for --nnodes above 1; default this "
            "host, port 29500.",
        ),
    )

    def decorate(function: Any) -> Any:
        for option in reversed(options):
            function = option(function)
        return function

    return decorate


def rounds() -> Decorator:
    """``--rounds N``: the bench's interleaved rounds."""
    return click.option(
        "--rounds",
        type=click.IntRange(1, MAX_ROUNDS),
        default=DEFAULT_ROUNDS,  # bench()'s own, written once
        show_default=True,
        help="Interleaved rounds; each runs every arm once (3 or more to call an effect).",
    )


def seconds() -> Decorator:
    """``--seconds S``: the bench's training time per arm and round."""
    return click.option(
        "--seconds",
        type=Finite(min=0.05, max=MAX_SECONDS),
        default=DEFAULT_SECONDS,  # bench()'s own, written once
        show_default=True,
        help="Seconds of training per arm and round, after its warm-up.",
    )
