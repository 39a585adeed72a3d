"""Where errors become messages and exit codes: the one place (see ``torch_autotune.errors``).

AutotuneError: its one line and its code, after the user's traceback when their code raised
its cause (``errors.user_code_failed``: their factory, model builder or dataset). Ctrl-C:
'interrupted', 130, also when clean-up on the way out fails because of it. A closed standard
output (``autotune show | head -1``): nothing said, 141, as a process SIGPIPE ends. A usage
error: one line, 2. Any other exception is a bug of ours: the traceback, a line that asks for
a report, 1. An exception of the user's own code in a training step is handled where it runs
(``group.user_code``).
"""

from __future__ import annotations

import errno
import io
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import click

from torch_autotune.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    AutotuneError,
    raised_by_user_code,
    their_traceback,
)

# torch warns "Failed to initialize NumPy: No module named 'numpy'" when it is first imported
# without numpy (from torch._subclasses.functional_tensor, torch 2.x). numpy is optional for
# torch and for torch-autotune (only seeded DataLoader workers use it, when it is there), so
# the command does not depend on it to keep its first line from being torch's warning.
_NUMPY_MISSING = "Failed to initialize NumPy"


class Group(click.Group):
    """A click group that turns every error into one message and its exit code (the module
    docstring says which)."""

    def main(  # click's own signature, with the handling of its standalone mode
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        self.arguments = list(sys.argv[1:] if args is None else args)  # for --nproc-per-node
        _stand_in_for_closed_streams()
        if not _current_directory_exists():
            click.echo(
                "autotune: error: the current directory no longer exists (it was removed while "
                "in use); cd to a directory that exists and run autotune again",
                err=True,
            )
            sys.exit(EXIT_USAGE)
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
            if _quiet(error):  # a rank other than 0, or a failure its own rank said
                ctx.exit(error.exit_code)
            cause = error.__cause__
            if cause is not None and raised_by_user_code(cause):  # their factory, model, data
                click.echo(their_traceback(cause), err=True, nl=False)
            click.echo(f"autotune: error: {_rank_said()}{error}", err=True)
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
            if _after_ctrl_c(error):
                click.echo("autotune: interrupted", err=True)
                ctx.exit(EXIT_INTERRUPTED)
            _report_bug(error)
            ctx.exit(EXIT_INTERNAL)


class _ClosedStdout(io.TextIOBase):
    """Standard output for a command started with it closed (``autotune recommend >&-``),
    where Python sets ``sys.stdout`` to None: writing says so as a closed pipe does
    (BrokenPipeError: nothing more is said, exit 141), after whatever the command did first
    (a measuring run saves its profile before it shows it)."""

    encoding = "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            raise BrokenPipeError(errno.EPIPE, "standard output is closed")
        return 0

    def flush(self) -> None:
        return


def _stand_in_for_closed_streams() -> None:
    """Where the command started with standard output or error closed: the null device holds
    descriptor 1 or 2, so that no file the command opens (a profile's temporary file) takes
    it and gets what torch or a worker writes there; a closed standard output is
    ``_ClosedStdout``. A stream that cannot write Unicode (``LC_ALL=C``) writes the charts'
    and tables' characters in ASCII (``render.console.write_in_ascii_where_needed``)."""
    for descriptor in (1, 2):
        try:
            os.fstat(descriptor)
        except OSError:
            null = os.open(os.devnull, os.O_WRONLY)  # the lowest free descriptor: 1 or 2
            if null != descriptor:
                os.dup2(null, descriptor)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = _ClosedStdout()
    if not _writes_unicode(sys.stdout) or not _writes_unicode(sys.stderr):  # LC_ALL=C
        from torch_autotune.render.console import write_in_ascii_where_needed

        write_in_ascii_where_needed(sys.stdout, sys.stderr)


def _writes_unicode(stream: Any) -> bool:
    """Whether ``stream`` (None: a closed one) writes any character: its encoding is UTF."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    return stream is None or encoding.lower().replace("_", "-").startswith("utf")


def _current_directory_exists() -> bool:
    """Whether the current directory still exists: one removed under the shell ends every
    relative path, and torch's start-up with it (oneMKL printed 'FATAL ERROR: Cannot load
    libtorch_cpu.so' and exited 2, before Python could say why)."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return False
    return True


def _quiet(error: AutotuneError) -> bool:
    """Whether a rank of a job says nothing of ``error`` (``launch.quiet_rank``)."""
    from torch_autotune.cli.launch import quiet_rank
    from torch_autotune.launch import ranks_from_environment

    try:
        ranks = ranks_from_environment(os.environ)
    except AutotuneError:  # variables torchrun would not set: the error says so itself
        return False
    return quiet_rank(ranks, error)


def _rank_said() -> str:
    """'rank 1: ' in a rank other than 0 of a job (what it says is its own), else ''."""
    from torch_autotune.launch import ranks_from_environment

    try:
        ranks = ranks_from_environment(os.environ)
    except AutotuneError:
        return ""
    return "" if ranks is None or ranks.leader else f"rank {ranks.rank}: "


def _usage_line(error: click.ClickException) -> str:
    """Click's message on one line, with where to read the usage."""
    message = " ".join(error.format_message().split())
    context = getattr(error, "ctx", None)
    if context is None or error.exit_code != EXIT_USAGE:  # an unwritable -o is no misuse
        return message
    return f"{message.rstrip('.')}; see '{context.command_path} --help'"


def _after_ctrl_c(error: BaseException) -> bool:
    """Whether ``error`` was raised while a Ctrl-C was being handled: by clean-up that ran on
    the way out (restoring torch's flags), which a Ctrl-C in the middle of an import can
    break. A Ctrl-C during torch's first ``use_deterministic_algorithms``, which imports
    inductor and sympy (0.8 s), left sympy half-imported, and putting the flags back raised
    "module 'sympy' has no attribute 'printing'": an internal error, exit 1, a traceback."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error.__context__, error.__cause__]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        pending += [current.__context__, current.__cause__]
    return False


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
