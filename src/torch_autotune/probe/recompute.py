"""One training step with activation checkpointing against one without, from the same weights
and the same batch: before the probe measures checkpointing, it checks that the recomputed
step is the step (the same loss and gradients within tolerance), so that a block whose forward
depends on more than its inputs is found before it trains wrong. A block whose recompute does
not even run as its forward did (torch's ``CheckpointError``: the recomputed tensors differ in
shape) raises in the checkpointed step alone: the check says so, as its finding, since the
plain step from the same weights trained.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from torch_autotune.apply import autocast, batch_to_device
from torch_autotune.errors import AutotuneError, blame_user_code, said_in_one_line
from torch_autotune.probe.oom import is_out_of_memory, release_memory
from torch_autotune.probe.search import RTOL, Agreement
from torch_autotune.wrapping import checkpoint_blocks

if TYPE_CHECKING:
    from torch_autotune.probe.trials import StepSettings
    from torch_autotune.probe.workloads import Workload

__all__ = ["Agreement", "checkpointed_step_agrees"]


def checkpointed_step_agrees(
    workload: Workload, settings: StepSettings, batch_size: int
) -> Agreement:
    """One forward and backward of a new model of the workload, then, with its blocks
    checkpointed in place (``wrapping.checkpoint_blocks``), another from the same weights (no
    optimizer step between), the RNG seeded alike for both (dropout draws the same masks), at
    ``batch_size`` on the settings' device under their autocast: one model on the device at a
    time, the plain step's loss and gradients kept on the host. Raises
    ``wrapping.NotCheckpointable`` where the model has no block to checkpoint safely, and what
    the plain step raises (the model's own error). Where only the checkpointed step raises
    (not out of memory, not an error of ours), the agreement says what it raised."""
    model = workload.make_model().to(settings.device)
    batch = batch_to_device(settings.settings, _users(workload.make_batch, batch_size))
    loss, grads = _step(workload, model, batch, settings)
    model.zero_grad(set_to_none=True)
    blocks = checkpoint_blocks(model, settings.settings.blocks)
    raised: str | None = None
    try:
        loss_cp, grads_cp = _step(workload, model, batch, settings)
    except Exception as error:  # the plain step trained: the model checkpointed raised
        if isinstance(error, AutotuneError) or is_out_of_memory(error):
            raise
        raised = said_in_one_line(error)
    if raised is not None:  # the failed step's frames are gone with its exception: free them
        del model, batch
        release_memory(settings.device)
        return Agreement(False, math.inf, blocks, raised=raised)
    differences = [_relative(loss, loss_cp)]
    differences += [_relative(a, b) for a, b in zip(grads, grads_cp, strict=True)]
    largest = max(differences)
    del model, batch
    release_memory(settings.device)
    return Agreement(largest <= RTOL, largest, blocks)


def _step(
    workload: Workload, model: Any, batch: Any, settings: StepSettings
) -> tuple[Any, list[Any]]:
    import torch

    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        with autocast(settings.settings):
            step = workload.train_step
            ours = getattr(step, "marks_user_code", False)
            loss = step(model, batch) if ours else _users(step, model, batch)
        _users(loss.backward)
    # kept on the host: the next step needs the device's room
    grads = [p.grad.detach().float().cpu() for p in model.parameters() if p.grad is not None]
    return loss.detach().float().cpu(), grads


def _relative(a: Any, b: Any) -> float:
    """The largest difference of ``a`` and ``b`` over the largest magnitude of ``a``."""
    scale = float(a.abs().max()) if a.numel() else 0.0
    difference = float((a - b).abs().max()) if a.numel() else 0.0
    if not math.isfinite(difference):
        return math.inf
    return difference / scale if scale > 0 else difference


def _users(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except Exception as error:  # the user's model, loss or data: theirs, as in a trial
        blame_user_code(error)
        raise
