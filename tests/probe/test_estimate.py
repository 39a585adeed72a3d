"""The FSDP2 estimate where the ranks are not here to measure (``probe.estimate``): one step's
peak tensor memory a rank, under fake tensors and torch's fake process group, on this CPU; and
the message of a model that does not fit one GPU, which gives it (``together``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.probe.fake_trials import recorded, tune_on
from torch_autotune.errors import DoesNotFitError
from torch_autotune.probe.estimate import fsdp_peak_bytes
from torch_autotune.probe.fit_plan import with_plan
from torch_autotune.probe.simulated import SimulatedMachine
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.workloads import Workload, resolve_workload
from torch_autotune.rules.engine import build_profile
from torch_autotune.settings import torch_defaults

H100 = recorded("h100-80gb-hbm3")
WIDTH = 512


class Tower(nn.Module):
    """Eight blocks of two 512x2048 layers: 16.8M parameters, 64 MiB in float32."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            *(
                nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
                for _ in range(8)
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def _tower() -> Workload:
    mlp = resolve_workload("mlp")
    return dataclasses.replace(
        mlp,
        name="tower",
        make_model=Tower,
        make_batch=lambda n: (torch.randn(n, WIDTH), torch.randn(n, WIDTH)),
        typical_batch=None,
        dataset=None,
        kind="mlp",
    )


@pytest.mark.slow  # fake-tensor estimates at three world sizes: seconds
def test_the_estimate_falls_as_the_ranks_shard_the_model() -> None:
    settings = StepSettings(torch_defaults("cpu"))
    peaks = {w: fsdp_peak_bytes(_tower(), settings, world_size=w, batch_size=8) for w in (1, 2, 8)}
    assert all(peak is not None for peak in peaks.values())
    one, two, eight = (peaks[w] or 0 for w in (1, 2, 8))
    params = 16_801_792 * 4  # bytes of float32 parameters
    # one rank holds the parameters, their gradients and AdamW's two moments: 4x the parameters
    assert 4 * params <= one < 6 * params
    assert one > two > eight
    # eight ranks hold an eighth of the state, and one block gathered whole at a time
    assert eight < one / 3
    assert not dist.is_initialized()  # the fake process group is gone again


def test_no_estimate_inside_a_process_group() -> None:
    store = dist.HashStore()
    dist.init_process_group("gloo", rank=0, world_size=1, store=store)
    try:
        settings = StepSettings(torch_defaults("cpu"))
        assert fsdp_peak_bytes(_tower(), settings, world_size=2, batch_size=8) is None
    finally:
        dist.destroy_process_group()


def test_a_model_that_cannot_be_faked_has_no_estimate() -> None:
    def make_batch(n: int) -> object:
        raise RuntimeError("the user's data needs a file that is not there")

    broken = dataclasses.replace(_tower(), make_batch=make_batch)
    settings = StepSettings(torch_defaults("cpu"))
    assert fsdp_peak_bytes(broken, settings, world_size=2, batch_size=8) is None


@pytest.mark.slow  # fake-tensor estimates at three world sizes: seconds
def test_a_model_that_does_not_fit_one_gpu_is_told_what_a_rank_would_need() -> None:
    rules_only = build_profile(H100)
    error = DoesNotFitError(
        "the tower workload does not train even at batch size 1 on cuda: it runs out of memory",
        batch_size=1,
    )
    told = str(with_plan(error, _tower(), rules_only)).splitlines()
    assert told[0] == f"{error.fact}."
    assert told[1].startswith("Batch 1 needs about 0.3 GiB of tensors in a step (estimated")
    assert told[2] == "What is left, each one step at batch 1:"
    # the tower is tiny beside an H100's memory (79 GiB of it, as NVML counts): two ranks do
    for world in (2, 4, 8):
        assert any(
            line.startswith(f"  - sharded with FSDP2 over {world} GPUs: about ")
            and line.endswith(
                f"a GPU (estimated), fits; on {world} GPUs like this one, autotune"
                f" --nproc-per-node {world} measures it"
            )
            for line in told
        ), told


def test_on_the_cpu_nothing_is_estimated() -> None:
    rules_only = build_profile(recorded("cpu-laptop-linux"))
    error = DoesNotFitError("does not train even at batch size 1 on cpu", batch_size=1)
    assert with_plan(error, _tower(), rules_only) is error


@pytest.mark.slow  # a real fake-tensor estimate of the tower at three world sizes
def test_tune_on_a_gpu_it_does_not_fit_gives_the_estimate() -> None:
    machine = SimulatedMachine(limit=0, leaves=1)  # not even batch 1 fits
    with pytest.raises(DoesNotFitError) as raised:
        tune_on(machine, _tower(), H100, budget_s=30)
    assert "  - sharded with FSDP2 over 2 GPUs: about " in str(raised.value)
    assert raised.value.exit_code == 7
