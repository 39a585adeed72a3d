"""The `autotune` command: parse, call the public API, render. Nothing else lives here.

Errors raised on purpose (``AutotuneError``) become one line on stderr and the exit code the
error class carries (see ``torch_autotune.errors``); only this module exits.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from torch_autotune.bounds import MAX_BATCH_SIZE, MAX_GLOBAL_BATCH, MAX_ROUNDS, MAX_WORKERS
from torch_autotune.errors import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_DIFFERENT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_WORKLOAD,
    AutotuneError,
    InputFileError,
    ProfileFileError,
    SnapshotFileError,
    raised_by_user_code,
)
from torch_autotune.version import __version__

T = TypeVar("T")


class _InputFile(click.Path):
    """A file to read ('-': standard input). Click checks nothing: the loader that reads it
    reports a missing, unreadable or invalid file as an InputFileError (exit 3, one line),
    where click's own checks would make it a usage error (exit 2)."""

    def __init__(self) -> None:
        super().__init__(path_type=Path, allow_dash=True, readable=False)
        self.name = "file"


class _Directory(click.Path):
    """The profile store's directory; the store reports what is wrong with it (exit 4)."""

    def __init__(self) -> None:
        super().__init__(path_type=Path, readable=False)
        self.name = "directory"


class _Finite(click.FloatRange):
    """A number in a range, and finite: click's FloatRange lets 'inf' through where there is
    no maximum, and 'nan' through every bound (a comparison with NaN is always false)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


_plot_option = click.option(
    "--plot",
    "plot_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also draw the charts into a PNG file (needs the 'plot' extra; without it they are "
    "drawn in the terminal).",
)


class _Group(click.Group):
    """The one place where errors become messages and exit codes (see ``errors.py``).

    AutotuneError: its one line and its code. Ctrl-C: 'interrupted', 130. A closed standard
    output (``autotune show | head -1``): nothing said, 141, as a process SIGPIPE ends. A
    usage error: one line, 2. Any other exception is a bug of ours: the traceback, a line that
    asks for a report, 1. The user's own code failing is handled where it runs (_user_code).
    """

    def main(  # click's own signature, with the handling of its standalone mode
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as error:
            click.echo(f"autotune: error: {_usage_line(error)}", err=True)
            sys.exit(error.exit_code)
        except click.Abort:  # Ctrl-C while click parsed the arguments
            click.echo("autotune: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else EXIT_OK)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings(
                        "ignore", message=_NUMPY_MISSING, category=UserWarning, module=r"torch\."
                    )
                    return super().invoke(ctx)
            finally:
                sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        except AutotuneError as error:
            click.echo(f"autotune: error: {error}", err=True)
            ctx.exit(error.exit_code)
        except KeyboardInterrupt:
            click.echo("autotune: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            _silence_stdout()
            ctx.exit(EXIT_BROKEN_PIPE)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as error:
            _report_bug(error)
            ctx.exit(EXIT_INTERNAL)


# torch warns "Failed to initialize NumPy: No module named 'numpy'" when it is first imported
# without numpy (from torch._subclasses.functional_tensor, torch 2.x). numpy is optional for
# torch and for torch-autotune (only seeded DataLoader workers use it, when it is there), so
# the command does not depend on it to keep its first line from being torch's warning.
_NUMPY_MISSING = "Failed to initialize NumPy"


def _usage_line(error: click.ClickException) -> str:
    """Click's message on one line, with where to read the usage."""
    message = " ".join(error.format_message().split())
    context = getattr(error, "ctx", None)
    if context is None:
        return message
    return f"{message.rstrip('.')}; see '{context.command_path} --help'"


