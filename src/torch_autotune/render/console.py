"""The command's consoles and its progress lines: rich on a terminal; whole, unpadded lines in a
pipe, a log file or CI, where a closed reader is the command's to handle."""

from __future__ import annotations

import errno
import io
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TextIO, cast

from rich.console import Console

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


# What the charts and tables draw, in ASCII for a stream that cannot write them (``LC_ALL=C``,
# ``PYTHONIOENCODING=ascii``): one character for one, so that columns and bars stay aligned
# (rich cut a long name to its column with one '…').
_IN_ASCII = {
    "…": "~",
    "◀": "<",
    "✗": "x",
    "│": "|",
    "→": ">",
    "×": "x",
    "█": "#",
    "▐": "#",
    **dict.fromkeys("▏▎▍", " "),  # under half a cell: rounded down
    **dict.fromkeys("▌▋▊▉", "#"),
}
IN_ASCII_ERRORS = "torch_autotune.in_ascii"
"""The codec error handler ``write_in_ascii_where_needed`` gives a stream."""


def _in_ascii(error: UnicodeError) -> tuple[str, int]:
    """A codec error handler: the characters ``error`` could not encode, as ``_IN_ASCII``
    spells them, else '?'."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    failed = error.object[error.start : error.end]
    return "".join(_IN_ASCII.get(c, "?") for c in failed), error.end


def write_in_ascii_where_needed(*streams: object) -> None:
    """Let each of ``streams`` that cannot encode what the charts and tables draw write it in
    ASCII (``_IN_ASCII``) instead of raising UnicodeEncodeError: a report or a truncated name
    ('…') on a stream in the C locale was an internal error, exit 1."""
    import codecs

    try:
        codecs.lookup_error(IN_ASCII_ERRORS)
    except LookupError:
        codecs.register_error(IN_ASCII_ERRORS, _in_ascii)
    for stream in streams:
        encoding = getattr(stream, "encoding", None) or "utf-8"
        try:
            "".join(_IN_ASCII).encode(encoding)
        except UnicodeEncodeError:
            reconfigure = getattr(stream, "reconfigure", None)
            if reconfigure is not None:
                reconfigure(errors=IN_ASCII_ERRORS)
        except LookupError:  # an encoding Python does not know: leave the stream as it is
            continue


def is_terminal(console: Console) -> bool:
    """Whether a person watches ``console`` live: a terminal that can redraw a line."""
    return console.is_terminal and not console.is_dumb_terminal


@contextmanager
def progress_reporter(
    budget_s: float,
    console: Console | None = None,
    clock: Callable[[], float] = time.perf_counter,
    *,
    estimate: bool = False,
    provisional: bool = False,
) -> Iterator[Callable[[str, str], None]]:
    """A progress callback that shows each phase and what it tries, against the time budget,
    or with ``estimate`` against an estimate of the whole (the bench's: it has no budget).

    On a terminal, a progress bar that is gone when the run ends. Anywhere else (CI, nohup, a
    log file), where a bar shows nothing, one plain line per call on ``console`` (default:
    stderr), such as ``autotune: [12.3 s of 120 s budget] search: batch 64``: one for each
    phase and each trial, so that a log says where the time went.

    The clock starts at the first report, which ``tune()`` makes when its budget starts (after
    importing torch), so the times shown are the budget's and end where its run time does.
    A ``("budget", "180 s")`` report replaces the budget; with ``estimate``, it is part of the
    estimate already, and an ``("estimate", "40 s")`` report (what is left, from now) replaces
    it instead (``"40 s for 3 arms x 5 rounds"``: the seconds first). ``provisional``: the
    budget is not known until its report comes (``tune()`` chooses it after detection: 120 s,
    or 180 s where it measures torch.compile), and the lines before it name none.
    """
    console = console or make_console(stderr=True)
    told = _Told(budget_s, estimate, clock)
    told.known = not provisional
    if not is_terminal(console):
        yield _plain_reporter(told, console)
        return
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        TextColumn(
            "of about {task.total:.0f} s (estimate)" if estimate else "of {task.total:.0f} s budget"
        ),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("starting", total=budget_s)

        def report(phase: str, what: str) -> None:
            elapsed = told.report(phase, what)
            progress.update(
                task, description=f"{phase}: {what}", completed=elapsed, total=told.total
            )

        yield report


class _Told:
    """The time a run has taken since its first report, and the total it is shown against:
    its budget, or with ``estimate`` an estimate of the whole that a later report refines."""

    def __init__(self, total: float, estimate: bool, clock: Callable[[], float]) -> None:
        self.total, self.estimate, self.clock = total, estimate, clock
        self.started: float | None = None
        self.known = True  # the total: False until a provisional budget's report comes

    def report(self, phase: str, what: str) -> float:
        """Seconds since the first report, the total updated from this one."""
        now = self.clock()
        if self.started is None:
            self.started = now
        elapsed = now - self.started
        seconds = _seconds_told(what)
        if seconds is not None and phase == ("estimate" if self.estimate else "budget"):
            self.total = elapsed + seconds if self.estimate else seconds
            self.known = True
        return elapsed

    def words(self, elapsed: float) -> str:
        """'12.3 s of 120 s budget', '12.3 s of about 40 s (estimate)', or past an estimate,
        '52.3 s, past the 40 s estimate'."""
        if not self.estimate:
            if not self.known:
                return f"{elapsed:.1f} s"
            return f"{elapsed:.1f} s of {self.total:.0f} s budget"
        if elapsed > self.total:
            return f"{elapsed:.1f} s, past the {self.total:.0f} s estimate"
        return f"{elapsed:.1f} s of about {self.total:.0f} s (estimate)"


def _seconds_told(what: str) -> float | None:
    """The seconds of a ``("budget", "180 s")`` or ``("estimate", "40 s for ...")`` report."""
    try:
        return float(what.split(" s", 1)[0])
    except ValueError:
        return None


def _plain_reporter(told: _Told, console: Console) -> Callable[[str, str], None]:
    """One line per call (a call that repeats the one before is left out)."""
    last: list[tuple[str, str]] = []

    def report(phase: str, what: str) -> None:
        elapsed = told.report(phase, what)
        if last == [(phase, what)]:
            return
        last[:] = [(phase, what)]
        line = f"autotune: [{told.words(elapsed)}] {phase}: {what}"
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    return report
