"""Workloads the ranks tests (``tests/test_ranks.py``) train under torchrun, as ``autotune -m
tests.ranks_workloads:NAME`` imports them: a user's model in the forms users train (dict
batches, two inputs, BatchNorm, a parameter no step uses), and models whose rank 1 runs out of
memory above a size, is killed, or raises. Each reads its rank from torchrun's ``RANK``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

OOM_ABOVE = 48
"""Rank 1 of ``oom_on_rank_1`` runs out of memory above this batch; rank 0 fits the CPU cap."""
KILLED_AT = 64
"""Rank 1 of ``killed_rank_1`` is killed by SIGKILL at the first batch this large."""
RANK_0_RAISES_FROM = 8
"""Rank 0 of ``raises_on_rank_0_alone`` raises from this batch on; rank 1 trains it."""


def _adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class TwoInputs(nn.Module):
    """An image and a feature vector in, ten classes out; ``unused`` is declared and never
    called, so DDP must walk the graph for it (find_unused_parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.extra = nn.Linear(4, 8)
        self.head = nn.Linear(16, 10)
        self.unused = nn.Linear(16, 16)

    def forward(self, image: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.image(image), self.extra(extra)], dim=1))


class Samples(Dataset[dict[str, torch.Tensor]]):
    """Dict samples: ``image``, ``extra`` and ``label``, seeded by index."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        return {
            "image": torch.randn(3, 16, 16, generator=generator),
            "extra": torch.randn(4, generator=generator),
            "label": torch.randint(0, 10, (), generator=generator),
        }


def user_model() -> dict[str, Any]:
    """The user's model with its dataset: the probe calls ``model(image=..., extra=...)`` and
    takes ``label`` as the targets of cross-entropy."""
    return {"model": TwoInputs(), "optimizer": _adamw, "dataset": Samples()}


class _Failing(nn.Module):
    """A small MLP whose rank 1 fails at some batch sizes, as ``failing`` says."""

    def __init__(self, failing: str) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        self.failing = failing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[0]
        if _rank() == 1:
            if self.failing == "oom" and size > OOM_ABOVE:
                raise MemoryError(f"out of memory on rank 1 at batch {size} (simulated)")
            if self.failing == "kill" and size >= KILLED_AT:
                os.kill(os.getpid(), signal.SIGKILL)
            if self.failing == "raise" and size >= KILLED_AT:
                raise ValueError(f"rank 1 cannot take batch {size}")
        if _rank() == 0 and self.failing == "raise on 0" and size >= RANK_0_RAISES_FROM:
            raise ValueError(f"rank 0 cannot take batch {size}")
        return self.layers(x)


def _mlp_data(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(size)
    return torch.randn(size, 32, generator=generator), torch.randint(0, 10, (size,))


def _failing(how: str) -> dict[str, Any]:
    return {"model": lambda: _Failing(how), "optimizer": _adamw, "example_batch": _mlp_data(8)}


def oom_on_rank_1() -> dict[str, Any]:
    return _failing("oom")


def killed_rank_1() -> dict[str, Any]:
    return _failing("kill")


def raising_rank_1() -> dict[str, Any]:
    return _failing("raise")


def raising_rank_0() -> dict[str, Any]:
    return _failing("raise on 0")


SHARDED_ABOVE = 32
"""``too_big_for_ddp`` trains sharded (FSDP2) up to this batch; in DDP, not even batch 1."""


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class TooBigForDdp(nn.Module):
    """Three repeated blocks and a head. Whole on a rank (DDP), it runs out of memory at any
    batch; sharded over the ranks (FSDP2 swaps its class), up to ``SHARDED_ABOVE``."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(_Block(), _Block(), _Block())
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.fsdp import FSDPModule

        if not isinstance(self, FSDPModule):
            raise MemoryError("out of memory: the whole model on one rank (simulated)")
        if x.shape[0] > SHARDED_ABOVE:
            raise MemoryError(f"out of memory at batch {x.shape[0]}, sharded (simulated)")
        return self.head(self.blocks(x))


def too_big_for_ddp() -> dict[str, Any]:
    return {"model": TooBigForDdp, "optimizer": _adamw, "example_batch": _mlp_data(8)}


def _two_ranks(
    rank: int,
    port: int,
    answers: Any,
    made: dict[str, Any],
    lead: Any,
    *,
    timeout_s: float,
    users_group: bool = False,
) -> None:
    """Two ranks over gloo in a test's own processes (``torch.multiprocessing.spawn``), training
    the model ``made`` describes: rank 1 follows, rank 0 leads with ``lead(leader)`` and tells
    it it is done. ``answers[rank]``: what the rank ended with (what ``lead`` returned on rank
    0, what rank 1 was handed at the end), or its error (a rank that hung ends in a timeout).
    ``users_group``: the script made the process group itself, on a ``file://`` rendezvous,
    and no ``MASTER_ADDR`` says where a store is."""
    from torch_autotune.launch import Ranks
    from torch_autotune.probe.ddp import DdpRunner
    from torch_autotune.probe.group import joined
    from torch_autotune.probe.ranks import Follower, Leader
    from torch_autotune.probe.trials import StepSettings
    from torch_autotune.probe.workloads import as_workload
    from torch_autotune.settings import torch_defaults

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    if users_group:
        import tempfile

        import torch.distributed as dist

        where = Path(tempfile.gettempdir()) / f"torch_autotune_test_rendezvous_{port}"
        dist.init_process_group("gloo", init_method=f"file://{where}", rank=rank, world_size=2)
        answers["rendezvous"] = str(where)  # the test removes it once both ranks are done
    else:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    workload = as_workload(made, name="mlp")
    try:
        with joined(Ranks(rank, rank, 2, 2, 0), "cpu", timeout_s=timeout_s) as group:

            def runner(given: StepSettings) -> DdpRunner:
                return DdpRunner(workload, given, group=group)

            if rank:
                answers[rank] = Follower(group, runner).follow()
                return
            leader = Leader.first(group, runner(StepSettings(torch_defaults("cpu"))))
            answer = lead(leader)
            leader.done("done")
            answers[rank] = answer
    except Exception as error:
        code = getattr(error, "exit_code", None)
        answers[rank] = f"{type(error).__name__}: {error}" + (f" [exit {code}]" if code else "")


