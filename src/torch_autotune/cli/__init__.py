"""The ``autotune`` command: parse, call the public API (``torch_autotune.api``), render.
Nothing else lives here.

Errors raised on purpose (``AutotuneError``) become one line on stderr and the exit code the
error class carries (see ``torch_autotune.errors``); only this package exits.

- ``options``: every option, declared once;
- ``inputs``: the files and standard input a command reads, and the profile it starts from;
- ``output``: the console, profile files and charts a command writes;
- ``exits``: where errors become one line and an exit code;
- ``group``: ``autotune`` itself, and the whole job without a subcommand;
- ``measure``: ``bench`` and ``report``;
- ``profiles``: ``detect``, ``recommend``, ``show``, ``export``, ``validate`` and ``diff``.
"""

from __future__ import annotations

from torch_autotune.cli import measure, profiles
from torch_autotune.cli.group import cli

__all__ = ["cli", "main"]

_COMMANDS = (measure, profiles)  # importing them registers their commands on ``cli``


def main() -> None:
    """Run the command (``torch_autotune.__main__.main`` is the console script: it also catches
    a Ctrl-C while this package is imported)."""
    cli(prog_name="autotune")
