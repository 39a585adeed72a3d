"""A user factory whose model has a shape bug: the probe must show it, not call it too big."""

import functools

import torch
from torch import nn


def make_workload() -> dict[str, object]:
    return {
        "model": lambda: nn.Sequential(nn.Linear(10, 4)),
        "optimizer": functools.partial(torch.optim.SGD, lr=0.1),
        "example_batch": (torch.randn(4, 11), torch.randint(0, 4, (4,))),  # 11 != 10
    }
