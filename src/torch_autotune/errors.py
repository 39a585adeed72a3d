"""The one exception tree of torch-autotune, and the exit code each error maps to.

The library raises; only the command-line entry point turns an error into a message and an
exit code. Messages say what happened, why, and what fixes it.

Exit codes (documented in the README):
    0  success
    1  an unexpected internal error (a bug: please report it with the traceback)
    2  usage error: unknown option, bad argument (click's own code); ranks a node cannot run,
       torchrun's variables not as torchrun sets them; a current directory that was removed
    3  an input file is missing, unreadable, or not valid (snapshot, profile)
    4  the profile store cannot be read or written (location, permissions, disk), a stored
       profile is corrupt or was made for another machine, or a write would replace a
       measured profile (or a stored file it cannot read) with a rules-only one (without
       --force); an output file (-o, --plot) cannot be written
    5  the workload cannot be used: the user's model factory fails to import or run, or its
       training step raises an error that is not out-of-memory (the user's own traceback is
       shown, but for a package their module imports that is not installed)
    6  the probe could not measure: the time budget ran out before a batch finished, or a
       size that ran no longer runs (the device is shared), or another rank of the job
       stopped
    7  the model does not fit the device: not even its smallest batch trains (out of
       memory), with activation checkpointing either where it could be tried; the message
       gives what a step needs, what was tried and what is left (sharding, an 8-bit
       optimizer, the optimizer's state in host memory, a shorter sequence), each estimated
  130  interrupted (Ctrl-C): one line, no traceback
  141  standard output was closed early (``autotune show | head -1``), or from the start
       (``autotune show >&-``): quietly, as a process that SIGPIPE ends (128 + 13)

``autotune diff`` follows diff(1): 0 when the profiles have the same settings, 1 when they
differ; its errors keep the codes above (a bad input file is 3), never 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_BAD_INPUT = 3
EXIT_STORE = 4
EXIT_WORKLOAD = 5
EXIT_PROBE = 6
EXIT_DOES_NOT_FIT = 7
EXIT_DIFFERENT = 1  # autotune diff only, as diff(1): the two profiles differ
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a process Ctrl-C ended
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for `yes | head -1`

_USER_CODE = "_torch_autotune_user_code"
USER_CODE_NOTE = "torch-autotune: "
"""How a note of ours on the user's error starts (``their_traceback`` leaves it out)."""


class AutotuneError(Exception):
    """Base class of every error torch-autotune raises on purpose."""

    exit_code: int = EXIT_INTERNAL


class InputFileError(AutotuneError):
    """A file given to torch-autotune is missing, unreadable, or does not hold what it should."""

    exit_code = EXIT_BAD_INPUT


class SnapshotFileError(InputFileError):
    """A hardware snapshot file cannot be used."""


class ProfileFileError(InputFileError):
    """A profile file cannot be used: bad YAML/JSON, unknown keys, broken invariants."""


class StaleProfileWarning(UserWarning):
    """The stored profile was made for this machine before its GPU, driver, torch or CUDA
    changed; it is not used."""


class WorldSizeWarning(UserWarning):
    """``recommend()`` under torchrun found no profile for the job's world size and returns
    the profile of one process, whose batch ran without DDP's extra memory a rank."""


class LateEnvironmentWarning(UserWarning):
    """An environment setting was applied after the library that reads it had started."""


class ProfileUseWarning(UserWarning):
    """A training script's own argument to a profile's helper leaves out or contradicts what
    the profile holds: ``drop_last=False`` for a training loader where batch 1 raised, an
    optimizer class without the profile's ``fused`` argument."""


class StoreError(AutotuneError):
    """The profile store cannot be read or written."""

    exit_code = EXIT_STORE


class StoredProfileError(StoreError):
    """A profile in the store cannot be used: not UTF-8, not JSON, invalid, from a newer
    release, or made for another machine than its file name says. The message names the file
    and the fix; reading never deletes it."""


