"""The job a process belongs to: its place among the training processes torchrun started
(``Ranks``, read from the environment torchrun gives every rank), and the torchrun command that
starts a job of several nodes.

torchrun (``python -m torch.distributed.run``, also run by ``srun`` under SLURM) gives each
process ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` and ``GROUP_RANK`` (the
node's rank), and passes no ``--local-rank`` argument; a process counts as started by it when
the first four are set, as Lightning's ``TorchElasticEnvironment`` decides. ``LOCAL_WORLD_SIZE``
is the same on every node, so the nodes are ``WORLD_SIZE / LOCAL_WORLD_SIZE``.

Part of the data model's ground floor: pure, the environment comes in as a mapping.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch_autotune.errors import LaunchError

__all__ = ["TORCHRUN_VARIABLES", "Ranks", "ranks_from_environment", "torchrun_command"]

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
"""What torchrun sets for every process it starts: all four, or the process is not one of its."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in a job torchrun started."""

    rank: int  # 0 .. world_size - 1: rank 0 saves the profile and reports
    local_rank: int  # 0 .. local_world_size - 1: the GPU this process drives on its node
    world_size: int  # training processes in the job, every node's
    local_world_size: int  # training processes on each node (torchrun's --nproc-per-node)
    node_rank: int  # the node's rank (GROUP_RANK)

    @property
    def nodes(self) -> int:
        """Nodes in the job: the world over the processes on each."""
        return self.world_size // self.local_world_size

    @property
    def leader(self) -> bool:
        """Whether this process is rank 0, which saves the profile and reports."""
        return self.rank == 0

    def describe(self) -> str:
        """'rank 1 of 2 (local rank 1 of 2 on node 0 of 1)'."""
        return (
            f"rank {self.rank} of {self.world_size} (local rank {self.local_rank} of "
            f"{self.local_world_size} on node {self.node_rank} of {self.nodes})"
        )


def ranks_from_environment(env: Mapping[str, str]) -> Ranks | None:
    """This process's ``Ranks`` where torchrun started it (``env`` is ``os.environ``), else
    None. Raises ``LaunchError`` where the variables are set but not as torchrun sets them."""
    present = [name for name in TORCHRUN_VARIABLES if name in env]
    if not present:
        return None
    missing = [name for name in TORCHRUN_VARIABLES if name not in env]
    if missing:
        raise LaunchError(
            f"{', '.join(present)} set but not {', '.join(missing)}: start autotune with "
            "torchrun (or autotune --nproc-per-node N), which sets all four"
        )
    values = {name: _count(env, name) for name in TORCHRUN_VARIABLES}
    world, local_world = values["WORLD_SIZE"], values["LOCAL_WORLD_SIZE"]
    rank, local_rank = values["RANK"], values["LOCAL_RANK"]
    problems = []
    if world < 1 or local_world < 1:
        problems.append("WORLD_SIZE and LOCAL_WORLD_SIZE must be at least 1")
    elif world % local_world:
        problems.append(
            f"WORLD_SIZE {world} is not a multiple of LOCAL_WORLD_SIZE {local_world} (torchrun "
            "starts the same number of processes on every node)"
        )
    if not 0 <= rank < max(world, 1):
        problems.append(f"RANK {rank} is not below WORLD_SIZE {world}")
    if not 0 <= local_rank < max(local_world, 1):
        problems.append(f"LOCAL_RANK {local_rank} is not below LOCAL_WORLD_SIZE {local_world}")
    if problems:
        raise LaunchError("; ".join(problems) + ": start autotune with torchrun")
    node = _count(env, "GROUP_RANK") if "GROUP_RANK" in env else rank // local_world
    return Ranks(rank, local_rank, world, local_world, node)


def _count(env: Mapping[str, str], name: str) -> int:
    text = env[name].strip()
    if not text.isdigit() or len(text) > 9:
        raise LaunchError(f"{name}={env[name]!r} is not a count: start autotune with torchrun")
    return int(text)


def torchrun_command(
    arguments: Sequence[str],
    *,
    nproc_per_node: int,
    nnodes: int,
    endpoint: str,
    run_id: str,
) -> str:
    """The torchrun line that starts ``autotune arguments`` as a job of ``nnodes`` nodes with
    ``nproc_per_node`` processes each, the same line on every node: the c10d rendezvous at
    ``endpoint`` ('host:port', a node every other can reach) under ``run_id``, no restarts
    (torchrun's default; a restarted probe would measure a half-torn-down job)."""
    words = [
        "torchrun",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={run_id}",
        "--max-restarts=0",
        "-m",
        "torch_autotune",
        *arguments,
    ]
    return shlex.join(words)
