"""What wraps the user's model, from the settings: DistributedDataParallel or FSDP2 over the
ranks of a job (``parallelize``, ``shard``), and activation checkpointing of its repeated
blocks (``checkpoint_blocks``). Beside ``apply``, the second half of the torch translation:
the probe and the profile's helpers wrap a model only through here, so that what was measured
is what the user's script trains.
"""

from __future__ import annotations

from typing import Any

from torch_autotune.settings import Settings

__all__ = ["NotCheckpointable", "checkpoint_blocks", "parallelize", "repeated_blocks", "shard"]

_CHECKPOINTED = "_torch_autotune_checkpointed"


def parallelize(
    settings: Settings,
    model: Any,
    *,
    process_group: Any = None,
    find_unused_parameters: bool = False,
) -> Any:
    """The model as the ranks of a job train it, where torch.distributed is initialised with
    more than one rank (in ``process_group``, default the whole job): sharded with FSDP2 where
    the settings say (``shard``), else in ``DistributedDataParallel`` with the settings' DDP
    options (rules DP1-DP3), on the current GPU on CUDA; ``model`` as it is in one process, or
    where it is already wrapped. ``find_unused_parameters``: also where the settings leave it
    off (the probe's first step found unused parameters)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if not dist.is_available() or not dist.is_initialized():
        return model
    if dist.get_world_size(process_group) < 2 or isinstance(model, DistributedDataParallel):
        return model
    if settings.fsdp.enabled:
        return shard(settings, model, process_group)
    options = settings.ddp
    return DistributedDataParallel(
        model,
        device_ids=[torch.cuda.current_device()] if settings.device == "cuda" else None,
        process_group=process_group,
        gradient_as_bucket_view=options.gradient_as_bucket_view,
        static_graph=options.static_graph,
        find_unused_parameters=options.find_unused_parameters or find_unused_parameters,
    )


def shard(settings: Settings, model: Any, process_group: Any = None, *, mesh: Any = None) -> Any:
    """FSDP2 over the ranks of ``process_group`` (or ``mesh``, a device mesh made already):
    ``fully_shard`` on each instance of the model's repeated block (``repeated_blocks``),
    innermost first, then on the model itself, as torchtitan shards a decoder's blocks and then
    its root. A model already sharded is left as it is."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard
    except ImportError:  # torch 2.4 and 2.5: FSDP2 was not public yet
        from torch.distributed._composable.fsdp import FSDPModule, fully_shard

    if isinstance(model, FSDPModule):
        return model
    if mesh is None:
        group = process_group if process_group is not None else dist.group.WORLD
        mesh = DeviceMesh.from_group(group, settings.device)
    for block in repeated_blocks(model):
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def repeated_blocks(model: Any) -> list[Any]:
    """The instances of the outermost kind of block that repeats in ``model`` and holds at
    least half as many parameters in all as the kind that holds most (a decoder's blocks
    rather than their linear layers, which repeat more), deepest first; none where nothing
    repeats. A block is a module of its class; a container (``nn.Sequential``, ``ModuleList``,
    ``ModuleDict``) is a block of the kinds of its children, so ``Sequential(Linear, LayerNorm,
    GELU)`` repeated is a block, and the ``Sequential`` that holds them all is not."""
    from torch import nn

    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    found: dict[object, list[Any]] = {}
    for module in model.modules():
        if module is model:
            continue
        kind: object = type(module)
        if isinstance(module, containers):
            kind = (type(module), tuple(type(child) for child in module.children()))
        found.setdefault(kind, []).append(module)

    def weight(kind: object) -> int:
        return sum(p.numel() for m in found[kind] for p in m.parameters())

    repeated = [kind for kind, instances in found.items() if len(instances) > 1 and weight(kind)]
    if not repeated:
        return []
    most = max(weight(kind) for kind in repeated)
    best = min((k for k in repeated if 2 * weight(k) >= most), key=lambda k: len(found[k]))
    return list(reversed(found[best]))


class NotCheckpointable(ValueError):
    """The model has no block activation checkpointing can recompute safely; the message says
    why (no repeated block, or BatchNorm in them)."""


def checkpoint_blocks(model: Any) -> int:
    """Activation checkpointing of ``model``'s repeated blocks (``repeated_blocks``): each
    block's forward runs under ``torch.utils.checkpoint`` (non-reentrant, as torch recommends
    and DDP needs; the RNG state kept, so dropout draws the same in the recompute), its
    activations freed after forward and recomputed in backward. The block stays the same
    module, so its parameters keep their names (``checkpoint_wrapper`` prefixes them). A Hugging
    Face model checkpoints its own layers (``gradient_checkpointing_enable``, non-reentrant).
    Returns how many blocks it wraps now (0 where they already are). Raises ``NotCheckpointable``
    where nothing repeats, or where a block holds BatchNorm, whose running statistics the
    recompute would update a second time each step."""
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.utils.checkpoint import checkpoint

    if getattr(model, "supports_gradient_checkpointing", False):  # Hugging Face's own
        return _hugging_face_checkpointing(model)
    blocks = repeated_blocks(model)
    if not blocks:
        raise NotCheckpointable("the model has no repeated block to checkpoint")
    normed = sorted(
        {type(b).__name__ for b in blocks if any(isinstance(m, _BatchNorm) for m in b.modules())}
    )
    if normed:
        raise NotCheckpointable(
            f"its repeated blocks ({', '.join(normed)}) hold BatchNorm, whose running statistics "
            "a recomputed forward would update twice each step"
        )
    wrapped = 0
    for block in blocks:
        if getattr(block, _CHECKPOINTED, False):
            continue
        forward = block.forward

        def recomputed(*args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = recomputed
        setattr(block, _CHECKPOINTED, True)
        wrapped += 1
    return wrapped


def _hugging_face_checkpointing(model: Any) -> int:
    """A ``PreTrainedModel``'s own checkpointing, non-reentrant: ``activation_checkpointing_
    enable`` from transformers 5 (``gradient_checkpointing_enable`` before, and its alias, which
    warns, since). 1 where it turns it on, 0 where it was on."""
    options = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        if model.is_activation_checkpointing:
            return 0
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
        return 1
    if model.is_gradient_checkpointing:
        return 0
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
    return 1