def alone_after_a_model_of_its_own(rank: int, port: int, answers: Any) -> None:
    """Rank 0 trains a trial, makes a variant with a model of its own (checkpointing's), which
    lets go of the base's model on every rank, then measures the base alone, as a job does for
    its scaling; its answer: the point's rate."""
    from torch_autotune.probe.checkpoint_phase import checkpointed

    def lead(leader: Any) -> float | None:
        leader(8)  # the base's model built, on every rank together
        leader.variant(checkpointed())  # a model of its own: the base's let go everywhere
        point = leader.alone(8, seconds=0.5)
        return point.samples_per_s if point is not None else None

    _two_ranks(rank, port, answers, _failing("none"), lead, timeout_s=15.0)


class _NormedHead(nn.Module):
    """An MLP with BatchNorm1d after its first layer: at batch 1 its training forward raises
    on every rank ("Expected more than 1 value per channel"); it trains from batch 2."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def batchnorm_head() -> dict[str, Any]:
    return {"model": _NormedHead, "optimizer": _adamw, "example_batch": _mlp_data(8)}


class _Recomputes(nn.Module):
    """A block that, called a second time in a step (checkpointing's recompute) on a batch of
    ``RECOMPUTE_RAISES_FROM`` or more, doubles its input: the recompute saves tensors of
    another shape, and torch's checkpoint raises ``CheckpointError`` in backward, on every
    rank. Called once a step, it is a plain layer."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > 1 and x.shape[0] >= RECOMPUTE_RAISES_FROM:
            x = torch.cat([x, x])
        return torch.relu(self.linear(x))


RECOMPUTE_RAISES_FROM = 8
"""``_RecomputeTower``'s checkpointed step raises from this batch on."""


class _RecomputeTower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Recomputes() for _ in range(3))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:  # a new step
            block.calls = 0
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def checkpointed_raises_on_every_rank(
    rank: int, port: int, answers: Any, *, users_group: bool = False
) -> None:
    """The base trains, then the checkpointed variant at a size where its step raises on every
    rank, then the base again; rank 0's answer: (what it caught, whether the base fit after)."""
    from torch_autotune.errors import said_in_one_line
    from torch_autotune.probe.checkpoint_phase import checkpointed

    def lead(leader: Any) -> tuple[str | None, bool]:
        leader(4)
        variant = leader.variant(checkpointed())
        variant(4)  # its model built and trained: the error below is its training step's
        caught = None
        try:
            variant(RECOMPUTE_RAISES_FROM)
        except Exception as error:  # as the checkpointing phase catches it
            caught = said_in_one_line(error)
            variant.release_model()  # as measure_variant lets it go: every rank, in step
        return caught, leader(4).fits

    made = {"model": _RecomputeTower, "optimizer": _adamw, "example_batch": _mlp_data(8)}
    _two_ranks(rank, port, answers, made, lead, timeout_s=60.0, users_group=users_group)


def checkpointed_raises_on_every_rank_in_the_users_group(
    rank: int, port: int, answers: Any
) -> None:
    """As ``checkpointed_raises_on_every_rank``, in a process group the script made itself on
    a ``file://`` rendezvous: the ranks find the group's store with no ``MASTER_ADDR``."""
    checkpointed_raises_on_every_rank(rank, port, answers, users_group=True)


def raises_on_rank_0_alone(rank: int, port: int, answers: Any) -> None:
    """Rank 0's training step raises at a batch rank 1 trains: the job ends, with rank 0's
    error, as soon as rank 1 says its step returned (no waiting out the 30 s bound)."""

    def lead(leader: Any) -> None:
        leader(4)
        leader(RANK_0_RAISES_FROM)

    _two_ranks(rank, port, answers, _failing("raise on 0"), lead, timeout_s=60.0)


def out_of_memory_in_the_first_pass_on_rank_1(rank: int, port: int, answers: Any) -> None:
    """The model is built at a batch rank 1 runs out of memory at (a smaller GPU), in DDP's
    first pass, which finds the unused parameters: no rank may be left waiting in the reduce
    after it. Rank 0's answer: whether that batch fit, then whether batch 8 did."""

    def lead(leader: Any) -> tuple[bool, bool]:
        return leader(OOM_ABOVE + 16).fits, leader(8).fits

    _two_ranks(rank, port, answers, _failing("oom"), lead, timeout_s=20.0)