class MeasuredProfileExistsError(StoreError):
    """Saving would replace a measured profile with a rules-only one, or a stored file that
    cannot be read and may hold one (``--force`` does)."""


class StoredProfileWarning(UserWarning):
    """``recommend()`` found a stored profile it cannot use (corrupt, made for another
    machine, or unreadable) and returns the rules-only profile instead; ``error`` (a
    ``StoredProfileError``, or a ``StoreError`` for a file that cannot be read) says which file
    and why."""

    def __init__(self, error: StoreError) -> None:
        super().__init__(f"{error}; using the rules-only profile meanwhile")
        self.error = error


class RulesOnlyWarning(UserWarning):
    """``recommend()`` was asked for a workload, or a mode, that the store holds no profile of
    for this machine, and returns the rules-only profile: the message says what was asked, what
    the store holds instead ("perhaps you meant ..."), and how to measure it."""


class UnusableGpuWarning(UserWarning):
    """The machine has a GPU the installed torch cannot run (no kernels for its architecture,
    or a CPU-only build of torch), so the profile trains on the CPU."""


class WorkloadError(AutotuneError):
    """The model, optimizer or data to probe cannot be built or trained (not out-of-memory)."""

    exit_code = EXIT_WORKLOAD


class DoesNotFitError(WorkloadError):
    """Not even the smallest batch trains: it runs out of memory (``batch_size``). Where the
    ranks of a job trained it in DDP, they try FSDP2 next (``together``); one GPU's message
    gives the plan (``probe.fit_plan``). Its own exit code: the workload is sound, the device
    too small for it.

    ``fact``: what was measured and tried, in one sentence; the message is the fact and then
    the ``plan`` (lines: what a step needs and what is left), or, without one, ``fix``.
    ``trials``: the search's records of the sizes that did not train (``SearchTrialRecord``);
    ``took``: on the CPU, how far the smallest went over --memory-limit, in words."""

    exit_code = EXIT_DOES_NOT_FIT

    def __init__(
        self,
        fact: str,
        *,
        batch_size: int,
        fix: str = "use a smaller model or a larger device",
        plan: str | None = None,
        over_cap: bool = False,
        trials: tuple[Any, ...] = (),
        took: str | None = None,
    ) -> None:
        super().__init__(f"{fact}.\n{plan}" if plan else f"{fact}; {fix}")
        self.fact = fact
        self.fix = fix
        self.plan = plan
        self.batch_size = batch_size
        self.over_cap = over_cap  # the CPU: it took more than --memory-limit, nothing ran out
        self.trials = trials
        self.took = took


def user_code_failed(message: str, error: BaseException) -> WorkloadError:
    """The ``WorkloadError`` for ``error``, which the user's own code raised while the workload
    was built (their module, factory, model, optimizer factory or dataset): ``error`` is marked
    as theirs (``blame_user_code``), so the command line shows its traceback above ``message``.
    Raise it ``from error``."""
    blame_user_code(error)
    return WorkloadError(message)


class ProbeError(AutotuneError):
    """The probe could not measure what it needs on this machine."""

    exit_code = EXIT_PROBE


class RecomputeDiffersError(ProbeError):
    """Activation checkpointing is on from the start (the probe again, where not even the
    smallest batch trained without it), and its recompute is not the step it replaces: the
    check found it differs, or raised. The probe turns it into ``DoesNotFitError``, with the
    plan."""


class LaunchError(AutotuneError):
    """The training processes cannot be started or joined as asked: more processes on a node
    than it has GPUs, torchrun's variables set but not as torchrun sets them, a launch option
    given to a process torchrun already started.

    Exit code 2, a usage error: the command line (autotune's or torchrun's) asks for what
    cannot run.
    """

    exit_code = EXIT_USAGE


