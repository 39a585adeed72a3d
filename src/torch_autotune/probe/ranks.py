"""The training processes of a job probing together: rank 0 leads, the others follow.

Rank 0 runs the probe's orchestration (``probe.run``) as one process would; its runner is a
``Leader``, the seam's ``Trials``, which sends every call to every rank before it makes the call
itself, so that all ranks train the same trial at the same time in DistributedDataParallel
(``probe.ddp.DdpRunner``), and then combines what each measured into one outcome: a size fits
only where it fit on every rank (so the largest batch is the smallest rank's, and mixed GPUs
work), a step takes the slowest rank's time, the group trains the sum of the ranks' samples.
The other ranks ``follow``: each call on their own runner, what they measured sent back, until
rank 0 says the probe is done and hands them the profile. Decisions are rank 0's alone (its
clock, its budget), so no two ranks can decide differently and wait for each other.

Control messages go over a gloo group of their own (``Group.control``) with a bounded timeout,
and DDP communicates over a group of its own (``Group.data``) with the same bound: a rank that
stops leaves none waiting longer than that (a rank killed outright closes its connections, and
the others' next message fails at once). A rank that fails posts what it said to the job's
store before it exits, where rank 0 reads it (``RankFailedError``).

An error is not always the end, in one process: the smallest batch's search goes on past an
error of the user's code at a small size (BatchNorm at batch 1), and checkpointing that raises
is not kept. So an error every rank raised on the same call is the job's: a rank whose call
raised asks whether rank 0 found it raised everywhere (``Group.raised_on_rank_0``), and rank
0, where its own call raised, waits for every other rank to say so (``raised_everywhere``);
then rank 0 handles its error as one process would, and the others' answers are set aside.
Where any rank did not raise, or says nothing within a bounded while, the job ends: a rank
other than 0 as above, rank 0 with its own error (``_alone``), which no phase takes for a
finding.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from torch_autotune.errors import (
    EXIT_PROBE,
    AutotuneError,
    RankFailedError,
    raised_by_user_code,
    their_traceback,
)
from torch_autotune.evidence import EAGER
from torch_autotune.probe.combine import combine_fed, combine_loads, combine_points, combine_trials
from torch_autotune.probe.fed import FedTrial
from torch_autotune.probe.group import Group
from torch_autotune.probe.loader import LoaderTrial
from torch_autotune.probe.search import TrialOutcome
from torch_autotune.probe.trials import PointOutcome, StepSettings
from torch_autotune.probe.variants import Variant

if TYPE_CHECKING:
    from torch_autotune.probe.fresh import FreshOutcome
    from torch_autotune.probe.search import Agreement

__all__ = ["Follower", "Leader", "run_ranks"]

_DONE = "done"
_AGAIN = "start again"


# --- the calls ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    """One call of the seam, as rank 0 sends it: which runner, which method, its arguments.
    ``left_s``, ``hard_s``: for a point, the seconds left until its share ends and until its
    phase does (each rank's own clock; ``hard_s`` None: no phase's end);
    ``number``: the how-manyth call (``Group.calls``), the key of rank 0's word on it."""

    runner: int
    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    left_s: float | None = None
    hard_s: float | None = None
    variant: tuple[str, tuple[tuple[str, Any], ...], bool, bool] | None = None
    number: int = 0


def _variant_spec(variant: Variant) -> tuple[str, tuple[tuple[str, Any], ...], bool, bool]:
    """What a follower needs of a variant to make its runner (its warm-up estimate is rank
    0's business, and may not pickle)."""
    return (variant.name, variant.changes, variant.fresh_model, variant.changes_memory)