def _silence_stdout() -> None:
    """Point standard output at the null device after a broken pipe, so that the interpreter's
    last flush does not fail again (the recipe of Python's signal documentation)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
    except (OSError, ValueError):  # a stream without a descriptor (a test runner's): no flush
        return


def _report_bug(error: Exception) -> None:
    """A bug of torch-autotune: the traceback and one line asking for a report."""
    import traceback

    traceback.print_exception(error)
    click.echo(
        f"autotune: internal error: {type(error).__name__}: {_first_line(error)}; this is a bug "
        "in torch-autotune, please report it with the traceback above",
        err=True,
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0].rstrip(".") if text else "(no message)"


@click.group(
    cls=_Group,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, "--version", "-V", prog_name="torch-autotune")
@click.option(
    "-m",
    "--model",
    "workload",
    default=None,
    metavar="NAME|package.module:factory",
    help="What to probe: a built-in workload (resnet50, gpt2, conv, transformer, mlp; default "
    "resnet50 on a GPU, conv on the CPU) or your own factory (see the README).",
)
@click.option(
    "--budget",
    type=_Finite(min=1),
    default=None,
    help="Seconds the whole run may take (default 120, or 180 where torch.compile is "
    "measured); no phase runs past it.",
)
@click.option(
    "--max-batch-size",
    type=click.IntRange(1, MAX_BATCH_SIZE),
    help="Never try a larger batch (default: 512 on the CPU, 65536 on a GPU).",
)
@click.option(
    "--target-batch",
    type=click.IntRange(1, MAX_GLOBAL_BATCH),
    help="Global batch to keep: gradient accumulation makes up what does not fit.",
)
@click.option(
    "--mode",
    type=click.Choice(["speed", "balanced", "reproducible"]),
    default="speed",
    show_default=True,
    help="speed: fastest; balanced: no torch.compile start-up cost; reproducible: "
    "deterministic kernels, TF32 off, seeded workers.",
)
@click.option("--variable-shapes", is_flag=True, help="Input shapes change from batch to batch.")
@click.option(
    "--workers",
    type=click.IntRange(0, MAX_WORKERS),
    help="Use this many DataLoader workers instead of measuring (Windows measures none).",
)
@_plot_option
@click.option("--no-save", is_flag=True, help="Show the profile without storing it.")
@click.option(
    "--store",
    type=_Directory(),
    envvar="TORCH_AUTOTUNE_HOME",
    help="Profile store directory [env TORCH_AUTOTUNE_HOME].",
)
@click.pass_context
def cli(  # click passes options by name
    ctx: click.Context,
    *,
    workload: str | None,
    budget: float | None,
    max_batch_size: int | None,
    target_batch: int | None,
    mode: str,
    variable_shapes: bool,
    workers: int | None,
    plot_file: Path | None,
    no_save: bool,
    store: Path | None,
) -> None:
    """Hardware-aware configuration tuner for PyTorch training.

    Without a command: detect this machine, apply the rules, probe the largest and the fastest
    batch and the DataLoader workers with a real training step, and save the profile that
    torch_autotune.recommend() returns.

    \b
    Exit codes: 0 success, 1 internal error (a bug), 2 usage error,
    3 an input file is missing or invalid, 4 the profile store cannot be
    read or written (or holds a corrupt or foreign profile, or --save would
    replace a measured one), 5 the workload cannot be built or trained,
    6 the probe could not measure (no torch, budget too small),
    130 interrupted, 141 standard output closed early.
    'autotune diff' exits 1 when the profiles differ, as diff(1).
    """
    if ctx.invoked_subcommand is not None:
        return
    from torch_autotune.probe.run import DEFAULT_COMPILE_BUDGET_S, tune
    from torch_autotune.render import progress_reporter, render_run

    def run() -> Any:
        with progress_reporter(budget or DEFAULT_COMPILE_BUDGET_S) as report:
            return tune(
                workload,
                mode=mode,
                budget_s=budget,
                max_batch_size=max_batch_size,
                target_global_batch=target_batch,
                fixed_shapes=not variable_shapes,
                num_workers=workers,
                progress=report,
            )

    profile = _user_code(ctx, run)
    _warn_unused_gpu(profile)
    saved = None
    if not no_save:
        from torch_autotune.store import ProfileStore

        saved = ProfileStore(store).save(profile)
    render_run(profile, _console(), saved)
    if plot_file is not None:
        _plot(profile, plot_file)


# Modules outside torch_autotune: the user's, torch's and every other package's.
_NOT_OURS = r"(?!torch_autotune(\.|$))"


def _user_code(ctx: click.Context, run: Callable[[], T]) -> T:
    """Run the probe or the bench; a failure of the user's model shows their traceback and
    exits 5. Only an exception the probe marked as raised in the user's code does
    (``errors.blame_user_code``); any other one is a bug of ours.

    A deprecation warning from outside torch-autotune is no failure of the training step: it is
    shown, never raised, even where the warning filters make warnings errors (torch 2.11 warns
    about ``torch.jit.script_method`` when torch.compile first imports inductor). Ours still
    follow the filters.
    """
    import warnings

    try:
        with warnings.catch_warnings():
            for category in (DeprecationWarning, PendingDeprecationWarning):
                warnings.filterwarnings("default", category=category, module=_NOT_OURS)
            return run()
    except Exception as error:
        if not raised_by_user_code(error):
            raise  # ours: an AutotuneError, or a bug (_Group says which)
        import traceback  # the user's model or data raised: show their traceback, not ours

        traceback.print_exception(error)
        click.echo(
            f"autotune: error: the training step raised {type(error).__name__} (not "
            "out-of-memory, so not a batch that is too big); fix the model or its data, see the "
            "traceback above",
            err=True,
        )
        ctx.exit(EXIT_WORKLOAD)
        raise  # unreachable: ctx.exit raises


@cli.command("detect")
@click.option("--json", "as_json", is_flag=True, help="Print the snapshot as JSON.")
@click.option(
    "--deep",
    is_flag=True,
    help="Also import torch (seconds) to fill what NVML and the OS cannot answer.",
)
@click.option(
    "--snapshot",
    "snapshot_file",
    type=_InputFile(),
    help="Describe the machine recorded in FILE (from 'autotune detect --json'; '-' reads "
    "standard input) instead.",
)
def detect_command(as_json: bool, deep: bool, snapshot_file: Path | None) -> None:
    """Describe this machine: GPUs, usable CPUs, RAM, Python and torch.

    Fast by default: reads NVML and the OS without importing torch or starting CUDA.
    """
    from torch_autotune.detect import detect

    snapshot = detect(_recorded_machine(snapshot_file), deep=deep)
    if as_json:
        click.echo(snapshot.model_dump_json(indent=2))
        return
    from torch_autotune.render import render_snapshot

    render_snapshot(snapshot, _console())


_snapshot_option = click.option(
    "--snapshot",
    "snapshot_file",
    type=_InputFile(),
    help="Reason about the machine recorded in FILE (from 'autotune detect --json'; '-' reads "
    "standard input).",
)
_store_option = click.option(
    "--store",
    "store",
    type=_Directory(),
    envvar="TORCH_AUTOTUNE_HOME",
    help="Profile store directory [env TORCH_AUTOTUNE_HOME; default: the user config dir].",
)
_workload_option = click.option(
    "-m",
    "--model",
    "workload",
    default=None,
    metavar="NAME|package.module:factory",
    help="The profile measured on this workload (as given to 'autotune -m'); default: the "
    "profile saved last on this machine.",
)
_mode_option = click.option(
    "--mode",
    type=click.Choice(["speed", "balanced", "reproducible"]),
    default=None,
    help="speed (default): fastest; balanced: no torch.compile start-up cost; "
    "reproducible: deterministic kernels, TF32 off, seeded workers.",
)


def _console() -> Any:
    from torch_autotune.render import make_console

    return make_console()


def _snapshot(snapshot_file: Path | None) -> Any:
    from torch_autotune.detect import detect

    return detect(_recorded_machine(snapshot_file))


def _is_stdin(path: Path) -> bool:
    return str(path) == "-"


def _stdin_text(error: type[InputFileError]) -> str:
    """Standard input as text, within the input limits; a terminal is refused, not waited on."""
    import sys

    from torch_autotune.input_files import read_stream

    stream = sys.stdin.buffer
    if stream.isatty():
        raise click.UsageError(
            "'-' reads standard input, which is a terminal here; pipe a file in, such as "
            "'autotune detect --json | autotune recommend --snapshot -'"
        )
    return read_stream(stream, "standard input", error)


def _recorded_machine(snapshot_file: Path | None) -> Any:
    """The machine recorded in ``snapshot_file`` ('-': standard input); None for this one."""
    from torch_autotune.detect import RecordedMachine, parse_snapshot

    if snapshot_file is None:
        return None
    if _is_stdin(snapshot_file):
        text = _stdin_text(SnapshotFileError)
        return RecordedMachine(parse_snapshot(text, source="standard input"))
    return RecordedMachine.from_file(snapshot_file)


def _load_profile(path: Path) -> Any:
    """The profile in the file ``path`` ('-': standard input)."""
    from torch_autotune.profile_io import load_profile, parse_profile

    if _is_stdin(path):
        return parse_profile(_stdin_text(ProfileFileError), source="standard input")
    return load_profile(path)


@cli.command("bench")
@click.option(
    "-m",
    "--model",
    "workload",
    default=None,
    metavar="NAME|package.module:factory",
    help="What to train: a built-in workload (resnet50, gpt2, conv, transformer, mlp) or your "
    "own factory; default: the one the stored profile was measured on, else autotune's default.",
)
@click.option(
    "--profile",
    "profile_file",
    type=_InputFile(),
    help="Bench this measured profile file instead of the machine's stored one (the store is "
    "then left alone; see --output).",
)
@click.option(
    "--baseline",
    "baseline_file",
    type=_InputFile(),
    help="Your own baseline: a YAML mapping such as 'batch_size: 64' and 'num_workers: 4' "
    "(default: float32, batch 32, no workers, no pinning, eager, torch's default backends).",
)
@click.option(
    "--rounds",
    type=click.IntRange(1, MAX_ROUNDS),
    default=5,
    show_default=True,
    help="Interleaved rounds; each runs every arm once (3 or more to call an effect).",
)
@click.option(
    "--seconds",
    type=_Finite(min=0.05),
    default=2.0,
    show_default=True,
    help="Seconds of training per arm and round, after its warm-up.",
)
@click.option(
    "--budget",
    type=_Finite(min=1),
    default=None,
    help="Seconds for tuning first, when there is no measured profile for the workload "
    "(default as for autotune).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the benched profile to FILE (YAML, or JSON for a .json name).",
)
@_plot_option
@click.option("--json", "as_json", is_flag=True, help="Print the bench results as JSON.")
@click.option("--no-save", is_flag=True, help="Do not store the benched profile.")
@_store_option
@click.pass_context
def bench_command(  # click passes options by name
    ctx: click.Context,
    *,
    workload: str | None,
    profile_file: Path | None,
    baseline_file: Path | None,
    rounds: int,
    seconds: float,
    budget: float | None,
    output: Path | None,
    plot_file: Path | None,
    as_json: bool,
    no_save: bool,
    store: Path | None,
) -> None:
    """Measure the profile against a baseline, and each setting on alone and off alone.

    Baseline and profile train the same loop in this one process, interleaved round by round
    so that the machine's drift hits every arm alike. A setting that measures slower than the
    profile without it (in every round, by more than 2%) is dropped from the profile, with the
    measurement as its reason. The results go into the profile's evidence and the store.
    """
    from torch_autotune.probe.ablation import bench
    from torch_autotune.profile_io import load_baseline, parse_baseline
    from torch_autotune.render import progress_reporter, render_bench

    if baseline_file is None:
        baseline = None
    elif _is_stdin(baseline_file):
        baseline = parse_baseline(_stdin_text(ProfileFileError), source="standard input")
    else:
        baseline = load_baseline(baseline_file)
    if profile_file is not None:
        profile = _load_profile(profile_file)
        if profile.evidence is None:
            raise ProfileFileError(
                f"{profile_file} was not measured (rules only): the bench needs the batch size "
                "the probe ran; run 'autotune' and bench the profile it saves"
            )
    else:
        profile = _stored_measured(store, workload)
    estimate = _bench_estimate(profile, rounds, seconds, budget)

    def run() -> Any:
        with progress_reporter(estimate) as report:
            return bench(
                profile,
                workload,
                baseline=baseline,
                rounds=rounds,
                seconds=seconds,
                budget_s=budget,
                progress=report,
            )

    benched = _user_code(ctx, run)
    saved = None
    if profile_file is None and not no_save:
        from torch_autotune.store import ProfileStore

        saved = ProfileStore(store).save(benched)
    if output is not None:
        _write_profile(benched, output)
    if as_json:
        bench_evidence = benched.evidence.bench if benched.evidence else None
        click.echo("{}" if bench_evidence is None else bench_evidence.model_dump_json(indent=2))
    else:
        render_bench(benched, _console())
        if saved is not None:
            from torch_autotune.render import saved_note

            click.echo(saved_note(benched, saved))
    if plot_file is not None:
        _plot(benched, plot_file)


def _stored_measured(store: Path | None, workload: str | None) -> Any:
    """The stored profile measured on ``workload`` (default: the machine's profile, when it
    was measured), else None: the bench then tunes first."""
    from torch_autotune.detect import detect
    from torch_autotune.profile import fingerprint
    from torch_autotune.store import ProfileStore

    stored = ProfileStore(store).load(fingerprint(detect()), workload)
    if stored is not None and stored.evidence is not None:
        return stored
    what = "measured profile" if workload is None else f"profile measured on {workload}"
    click.echo(f"autotune: no {what} for this machine yet: tuning first", err=True)
    return None


def _bench_estimate(profile: Any, rounds: int, seconds: float, budget: float | None) -> float:
    """Seconds the bench should take, for the progress bar: arms x rounds x (seconds + warm-up)."""
    from torch_autotune.bench import TrainConfig, plan_arms, tuned_config

    if profile is None:
        from torch_autotune.probe.run import DEFAULT_COMPILE_BUDGET_S

        return (budget or DEFAULT_COMPILE_BUDGET_S) + rounds * 4 * (seconds + 1.0)
    plan = plan_arms(TrainConfig(), tuned_config(profile))
    return float(len(plan.configs) * rounds * (seconds + 1.0))


def _write_profile(profile: Any, output: Path) -> None:
    from torch_autotune.files import write_atomically
    from torch_autotune.profile_io import dump_profile

    write_atomically(output, dump_profile(profile, "json" if output.suffix == ".json" else "yaml"))
    click.echo(f"wrote {output}", err=True)


def _plot(profile: Any, path: Path) -> None:
    """The charts as a PNG after a run that measured; in the terminal, with a warning, when
    matplotlib is not installed (the measurements are saved either way)."""
    from torch_autotune import plot

    if not plot.matplotlib_available():
        click.echo(
            "autotune: warning: matplotlib is not installed, so no PNG was written; the charts "
            "follow as text (pip install 'torch-autotune[plot]' for the PNG)",
            err=True,
        )
        plot.render_charts(profile, _console())
        return
    plot.save_png(profile, path)
    click.echo(f"wrote {path}", err=True)


@cli.command("report")
@click.option(
    "--profile",
    "profile_file",
    type=_InputFile(),
    help="Draw this measured profile file instead of the machine's stored profile.",
)
@click.option(
    "--plot",
    "plot_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Draw into a PNG file (needs the 'plot' extra) instead of the terminal.",
)
@_workload_option
@_store_option
def report_command(
    profile_file: Path | None, plot_file: Path | None, workload: str | None, store: Path | None
) -> None:
    """Draw what the probe and the bench measured: throughput against batch size with the
    memory limit, DataLoader throughput against workers, and each setting's speedup."""
    from torch_autotune import plot

    if profile_file is not None:
        profile = _load_profile(profile_file)
    else:
        profile = _current_profile(store, None, None, workload)
    if plot_file is None:
        plot.render_charts(profile, _console())
        return
    plot.save_png(profile, plot_file)
    click.echo(f"wrote {plot_file}", err=True)


