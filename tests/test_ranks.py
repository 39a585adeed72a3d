"""Several ranks on this CPU over gloo: ``torchrun -m torch_autotune`` and ``autotune
--nproc-per-node 2`` tune a built-in and a user's model (dict batches, two inputs, BatchNorm, a
parameter no step uses) as one job; a rank that runs out of memory at a size the other fits,
one that is killed and one whose model raises end the job within bounds, with one message;
an error every rank raises (BatchNorm at batch 1, checkpointing whose recompute differs) is
rank 0's to handle, as in one process; rank 0's point alone after checkpointing was measured
does not hang the ranks; a script that tunes in its ranks, then trains them in a group of its
own, trains.

System tier: the installed package in subprocesses, as a user runs it. Each job has a short
budget; together these take about a minute on 2 cores.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import torch_autotune
from tests.conftest import env_importing_from
from tests.ranks_workloads import KILLED_AT, OOM_ABOVE, RANK_0_RAISES_FROM, SHARDED_ABOVE
from torch_autotune.profile import Profile

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parent.parent
# Where the ranks import the package from: where this test imports it, the checkout's src, or
# the built wheel's folder in CI's wheel pass, whose ranks torchrun then starts.
PACKAGE_FROM = Path(torch_autotune.__file__).resolve().parent.parent
BOUND_S = 90.0  # a job that hangs is killed here, and fails the test
HEADER = "torch-autotune: measured profile"


def _job(*args: str, store: Path, torchrun: bool) -> subprocess.CompletedProcess[str]:
    """A job of two ranks from the checkout's root (where ``tests.ranks_workloads`` imports),
    started by torchrun or by ``autotune --nproc-per-node 2``; ``_took[0]``: its seconds."""
    tune = ["--store", str(store), *args]
    if torchrun:
        start = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
        start += ["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--max-restarts=0"]
        command = [*start, "-m", "torch_autotune", *tune]
    else:
        command = [sys.executable, "-m", "torch_autotune", "--nproc-per-node", "2", *tune]
    began = time.monotonic()
    done = subprocess.run(
        command,
        cwd=ROOT,
        # the CPU over gloo on any machine: a GPU machine's one GPU would refuse two ranks
        env=env_importing_from(PACKAGE_FROM, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""),
        check=False,
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    _took[:] = [time.monotonic() - began]
    return done


_took: list[float] = [0.0]

TUNE_THEN_TRAIN = """
import functools, os, sys, time
import torch, torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
import torch_autotune

torch.manual_seed(0)
data = TensorDataset(torch.randn(200, 16), torch.randint(0, 4, (200,)))
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
sgd = functools.partial(torch.optim.SGD, lr=0.1)
profile = torch_autotune.tune(model=model, optimizer=sgd, dataset=data, budget_s=8)
if os.environ["RANK"] == "1":
    time.sleep(3)  # the ranks reach their own group apart, as ranks of a real script do
dist.init_process_group("gloo")
trained = profile.prepare_model(model)
optimizer = sgd(trained.parameters(), **profile.optimizer_kwargs())
loader = DataLoader(data, batch_size=profile.batch_size, sampler=DistributedSampler(data),
                    **profile.dataloader_kwargs())
