"""One training step as the user's loop runs it (the workload's forward and loss under the
settings' autocast, backward through the scaler, the optimizer's step), and the optimizer it
steps: what the probe's trials, the bench's loop and the memory estimates train with. The
user's errors are marked as theirs (``errors.blame_user_code``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch_autotune.apply import autocast
from torch_autotune.errors import blame_user_code

if TYPE_CHECKING:
    from torch_autotune.probe.workloads import Workload
    from torch_autotune.settings import Settings

__all__ = ["make_optimizer", "train_step"]


def make_optimizer(workload: Workload, model: Any, options: Mapping[str, Any]) -> Any:
    """The workload's optimizer over ``model``'s parameters with ``options`` (``fused=True``),
    or without them when the user's optimizer does not take them. A model in DDP is given as
    the module inside, as the user's own code builds its optimizer (the same parameters): a
    LightningModule's ``configure_optimizers`` or a Trainer's ``create_optimizer(model)`` is
    asked of their model, not of the wrapper, which has neither."""
    from torch.nn.parallel import DistributedDataParallel

    kwargs = dict(options)
    accepts = getattr(workload, "optimizer_accepts", None)
    if kwargs and accepts is not None and not accepts(**kwargs):
        kwargs = {}
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    return workload.make_optimizer(inner, **kwargs)


def train_step(
    workload: Workload,
    batch: Any,
    settings: Settings,
    *,
    model: Any,
    optimizer: Any,
    scaler: Any,
) -> None:
    """One step as the user's loop runs it: the forward pass and the loss (the workload's
    ``train_step``) under the settings' autocast, backward through the scaler, optimizer step,
    zero_grad. What the user's code raises is marked as theirs: a step of ours
    (``workloads.steps``: ``marks_user_code``) marks it itself, so that its own failures stay
    ours; any other step is the user's, and so are backward and the optimizer step (their
    model and optimizer)."""
    step = workload.train_step
    with autocast(settings):  # ours: outside the user's part
        if getattr(step, "marks_user_code", False):
            loss = step(model, batch)
        else:
            loss = _users_step(step, model, batch)
    try:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    except Exception as error:  # the user's model (its backward) or optimizer: re-raised as is
        blame_user_code(error)
        raise


def _users_step(step: Callable[[Any, Any], Any], model: Any, batch: Any) -> Any:
    try:
        return step(model, batch)
    except Exception as error:  # a step the user wrote: their error, re-raised as is
        blame_user_code(error)
        raise