@cli.command("recommend")
@_snapshot_option
@_mode_option
@click.option(
    "--model-kind",
    type=click.Choice(["conv", "transformer", "mlp", "other"]),
    default="other",
    show_default=True,
    help="What the model mostly is (cuDNN autotuner and channels_last help conv nets).",
)
@click.option("--variable-shapes", is_flag=True, help="Input shapes change from batch to batch.")
@click.option(
    "--optimizer",
    type=click.Choice(["adam", "adamw", "sgd", "other"]),
    default="adamw",
    show_default=True,
)
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
@click.option("--save", is_flag=True, help="Store the profile for this machine.")
@click.option(
    "--force",
    is_flag=True,
    help="With --save: replace a measured profile stored for this machine (refused without).",
)
@_store_option
def recommend_command(  # click passes options by name
    *,
    snapshot_file: Path | None,
    mode: str | None,
    model_kind: str,
    variable_shapes: bool,
    optimizer: str,
    as_json: bool,
    save: bool,
    force: bool,
    store: Path | None,
) -> None:
    """Show the profile the rules give, each setting with its reason."""
    from torch_autotune.profile import Mode, Preferences
    from torch_autotune.rules.engine import build_profile

    snapshot = _snapshot(snapshot_file)
    preferences = Preferences(
        mode=Mode(mode or "speed"),
        model_kind=model_kind,  # type: ignore[arg-type]
        fixed_shapes=not variable_shapes,
        optimizer=optimizer,  # type: ignore[arg-type]
    )
    profile = build_profile(snapshot, preferences=preferences)
    _warn_unused_gpu(profile)
    if save:
        from torch_autotune.store import ProfileStore

        path = ProfileStore(store).save(profile, force=force)
        click.echo(f"saved to {path}", err=True)
    if as_json:
        from torch_autotune.profile_io import dump_profile

        click.echo(dump_profile(profile, "json"), nl=False)
        return
    from torch_autotune.render import render_profile

    render_profile(profile, _console())


