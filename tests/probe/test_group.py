"""Rank 0's word on whether a call raised there too, through the job's store
(``probe.group.Group.verdict`` and ``raised_on_rank_0``), and what a rank whose call raised
does with it (``probe.ranks._made``): it answers the call where rank 0 raised too, and ends
the job where rank 0 did not, said nothing in time, or the store is gone. A fake store; the
ranks' jobs themselves run in tests/test_ranks.py."""

from __future__ import annotations

import datetime
import time
from typing import Any

import pytest

from torch_autotune.errors import ProbeError, RankFailedError
from torch_autotune.launch import Ranks
from torch_autotune.probe import group as group_module
from torch_autotune.probe import ranks
from torch_autotune.probe.group import Group


class Store:
    """The job's key-value store, as ``torch.distributed.TCPStore`` answers: ``wait`` raises
    where a key is not set within its timeout (torch's ``DistStoreError``, a RuntimeError)."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.waited: list[float] = []

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = value

    def get(self, key: str) -> bytes:
        return self.values[key]

    def check(self, keys: list[str]) -> bool:
        return all(key in self.values for key in keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        self.waited.append(timeout.total_seconds())
        if not self.check(keys):
            raise RuntimeError("Wait timeout")


def _group(rank: int, store: Any, run: str = "join-1") -> Group:
    return Group(Ranks(rank, rank, 2, 2, 0), None, None, store, 60.0, "cpu", run=run)


def test_a_rank_learns_that_the_call_raised_on_every_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(group_module, "VERDICT_WAIT_S", 0.05)
    store = Store()
    leader, follower = _group(0, store), _group(1, store)
    began = time.monotonic()
    assert not leader.raised_everywhere(3)  # rank 1 said nothing: no, at the bound
    assert time.monotonic() - began >= 0.05
    assert follower.raised_on_rank_0(3) is False  # says it raised; rank 0 said nothing in time
    assert leader.raised_everywhere(3)  # now it has said so
    leader.verdict(3, raised=True)
    assert follower.raised_on_rank_0(3)
    leader.verdict(4, raised=False)
    assert not follower.raised_on_rank_0(4)
    assert set(store.waited) == {0.05}  # every wait bounded
    assert not _group(1, None).raised_on_rank_0(3)  # no store: nothing to wait for
    assert not _group(0, None).raised_everywhere(3)


def test_rank_0_learns_at_once_that_another_rank_trained_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its own call raised, rank 1's returned: no waiting out the bound to end the job."""
    monkeypatch.setattr(group_module, "VERDICT_WAIT_S", 60.0)
    store = Store()
    _group(1, store).answered(5, raised=False)
    began = time.monotonic()
    assert not _group(0, store).raised_everywhere(5)
    assert time.monotonic() - began < 1.0


