"""The commands about machines and profiles, which measure nothing: ``detect``,
``recommend``, ``show``, ``export``, ``validate`` and ``diff``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from torch_autotune.cli import inputs, options
from torch_autotune.cli.group import cli
from torch_autotune.cli.output import console, warn_unused_gpu
from torch_autotune.errors import EXIT_BAD_INPUT, EXIT_DIFFERENT, InputFileError


@cli.command("detect")
@options.as_json("Print the snapshot as JSON.")
@click.option(
    "--deep",
    is_flag=True,
    help="Also import torch (seconds) to fill what NVML and the OS cannot answer.",
)
@options.snapshot(
    "Describe the machine recorded in FILE (from 'autotune detect --json'; '-' reads standard "
    "input) instead."
)
def detect_command(as_json: bool, deep: bool, snapshot_file: Path | None) -> None:
    """Describe this machine: GPUs, usable CPUs, RAM, Python and torch.

    Fast by default: reads NVML and the OS without importing torch or starting CUDA.
    """
    from torch_autotune import api

    snapshot = api.detect(inputs.recorded_machine(snapshot_file), deep=deep)
    if as_json:
        click.echo(snapshot.model_dump_json(indent=2))
        return
    from torch_autotune.render import render_snapshot

    render_snapshot(snapshot, console())


@cli.command("recommend")
@options.recorded_snapshot()
@options.mode(default=None)
@click.option(
    "--model-kind",
    type=click.Choice(["conv", "transformer", "mlp", "other"]),
    default="other",
    show_default=True,
    help="What the model mostly is (cuDNN autotuner and channels_last help conv nets).",
)
@options.variable_shapes()
@click.option(
    "--optimizer",
    type=click.Choice(["adam", "adamw", "sgd", "other"]),
    default="adamw",
    show_default=True,
    help="The optimizer the script trains with (fused kernels are trusted for Adam/AdamW).",
)
@options.processes_per_node()
@options.as_json("Print the profile as JSON.")
@click.option("--save", is_flag=True, help="Store the profile for this machine.")
@click.option(
    "--force",
    is_flag=True,
    help="With --save: replace a measured profile stored for this machine, or a stored file "
    "this version cannot read (refused without).",
)
@options.store()
def recommend_command(  # click passes options by name
    *,
    snapshot_file: Path | None,
    mode: str | None,
    model_kind: str,
    variable_shapes: bool,
    optimizer: str,
    processes_per_node: int | None,
    as_json: bool,
    save: bool,
    force: bool,
    store: Path | None,
) -> None:
    """Show the profile the rules give, each setting with its reason."""
    from torch_autotune import api
    from torch_autotune.profile import Mode, Preferences

    snapshot = inputs.snapshot(snapshot_file)
    preferences = Preferences(
        mode=Mode(mode or "speed"),
        model_kind=model_kind,  # type: ignore[arg-type]
        fixed_shapes=not variable_shapes,
        optimizer=optimizer,  # type: ignore[arg-type]
        processes_per_node=processes_per_node,
    )
    profile = api.rules_profile(snapshot, preferences)
    warn_unused_gpu(profile)
    if save:
        path = api.save(profile, store, force=force)
        click.echo(f"saved to {path}", err=True)
    _print_profile(profile, as_json=as_json)


def _print_profile(profile: Any, *, as_json: bool, measured_on: str = "this machine") -> None:
    """A profile as JSON, or as a table of its settings, each with its rule and reason, and
    where it was measured (``measured_on``)."""
    if as_json:
        from torch_autotune.profile_io import dump_profile

        click.echo(dump_profile(profile, "json"), nl=False)
        return
    from torch_autotune.render import render_profile

    render_profile(profile, console(), measured_on=measured_on)


def _measured_on(profile: Any) -> str:
    """Where the measured ``profile`` of a file was measured, in words: this machine where the
    fingerprints agree; else this machine before it changed (it wrote the profile), or
    another machine, with what differs."""
    from torch_autotune import api
    from torch_autotune.profile import fingerprint
    from torch_autotune.remeasure import changes_since

    here = inputs.snapshot(None)
    if profile.provenance.fingerprint == fingerprint(here):
        return "this machine"
    changes = changes_since(profile, here)
    if profile.provenance.machine_id == api.host_id():
        return f"this machine before it changed ({changes})"
    return f"another machine (what differs, that machine -> this one: {changes})"


@cli.command("show")
@options.stored_model()
@options.store()
@options.mode(default=None)
@options.recorded_snapshot()
@options.profile_file(
    "Show this profile file (saved from Python with torch_autotune.save, or by 'autotune "
    "export') instead of the machine's stored profile ('-' reads standard input)."
)
@options.as_json("Print the profile as JSON.")
def show_command(  # click passes options by name
    *,
    workload: str | None,
    store: Path | None,
    mode: str | None,
    snapshot_file: Path | None,
    profile_file: Path | None,
    as_json: bool,
) -> None:
    """Show this machine's profile: the stored one if it is fresh, else the rules-only one;
    or, with --profile, a profile file."""
    where = inputs.machine_words(snapshot_file)[0]  # the store keeps each under its machine
    if profile_file is not None:
        _only_the_file("show", workload, mode, snapshot_file)
        profile = inputs.load_profile(profile_file)
        if profile.measured and not as_json:  # a file may come from anywhere: compare
            where = _measured_on(profile)
    else:
        profile = inputs.current_profile(store, mode, snapshot_file, workload)
    _print_profile(profile, as_json=as_json, measured_on=where)


def _only_the_file(
    verb: str, workload: str | None, mode: str | None, snapshot_file: Path | None
) -> None:
    """A usage error (exit 2) where ``--profile`` comes with an option that chooses a stored
    profile instead: ``-m``, ``--mode`` or ``--snapshot``."""
    chosen = [flag for flag, value in (("-m", workload), ("--mode", mode)) if value]
    if snapshot_file is not None:
        chosen.append("--snapshot")
    if chosen:
        raise click.UsageError(
            f"--profile names the profile to {verb}; {', '.join(chosen)} choose a stored"
            " one: give one or the other"
        )


@cli.command("export")
@options.output("Write to FILE (atomically) instead of standard output.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["yaml", "json", "lightning", "hf", "accelerate", "env"]),
    default="yaml",
    show_default=True,
    help="yaml/json: the profile itself; lightning: LightningCLI trainer config; hf: "
    "TrainingArguments JSON; accelerate: accelerate config file; env: shell exports.",
)
@options.stored_model()
@options.store()
@options.mode(default=None)
@options.recorded_snapshot()
@options.profile_file(
    "Export this profile file (saved from Python with torch_autotune.save, or by 'autotune "
    "export') instead of the machine's stored profile ('-' reads standard input)."
)
def export_command(  # click passes options by name
    *,
    output: Path | None,
    fmt: str,
    workload: str | None,
    store: Path | None,
    mode: str | None,
    snapshot_file: Path | None,
    profile_file: Path | None,
) -> None:
    """Write this machine's profile as YAML or JSON, or as a Lightning, Hugging Face,
    accelerate or shell-environment file."""
    if profile_file is not None:
        _only_the_file("export", workload, mode, snapshot_file)
        profile = inputs.load_profile(profile_file)
    else:
        profile = inputs.current_profile(store, mode, snapshot_file, workload)
    if fmt in ("yaml", "json"):
        from torch_autotune.profile_io import dump_profile

        text = dump_profile(profile, fmt)  # type: ignore[arg-type]
    else:
        from torch_autotune.integrations import EXPORT_FORMATS, hf_notes

        text = EXPORT_FORMATS[fmt](profile)
        notes = hf_notes(profile) if fmt == "hf" else []
        if notes:  # JSON holds no comments: what TrainingArguments cannot set goes beside it
            click.echo(
                "autotune: note: not in the JSON (TrainingArguments has no argument for these,"
                " or the line says why it is left out):",
                err=True,
            )
            for note in notes:
                click.echo(f"autotune: note:   {note}", err=True)
    if output is None:
        click.echo(text, nl=False)
        return
    from torch_autotune.files import write_atomically

    write_atomically(output, text)
    click.echo(f"wrote {output}", err=True)


@cli.command("validate")
@click.argument("files", nargs=-1, required=True, type=options.InputFile())
@click.pass_context
def validate_command(ctx: click.Context, files: tuple[Path, ...]) -> None:
    """Check profile files: syntax, schema, and every cross-field invariant.

    One line for each FILE ('-' reads standard input): on stdout when it is valid, on stderr
    when it is not. The exit code is 3 when any file is not valid.
    """
    invalid = 0
    for file in files:
        try:
            profile = inputs.load_profile(file)
        except InputFileError as error:
            click.echo(f"autotune: error: {error}", err=True)
            invalid += 1
            continue
        name = "standard input" if inputs.is_stdin(file) else file
        click.echo(
            f"{name}: valid profile (schema {profile.schema_version}, mode "
            f"{profile.mode.value}, device {profile.settings.device}, "
            f"{len(profile.decisions)} decisions)"
        )
    if invalid:
        ctx.exit(EXIT_BAD_INPUT)


@cli.command("diff")
@click.argument("first", type=options.InputFile())
@click.argument("second", type=options.InputFile())
@click.pass_context
def diff_command(ctx: click.Context, first: Path, second: Path) -> None:
    """Show the settings two profile files disagree on.

    Exit status as diff(1): 0 when the settings are the same, 1 when they differ; a missing
    or invalid file is 3, as for every command.
    """
    from torch_autotune import api
    from torch_autotune.render import render_diff

    rows = api.settings_diff(inputs.load_profile(first), inputs.load_profile(second))
    render_diff(rows, console())
    if rows:
        ctx.exit(EXIT_DIFFERENT)