steps = torch.zeros(1)
for x, y in loader:
    nn.functional.cross_entropy(trained(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
    steps += 1
dist.all_reduce(steps)
print(f"rank {os.environ['RANK']}: batch {profile.batch_size}, {int(steps)} steps together")
dist.destroy_process_group()
sys.stdout.flush()
# Left at once: torch 2.13 stashes a Python object in the thread-local state of a backward,
# which gloo's all-reduce work captures and frees on its own worker thread; where that thread
# frees it while the interpreter finalizes, it needs the GIL and the process aborts
# ('terminate called without an active exception', 1 run in 4 on a loaded 2-core machine,
# more often the larger the heap left to finalize). That is torch's, after this script's work.
os._exit(0)
"""


def _saved(store: Path) -> list[Profile]:
    """Every profile the job saved, each once (the machine's and the workload's files)."""
    paths = sorted((store / "profiles").rglob("*.json"))
    texts = {path.read_text(encoding="utf-8") for path in paths}
    return [Profile.model_validate(json.loads(text)) for text in texts]


def _spawned(function: Any) -> tuple[dict[int, Any], float]:
    """``function(rank, port, answers)`` on two ranks in processes of this test's own
    (``torch.multiprocessing.spawn``): what each rank answered, and the seconds it took."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with mp.Manager() as manager:
        answers = manager.dict()
        began = time.monotonic()
        mp.spawn(function, args=(port, answers), nprocs=2)
        took = time.monotonic() - began
        return dict(answers), took


@pytest.mark.parametrize(
    ("workload", "torchrun"),
    [("mlp", True), ("tests.ranks_workloads:user_model", False)],
    ids=["built-in-torchrun", "user model---nproc-per-node"],
)
def test_two_ranks_tune_as_one_job(workload: str, torchrun: bool, tmp_path: Path) -> None:
    """Each launcher once and each workload once (the launcher starts the ranks; what they
    train is the same either way): 14 s a job on 2 cores."""
    done = _job("-m", workload, "--budget", "10", store=tmp_path, torchrun=torchrun)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(HEADER) == 1  # rank 0 reports; rank 1 says nothing
    assert "Traceback" not in done.stderr
    (profile,) = _saved(tmp_path)  # one profile for the job, in the job's files only
    assert profile.topology.world_size == 2
    assert profile.topology.backend == "gloo"
    files = sorted(p.relative_to(tmp_path / "profiles") for p in tmp_path.rglob("*.json"))
    assert all(part.startswith("world-2") for f in files for part in f.parts[1:2])
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.ranks is not None
    assert evidence.ranks.devices == ("cpu", "cpu")
    assert profile.settings.ddp.gradient_as_bucket_view
    # the user's model declares a layer it never calls: its first step found it, DDP walks it
    unused = workload != "mlp"
    assert evidence.ranks.unused_parameters == (2 if unused else 0)
    assert profile.settings.ddp.find_unused_parameters is unused
    ranks_row = next(line for line in done.stdout.splitlines() if line.startswith("ranks "))
    batch = profile.settings.batch.batch_size
    assert batch is not None
    assert f"batch {batch} a rank, {2 * batch} a step together" in ranks_row


def test_a_script_tunes_then_trains_in_a_group_of_its_own(tmp_path: Path) -> None:
    """The README's loop under torchrun: tune() in each rank, then the script's own group,
    DDP and a DistributedSampler. torch counts groups from 0 again once the probe's default
    group is gone, and torchrun's store kept its keys: rank 0's group read rank 1's old
    address and gloo refused the connection, in 2 runs of 2 where the ranks reached it apart.
    The batch is at most each rank's share of the 200 samples, so the epoch trains."""
    script = tmp_path / "train.py"
    script.write_text(TUNE_THEN_TRAIN, encoding="utf-8")
    start = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    start += ["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--max-restarts=0"]
    done = subprocess.run(
        [*start, str(script)],
        cwd=tmp_path,
        env=env_importing_from(
            PACKAGE_FROM,
            OMP_NUM_THREADS="1",
            CUDA_VISIBLE_DEVICES="",
            TORCH_AUTOTUNE_HOME=str(tmp_path / "home"),
        ),
        check=False,
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    assert done.returncode == 0, done.stderr
    said = re.findall(r"rank (\d): batch (\d+), (\d+) steps together", done.stdout)
    assert sorted(rank for rank, _, _ in said) == ["0", "1"]
    ((batch, steps),) = {(int(b), int(n)) for _, b, n in said}  # one profile, one count
    assert batch <= 100
    assert steps >= 2 * (100 // batch)


def test_a_model_whose_batchnorm_cannot_train_batch_1_tunes_from_2_on_every_rank(
    tmp_path: Path,
) -> None:
    """At batch 1 the model raises on every rank (BatchNorm1d: one value per channel), as in
    one process, where the search goes on to 2: rank 0 handles its own error, and rank 1, told
    that it raised there too, answers so and goes on (it ended the job before)."""
    done = _job(
        "-m",
        "tests.ranks_workloads:batchnorm_head",
        "--budget",
        "10",
        store=tmp_path,
        torchrun=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    (profile,) = _saved(tmp_path)
    assert profile.evidence is not None
    details = profile.evidence.details
    assert details is not None
    assert details.min_batch_size == 2
    assert details.min_batch_reason is not None
    assert "Expected more than 1 value per channel when training" in details.min_batch_reason


def test_checkpointing_that_raises_on_every_rank_is_the_leaders_to_handle() -> None:
    """The checkpointed step raises on both ranks (torch's CheckpointError): rank 0 catches
    it as the checkpointing phase does, and both ranks train the base again, in step. The
    script made the process group itself, on a ``file://`` rendezvous: no ``MASTER_ADDR``
    says where the store is, and the ranks find the group's own (the store ``MASTER_ADDR``
    names: the BatchNorm job above, and rank 0's error alone below)."""
    from tests.ranks_workloads import checkpointed_raises_on_every_rank_in_the_users_group

    found, _ = _spawned(checkpointed_raises_on_every_rank_in_the_users_group)
    Path(found.pop("rendezvous")).unlink(missing_ok=True)
    assert found[1] == "done", found
    caught, fits = found[0]
    assert caught.startswith("CheckpointError: torch.utils.checkpoint: Recomputed values"), found
    assert fits


def test_out_of_memory_on_one_rank_in_ddps_first_pass_leaves_none_waiting() -> None:
    """Rank 1 runs out of memory in the pass that finds the unused parameters, rank 0 does not:
    the size does not fit on either, and the next trains (they hung to the bound before)."""
    from tests.ranks_workloads import out_of_memory_in_the_first_pass_on_rank_1

    found, took = _spawned(out_of_memory_in_the_first_pass_on_rank_1)
    assert found == {0: (False, True), 1: "done"}, found
    assert took < 20.0


def test_an_error_of_rank_0_alone_ends_the_job_with_it() -> None:
    """Rank 0's step raises where rank 1's trains: no phase may take it for a finding (rank 1
    waits in what rank 0 left); rank 0 ends with its own error, rank 1 within seconds."""
    from tests.ranks_workloads import raises_on_rank_0_alone

    found, took = _spawned(raises_on_rank_0_alone)
    assert found[0] == (
        "RankFailedError: rank 0: the training step raised ValueError: rank 0 cannot take batch"
        f" {RANK_0_RAISES_FROM}; not every rank raised it on the same call [exit 5]"
    ), found
    assert found[1].startswith("RankFailedError"), found
    assert took < 25.0  # two processes started and joined: not the 30 s bound on top


def test_a_rank_out_of_memory_at_a_size_the_other_fits_sets_the_largest(tmp_path: Path) -> None:
    """Rank 1 runs out of memory above 48; rank 0 would train up to the CPU cap (512). The
    largest batch is rank 1's, and nothing hangs."""
    workload = "tests.ranks_workloads:oom_on_rank_1"
    done = _job("-m", workload, "--budget", "10", store=tmp_path, torchrun=False)
    assert done.returncode == 0, done.stderr
    (profile,) = _saved(tmp_path)
    assert profile.evidence is not None
    assert profile.evidence.max_batch_size == OOM_ABOVE
    batch = profile.settings.batch.batch_size
    assert batch is not None
    assert batch <= OOM_ABOVE
    assert re.search(rf"^largest batch\s+{OOM_ABOVE} \(limited by memory", done.stdout, re.M)


def test_rank_0_alone_after_a_variant_with_a_model_of_its_own_does_not_hang() -> None:
    """Measuring checkpointing lets go of the base's model on every rank; rank 0 alone then
    builds it again, and wrapping it in DDP is a collective: every rank builds it together
    first (the job hung here, now and then, until its bound, where checkpointing was measured
    before the scaling point)."""
    from tests.ranks_workloads import alone_after_a_model_of_its_own

    found, took = _spawned(alone_after_a_model_of_its_own)
    assert found[1] == "done", found
    assert isinstance(found[0], float), found
    assert found[0] > 0
    assert took < 60.0


@pytest.mark.parametrize("torchrun", [False, True], ids=["--nproc-per-node", "torchrun"])
def test_a_killed_rank_ends_the_job_within_its_bound(torchrun: bool, tmp_path: Path) -> None:
    """Rank 1 is killed (SIGKILL) at its first batch of 64: the job ends within seconds, not at
    a timeout, nothing is saved, and no rank prints a traceback."""
    workload = "tests.ranks_workloads:killed_rank_1"
    done = _job("-m", workload, "--budget", "30", store=tmp_path, torchrun=torchrun)
    assert done.returncode != 0
    assert _took[0] < 30.0  # well before the budget, let alone the wait's bound (budget + 120 s)
    assert not (tmp_path / "profiles").exists()
    if not torchrun:  # torchrun's own summary names the rank where it started the job
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        assert errors == [
            "autotune: error: rank 1 (local rank 1) was ended by SIGKILL while the ranks "
            "probed together; the others were stopped"
        ], done.stderr
        assert done.returncode == 6
    assert KILLED_AT == 64


@pytest.mark.parametrize(
    ("rank", "said"),
    [
        (1, "the training step raised ValueError: rank 1 cannot take batch {at}"),
        (
            0,
            f"the training step raised ValueError: rank 0 cannot take batch {RANK_0_RAISES_FROM};"
            " not every rank raised it on the same call",
        ),
    ],
    ids=["rank 1", "rank 0"],
)
def test_a_rank_whose_model_raises_shows_its_traceback_and_one_line(
    rank: int, said: str, tmp_path: Path
) -> None:
    """The rank whose model raised says it, once (rank 0 too: the launcher would not), and
    the job ends within seconds, the other rank saying nothing."""
    workload = f"tests.ranks_workloads:raising_rank_{rank}"
    done = _job("-m", workload, "--budget", "30", store=tmp_path, torchrun=False)
    assert done.returncode == 5
    assert done.stderr.count("Traceback (most recent call last)") == 1  # the user's
    errors = [line for line in done.stderr.splitlines() if line.startswith("autotune: error")]
    (error,) = errors
    at = re.search(r"cannot take batch (\d+)", error)
    assert at is not None
    assert int(at.group(1)) >= (KILLED_AT if rank else RANK_0_RAISES_FROM)  # where the search went
    assert error == f"autotune: error: rank {rank}: {said.format(at=at.group(1))}"
    assert _took[0] < 30.0
    assert not (tmp_path / "profiles").exists()


def test_a_model_ddp_cannot_train_is_sharded_with_fsdp2(tmp_path: Path) -> None:
    """Whole on a rank it runs out of memory at any batch (DDP); sharded over the two ranks it
    trains up to 32: the job's profile shards it, with the numbers of both."""
    workload = "tests.ranks_workloads:too_big_for_ddp"
    done = _job("-m", workload, "--budget", "15", store=tmp_path, torchrun=False)
    assert done.returncode == 0, done.stderr
    (profile,) = _saved(tmp_path)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.ranks is not None
    assert profile.settings.fsdp.enabled
    assert evidence.ranks.ddp_did_not_fit == 1
    assert evidence.max_batch_size == SHARDED_ABOVE
    assert evidence.ranks.one_rank_samples_per_s is None  # no rank trains it alone
    decision = profile.decision("fsdp.enabled")
    assert decision is not None
    assert decision.reason.startswith("on: DDP did not train batch 1 on every rank")
    assert f"the largest batch that trained was {SHARDED_ABOVE}" in decision.reason
    assert "sharded with FSDP2: DDP did not train batch 1 on every rank" in done.stdout
