"""The recompute check keeps one copy of the gradients on the host (the plain step's), and
compares the checkpointed step's with it one tensor at a time as they come off the device;
each step draws alike from Python's generator. On real torch on the CPU."""

from __future__ import annotations

import random
import weakref
from typing import Any

import pytest
import torch

from tests.probe.test_checkpointing_raises import _workload  # the mlp's step on 16 -> 4
from tests.probe.test_recompute_blocks import Layer, Tower
from torch_autotune.probe.recompute import checkpointed_step_agrees
from torch_autotune.probe.trials import StepSettings
from torch_autotune.settings import torch_defaults

CPU = StepSettings(torch_defaults("cpu"))


class Scaled(Layer):
    """Its output scaled by a draw of Python's generator: nothing it saves for its backward
    holds the draw, so its recompute is its forward whatever it draws."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * (1 + random.gauss(0, 0.1))


def _fitting(kind: type[Layer]) -> Any:
    """The mlp's workload on three blocks of ``kind`` and a head, the plain step fitting."""
    return _workload(lambda: Tower(kind, fits_checkpointed_only=False))


def test_the_host_holds_one_copy_of_the_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain step's loss and gradients are kept on the host; the checkpointed step's are
    compared with them one tensor at a time (before: a second full copy, 8.8 GB for a 1.1B
    model's two). Counted: the copies ``.cpu()`` made alive at once."""
    alive: list[weakref.ref[torch.Tensor]] = []
    most = [0]
    cpu = torch.Tensor.cpu

    def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        copy = cpu(tensor, *args, **kwargs)
        alive.append(weakref.ref(copy))
        most[0] = max(most[0], sum(1 for kept in alive if kept() is not None))
        return copy

    monkeypatch.setattr(torch.Tensor, "cpu", counted)
    workload = _fitting(Layer)
    tensors = 1 + sum(1 for p in workload.make_model().parameters() if p.requires_grad)
    found = checkpointed_step_agrees(workload, CPU, 4)
    assert found.agrees
    assert most[0] == tensors + 1  # the plain step's, and one of the step compared


def test_python_draws_are_seeded_alike_for_each_step() -> None:
    """Before, each step drew anew from Python's generator: the checkpointed step's forward
    drew other values than the plain one's, and a block whose recompute is its forward was
    refused."""
    found = checkpointed_step_agrees(_fitting(Scaled), CPU, 4)
    assert found.agrees
    assert found.largest_difference == 0.0
    state = random.getstate()
    checkpointed_step_agrees(_fitting(Scaled), CPU, 4)
    assert random.getstate() == state  # the caller's stream goes on as it was
