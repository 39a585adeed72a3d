"""The `autotune` command: parse, call the public API, render. Nothing else lives here.

Errors raised on purpose (``AutotuneError``) become one line on stderr and the exit code the
error class carries (see ``torch_autotune.errors``); only this module exits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from torch_autotune import __version__
from torch_autotune.errors import AutotuneError


class _Group(click.Group):
    """A click group that maps AutotuneError to its message and exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AutotuneError as error:
            click.echo(f"autotune: error: {error}", err=True)
            ctx.exit(error.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="torch-autotune")
def cli() -> None:
    """Hardware-aware configuration tuner for PyTorch training.

    \b
    Exit codes: 0 success, 1 internal error (a bug), 2 usage error,
    3 an input file is missing or invalid.
    """


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
    type=click.Path(dir_okay=False, path_type=Path),
    help="Describe the machine recorded in FILE (from 'autotune detect --json') instead.",
)
def detect_command(as_json: bool, deep: bool, snapshot_file: Path | None) -> None:
    """Describe this machine: GPUs, usable CPUs, RAM, Python and torch.

    Fast by default: reads NVML and the OS without importing torch or starting CUDA.
    """
    from torch_autotune.detect import RecordedMachine, detect

    machine = RecordedMachine.from_file(snapshot_file) if snapshot_file else None
    snapshot = detect(machine, deep=deep)
    if as_json:
        click.echo(snapshot.model_dump_json(indent=2))
        return
    from rich.console import Console

    from torch_autotune.render import render_snapshot

    render_snapshot(snapshot, Console(highlight=False))  # writes to sys.stdout at print time


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="autotune")


if __name__ == "__main__":  # pragma: no cover
    main()