class RankFailedError(ProbeError):
    """Another training process of the job failed while the ranks probed together: it raised
    (``exit_code`` 5 where its error was the user's model or data, its traceback printed by
    that rank), ran out of memory outside a trial, or stopped (killed, crashed). Every rank
    stops within its wait's bound; the message names the rank and what it said."""

    def __init__(
        self, message: str, *, exit_code: int = EXIT_PROBE, said: bool = False, hung: bool = False
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.said = said  # the failed rank said it itself (its one line is on its stderr)
        self.hung = hung  # a rank did not answer in time: alive, so no launcher says it


class MemoryLimitError(AutotuneError, ValueError):
    """``--memory-limit`` (``tune(memory_limit_gib=...)``) asks for more memory than the device
    the probe trains on has: host RAM on the CPU, the GPU's own on a GPU. No cap above the
    device binds, so the run would say a limit held that never did.

    Exit code 2, a usage error; from Python a ``ValueError``, as the other arguments' are.
    """

    exit_code = EXIT_USAGE


class PlotUnavailableError(AutotuneError):
    """matplotlib, which drawing a PNG needs, is not installed (or is too old).

    Exit code 2, a usage error: the option asked for cannot be used in this installation.
    """

    exit_code = EXIT_USAGE


def blame_user_code(error: BaseException) -> None:
    """Mark ``error`` as raised by the user's own code: their model, loss, optimizer or data,
    called by the probe or the bench. The exception keeps its type and traceback (the user
    reads their own error); the command line exits 5 for it, and 1 (a bug of ours) for any
    other exception. An exception that takes no attributes stays unmarked, and so does an
    ``AutotuneError``: ours, it says in one line what the user's code did, and the command line
    shows their traceback from its cause (``user_code_failed``)."""
    if isinstance(error, AutotuneError):
        return
    try:
        setattr(error, _USER_CODE, True)
    except (AttributeError, TypeError):  # a type with __slots__ and no __dict__
        return


def raised_by_user_code(error: BaseException) -> bool:
    """Whether ``blame_user_code`` marked ``error``."""
    return getattr(error, _USER_CODE, False) is True


def their_traceback(error: BaseException) -> str:
    """The traceback of an error the user's code raised, as Python prints it, without the
    frames of torch-autotune that lead down to their model or data (the probe's own calls),
    in it and in the errors it chains; every frame where all of them are ours."""
    import traceback

    ours = Path(__file__).resolve().parent
    seen: set[int] = set()

    def trimmed(shown: traceback.TracebackException) -> None:
        if id(shown) in seen:
            return
        seen.add(id(shown))
        frames = list(shown.stack)
        while frames and Path(frames[0].filename).resolve().is_relative_to(ours):
            frames.pop(0)
        shown.stack = traceback.StackSummary.from_list(frames or list(shown.stack))
        notes = getattr(shown, "__notes__", None)  # the command says it in its own line
        if notes:
            kept = [n for n in notes if not str(n).startswith(USER_CODE_NOTE)] or None
            setattr(shown, "__notes__", kept)  # noqa: B010 (typeshed has no __notes__ here)
        grouped = getattr(shown, "exceptions", None) or []  # an ExceptionGroup's own
        for chained in (shown.__cause__, shown.__context__, *grouped):
            if chained is not None:
                trimmed(chained)

    shown = traceback.TracebackException.from_exception(error)
    trimmed(shown)
    return "".join(shown.format())


def said_in_one_line(error: BaseException) -> str:
    """What ``error`` says, in one line for a note where a variant's failure is kept instead
    of raised: its type and its message's first line (at most 200 characters, a closing full
    stop dropped: the line goes on inside a sentence), or its type alone where the message is
    empty."""
    text = str(error).strip()
    if not text:
        return type(error).__name__
    line = text.splitlines()[0][:200]
    if line.endswith(".") and not line.endswith(".."):
        line = line[:-1]
    return f"{type(error).__name__}: {line}"
