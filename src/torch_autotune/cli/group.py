"""``autotune`` itself: the command group and the whole job that runs without a subcommand
(``torch_autotune.api.tune``, then the store), and the user's code run in between."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TypeVar

import click

from torch_autotune.cli import options
from torch_autotune.cli.exits import Group
from torch_autotune.cli.output import check_can_save, console, plot_after_run, warn_unused_gpu
from torch_autotune.errors import EXIT_WORKLOAD, StoreError, raised_by_user_code, their_traceback
from torch_autotune.version import __version__

T = TypeVar("T")

# Modules outside torch_autotune: the user's, torch's and every other package's.
_NOT_OURS = r"(?!torch_autotune(\.|$))"


@click.group(
    cls=Group,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, "--version", "-V", prog_name="torch-autotune")
@options.model(
    "What to probe: a built-in workload (resnet50, gpt2, gpt2-large, llama-1b, conv, "
    "transformer, mlp; default resnet50 on a GPU, conv on the CPU) or your own factory (see "
    "the README)."
)
@options.budget(
    "Seconds the whole run may take (default 120, or 180 where torch.compile is measured); no "
    "phase runs past it."
)
@options.max_batch_size()
@options.min_batch_size()
@options.target_batch()
@options.mode(default="speed")
@options.variable_shapes()
@options.workers()
@options.processes_per_node()
@options.memory_limit()
@options.launch()
@options.plot(
    "Also draw the charts into a PNG file (needs the 'plot' extra; without it they are drawn "
    "in the terminal)."
)
@options.no_save("Show the profile without storing it.")
@options.store()
@click.pass_context
def cli(  # click passes options by name
    ctx: click.Context,
    *,
    workload: str | None,
    budget: float | None,
    max_batch_size: int | None,
    min_batch_size: int | None,
    target_batch: int | None,
    mode: str,
    variable_shapes: bool,
    workers: int | None,
    processes_per_node: int | None,
    memory_limit: float | None,
    nproc_per_node: int | None,
    nnodes: int,
    rdzv_endpoint: str | None,
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
    6 the probe could not measure (no torch, budget too small, a rank stopped),
    7 the model does not fit the device even at its smallest batch (with a plan),
    130 interrupted, 141 standard output closed early.
    'autotune diff' exits 1 when the profiles differ, as diff(1).
    """
    if ctx.invoked_subcommand is not None:
        options.check_none_before(ctx, ctx.invoked_subcommand)
        return
    options.check_batch_range(ctx, min_batch_size, max_batch_size)
    from torch_autotune import api
    from torch_autotune.cli.inputs import check_workers_option, check_workload_name
    from torch_autotune.cli.launch import launch, quiet_rank
    from torch_autotune.launch import ranks_from_environment
    from torch_autotune.render import progress_reporter

    if nproc_per_node is not None or nnodes > 1:  # start the job's ranks, or print the line
        ctx.exit(launch(ctx, nproc_per_node or 1, nnodes, rdzv_endpoint))
    check_workload_name(workload, store, bench=False)
    check_workers_option(workers)
    quiet = quiet_rank(ranks_from_environment(os.environ))  # a rank other than 0: no report
    if not (quiet or no_save):
        check_can_save(store)  # now, not after the probe
    reporter = progress_reporter(budget or api.default_tune_budget_s(), provisional=not budget)

    def run() -> Any:
        with nullcontext(None) if quiet else reporter as report:
            return api.tune(
                workload,
                mode=mode,
                budget_s=budget,
                max_batch_size=max_batch_size,
                min_batch_size=min_batch_size,
                target_global_batch=target_batch,
                fixed_shapes=not variable_shapes,
                num_workers=workers,
                processes_per_node=processes_per_node,
                memory_limit_gib=memory_limit,
                progress=report,
            )

    profile = user_code(ctx, run)
    if quiet:  # rank 0 saves the job's profile and reports it
        return
    warn_unused_gpu(profile)
    _save_and_show(profile, store, plot_file, save=not no_save)


def _save_and_show(profile: Any, store: Path | None, plot_file: Path | None, *, save: bool) -> None:
    """Save what the run measured, then show it; where the save fails, show it all the same
    before the store's one line (the summary is all that is left of the run)."""
    from torch_autotune import api
    from torch_autotune.render import render_run

    try:
        saved = api.save(profile, store) if save else None
    except StoreError:
        render_run(profile, console(), None)
        raise
    render_run(profile, console(), saved)
    if plot_file is not None:
        plot_after_run(profile, plot_file)


def user_code(ctx: click.Context, run: Callable[[], T]) -> T:
    """Run the probe or the bench; a failure of the user's model shows their traceback, then
    one line with how the model was called (``steps.call_of``: ``model(**batch) with
    input_ids, labels``), and exits 5. Only an exception the probe marked as raised in the
    user's code does (``errors.blame_user_code``); any other one is a bug of ours.

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
            raise  # ours: an AutotuneError, or a bug (exits.Group says which)
        # the user's model or data raised: show their traceback, not ours
        from torch_autotune.probe.workloads.steps import call_of

        click.echo(their_traceback(error), err=True, nl=False)
        call = call_of(error)
        click.echo(
            f"autotune: error: the training step raised {type(error).__name__}"
            f"{f' in {call}' if call else ''} (not out-of-memory, so not a batch that is too"
            " big); fix the model or its data, see the traceback above",
            err=True,
        )
        ctx.exit(EXIT_WORKLOAD)
        raise  # unreachable: ctx.exit raises
