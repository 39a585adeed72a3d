"""The job's process groups as the probe's ranks talk over them (``probe.ranks``): a gloo group
of its own for the calls and what each rank measured (``Group.control``), one for DDP's
all-reduce (``Group.data``), each wait bounded; and the job's key-value store, where a rank
that fails posts what it said before it exits (``Group.post``). An error every rank raised on
the same call is the job's, as in one process (checkpointing that raises is not kept), and one
rank's alone ends the job; the ranks learn which through the store: a rank other than 0 whose
call raised says so (``raised_on_rank_0``) and waits for rank 0's word on the call
(``Group.verdict``), one whose call returned says that (``answered``); rank 0, where its own
call raised, waits for the others to say it raised on them too (``raised_everywhere``), and
ends the job as soon as one says its call returned. Each wait is bounded by ``VERDICT_WAIT_S``.
The keys of one join carry a name of its own (``Group.run``), so a later tune in the same job
never reads an earlier one's.
"""

from __future__ import annotations

import datetime
import itertools
import os
import pickle
import time
import uuid
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
_POLL_S = 0.05  # rank 0 looks at the others' words 20 times a second while it waits for them

VERDICT_WAIT_S = 30.0
"""How long a rank whose call raised waits for the other ranks' words on the same call: the
ranks train the same step, so an error of the job's raises on every rank within a step's time;
where one says nothing in that while (it waits in a collective this rank left), the job ends
as before."""


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
    run: str = ""  # this join's name, rank 0's, in every key it posts
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
        if error is not None and "timed out" in str(error).lower():  # gloo's, for a recv
            return RankFailedError(
                f"a rank did not answer within {self.timeout_s:.0f} s while the ranks probed"
                f" together{why}: it hung, or ran far slower than the others; its launcher's"
                " log has what it said",
                hung=True,
            )
        return RankFailedError(
            f"a rank stopped without a word while the ranks probed together{why}: killed, "
            f"crashed or out of host memory; its launcher's log says which (every rank "
            f"stops within {self.timeout_s:.0f} s of it)"
        )

    def post(self, code: int, text: str) -> None:
        """Post this rank's failure for rank 0 (best effort: the store may be gone too)."""
        self._set(f"{_KEY}{self.run}/{self.rank}", pickle.dumps((code, text)))

    def verdict(self, call: int, *, raised: bool) -> None:
        """Rank 0: whether call number ``call`` raised on every rank, so that the job goes on
        (best effort, as ``post``)."""
        self._set(f"{_VERDICT}{self.run}/{call}", _RAISED if raised else b"no")

    def answered(self, call: int, *, raised: bool) -> None:
        """A rank other than 0: whether its call number ``call`` raised (best effort)."""
        self._set(f"{_VERDICT}{self.run}/{call}/{self.rank}", _RAISED if raised else b"no")

    def raised_on_rank_0(self, call: int, *, wait_s: float = VERDICT_WAIT_S) -> bool:
        """A rank other than 0 whose call number ``call`` raised: says so, then whether rank 0
        says it raised on every rank, which then goes on without this rank's answer; False
        where rank 0 says it did not, says nothing within ``wait_s``, or the store cannot be
        reached."""
        self.answered(call, raised=True)
        key = f"{_VERDICT}{self.run}/{call}"
        return self._waited([key], wait_s) and self._get(key) == _RAISED

    def raised_everywhere(self, call: int, *, wait_s: float = VERDICT_WAIT_S) -> bool:
        """Rank 0, whose call number ``call`` raised: whether every other rank said it raised
        there too, within ``wait_s``; False as soon as one says it did not (its call
        returned) or posts a failure, at the bound where one says nothing (it waits in a
        collective this rank left), or where the store cannot be reached."""
        if self.store is None:
            return False
        keys = [f"{_VERDICT}{self.run}/{call}/{r}" for r in range(1, self.ranks.world_size)]
        deadline = time.monotonic() + min(wait_s, VERDICT_WAIT_S)
        while True:
            said = [self._get(key) if self._checked(key) else None for key in keys]
            if any(word not in (None, _RAISED) for word in said) or self.posted():
                return False
            if all(word == _RAISED for word in said):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(_POLL_S)

    def _checked(self, key: str) -> bool:
        try:
            return bool(self.store.check([key]))
        except (RuntimeError, ConnectionError, TimeoutError):
            return False

    def _set(self, key: str, value: bytes) -> None:
        if self.store is None:
            return
        try:
            self.store.set(key, value)
        except (RuntimeError, ConnectionError, TimeoutError):
            return

    def _get(self, key: str) -> bytes | None:
        try:
            return bytes(self.store.get(key))
        except (RuntimeError, ConnectionError, TimeoutError):
            return None

    def _waited(self, keys: list[str], wait_s: float) -> bool:
        """Whether ``keys`` are all set within ``wait_s`` (``VERDICT_WAIT_S`` at most)."""
        if self.store is None:
            return False
        try:
            self.store.wait(keys, datetime.timedelta(seconds=min(wait_s, VERDICT_WAIT_S)))
        except (RuntimeError, ConnectionError, TimeoutError):  # DistStoreError: a RuntimeError
            return False
        return True

    def posted(self) -> dict[int, tuple[int, str]]:
        """The failures other ranks posted, by rank."""
        if self.store is None:
            return {}
        found: dict[int, tuple[int, str]] = {}
        for rank in range(self.ranks.world_size):
            key = f"{_KEY}{self.run}/{rank}"
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
    try:
        if made:
            _init_default_group(backend, timeout)
        control = dist.new_group(backend="gloo", timeout=timeout)
        data = dist.new_group(backend=backend, timeout=timeout)
    except getattr(dist, "DistStoreError", ()) as error:  # (torch 2.2 on) a rank that never
        # came: the store's keys it would have set never were
        raise RankFailedError(
            f"the job's other ranks did not join rank {ranks.rank}'s tune() within"
            f" {timeout_s:g} s: every rank torchrun started must call tune() (or none)"
        ) from error
    run = [uuid.uuid4().hex if ranks.rank == 0 else None]  # this join's keys, rank 0's name
    dist.broadcast_object_list(run, src=0, group=control)
    try:
        yield Group(ranks, control, data, _store(timeout), timeout_s, device, run=str(run[0]))
    finally:
        if made:
            dist.destroy_process_group()
        else:
            for group in (data, control):
                dist.destroy_process_group(group)


