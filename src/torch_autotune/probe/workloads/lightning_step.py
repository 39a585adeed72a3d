"""The model the probe trains for a ``LightningModule``, and its step.

``TrainingStep`` is a thin ``nn.Module`` whose ``forward(batch, batch_idx)`` is the module's
``training_step``. ``torch.compile`` of it compiles the whole step, loss included, which is
what Lightning does to a compiled module (``trainer.fit(torch.compile(module))`` compiles its
``*_step`` methods, ``lightning.pytorch.utilities.compile.from_compiled``): the compile the
probe measures is the one the user deploys. Compiling the module alone would compile its
``forward``, which the probe's step would then not call. ``LightningStep`` is the workload's
``train_step``: it calls that model and reads the loss as Lightning does (a tensor, or a dict's
``"loss"``).

``batch_idx`` is ``BATCH_IDX`` (1) at every step: dynamo specialises an int argument, so a
count would compile the step again at its second call (a real run pays that once; here it
would spoil the timing of that step), and 0 is the index many steps single out to log samples.
``self.log()`` outside a Trainer warns at every call; that one warning is silenced for the
probe's steps (``quiet_log``), no other. Copies of the model share the datasets the module
holds and drop the Trainer it may be attached to (``copied``). Importing this module imports
torch: ``lightning`` imports it when the user's objects are Lightning's.

Under a Trainer, Lightning 2.6.6 and older with torch 2.12 or 2.13 fail to compile a
``training_step`` that calls ``self.log()`` (Lightning issue #21836, fixed by #21837, which
makes ``log`` a graph break); outside a Trainer ``self.log()`` returns before that code, at a
graph break of its own, so the probe compiles such a step as the fixed Lightning does.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from torch_autotune.errors import WorkloadError, blame_user_code, user_code_failed
from torch_autotune.probe.workloads.messages import _article, _exception, _listed
from torch_autotune.probe.workloads.steps import _checked_loss

__all__ = [
    "BATCH_IDX",
    "LightningStep",
    "QuietStep",
    "TrainingStep",
    "copied",
    "hook_failed",
    "quiet_log",
]

BATCH_IDX = 1
"""The ``batch_idx`` of every step (the module docstring says why)."""

NO_TRAINER = "is not attached to a `Trainer`"
"""What Lightning's ``self.trainer`` raises outside a Trainer."""
_LOG_WARNING = (
    r"You are trying to `self\.log\(\)` but the `self\.trainer` reference is not registered"
)


def hook_failed(name: str, what: str, error: BaseException, fix: str) -> WorkloadError:
    """The one line for a hook of the user's that raised, ``error`` marked as theirs; ``fix``
    is said where the hook needs a Trainer (``self.trainer``)."""
    if NO_TRAINER in str(error):
        return user_code_failed(
            f"'{name}': {what} uses self.trainer, and no Lightning Trainer runs while the probe"
            f" trains; {fix}",
            error,
        )
    return user_code_failed(f"'{name}': {what} raised {_exception(error)}; fix it", error)


