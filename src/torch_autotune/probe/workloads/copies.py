"""The user's model, fresh for every trial: a module deep-copied, or a function called.

The probe never trains the user's own module: every trial trains a copy (``ModelCopies``), so
the original's weights are as they were when the probe ends. A module given on an accelerator
(a Hugging Face Trainer moves its model there when it is built) would keep its weights on the
device while the copies train beside it, and the largest batch found would be short by the
model's size; ``ModelCopies.parked()`` moves the original's parameters and buffers to the CPU
for the probe's duration and each back to its own device after, whatever happens. Importing
this module does not import torch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from torch_autotune.errors import WorkloadError, user_code_failed
from torch_autotune.probe.workloads.messages import _article, _exception

if TYPE_CHECKING:
    from torch.nn import Module

__all__ = ["ModelBuilder", "ModelCopies", "model_builder", "parked"]


_HOST = ("cpu", "meta")  # meta tensors hold no data to move


def device_of(tensor: Any) -> str:
    """The device a tensor lives on, as torch names it (``cuda:0``, ``cpu``)."""
    return str(tensor.device)


def move(tensor: Any, device: str) -> None:
    """Move ``tensor``'s data to ``device`` in place: the tensor stays the same object."""
    tensor.data = tensor.data.to(device)


def parked(make_model: Callable[[], Module]) -> AbstractContextManager[None]:
    """While a probe or a bench runs: the user's original module off the accelerator, where
    ``make_model`` copies one (``ModelCopies.parked``); nothing to do for any other."""
    return make_model.parked() if isinstance(make_model, ModelCopies) else nullcontext()


def model_builder(model: Any, name: str) -> tuple[Module | None, Callable[[], Module]]:
    """(the user's module, or None for a builder; ``make_model``): a module is copied at
    each call, a function that builds one is called."""
    from torch import nn

    if isinstance(model, nn.Module):
        return model, ModelCopies(model, name)
    if callable(model):
        return None, ModelBuilder(model, name)
    raise WorkloadError(
        f"'{name}': 'model' is {_article(model)}; give an nn.Module or a function that builds one"
    )


class ModelCopies:
    """A fresh deep copy of the user's model at every call; the original is never trained."""

    def __init__(self, template: Module, name: str) -> None:
        self.template = template
        self.name = name

    @contextmanager
    def parked(self) -> Iterator[None]:
        """The original's parameters and buffers on the CPU while the block runs, then each
        back on its own device (a model split over several devices is put back as it was).
        The tensors stay the same objects: an optimizer the user built over them still holds
        them."""
        tensors = {id(t): t for t in (*self.template.parameters(), *self.template.buffers())}
        away = [(t, device_of(t)) for t in tensors.values() if device_of(t) not in _HOST]
        for tensor, _device in away:
            move(tensor, "cpu")
        try:
            yield
        finally:
            for tensor, device in away:
                move(tensor, device)

    def __call__(self) -> Module:
        try:
            model = copy.deepcopy(self.template)
        except Exception as exc:
            raise WorkloadError(
                f"'{self.name}': the model cannot be copied ({_exception(exc)}); give 'model'"
                " as a function that builds a fresh model"
            ) from exc
        return model.train()


class ModelBuilder:
    """The user's model function, its failures and wrong results made ``WorkloadError``."""

    def __init__(self, build: Callable[[], Any], name: str) -> None:
        self.build = build
        self.name = name

    def __call__(self) -> Module:
        from torch import nn

        try:
            model = self.build()
        except Exception as exc:
            raise user_code_failed(
                f"'{self.name}': building the model raised {_exception(exc)}; fix the model"
                " function",
                exc,
            ) from exc
        if not isinstance(model, nn.Module):
            raise WorkloadError(
                f"'{self.name}': the model function returned {_article(model)}, not an nn.Module"
            )
        return model.train()