def test_a_later_join_never_reads_an_earlier_ones_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second tune in the same job numbers its calls from 1 again: its keys are its own."""
    monkeypatch.setattr(group_module, "VERDICT_WAIT_S", 0.05)
    store = Store()
    _group(0, store, run="join-1").verdict(1, raised=True)
    _group(1, store, run="join-1").raised_on_rank_0(1)
    assert _group(0, store, run="join-1").raised_everywhere(1)
    assert not _group(1, store, run="join-2").raised_on_rank_0(1)
    assert not _group(0, store, run="join-3").raised_everywhere(1)
    _group(1, store, run="join-1").post(5, "raised")
    assert _group(0, store, run="join-1").posted() == {1: (5, "raised")}
    assert _group(0, store, run="join-2").posted() == {}


def test_rank_0_stops_waiting_where_another_rank_failed_and_said_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(group_module, "VERDICT_WAIT_S", 60.0)
    store = Store()
    _group(1, store).post(6, "out of memory outside a trial")
    began = time.monotonic()
    assert not _group(0, store).raised_everywhere(5)
    assert time.monotonic() - began < 1.0


class _Exited(Exception):
    pass


def _call(number: int, runner: int = 1) -> Any:
    return ranks._Call(runner, "__call__", (8,), number=number)


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """``ranks._exit`` recorded instead of ending this process."""
    ended: list[BaseException] = []

    def _exit(_group: Group, error: BaseException) -> None:
        ended.append(error)
        raise _Exited

    monkeypatch.setattr(ranks, "_exit", _exit)
    return ended


def _raises(error: BaseException) -> Any:
    def make(_call: Any) -> Any:
        raise error

    return make


def test_a_call_that_raised_on_rank_0_too_is_answered_and_the_rank_goes_on(
    exits: list[BaseException],
) -> None:
    store = Store()
    _group(0, store).verdict(7, raised=True)
    answer = ranks._made(_group(1, store), _raises(ValueError("batch 1")), _call(7))
    assert answer == ranks._RAISED
    assert exits == []


def test_a_call_that_raised_here_alone_ends_the_job(exits: list[BaseException]) -> None:
    store = Store()
    _group(0, store).verdict(7, raised=False)
    error = ValueError("rank 1 cannot take batch 512")
    with pytest.raises(_Exited):
        ranks._made(_group(1, store), _raises(error), _call(7))
    assert exits == [error]


def test_a_collective_another_rank_left_ends_with_that_ranks_word(
    exits: list[BaseException],
) -> None:
    """gloo's error where rank 0 stopped is not this rank's to say, nor to wait on."""
    store = Store()
    _group(0, store).post(5, "rank 0: the training step raised ValueError: no")
    closed = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [::1]:1")
    with pytest.raises(RankFailedError, match="rank 0 failed: rank 0: the training step") as ended:
        ranks._made(_group(1, store), _raises(closed), _call(7))
    assert ended.value.said  # the failed rank said it: this one says nothing
    assert exits == []
    assert store.waited == []


@pytest.mark.parametrize("error", [ProbeError("ours"), KeyboardInterrupt()])
def test_ours_and_ctrl_c_end_the_job_whatever_rank_0_did(
    error: BaseException, exits: list[BaseException]
) -> None:
    store = Store()
    _group(0, store).verdict(7, raised=True)
    with pytest.raises(_Exited):
        ranks._made(_group(1, store), _raises(error), _call(7))
    assert exits == [error]
    assert store.waited == []  # not even asked


def test_a_rank_whose_peers_never_call_tune_is_told_so_in_a_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only rank 0 of 2 called tune(): torch's DistStoreError (the keys it waited on, and its
    traceback from our frames) after the whole timeout; now one line that says every rank must
    call it. Rank 0 of a job of 2 alone, on a store of its own, with a 1 s bound."""
    import socket

    import torch.distributed as dist

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    environment = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0"}
    for name, value in {**environment, "WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    alone = Ranks(rank=0, local_rank=0, world_size=2, local_world_size=2, node_rank=0)
    with (
        pytest.raises(RankFailedError, match="every rank torchrun started must call tune"),
        group_module.joined(alone, "cpu", timeout_s=1.0),
    ):
        pass
    assert not dist.is_initialized()


def test_a_torch_without_its_dist_errors_reads_a_closed_peer_by_its_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch before 2.2 has no DistError: asking for it was an AttributeError (exit 1) in
    place of the rank's own error."""
    import torch.distributed as dist

    monkeypatch.delattr(dist, "DistError", raising=False)
    assert ranks._collective_failed(RuntimeError("[gloo] Connection reset by peer"))
    assert not ranks._collective_failed(RuntimeError("the user's model raised"))


def test_a_rank_that_hung_is_said_to_have_hung_and_rank_0_says_it_under_the_launcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rank alive in a step far longer than the others: gloo's receive timed out on rank 0,
    which said 'a rank stopped without a word ... killed, crashed', and under `autotune
    --nproc-per-node` said nothing at all (exit 6 and no line): the launcher speaks only of a
    rank a signal ended."""
    from torch_autotune.cli.launch import LAUNCHED, quiet_rank

    timed_out = RuntimeError("[gloo] Timed out waiting 60000ms for recv operation to complete")
    failure = _group(0, Store()).failure(timed_out)
    assert failure.hung
    assert str(failure).startswith("a rank did not answer within 60 s while the ranks probed")
    closed = _group(0, Store()).failure(RuntimeError("Connection closed by peer"))
    assert not closed.hung
    monkeypatch.setenv(LAUNCHED, "1")
    leader = Ranks(0, 0, 2, 2, 0)
    assert not quiet_rank(leader, failure)  # no one else can say it
    assert quiet_rank(leader, closed)  # the launcher says which signal ended the rank