@contextlib.contextmanager
def quiet_log() -> Iterator[None]:
    """Silence the warning ``self.log()`` gives at every call outside a Trainer, only it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LOG_WARNING)
        yield


def _shared(module: nn.Module) -> dict[int, Any]:
    """A deep-copy memo that keeps what copies of ``module`` need not copy: the datasets and
    DataLoaders it holds (read-only in training) and the Trainer it is attached to."""
    from torch.utils.data import DataLoader, Dataset

    memo: dict[int, Any] = {}
    for part in module.modules():
        for value in vars(part).values():
            if isinstance(value, (Dataset, DataLoader)):
                memo[id(value)] = value
        for attribute in ("_trainer", "_fabric"):
            attached = vars(part).get(attribute)
            if attached is not None:
                memo[id(attached)] = None
    return memo


def copied(module: nn.Module, name: str, memo: dict[int, Any] | None = None) -> nn.Module:
    """A deep copy of ``module`` that shares its datasets and drops its Trainer."""
    memo = {**(memo or {}), **_shared(module)}
    try:
        return copy.deepcopy(module, memo)
    except Exception as error:
        raise WorkloadError(
            f"'{name}': the LightningModule cannot be copied ({_exception(error)}); the probe"
            " trains copies so that yours is never changed: make it deep-copyable"
        ) from error


def _takes_batch_idx(step: Callable[..., Any]) -> bool:
    """Whether ``training_step`` takes ``batch_idx``, as Lightning judges it: a second
    argument, or ``*args``."""
    try:
        parameters = list(inspect.signature(step).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in parameters)


class TrainingStep(nn.Module):  # type: ignore[misc]
    """A LightningModule as a model whose ``forward(batch, batch_idx)`` is its
    ``training_step``: ``torch.compile`` of it compiles the whole step (the module docstring).

    ``to()`` goes through the LightningModule's own, so that ``self.device`` follows it. A
    deep copy shares the datasets the module holds (``_shared``).
    """

    def __init__(self, module: nn.Module, name: str) -> None:
        super().__init__()
        self.module = module
        self.workload_name = name
        self.takes_index = _takes_batch_idx(module.training_step)

    def forward(self, batch: Any, batch_idx: int) -> Any:
        if self.takes_index:
            return self.module.training_step(batch, batch_idx)
        return self.module.training_step(batch)

    def to(self, *args: Any, **kwargs: Any) -> TrainingStep:
        self.module.to(*args, **kwargs)
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> TrainingStep:
        twin = TrainingStep(copied(self.module, self.workload_name, memo), self.workload_name)
        twin.train(self.training)
        return twin


class LightningStep:
    """``train_step(model, batch) -> loss`` for a ``TrainingStep``: the module's
    ``training_step`` and its loss (a tensor, or a dict's ``"loss"``)."""

    marks_user_code = True

    def __init__(self, name: str) -> None:
        self.name = name
        self.last_loss: torch.Tensor | None = None  # detached: read once, at the end

    def __call__(self, model: nn.Module, batch: Any) -> torch.Tensor:
        loss = self._loss(model, batch)
        self.last_loss = loss.detach()
        return loss

    def _loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        with quiet_log():
            try:
                output = model(batch, BATCH_IDX)
            except Exception as error:
                if NO_TRAINER in str(error):
                    raise hook_failed(
                        self.name,
                        "training_step",
                        error,
                        "give train_step(model, batch) -> loss that computes the loss without it",
                    ) from error
                blame_user_code(error)
                raise
        return _checked_loss(_step_loss(output, self.name), self.name, "training_step's loss")


def _step_loss(output: Any, name: str) -> Any:
    """The loss in what ``training_step`` returned, as Lightning reads it."""
    if isinstance(output, Mapping):
        if "loss" not in output:
            raise WorkloadError(
                f"'{name}': training_step returned a dict without 'loss' (its keys:"
                f" {_listed(output)}); return the loss, or a dict with it under 'loss'"
            )
        return output["loss"]
    if output is None:
        raise WorkloadError(
            f"'{name}': training_step returned None, which Lightning takes as 'skip this"
            " batch'; the probe times steps that train: return the loss, or give"
            " train_step(model, batch) -> loss"
        )
    if not isinstance(output, torch.Tensor):
        raise WorkloadError(
            f"'{name}': training_step returned {_article(output)}; return the loss tensor or a"
            " dict with 'loss', as Lightning's automatic optimization needs"
        )
    return output


class QuietStep:
    """The user's own step for a LightningModule, with ``self.log()`` quiet."""

    marks_user_code = True

    def __init__(self, step: Callable[[nn.Module, Any], torch.Tensor]) -> None:
        self.step = step

    def __call__(self, model: nn.Module, batch: Any) -> torch.Tensor:
        with quiet_log():
            return self.step(model, batch)