def _init_default_group(backend: str, timeout: datetime.timedelta) -> None:
    """The default process group, made as ``env://`` makes it but with its keys under a
    prefix of this join's own (the joins' count, the same on every rank: each calls tune() as
    often), where torch puts them under ``default_pg``. torch counts its groups from 0 again
    once the default one is destroyed, and torchrun's store outlives it: a group the user's
    script made after tune() read the probe's ranks' addresses there, and gloo failed to
    connect (``Connection refused``) whenever its ranks did not start together."""
    import torch.distributed as dist

    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    prefixed = dist.PrefixStore(f"torch_autotune/join-{next(_JOINS)}", store)
    dist.init_process_group(
        backend=backend, store=prefixed, rank=rank, world_size=world_size, timeout=timeout
    )


_JOINS = itertools.count(1)  # the default groups this process made, counted


def _store(timeout: datetime.timedelta) -> Any:
    """The job's key-value store: a client of its own where torchrun says where it is
    (``MASTER_ADDR``), else the default process group's, which a script that made its group on
    a ``tcp://`` or ``file://`` rendezvous has too; None where neither is reachable."""
    import torch.distributed as dist

    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if host and port.isdigit():
        try:
            return dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
        except (RuntimeError, ConnectionError, TimeoutError):
            pass
    try:  # torch's own name for it since 1.x, private: read, never relied on
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None
