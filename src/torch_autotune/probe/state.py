"""What the probe puts back: the model's parameters and buffers, the optimizer's state, every
RNG and torch's global flags, however a run ends (``preserved``)."""

from __future__ import annotations

import copy
import random
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from torch_autotune.apply import global_flags, restore_flags


def _rng_states(torch: Any) -> dict[str, Any]:
    states: dict[str, Any] = {"torch": torch.random.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_initialized():  # never start CUDA just to save its generators
        states["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = numpy.random.get_state()
    return states


def _restore_rng(torch: Any, states: dict[str, Any]) -> None:
    torch.random.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])
    if "numpy" in states:
        sys.modules["numpy"].random.set_state(states["numpy"])


def _cpu_copy(state: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of a state dict with tensors cloned to the CPU (the GPU stays free)."""
    import torch

    def clone(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.detach().to("cpu", copy=True)
        if isinstance(value, dict):
            return {k: clone(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(clone(v) for v in value)
        return copy.deepcopy(value)

    return {key: clone(value) for key, value in state.items()}


@contextmanager
def preserved(model: Any = None, optimizer: Any = None) -> Iterator[None]:
    """Put back the model's weights, the optimizer's state, every RNG and torch's global flags
    on the way out, however the block ends (success, error, KeyboardInterrupt)."""
    import torch

    flags = global_flags(torch)
    rng = _rng_states(torch)
    model_state = None if model is None else _cpu_copy(model.state_dict())
    optimizer_state = None if optimizer is None else _cpu_copy(optimizer.state_dict())
    try:
        yield
    finally:
        if model is not None and model_state is not None:
            model.load_state_dict(model_state)
        if optimizer is not None and optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
        _restore_rng(torch, rng)
        restore_flags(torch, flags)