class Leader:
    """Rank 0's ``Trials``: each call sent to every rank, made here too, and what the ranks
    measured combined (module docstring)."""

    def __init__(
        self,
        group: Group,
        runner: Any,
        *,
        name: str = EAGER,
        ident: int = 0,
        family: dict[str, Leader] | None = None,
    ):
        self.group = group
        self.runner = runner
        self.settings: StepSettings = runner.settings
        self.name = name
        self.ident = ident
        self.family = family if family is not None else {}  # every variant's, by name
        self.family.setdefault(name, self)

    def _all(self, call: _Call, here: Callable[[], Any]) -> list[Any]:
        """``call`` made on every rank, ``here`` on this one; what each rank returned. What
        raises here propagates as in one process, once every rank is past the call (the
        module docstring); ours and Ctrl-C at once (the other ranks stop when this process
        ends, or when their wait's bound passes)."""
        self.group.calls += 1
        call = replace(call, number=self.group.calls)
        self.group.broadcast(call)
        began = time.monotonic()
        try:
            mine = here()
        except AutotuneError:
            raise
        except Exception as error:
            if _collective_failed(error):  # another rank stopped: its word, not this error
                raise self.group.failure(error) from None
            wait_s = _wait_s(time.monotonic() - began)
            everywhere = self.group.raised_everywhere(call.number, wait_s=wait_s)
            self.group.verdict(call.number, raised=everywhere)
            if not everywhere:  # rank 0's alone: the others may wait in what it left
                raise _alone(self.group, error) from error
            self.group.gather(_RAISED)  # every rank is past the call: the job's error
            raise
        self.group.verdict(call.number, raised=False)
        return self.group.gather(mine)

    def __call__(self, batch_size: int) -> TrialOutcome:
        found = self._all(
            _Call(self.ident, "__call__", (batch_size,)), lambda: self.runner(batch_size)
        )
        return combine_trials(found)

    def point(
        self, batch_size: int, *, until: float, deadline: float | None = None
    ) -> PointOutcome:
        now = self.runner.clock()
        hard = None if deadline is None else deadline - now
        call = _Call(self.ident, "point", (batch_size,), left_s=until - now, hard_s=hard)
        found = self._all(
            call, lambda: self.runner.point(batch_size, until=until, deadline=deadline)
        )
        return combine_points(found)

    def variant(self, variant: Variant) -> Leader:
        child = len(self.family)
        call = _Call(self.ident, "variant", (child,), variant=_variant_spec(variant))
        made: list[Any] = []
        self._all(call, lambda: made.append(self.runner.variant(variant)))
        leader = Leader(self.group, made[0], name=variant.name, ident=child, family=self.family)
        self.family[variant.name] = leader
        return leader

    def devices(self) -> list[str]:
        """What each rank trains on, in rank order."""
        return self._all(_Call(self.ident, "device_name"), self.runner.device_name)

    def alone(self, batch_size: int, *, seconds: float) -> PointOutcome | None:
        """A throughput point of rank 0 by itself (the others wait): the one-rank rate the
        group's is measured against; None where the model is sharded (no rank trains it
        alone)."""
        if self.runner.sharded:
            return None
        # every rank builds the model first, together: wrapping it in DDP is a collective, and
        # a variant with a model of its own (checkpointing) let go of this runner's
        self.leaf_modules()
        with self.runner.alone():
            point: PointOutcome = self.runner.point(batch_size, until=self.runner.clock() + seconds)
        return point

    def apply_flags(self, *, cudnn_benchmark: bool | None = None) -> None:
        kwargs = {"cudnn_benchmark": cudnn_benchmark}
        self._all(
            _Call(self.ident, "apply_flags", kwargs=kwargs),
            lambda: self.runner.apply_flags(**kwargs),
        )

    def leaf_modules(self) -> int:
        found = self._all(_Call(self.ident, "leaf_modules"), self.runner.leaf_modules)
        return int(found[0])

    @property
    def built_s(self) -> float | None:
        return cast("float | None", self.runner.built_s)  # rank 0's: the ranks build alike

    def release_model(self) -> None:
        self._all(_Call(self.ident, "release_model"), self.runner.release_model)

    def recompute_check(self, batch_size: int) -> Agreement | None:
        """Rank 0's alone: a model of its own beside its DDP model, which it keeps (the other
        ranks keep theirs, and wait for the next call: no collective, nothing out of step)."""
        return cast("Agreement | None", self.runner.recompute_check(batch_size, keep_model=True))

    def fresh(self, environment: dict[str, str | None], **_trials: Any) -> FreshOutcome | None:
        """None: a fresh process of one rank is not the job's (its ranks start together)."""
        del environment
        return None

    def memory_limit(self) -> int | None:
        found = self._all(_Call(self.ident, "memory_limit"), self.runner.memory_limit)
        known = [value for value in found if value is not None]
        return min(known) if len(known) == len(found) else None

    def load(
        self, num_workers: int, batch_size: int, *, batches: int, timeout_s: float, seconds: float
    ) -> LoaderTrial:
        kwargs = {"batches": batches, "timeout_s": timeout_s, "seconds": seconds}
        call = _Call(self.ident, "load", (num_workers, batch_size), kwargs)
        found = self._all(call, lambda: self.runner.load(num_workers, batch_size, **kwargs))
        return combine_loads(found)

    def fed(
        self, batch_size: int, num_workers: int, threads: int | None, *, seconds: float
    ) -> FedTrial:
        call = _Call(self.ident, "fed", (batch_size, num_workers, threads), {"seconds": seconds})
        found = self._all(
            call, lambda: self.runner.fed(batch_size, num_workers, threads, seconds=seconds)
        )
        return combine_fed(found)

    def done(self, result: Any) -> None:
        """Tell every rank the probe is over, with ``result`` (the profile) for them."""
        self.group.broadcast(_Call(self.ident, _DONE, (result,)))

    @classmethod
    def first(cls, group: Group, runner: Any) -> Leader:
        """The leader of the probe's first start: the other ranks get its settings first."""
        group.broadcast(runner.settings)
        return cls(group, runner)

    def again(self, runner: Any) -> Leader:
        """The leader of a new start with ``runner`` (FSDP2 after DDP did not fit): every rank
        lets go of the models it holds and makes a runner of the new settings."""
        for leader in self.family.values():
            leader.runner.release_model()
        self._all(_Call(0, _AGAIN, (runner.settings,)), lambda: None)
        return Leader(self.group, runner)


