"""One training step with activation checkpointing against one without, from the same weights
and the same batch: before the probe measures checkpointing, it checks that the recomputed
step is the step (the same loss and gradients within tolerance), so that a block whose forward
depends on more than its inputs is found before it trains wrong. The tolerance is measured:
the plain step runs twice, and what it differs by from itself (on a GPU, attention's backward
sums in no fixed order) widens it (``search.tolerance``); where it differs from itself by more
than kernels' noise reaches (a block that changes state at each call), no recompute is the step
and the check refuses (``search.within_tolerance``). A block
whose recompute does not even run as its forward did (torch's ``CheckpointError``: the
recomputed tensors differ in shape) raises in the checkpointed step alone: the check says so,
as its finding, since the plain step from the same weights trained.

The host keeps one copy of the gradients, the first plain step's: each later step's are
compared with it one tensor at a time as they come off the device (a 1.1B model's are 4.4 GB).

Where the plain step does not fit (the model trains only checkpointed), one block of each kind
is checked instead, alone (``checkpointed_blocks_agree``): its forward and backward, plain then
recomputed, on the inputs it was given in a forward of the model, which needs the memory of
one block's activations, not the whole model's.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from torch_autotune.apply import autocast, batch_to_device
from torch_autotune.errors import AutotuneError, blame_user_code, said_in_one_line
from torch_autotune.probe.oom import is_out_of_memory, release_memory
from torch_autotune.probe.search import Agreement, within_tolerance
from torch_autotune.wrapping import checkpoint_blocks, recompute_calls

if TYPE_CHECKING:
    from torch_autotune.probe.trials import StepSettings
    from torch_autotune.probe.workloads import Workload

__all__ = ["Agreement", "checkpointed_blocks_agree", "checkpointed_step_agrees"]


def checkpointed_step_agrees(
    workload: Workload, settings: StepSettings, batch_size: int
) -> Agreement:
    """Two forwards and backwards of a new model of the workload (the second: the plain step's
    own noise), then, with its blocks checkpointed in place (``wrapping.checkpoint_blocks``),
    another from the same weights (no optimizer step between), the RNG seeded alike for each
    (dropout draws the same masks), at ``batch_size`` on the settings' device under their
    autocast: one model on the device at a time, the first step's loss and gradients kept on
    the host, the others' compared with them tensor by tensor. Raises
    ``wrapping.NotCheckpointable`` where the model has no block to checkpoint safely, and what
    the plain step raises (the model's own error). Where only the checkpointed step raises
    (not out of memory, not an error of ours), the agreement says what it raised."""
    model = workload.model_on(settings.device)
    batch = batch_to_device(settings.settings, _users(workload.make_batch, batch_size))
    kept = [_on_host(t) for t in _step(workload, model, batch, settings)]
    model.zero_grad(set_to_none=True)
    noise = _apart(kept, _step(workload, model, batch, settings))
    model.zero_grad(set_to_none=True)
    blocks = checkpoint_blocks(model, settings.settings.blocks)
    raised: str | None = None
    try:
        found = _step(workload, model, batch, settings)
    except Exception as error:  # the plain step trained: the model checkpointed raised
        if isinstance(error, AutotuneError) or is_out_of_memory(error):
            raise
        raised = said_in_one_line(error)
    if raised is not None:  # the failed step's frames are gone with its exception: free them
        del model, batch
        release_memory(settings.device)
        return Agreement(False, math.inf, blocks, raised=raised, noise=noise)
    largest = _apart(kept, found)
    del model, batch, found
    release_memory(settings.device)
    return Agreement(within_tolerance(largest, noise), largest, blocks, noise=noise)


def checkpointed_blocks_agree(
    workload: Workload, settings: StepSettings, batch_size: int
) -> Agreement | None:
    """Where the plain step does not fit: a new model of the workload with its blocks
    checkpointed in place, its training step's forward at ``batch_size`` (the inputs of the
    first block of each kind kept; no backward), then each of those blocks alone: a forward and a
    backward of a fixed random projection of its outputs, plain twice (its own noise: the
    largest of the blocks' is the agreement's), then recomputed, the RNG seeded alike.
    Compared: its outputs, its parameters' gradients and its inputs'. None where
    no block can be trained alone (a Hugging Face model that checkpoints layers of its own
    choosing) or none ran in the forward. Raises as ``checkpointed_step_agrees`` does; where
    only a recomputed block raises, the agreement says what it raised."""
    model = workload.model_on(settings.device)
    batch = batch_to_device(settings.settings, _users(workload.make_batch, batch_size))
    wrapped = checkpoint_blocks(model, settings.settings.blocks)
    kinds: dict[type, tuple[Any, Any, Any]] = {}
    for block, plain, recomputed in recompute_calls(model):
        kinds.setdefault(type(block), (block, plain, recomputed))
    given = _inputs(workload, model, batch, settings, [found[0] for found in kinds.values()])
    del batch
    largest = noise = 0.0
    for block, plain, recomputed in kinds.values():
        if block not in given:
            continue
        expected = [_on_host(t) for t in _block_step(block, plain, given[block], settings)]
        noise = max(noise, _apart(expected, _block_step(block, plain, given[block], settings)))
        try:
            found = _block_step(block, recomputed, given[block], settings)
        except Exception as error:  # the plain block trained: the block recomputed raised
            if isinstance(error, AutotuneError) or is_out_of_memory(error):
                raise
            said = said_in_one_line(error)
            return Agreement(False, math.inf, wrapped, raised=said, kinds=1, noise=noise)
        largest = max(largest, _apart(expected, found))
    if not given:
        return None
    agrees = within_tolerance(largest, noise)
    return Agreement(agrees, largest, wrapped, kinds=len(given), noise=noise)


def _inputs(
    workload: Workload, model: Any, batch: Any, settings: StepSettings, blocks: list[Any]
) -> dict[Any, tuple[Any, Any]]:
    """The positional and keyword arguments each of ``blocks`` got first in the training
    step's forward of ``model`` on ``batch`` (copies, on the device): the model checkpointed,
    so no more memory than a checkpointed step's; its loss is dropped unused."""
    from torch.utils._pytree import tree_map

    given: dict[Any, tuple[Any, Any]] = {}

    def keep(block: Any, _module: Any, args: Any, kwargs: Any) -> None:
        if block not in given:
            given[block] = tree_map(_copied, (args, kwargs))

    hooks = [b.register_forward_pre_hook(partial(keep, b), with_kwargs=True) for b in blocks]
    model.train()
    try:
        with _seeded(), autocast(settings.settings):
            _loss(workload, model, batch)
    finally:
        for hook in hooks:
            hook.remove()
    return given


