"""The job's process groups as the probe's ranks talk over them (``probe.ranks``): a gloo group
of its own for the calls and what each rank measured (``Group.control``), one for DDP's
all-reduce (``Group.data``), each wait bounded; and the job's key-value store, where a rank
that fails posts what it said before it exits (``Group.post``), and where rank 0 says, after
each call, whether the call raised on it too (``Group.verdict``): a rank whose call raised
waits for that word, a bounded while, to learn whether rank 0 goes on without its answer (the
error was the job's, as in one process: checkpointing that raises is not kept) or it must end
the job.
"""

from __future__ import annotations

import datetime
import os
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch_autotune.errors import RankFailedError
from torch_autotune.launch import Ranks

__all__ = ["VERDICT_WAIT_S", "Group", "joined"]

_KEY = "torch_autotune/failed/"
_VERDICT = "torch_autotune/raised/"
_RAISED = b"raised"

VERDICT_WAIT_S = 30.0
"""How long a rank whose call raised waits for rank 0's word on the same call: the ranks train
the same step, so an error of the job's raises on rank 0 within a step's time of the others;
where rank 0 says nothing in that while (it waits in a collective this rank left), this rank
ends the job as before."""


@dataclass
class Group:
    """The job's ranks as the probe talks to them: ``control`` (gloo) carries the calls and
    what each rank measured, ``data`` is what DDP all-reduces over, ``store`` the job's
    key-value store (None where the job has none reachable), each wait bounded by
    ``timeout_s``."""

    ranks: Ranks
    control: Any
    data: Any
    store: Any
    timeout_s: float
    device: str
    calls: int = 0  # the calls rank 0 sent so far: each call's number, the same on every rank

    @property
    def rank(self) -> int:
        return self.ranks.rank

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        import torch.distributed as dist

        box = [value]
        self._guarded(lambda: dist.broadcast_object_list(box, src=0, group=self.control))
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank."""
        import torch.distributed as dist

        values: list[Any] = [None] * self.ranks.world_size
        self._guarded(lambda: dist.all_gather_object(values, value, group=self.control))
        return values

    def reduce(self, value: int, *, largest: bool) -> int:
        """The largest (``largest``) or smallest of every rank's ``value``."""
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.int64)
        op = dist.ReduceOp.MAX if largest else dist.ReduceOp.MIN
        self._guarded(lambda: dist.all_reduce(tensor, op=op, group=self.control))
        return int(tensor.item())

    def _guarded(self, call: Callable[[], object]) -> None:
        """``call()``; a rank that stopped or failed becomes ``RankFailedError``."""
        try:
            call()
        except (RuntimeError, ConnectionError, TimeoutError) as error:  # gloo's, torch's
            raise self.failure(error) from None

    def failure(self, error: BaseException | None = None) -> RankFailedError:
        """What another rank posted before it stopped, or that one stopped without a word."""
        posted = self.posted()
        if posted:
            rank, (code, text) = min(posted.items())
            return RankFailedError(f"rank {rank} failed: {text}", exit_code=code, said=True)
        why = f" ({type(error).__name__})" if error is not None else ""
        return RankFailedError(
            f"a rank stopped without a word while the ranks probed together{why}: killed, "
            f"crashed or out of host memory; its launcher's log says which (every rank "
            f"stops within {self.timeout_s:.0f} s of it)"
        )

    def post(self, code: int, text: str) -> None:
        """Post this rank's failure for rank 0 (best effort: the store may be gone too)."""
        if self.store is None:
            return
        try:
            self.store.set(f"{_KEY}{self.rank}", pickle.dumps((code, text)))
        except (RuntimeError, ConnectionError, TimeoutError):
            return

    def verdict(self, call: int, *, raised: bool) -> None:
        """Rank 0: whether call number ``call`` raised here (best effort, as ``post``)."""
        if self.store is None:
            return
        try:
            self.store.set(f"{_VERDICT}{call}", _RAISED if raised else b"no")
        except (RuntimeError, ConnectionError, TimeoutError):
            return

    def raised_on_rank_0(self, call: int) -> bool:
        """Another rank whose call number ``call`` raised: whether it raised on rank 0 too,
        which then goes on without this rank's answer; False where rank 0 says it did not,
        says nothing within ``VERDICT_WAIT_S``, or the store cannot be reached."""
        if self.store is None:
            return False
        key = f"{_VERDICT}{call}"
        try:
            self.store.wait([key], datetime.timedelta(seconds=VERDICT_WAIT_S))
            return bool(self.store.get(key) == _RAISED)
        except (RuntimeError, ConnectionError, TimeoutError):  # DistStoreError: a RuntimeError
            return False

    def posted(self) -> dict[int, tuple[int, str]]:
        """The failures other ranks posted, by rank."""
        if self.store is None:
            return {}
        found: dict[int, tuple[int, str]] = {}
        for rank in range(self.ranks.world_size):
            key = f"{_KEY}{rank}"
            try:
                if rank != self.rank and self.store.check([key]):
                    found[rank] = pickle.loads(self.store.get(key))  # our own
            except (RuntimeError, ConnectionError, TimeoutError, pickle.UnpicklingError):
                continue
        return found


@contextmanager
def joined(ranks: Ranks, device: str, *, timeout_s: float) -> Iterator[Group]:
    """The job's process group, joined as torchrun set it up (``env://``), or the one the
    user's script already made; the probe's own control and data groups in it, each wait
    bounded by ``timeout_s``. On a GPU each rank drives the GPU of its local rank. What this
    made is taken down on the way out."""
    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(ranks.local_rank)
    made = not dist.is_initialized()
    if made:
        dist.init_process_group(backend=backend, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout)
    data = dist.new_group(backend=backend, timeout=timeout)
    try:
        yield Group(ranks, control, data, _store(timeout), timeout_s, device)
    finally:
        if made:
            dist.destroy_process_group()
        else:
            for group in (data, control):
                dist.destroy_process_group(group)


def _store(timeout: datetime.timedelta) -> Any:
    """A client of the job's store, where torchrun says it is (None: not reachable)."""
    import torch.distributed as dist

    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if not host or not port.isdigit():
        return None
    try:
        return dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
    except (RuntimeError, ConnectionError, TimeoutError):
        return None