class Follower:
    """A rank other than 0: each call rank 0 sends, made on this rank's runners, until done.
    ``make(settings)`` builds a runner, for the first settings rank 0 sends and for each start
    again (FSDP2 after DDP did not fit)."""

    def __init__(self, group: Group, make: Callable[[StepSettings], Any]):
        self.group = group
        self.make = make
        self.runners: dict[int, Any] = {0: make(group.broadcast(None))}

    def follow(self) -> Any:
        """Make rank 0's calls until it is done; what it handed over at the end."""
        while True:
            call: _Call = self.group.broadcast(None)
            if call.method == _DONE:
                return call.args[0]
            self.group.gather(_made(self.group, self._make, call))

    def _make(self, call: _Call) -> Any:
        runner = self.runners[call.runner]
        if call.method == _AGAIN:  # the models of the last start let go, a runner of these
            for old in self.runners.values():
                old.release_model()
            self.runners = {0: self.make(call.args[0])}
            return None
        if call.method == "variant":
            assert call.variant is not None
            name, changes, fresh, memory = call.variant
            variant = Variant(name, changes, fresh_model=fresh, changes_memory=memory)
            self.runners[call.args[0]] = runner.variant(variant)
            return None
        kwargs = dict(call.kwargs)
        if call.left_s is not None:
            kwargs["until"] = runner.clock() + call.left_s
        if call.hard_s is not None:
            kwargs["deadline"] = runner.clock() + call.hard_s
        return getattr(runner, call.method)(*call.args, **kwargs)


def _made(group: Group, make: Callable[[_Call], Any], call: _Call) -> Any:
    """``make(call)`` on this rank. Where it raises what rank 0 raised too (the module
    docstring), ``_RAISED``; else the rank posts what it said, shows the user's traceback where
    their code raised, and exits at once, so that no rank waits on it for longer than its
    connections take to close."""
    began = time.monotonic()
    try:
        made = make(call)
    except RankFailedError:
        raise
    except BaseException as error:  # every way a rank can fail: it must not leave the others
        if _collective_failed(error) or group.posted():  # another rank stopped: its word
            raise group.failure(error) from None
        wait_s = _wait_s(time.monotonic() - began)
        if _rank_0s_to_handle(error) and group.raised_on_rank_0(call.number, wait_s=wait_s):
            return _RAISED
        if group.posted():  # rank 0 failed alone meanwhile and said so: nothing more to say
            raise group.failure(error) from None
        _exit(group, error)
        raise  # unreachable: _exit does not return
    group.answered(call.number, raised=False)  # rank 0, where it raised, knows at once
    return made


_RAISED = "raised"
"""A rank's answer to a call that raised on it and on rank 0: set aside, as rank 0 goes on
with its own error."""