def _current_profile(
    store: Path | None,
    mode: str | None,
    snapshot_file: Path | None,
    workload: str | None = None,
) -> Any:
    """recommend() for this machine (or a recorded one), for ``workload`` when one is named:
    stored if fresh, else rules only, with a note on stderr that says which.

    A recorded machine is another machine (or this one at another time): the store's profile
    for its fingerprint is shown when there is one, else the rules-only profile for it, and
    nothing is called stale, since this machine's history says nothing about it. A stored
    profile that cannot be used (corrupt, or made for another machine) is an error (exit 4)
    naming the file and the fix, where recommend() in a script warns and goes on.
    """
    import warnings

    from torch_autotune.api import profile_for
    from torch_autotune.errors import (
        StaleProfileWarning,
        StoredProfileWarning,
        UnusableGpuWarning,
    )
    from torch_autotune.store import machine_id

    snapshot = _snapshot(snapshot_file)
    with warnings.catch_warnings(record=True) as caught:
        for category in (StaleProfileWarning, StoredProfileWarning, UnusableGpuWarning):
            warnings.simplefilter("always", category)
        writer = None if snapshot_file is not None else machine_id()
        profile = profile_for(snapshot, mode, workload=workload, store=store, writer=writer)
    for warning in caught:
        if isinstance(warning.message, StoredProfileWarning):
            raise warning.message.error
    stale = False
    for warning in caught:
        stale = stale or isinstance(warning.message, StaleProfileWarning)
        click.echo(f"autotune: warning: {warning.message}", err=True)
    if not profile.measured and not stale:
        text = _nothing_stored(store, profile, workload, snapshot_file)
        click.echo(f"autotune: note: {text}", err=True)
    return profile


