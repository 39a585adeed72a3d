"""The job a process belongs to, from torchrun's variables (``launch.ranks_from_environment``),
and the torchrun line that starts a job of several nodes; the topology's nodes, world size and
back end, and the accumulation over every node's processes."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.rules.helpers import context_with, run, snapshot
from torch_autotune.errors import EXIT_USAGE, LaunchError
from torch_autotune.launch import Ranks, ranks_from_environment, torchrun_command
from torch_autotune.rules.context import Measurements
from torch_autotune.rules.optimizer import batch
from torch_autotune.topology import derive_topology

# What torchrun --nproc-per-node 2 gave its second process (torch 2.13, one node).
TORCHRUN_RANK_1 = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0",
    "GROUP_WORLD_SIZE": "1",
    "MASTER_ADDR": "localhost",
    "MASTER_PORT": "43117",
    "TORCHELASTIC_RUN_ID": "none",
    "OMP_NUM_THREADS": "1",
}


def test_a_process_torchrun_did_not_start_is_no_rank() -> None:
    assert ranks_from_environment({"PATH": "/usr/bin", "MASTER_PORT": "29500"}) is None


def test_torchruns_second_process_on_one_node() -> None:
    ranks = ranks_from_environment(TORCHRUN_RANK_1)
    assert ranks == Ranks(rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0)
    assert ranks is not None
    assert ranks.nodes == 1
    assert not ranks.leader
    assert ranks.describe() == "rank 1 of 2 (local rank 1 of 2 on node 0 of 1)"


def test_sixteen_ranks_on_two_nodes_of_eight() -> None:
    env = {"RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}
    ranks = ranks_from_environment({**env, "GROUP_RANK": "1"})
    assert ranks is not None
    assert (ranks.nodes, ranks.node_rank, ranks.leader) == (2, 1, False)
    # without GROUP_RANK (an older launcher), the node follows from the rank
    assert ranks_from_environment(env) == ranks


def test_a_world_of_one_is_a_job_too() -> None:
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    ranks = ranks_from_environment(env)
    assert ranks is not None
    assert ranks.leader
    assert ranks.world_size == 1


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"RANK": "0", "WORLD_SIZE": "2"}, "RANK, WORLD_SIZE set but not LOCAL_RANK, LOCAL_WORLD"),
        ({**TORCHRUN_RANK_1, "RANK": "2"}, "RANK 2 is not below WORLD_SIZE 2"),
        ({**TORCHRUN_RANK_1, "LOCAL_RANK": "3"}, "LOCAL_RANK 3 is not below LOCAL_WORLD_SIZE 2"),
        ({**TORCHRUN_RANK_1, "WORLD_SIZE": "3"}, "WORLD_SIZE 3 is not a multiple of"),
        ({**TORCHRUN_RANK_1, "WORLD_SIZE": "0"}, "must be at least 1"),
        ({**TORCHRUN_RANK_1, "RANK": "-1"}, "RANK='-1' is not a count"),
        ({**TORCHRUN_RANK_1, "LOCAL_RANK": "one"}, "LOCAL_RANK='one' is not a count"),
    ],
)
def test_variables_torchrun_would_not_set_are_refused_in_one_line(
    env: dict[str, str], says: str
) -> None:
    with pytest.raises(LaunchError) as raised:
        ranks_from_environment(env)
    message = str(raised.value)
    assert says in message
    assert "torchrun" in message
    assert "\n" not in message
    assert raised.value.exit_code == EXIT_USAGE


@given(
    nodes=st.integers(1, 64),
    per_node=st.integers(1, 16),
    data=st.data(),
)
def test_every_rank_torchrun_can_give_is_read_back(
    nodes: int, per_node: int, data: st.DataObject
) -> None:
    world = nodes * per_node
    rank = data.draw(st.integers(0, world - 1))
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % per_node),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(per_node),
        "GROUP_RANK": str(rank // per_node),
    }
    ranks = ranks_from_environment(env)
    assert ranks == Ranks(rank, rank % per_node, world, per_node, rank // per_node)
    assert ranks is not None
    assert ranks.nodes == nodes


def test_the_torchrun_line_is_the_same_on_every_node() -> None:
    line = torchrun_command(
        ["-m", "my_pkg.models:build", "--budget", "300"],
        nproc_per_node=8,
        nnodes=4,
        endpoint="node-001:29500",
        run_id="autotune-4x8",
    )
    assert shlex.split(line) == [
        "torchrun",
        "--nnodes=4",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node-001:29500",
        "--rdzv-id=autotune-4x8",
        "--max-restarts=0",
        "-m",
        "torch_autotune",
        "-m",
        "my_pkg.models:build",
        "--budget",
        "300",
    ]


def test_an_argument_with_spaces_survives_the_line() -> None:
    line = torchrun_command(
        ["-m", "pkg:f", "--store", "/data/my profiles"],
        nproc_per_node=2,
        nnodes=2,
        endpoint="h:1",
        run_id="r",
    )
    assert shlex.split(line)[-2:] == ["--store", "/data/my profiles"]


# --- the topology of a job ------------------------------------------------------------------


def _topology(name: str, processes: int | None, nodes: int | None, device: str = "cuda"):  # type: ignore[no-untyped-def]
    return derive_topology(
        snapshot(name), processes, device=device, tensor_core_math=True, nodes=nodes
    )


def test_one_process_has_no_process_group() -> None:
    topology = _topology("h100-80gb-hbm3", None, None)
    assert (topology.world_size, topology.nodes, topology.backend) == (1, 1, None)
    assert topology.backend_reason == "none: one training process, so no process group"


def test_eight_gpus_on_two_nodes_are_sixteen_ranks_over_nccl() -> None:
    topology = _topology("a100-sxm4-80gb-8x", None, 2)
    assert (topology.processes_per_node, topology.nodes, topology.world_size) == (8, 2, 16)
    assert topology.backend == "nccl"
    assert topology.nodes_reason == "2: as the job runs (its nodes)"


def test_ranks_on_the_cpu_and_ranks_sharing_a_gpu_use_gloo() -> None:
    cpu = _topology("cpu-laptop-linux", 2, None, device="cpu")
    assert cpu.backend == "gloo"
    assert "NCCL is for GPUs" in cpu.backend_reason
    shared = _topology("h100-80gb-hbm3", 2, None)
    assert shared.backend == "gloo"
    assert "NCCL refuses two ranks on one GPU" in shared.backend_reason


def test_rocm_gpus_talk_over_rccl() -> None:
    topology = _topology("mi300x-rocm", 1, 2)
    assert topology.backend == "nccl"
    assert "RCCL" in topology.backend_reason


def test_mps_stays_one_node_of_one_process() -> None:
    topology = _topology("apple-m2-pro-mps", 4, 3, device="mps")
    assert (topology.world_size, topology.backend) == (1, None)


def test_the_accumulation_counts_every_nodes_processes() -> None:
    """L1 over the world: batch 32 on 2 nodes of 8 GPUs makes 512 a step, so a target of 2048
    takes 4 steps, not the 8 one node would need."""
    ctx = context_with(
        "a100-sxm4-80gb-8x", Measurements(batch_size=32), nodes=2, target_global_batch=2048
    )
    found = run(ctx, batch)["batch.grad_accum_steps"]
    assert found.value == 4
    assert (
        found.reason
        == "4: batch 32 x 4 steps x 16 processes = a global batch of 2048, the target (2048)"
    )
