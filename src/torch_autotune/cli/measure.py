"""``autotune bench`` and ``autotune report``: measure a profile against a baseline, and draw
what was measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from torch_autotune.cli import inputs, options
from torch_autotune.cli.group import cli, user_code
from torch_autotune.cli.output import check_can_save, console, plot_after_run, write_profile
from torch_autotune.errors import ProfileFileError, StoreError


@cli.command("bench")
@options.model(
    "What to train: a built-in workload (resnet50, gpt2, gpt2-large, llama-1b, conv, "
    "transformer, mlp) or your own "
    "factory; default: the one the stored profile was measured on, else autotune's default."
)
@options.profile_file(
    "Bench this measured profile file instead of the machine's stored one (the store is then "
    "left alone; see --output)."
)
@click.option(
    "--baseline",
    "baseline_file",
    type=options.InputFile(),
    help="Your own baseline: a YAML mapping such as 'batch_size: 64' and 'num_workers: 4' "
    "(default: float32, batch 32, no workers, no pinning, eager, torch's default backends).",
)
@options.rounds()
@options.seconds()
@options.budget(
    "Seconds for tuning first, when there is no measured profile for the workload (default as "
    "for autotune)."
)
@options.output("Also write the benched profile to FILE (YAML, or JSON for a .json name).")
@options.plot(
    "Also draw the charts into a PNG file (needs the 'plot' extra; without it they are drawn "
    "in the terminal)."
)
@options.as_json("Print the bench results as JSON.")
@options.no_save("Do not store the benched profile.")
@options.store()
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
    from torch_autotune import api
    from torch_autotune.render import progress_reporter

    inputs.check_workload_name(workload, store, bench=True)
    baseline = inputs.load_baseline(baseline_file)
    if profile_file is None and not no_save:
        check_can_save(store)  # now, not after the bench
    profile = _profile_to_bench(profile_file, store, workload)
    estimate, how = api.bench_estimate(profile, rounds, seconds, budget, baseline)
    click.echo(f"autotune: the bench should take {how}", err=True)

    def run() -> Any:
        with progress_reporter(estimate, estimate=True) as report:
            return api.bench(
                profile,
                workload,
                baseline=baseline,
                rounds=rounds,
                seconds=seconds,
                budget_s=budget,
                progress=report,
            )

    benched = user_code(ctx, run)
    saved = None
    try:
        if profile_file is None and not no_save:
            saved = api.save(benched, store)
        if output is not None:
            write_profile(benched, output)
    except StoreError:  # what was measured is shown before the file's one line
        _render_bench(benched, saved, as_json=as_json)
        raise
    _render_bench(benched, saved, as_json=as_json)
    if plot_file is not None:
        plot_after_run(benched, plot_file)


def _profile_to_bench(profile_file: Path | None, store: Path | None, workload: str | None) -> Any:
    """The measured profile in ``profile_file``; else the stored one measured on
    ``workload`` (default: the machine's profile, when it was measured); else None: the
    bench then tunes first, and says so."""
    from torch_autotune import api

    if profile_file is not None:
        profile = inputs.load_profile(profile_file)
        if profile.evidence is None:
            raise ProfileFileError(
                f"{profile_file} was not measured (rules only): the bench needs the batch size "
                "the probe ran; run 'autotune' and bench the profile it saves"
            )
        inputs.check_profile_counts(profile, profile_file)
        return profile
    stored = api.stored_measured(store, workload)
    if stored is not None:
        return stored
    what = "measured profile" if workload is None else f"profile measured on {workload}"
    click.echo(f"autotune: no {what} for this machine yet: tuning first", err=True)
    return None


def _render_bench(benched: Any, saved: Path | None, *, as_json: bool) -> None:
    """The bench's results as JSON, or as tables with a note on where the profile went."""
    from torch_autotune.render import render_bench, saved_note

    if as_json:
        bench_evidence = benched.evidence.bench if benched.evidence else None
        click.echo("{}" if bench_evidence is None else bench_evidence.model_dump_json(indent=2))
        return
    render_bench(benched, console())
    if saved is not None:
        click.echo(saved_note(benched, saved))


@cli.command("report")
@options.profile_file("Draw this measured profile file instead of the machine's stored profile.")
@options.plot("Draw into a PNG file (needs the 'plot' extra) instead of the terminal.")
@options.stored_model()
@options.store()
def report_command(
    profile_file: Path | None, plot_file: Path | None, workload: str | None, store: Path | None
) -> None:
    """Draw what the probe and the bench measured: throughput against batch size with the
    memory limit, DataLoader throughput against workers, and each setting's speedup."""
    from torch_autotune import plot

    if profile_file is not None:
        profile = inputs.load_profile(profile_file)
    else:
        profile = inputs.current_profile(store, None, None, workload)
    if plot_file is None:
        plot.render_charts(profile, console())
        return
    plot.save_png(profile, plot_file)
    click.echo(f"wrote {plot_file}", err=True)