def _wait_s(elapsed_s: float) -> float:
    """How long a rank whose call raised after ``elapsed_s`` waits for the others' words: an
    error of the job's raises on every rank within about the same time into the same call
    (four times it, at least 5 s, at most ``VERDICT_WAIT_S``)."""
    from torch_autotune.probe import group

    return min(group.VERDICT_WAIT_S, max(5.0, 4 * elapsed_s))


def _collective_failed(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed because another rank stopped (its
    connection closed), not an error of this rank's own."""
    import torch.distributed as dist

    text = str(error)
    failed = getattr(dist, "DistError", ())  # torch 2.2 and newer
    return isinstance(error, failed) or any(m in text for m in _CLOSED)


_CLOSED = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
"""What gloo says where the rank at the other end of a collective stopped."""


def _rank_0s_to_handle(error: BaseException) -> bool:
    """Whether ``error`` may be rank 0's to handle, where its call raised there too: an
    exception of the user's code or of torch, not ours and not Ctrl-C."""
    return isinstance(error, Exception) and not isinstance(error, AutotuneError)


def _said(error: BaseException) -> tuple[int, str]:
    """The exit code and the words of a rank that fails with ``error`` (1: a bug of ours)."""
    if raised_by_user_code(error):
        return 5, f"the training step raised {type(error).__name__}: {error}"
    if isinstance(error, AutotuneError):
        return error.exit_code, str(error)
    if isinstance(error, KeyboardInterrupt):
        return 130, "interrupted"
    return 1, f"{type(error).__name__}: {error} (a bug of torch-autotune)"


def _say(group: Group, error: BaseException, code: int, text: str) -> None:
    """What a failed rank says of ``error``: its traceback where it is the user's or a bug of
    ours (not ours said, not Ctrl-C), ``text`` posted for the others, its first line here."""
    import sys
    import traceback

    if raised_by_user_code(error):
        sys.stderr.write(their_traceback(error))
    elif not isinstance(error, (AutotuneError, KeyboardInterrupt)):
        traceback.print_exception(error)
    group.post(code, text)
    sys.stderr.write(f"autotune: error: rank {group.rank}: {text.splitlines()[0]}\n")
    sys.stderr.flush()


def _alone(group: Group, error: Exception) -> RankFailedError:
    """Rank 0's error that not every rank raised on the same call: the job's end, as another
    rank's error alone is, which no phase of the probe takes for a finding of its own. Rank 0
    says it here, as a failed rank does (``_say``), and the others end quietly."""
    code, text = _said(error)
    said = f"{text.splitlines()[0]}; not every rank raised it on the same call"
    _say(group, error, code, said)
    return RankFailedError(
        f"rank 0: {said}", exit_code=code if code != 1 else EXIT_PROBE, said=True
    )


def _exit(group: Group, error: BaseException) -> None:
    code, text = _said(error)
    _say(group, error, code, text)
    os._exit(code if code != 1 else EXIT_PROBE)


def run_ranks(
    arguments: list[str], *, nproc_per_node: int
) -> tuple[int, tuple[int, int, str] | None]:
    """``python -m torch_autotune arguments`` as ``nproc_per_node`` ranks on this node
    (``together.start_ranks``); (the job's exit code, (rank, local rank, signal) where the
    first rank to fail was ended by a signal)."""
    import logging
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(
        [
            "--nnodes=1",
            f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=localhost:0",
            "--max-restarts=0",
            "--module",
            "torch_autotune",
            *arguments,
        ]
    )
    # the agent logs each failed rank; the ranks and the caller say it once, in our words
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        run(args)
    except SignalException as stopped:  # the agent's: its ranks are ended, as one process's
        _end_as_one_process(stopped.sigval)
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        if failure.exitcode >= 0:
            return int(failure.exitcode), None  # the rank said why itself
        name = signal.Signals(-failure.exitcode).name
        return EXIT_PROBE, (int(rank), int(failure.local_rank), name)
    return 0, None


def _end_as_one_process(number: int) -> None:
    """The job ends on ``number``, which the agent took in place of the process: Ctrl-C
    is ``KeyboardInterrupt`` (exit 130 and one line, as a probe in one process; it was an
    internal error, exit 1 with torch's traceback), any other signal ends this process as its
    default action does (SIGTERM: 143 to the shell)."""
    import signal

    if number == signal.SIGINT:
        raise KeyboardInterrupt from None
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    raise SystemExit(128 + number)  # where the default action does not end the process