def _warn_unused_gpu(profile: Any) -> None:
    """One line on stderr when the profile trains on the CPU of a machine with a GPU."""
    from torch_autotune.api import unused_gpu_reason

    reason = unused_gpu_reason(profile)
    if reason is not None:
        click.echo(f"autotune: warning: {reason}", err=True)


def _nothing_stored(
    store: Path | None, profile: Any, workload: str | None, snapshot_file: Path | None = None
) -> str:
    """Why the rules-only profile is shown, and the command that measures one."""
    machine = "this machine" if snapshot_file is None else f"the machine in {snapshot_file}"
    there = "" if snapshot_file is None else " on that machine"
    if workload is None:
        return (
            f"no profile stored for {machine}; showing the rules-only profile (run "
            f"'autotune'{there} to measure)"
        )
    import difflib

    from torch_autotune.store import ProfileStore

    measured = ProfileStore(store).measured_workloads(profile.provenance.fingerprint)
    text = f"no profile measured on {workload} for {machine}"
    close = difflib.get_close_matches(workload, measured, n=1)
    if close:
        text += f"; perhaps you meant '{close[0]}'?"
    elif measured:
        text += f" (measured here: {', '.join(measured)})"
    return (
        f"{text}; showing the rules-only profile (run 'autotune -m {workload}'{there} to measure)"
    )


