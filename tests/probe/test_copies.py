"""The user's model is never trained: each trial trains a copy, and a model given on an
accelerator is parked on the CPU while the probe runs, each tensor put back after."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from torch_autotune.probe.workloads import copies
from torch_autotune.probe.workloads.copies import ModelCopies, parked


class Tied(torch.nn.Module):
    """Two layers sharing one weight, a buffer, and a second layer on 'another device'."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Linear(4, 4)
        self.second.weight = self.first.weight
        self.head = torch.nn.Linear(4, 2)
        self.register_buffer("steps", torch.zeros(()))


@dataclass
class Devices:
    """Where each tensor 'lives' (by id; absent: the CPU), and every move made: the seam the
    parking reads and writes, since this machine has no GPU."""

    where: dict[int, str] = field(default_factory=dict)
    moves: list[tuple[int, str]] = field(default_factory=list)

    def put(self, tensor: Any, device: str) -> None:
        self.where[id(tensor)] = device

    def of(self, tensor: Any) -> str:
        return self.where.get(id(tensor), "cpu")


@pytest.fixture
def devices(monkeypatch: pytest.MonkeyPatch) -> Devices:
    table = Devices()

    def move(tensor: Any, device: str) -> None:
        table.moves.append((id(tensor), device))
        table.put(tensor, device)

    monkeypatch.setattr(copies, "device_of", table.of)
    monkeypatch.setattr(copies, "move", move)
    return table


def test_a_model_on_accelerators_is_parked_on_the_cpu_and_each_tensor_put_back(
    devices: Devices,
) -> None:
    model = Tied()
    devices.put(model.first.weight, "cuda:0")  # shared with model.second
    devices.put(model.head.weight, "cuda:1")
    devices.put(model.steps, "cuda:0")
    tensors = [*model.parameters(), *model.buffers()]
    with parked(ModelCopies(model, "m")):
        assert {devices.of(t) for t in tensors} == {"cpu"}
    assert devices.of(model.first.weight) == "cuda:0"
    assert devices.of(model.head.weight) == "cuda:1"
    assert devices.of(model.steps) == "cuda:0"
    assert model.second.weight is model.first.weight  # the same objects, still tied
    moved = [key for key, _ in devices.moves]
    assert moved.count(id(model.first.weight)) == 2  # once away, once back: not per module


def test_the_model_goes_back_when_the_probe_fails(devices: Devices) -> None:
    model = Tied()
    devices.put(model.head.weight, "cuda:0")
    with pytest.raises(KeyboardInterrupt), parked(ModelCopies(model, "m")):
        raise KeyboardInterrupt
    assert devices.of(model.head.weight) == "cuda:0"


def test_a_model_on_the_cpu_or_a_model_function_is_left_alone(devices: Devices) -> None:
    model = Tied()
    with parked(ModelCopies(model, "m")), parked(Tied):
        pass
    assert devices.moves == []


def test_every_copy_is_fresh_and_in_training_mode_and_the_original_untouched() -> None:
    model = Tied().eval()
    make = ModelCopies(model, "m")
    first, second = make(), make()
    assert first is not second
    assert first is not model
    assert first.training
    assert not model.training
    assert torch.equal(first.first.weight, model.first.weight)
    assert first.second.weight is first.first.weight  # ties kept in the copy
