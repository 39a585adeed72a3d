"""``autotune --nproc-per-node N``: the job's ranks started through torch.distributed.run, as
accelerate and Lightning's Fabric start theirs; ``--nnodes M``: the torchrun line each node
runs. Under torchrun, what a rank other than 0 prints: only its own errors.

One node: ``torch.distributed.run`` in this process, with the c10d rendezvous on a free local
port (several jobs can share a host) and no restarts (a restarted probe would measure a
half-torn-down job); each rank runs ``python -m torch_autotune`` with the same arguments but
these. Several nodes: nothing is started from here (no ssh, no scheduler of ours); the one
torchrun line, the same on every node, is printed for ``srun`` or each node's shell.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

import click

from torch_autotune.errors import (
    EXIT_PROBE,
    LaunchError,
    RankFailedError,
    WorkloadError,
    raised_by_user_code,
)
from torch_autotune.launch import Ranks, ranks_from_environment, torchrun_command

__all__ = ["LAUNCHED", "launch", "quiet_rank", "without_launch_options"]

LAUNCHED = "TORCH_AUTOTUNE_LAUNCHED"
"""Set for the ranks ``autotune --nproc-per-node`` starts: the parent reports a rank that died
without a word; the ranks say only their own errors."""
_OPTIONS = ("--nproc-per-node", "--nnodes", "--rdzv-endpoint")


def without_launch_options(arguments: Sequence[str]) -> list[str]:
    """``arguments`` less the launch options and their values, for the ranks to run."""
    kept: list[str] = []
    skip = False
    for word in arguments:
        if skip:
            skip = False
            continue
        name = word.split("=", 1)[0]
        if name in _OPTIONS:
            skip = "=" not in word
            continue
        kept.append(word)
    return kept


def launch(ctx: click.Context, nproc_per_node: int, nnodes: int, endpoint: str | None) -> int:
    """Start this node's ranks (one node) and return the job's exit code, or print the line
    every node runs (several), for the command line ``ctx`` parsed (less these options).
    Raises ``LaunchError`` inside a job torchrun already started."""
    arguments: Sequence[str] = getattr(ctx.command, "arguments", [])
    if ranks_from_environment(os.environ) is not None:
        raise LaunchError(
            "--nproc-per-node: this process is already one of torchrun's ranks; run autotune "
            "under torchrun without it, or start it with --nproc-per-node alone"
        )
    rest = without_launch_options(arguments)
    if nnodes > 1:
        where = endpoint or f"{socket.getfqdn()}:29500"
        line = torchrun_command(
            rest, nproc_per_node=nproc_per_node, nnodes=nnodes, endpoint=where, run_id="autotune"
        )
        click.echo(f"# run on each of the {nnodes} nodes (the same line), e.g. under SLURM:")
        click.echo(f"# srun --nodes={nnodes} --ntasks-per-node=1 {line}")
        click.echo(line)
        return 0
    return _run_here(rest, nproc_per_node)


def _run_here(rest: list[str], nproc_per_node: int) -> int:
    from torch_autotune import api
    from torch_autotune.profile import Preferences
    from torch_autotune.together import check_ranks, start_ranks

    snapshot = api.detect()
    preferences = Preferences(processes_per_node=nproc_per_node)
    check_ranks(nproc_per_node, api.rules_profile(snapshot, preferences))  # before any starts

    os.environ[LAUNCHED] = "1"
    # torchrun's default of 1 thread a rank leaves CPUs idle; the rules set the rest per rank
    usable = snapshot.host.cpus_usable
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, usable // nproc_per_node)))
    ended = start_ranks(rest, nproc_per_node=nproc_per_node)
    if ended.signal is not None:
        click.echo(
            f"autotune: error: rank {ended.rank} (local rank {ended.local_rank}) was ended by "
            f"{ended.signal} while the ranks probed together; the others were stopped",
            err=True,
        )
        return EXIT_PROBE
    return ended.exit_code


def built_by_the_user(error: BaseException | None) -> bool:
    """Whether ``error`` is the user's own code failing while this rank built its workload
    (``errors.user_code_failed``: their factory, model, data), before it followed rank 0: a
    factory that raised on rank 1 alone was said by no rank (rank 0 never met it, and torchrun
    ended it), so the rank says it, as its own, even where every rank meets it alike."""
    cause = getattr(error, "__cause__", None)
    return isinstance(error, WorkloadError) and cause is not None and raised_by_user_code(cause)


def quiet_rank(ranks: Ranks | None, error: BaseException | None = None) -> bool:
    """Whether this process says nothing (of ``error``, or of its run where None): a rank other
    than 0 says only the failures of its own while it followed rank 0 (``probe.ranks``), as
    they come; what every rank finds alike (a workload that cannot be built, a launch that
    cannot run) rank 0 says; no rank repeats a failure the failed rank or the launcher says."""
    if ranks is None:
        return False
    if not ranks.leader:  # its own failures while it followed rank 0 it said as they came
        return not built_by_the_user(error)
    if not isinstance(error, RankFailedError):
        return False
    # the launcher says a rank a signal ended; one that hung it cannot see: rank 0 says it
    return error.said or (bool(os.environ.get(LAUNCHED)) and not error.hung)