@cli.command("show")
@_workload_option
@_store_option
@_mode_option
@_snapshot_option
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
def show_command(
    workload: str | None,
    store: Path | None,
    mode: str | None,
    snapshot_file: Path | None,
    as_json: bool,
) -> None:
    """Show this machine's profile: the stored one if it is fresh, else the rules-only one."""
    profile = _current_profile(store, mode, snapshot_file, workload)
    if as_json:
        from torch_autotune.profile_io import dump_profile

        click.echo(dump_profile(profile, "json"), nl=False)
        return
    from torch_autotune.render import render_profile

    render_profile(profile, _console())


@cli.command("export")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write to FILE (atomically) instead of standard output.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["yaml", "json", "lightning", "hf", "accelerate", "env"]),
    default="yaml",
    show_default=True,
    help="yaml/json: the profile itself; lightning: LightningCLI trainer config; hf: "
    "TrainingArguments JSON; accelerate: accelerate config file; env: shell exports.",
)
@_workload_option
@_store_option
@_mode_option
@_snapshot_option
def export_command(  # click passes options by name
    *,
    output: Path | None,
    fmt: str,
    workload: str | None,
    store: Path | None,
    mode: str | None,
    snapshot_file: Path | None,
) -> None:
    """Write this machine's profile as YAML or JSON, or as a Lightning, Hugging Face,
    accelerate or shell-environment file."""
    profile = _current_profile(store, mode, snapshot_file, workload)
    if fmt in ("yaml", "json"):
        from torch_autotune.profile_io import dump_profile

        text = dump_profile(profile, fmt)  # type: ignore[arg-type]
    else:
        from torch_autotune.integrations import EXPORT_FORMATS, hf_notes

        text = EXPORT_FORMATS[fmt](profile)
        notes = hf_notes(profile) if fmt == "hf" else []
        if notes:  # JSON holds no comments: what TrainingArguments cannot set goes beside it
            click.echo("autotune: note: TrainingArguments has no argument for these:", err=True)
            for note in notes:
                click.echo(f"autotune: note:   {note}", err=True)
    if output is None:
        click.echo(text, nl=False)
        return
    from torch_autotune.files import write_atomically

    write_atomically(output, text)
    click.echo(f"wrote {output}", err=True)