def _copied(value: Any) -> Any:
    import torch

    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _block_step(block: Any, call: Any, given: tuple[Any, Any], settings: StepSettings) -> list[Any]:
    """``call`` (``block``'s forward, plain or recomputed) on fresh copies of ``given``, its
    floating inputs needing gradients, and a backward of a fixed random projection of its
    outputs; (its outputs, its inputs' gradients, its parameters' gradients), on the device
    (the block's own gradients let go)."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    def leaf(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        return value.detach().clone().requires_grad_(value.is_floating_point())

    args, kwargs = tree_map(leaf, given)
    inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    with _seeded(), autocast(settings.settings):
        out = _users(lambda: call(*args, **kwargs))
    outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outputs:
        return []
    draws = torch.Generator().manual_seed(1)
    projected = [
        (o.float() * torch.randn(o.shape, generator=draws).to(o.device)).sum() for o in outputs
    ]
    _users(torch.stack(projected).sum().backward)
    found = [o.detach() for o in outputs]
    found += [t.grad for t in inputs if t.grad is not None]
    found += [p.grad for p in block.parameters() if p.grad is not None]
    block.zero_grad(set_to_none=True)
    return found


def _step(workload: Workload, model: Any, batch: Any, settings: StepSettings) -> list[Any]:
    """One forward and backward of ``model`` on ``batch``: its loss, then its gradients, on the
    device (the model still holds them)."""
    model.train()
    with _seeded():
        with autocast(settings.settings):
            loss = _loss(workload, model, batch)
        _users(loss.backward)
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    return [loss.detach(), *grads]


def _on_host(tensor: Any) -> Any:
    """A float32 copy of ``tensor`` on the host (the next step needs the device's room)."""
    return tensor.detach().float().cpu()


def _apart(kept: list[Any], found: Iterable[Any]) -> float:
    """The largest relative difference (``_relative``) of ``kept``, on the host, and ``found``,
    the same tensors of another step on the device, each copied to the host alone and let go
    once compared: the host never holds a second copy of them all. Without bound where they
    are not as many."""
    count, largest = 0, 0.0
    for count, tensor in enumerate(found, 1):
        if count > len(kept):
            return math.inf
        largest = max(largest, _relative(kept[count - 1], _on_host(tensor)))
    return largest if count == len(kept) else math.inf


@contextmanager
def _seeded() -> Iterator[None]:
    """Torch's generators seeded alike for each of the steps compared (dropout draws the same
    masks), and Python's and NumPy's global ones too: a block that draws from them draws
    alike in each plain step, so the plain step run twice differs by its kernels alone, while
    its recompute, which checkpointing does not replay them for, still draws anew. The CPU's,
    Python's and NumPy's put back after."""
    import torch

    numpy = sys.modules.get("numpy")  # only where something imported it: drawn from, maybe
    state = random.getstate(), numpy.random.get_state() if numpy is not None else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        random.seed(0)
        if numpy is not None:
            numpy.random.seed(0)
        try:
            yield
        finally:
            random.setstate(state[0])
            if numpy is not None:
                numpy.random.set_state(state[1])


def _loss(workload: Workload, model: Any, batch: Any) -> Any:
    """The workload's training step on ``batch``: its loss (a step of ours marks the user's
    errors itself)."""
    step = workload.train_step
    return (
        step(model, batch)
        if getattr(step, "marks_user_code", False)
        else _users(step, model, batch)
    )


def _relative(a: Any, b: Any) -> float:
    """The largest difference of ``a`` and ``b`` over the largest magnitude of ``a``; without
    bound where they are not of one shape (a block that changes state: a call of another
    batch)."""
    if a.shape != b.shape:
        return math.inf
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