@cli.command("validate")
@click.argument("files", nargs=-1, required=True, type=_InputFile())
@click.pass_context
def validate_command(ctx: click.Context, files: tuple[Path, ...]) -> None:
    """Check profile files: syntax, schema, and every cross-field invariant.

    One line for each FILE ('-' reads standard input): on stdout when it is valid, on stderr
    when it is not. The exit code is 3 when any file is not valid.
    """
    invalid = 0
    for file in files:
        try:
            profile = _load_profile(file)
        except InputFileError as error:
            click.echo(f"autotune: error: {error}", err=True)
            invalid += 1
            continue
        name = "standard input" if _is_stdin(file) else file
        click.echo(
            f"{name}: valid profile (schema {profile.schema_version}, mode "
            f"{profile.mode.value}, device {profile.settings.device}, "
            f"{len(profile.decisions)} decisions)"
        )
    if invalid:
        ctx.exit(EXIT_BAD_INPUT)


@cli.command("diff")
@click.argument("first", type=_InputFile())
@click.argument("second", type=_InputFile())
@click.pass_context
def diff_command(ctx: click.Context, first: Path, second: Path) -> None:
    """Show the settings two profile files disagree on.

    Exit status as diff(1): 0 when the settings are the same, 1 when they differ; a missing
    or invalid file is 3, as for every command.
    """
    from torch_autotune.render import render_diff

    a, b = _load_profile(first), _load_profile(second)
    flat_a, flat_b = _flatten(a.settings.model_dump()), _flatten(b.settings.model_dump())
    rows = [
        (key, flat_a.get(key), flat_b.get(key))
        for key in sorted(set(flat_a) | set(flat_b))
        if flat_a.get(key) != flat_b.get(key)
    ]
    render_diff(rows, _console())
    if rows:
        ctx.exit(EXIT_DIFFERENT)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def main() -> None:
    """Run the command (``torch_autotune.__main__.main`` is the console script: it also catches
    a Ctrl-C while this module is imported)."""
    cli(prog_name="autotune")
