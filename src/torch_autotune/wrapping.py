"""What wraps the user's model, from the settings: DistributedDataParallel or FSDP2 over the
ranks of a job (``parallelize``, ``shard``), and activation checkpointing of its repeated
blocks (``checkpoint_blocks``). Beside ``apply``, the second half of the torch translation:
the probe and the profile's helpers wrap a model only through here, so that what was measured
is what the user's script trains.
"""

from __future__ import annotations

from typing import Any

from torch_autotune.settings import Settings

__all__ = [
    "NotCheckpointable",
    "block_names",
    "checkpoint_blocks",
    "checkpoints_itself",
    "is_checkpointed",
    "model_blocks",
    "parallelize",
    "recompute_calls",
    "repeated_blocks",
    "shard",
    "unwrapped",
]


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
    ``fully_shard`` on each of the model's blocks (``model_blocks``: the settings' classes,
    else its repeated blocks),
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
    blocks = model_blocks(model, settings.blocks)
    if settings.blocks is not None and not blocks:
        raise ValueError(
            f"the model has no module of the classes the profile names as its blocks"
            f" ({settings.blocks}): FSDP2 would shard it whole, not as it was measured"
        )
    for block in blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def repeated_blocks(model: Any) -> list[Any]:
    """The instances of the outermost kind of block that repeats in ``model`` and holds at
    least half as many parameters in all as the kind that holds most (a decoder's blocks
    rather than their linear layers, which repeat more), deepest first; none where nothing
    repeats (in the tree: one block shared by weight in 8 places repeats). A block is a module
    of its class; a container (``nn.Sequential``, ``ModuleList``,
    ``ModuleDict``) is a block of the kinds of its children, so ``Sequential(Linear, LayerNorm,
    GELU)`` repeated is a block, and the ``Sequential`` that holds them all is not. Kinds that
    hold other modules come first, where the heaviest of them holds at least half as much as
    any kind of layer (``Linear``) less that kind's largest instance: a shallow decoder's large
    output layer, a ``Linear`` outside the blocks that can outweigh them all, does not make its
    linear layers the blocks, and two light heads do not make the blocks of a stack of
    ``Linear`` layers."""
    from torch import nn

    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    found: dict[object, list[Any]] = {}
    places: dict[object, int] = {}  # where each kind sits in the tree: a block shared by
    for _, module in model.named_modules(remove_duplicate=False):  # weight is one, 8 times
        if module is model:
            continue
        kind: object = type(module)
        if isinstance(module, containers):
            kind = (type(module), tuple(type(child) for child in module.children()))
        places[kind] = places.get(kind, 0) + 1
        if all(module is not m for m in found.setdefault(kind, [])):
            found[kind].append(module)

    def weight(kind: object) -> int:
        return sum(p.numel() for m in found[kind] for p in m.parameters())

    repeated = [kind for kind in found if places[kind] > 1 and weight(kind)]
    composite = [k for k in repeated if any(True for _ in found[k][0].children())]
    layers = [k for k in repeated if k not in composite]

    def but_largest(kind: object) -> int:  # a large output layer is one instance of its kind
        largest = max(sum(p.numel() for p in m.parameters()) for m in found[kind])
        return weight(kind) - int(largest)

    heaviest = max((weight(k) for k in composite), default=0)
    if composite and 2 * heaviest >= max((but_largest(k) for k in layers), default=0):
        repeated = composite
    if not repeated:
        return []
    most = max(weight(kind) for kind in repeated)
    best = min((k for k in repeated if 2 * weight(k) >= most), key=lambda k: len(found[k]))
    return list(reversed(found[best]))


def block_names(classes: Any) -> tuple[str, ...]:
    """The names a profile holds for ``classes`` (a module class, or several): each by its
    module and qualified name, ``pkg.model.Block``. Raises ``TypeError`` for anything else."""
    from torch import nn

    given = [classes] if isinstance(classes, type) else list(classes)
    if not given or not all(isinstance(c, type) and issubclass(c, nn.Module) for c in given):
        raise TypeError("blocks are module classes")
    return tuple(dict.fromkeys(f"{c.__module__}.{c.__qualname__}" for c in given))


def model_blocks(model: Any, names: str | None) -> list[Any]:
    """The blocks of ``model``: the modules whose class, or a class it derives from, is one of
    ``names`` (``Settings.blocks``: comma-separated), the outermost where they nest, deepest
    first; where ``names`` is None, its repeated blocks (``repeated_blocks``). Where no class
    matches by module and name, by name alone: a class the tuning script defined is
    ``__main__.Block`` in the profile and ``train.Block`` where a training script imports it."""
    if names is None:
        return repeated_blocks(model)
    wanted = names.split(",")
    found = _outermost(model, set(wanted), lambda c: f"{c.__module__}.{c.__qualname__}")
    if not found:
        found = _outermost(model, {w.rsplit(".", 1)[-1] for w in wanted}, lambda c: c.__qualname__)
    return found


def _outermost(model: Any, wanted: set[str], name: Any) -> list[Any]:
    """The outermost modules below ``model`` whose class, or a class it derives from, has a
    ``name`` in ``wanted``, deepest first."""
    found: list[Any] = []
    inside: set[int] = set()
    for module in model.modules():
        if module is model or id(module) in inside:
            continue
        if any(name(c) in wanted for c in type(module).__mro__):
            found.append(module)
            inside.update(id(m) for m in module.modules())
    return list(reversed(found))


class NotCheckpointable(ValueError):
    """The model has no block activation checkpointing can recompute safely; the message says
    why (no repeated block, or BatchNorm in them)."""


def checkpoint_blocks(model: Any, names: str | None = None) -> int:
    """Activation checkpointing of ``model``'s blocks (``model_blocks``: the classes ``names``
    gives, else its repeated blocks): each
    block's forward runs under ``torch.utils.checkpoint`` (non-reentrant, as torch recommends
    and DDP needs; the RNG state kept, so dropout draws the same in the recompute), its
    activations freed after forward and recomputed in backward. The block stays the same
    module, so its parameters keep their names (``checkpoint_wrapper`` prefixes them), and the
    model deep-copies (an EMA or ``AveragedModel``'s copy recomputes its own blocks) and
    pickles whole. A Hugging Face model checkpoints its own layers
    (``gradient_checkpointing_enable``, non-reentrant), unless ``names`` says which. ``model``
    may be inside DDP, FSDP or torch.compile (``unwrapped``): what is decided is the model's.
    Returns how many blocks it wraps now (0 where they, a block around them or one inside
    them, or the model's own checkpointing, recompute already). Raises ``NotCheckpointable`` where
    there is no block, or where a
    block holds a norm that keeps running statistics (BatchNorm), which the recompute would
    update a second time each step."""
    model = unwrapped(model)
    if names is not None and checkpoints_itself(model):
        raise NotCheckpointable(
            "the model checkpoints its own layers already (a Hugging Face model's"
            " gradient_checkpointing_enable()): the blocks named would recompute inside what it"
            " recomputes; turn its own off to measure them"
        )
    hugging_face = names is None and getattr(model, "supports_gradient_checkpointing", False)
    blocks = _hugging_face_layers(model) if hugging_face else model_blocks(model, names)
    if not blocks and not hugging_face:
        raise NotCheckpointable(
            "the model has no repeated block to checkpoint"
            if names is None
            else f"the model has no module of the classes given as its blocks ({names})"
        )
    normed = {type(b).__name__: _norms(b) for b in blocks if _norms(b)}
    if normed:
        norms = sorted({n for names in normed.values() for n in names})
        raise NotCheckpointable(
            f"its repeated blocks ({', '.join(sorted(normed))}) hold {', '.join(norms)}, whose "
            "running statistics a recomputed forward would update twice each step"
        )
    covered = _recomputed(model)
    if hugging_face:
        return 0 if covered else _hugging_face_checkpointing(model)
    wrapped = 0
    for block in blocks:
        if any(id(m) in covered for m in block.modules()):
            continue  # it, or a block inside it, is recomputed already
        block.forward = _Recomputed(block)
        wrapped += 1
    return wrapped


def _recomputed(model: Any) -> set[int]:
    """The ids of the modules of ``model`` that a recompute covers already: the blocks
    ``checkpoint_blocks`` wrapped, the modules inside them, and the layers a Hugging Face model
    checkpoints itself (its ``gradient_checkpointing`` flag on)."""
    covered: set[int] = set()
    for module in model.modules():
        own = _layer_of_its_own(module) and getattr(module, "gradient_checkpointing", 0) is True
        if own or is_checkpointed(module):
            covered.update(id(m) for m in module.modules())
    return covered


_WRAPPERS = {
    "torch.nn.parallel.distributed.DistributedDataParallel": "module",
    "torch.nn.parallel.data_parallel.DataParallel": "module",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel": "module",
    "torch._dynamo.eval_frame.OptimizedModule": "_orig_mod",
}


def unwrapped(model: Any) -> Any:
    """The user's model inside the wrappers that train it, however they nest:
    ``DistributedDataParallel``'s, ``DataParallel``'s and FSDP's (the wrapper of its first
    version) ``module``, ``torch.compile``'s ``_orig_mod``. FSDP2 shards a model in place: it
    is the model. Known by torch's own classes (and their subclasses), not by the attribute's
    name, which a model of the user's may hold for a layer."""
    while True:
        names = (f"{c.__module__}.{c.__qualname__}" for c in type(model).__mro__)
        inner = next((_WRAPPERS[n] for n in names if n in _WRAPPERS), None)
        if inner is None or getattr(model, inner, None) is None:
            return model
        model = getattr(model, inner)


def is_checkpointed(block: Any) -> bool:
    """Whether ``checkpoint_blocks`` wrapped ``block``'s forward."""
    return isinstance(getattr(block, "__dict__", {}).get("forward"), _Recomputed)


def recompute_calls(model: Any) -> list[tuple[Any, Any, Any]]:
    """Each block of ``model`` that activation checkpointing recomputes, with its forward as
    two calls: plain and recomputed (``checkpoint_blocks`` made either kind). A Hugging Face
    layer is called with its own checkpointing switched off, then on (its ``__call__`` reads
    its ``gradient_checkpointing`` flag). A Hugging Face model that checkpoints layers of its
    own choosing (older transformers), or none, has no block to call alone: none."""
    calls: list[tuple[Any, Any, Any]] = []
    for block in model.modules():
        recomputed = getattr(block, "__dict__", {}).get("forward")
        if isinstance(recomputed, _Recomputed):
            plain = recomputed.given or type(block).forward.__get__(block)
            calls.append((block, plain, recomputed))
        elif _layer_of_its_own(block) and block.gradient_checkpointing is True:
            calls.append((block, _switched(block, on=False), _switched(block, on=True)))
    return calls


def _switched(layer: Any, *, on: bool) -> Any:
    """A Hugging Face layer's call with its own checkpointing ``on`` or off for the while."""

    def call(*args: Any, **kwargs: Any) -> Any:
        layer.gradient_checkpointing = on
        try:
            return layer(*args, **kwargs)
        finally:
            layer.gradient_checkpointing = True

    return call


class _Recomputed:
    """A block's forward under ``torch.utils.checkpoint``, non-reentrant: an object of its own
    (not a closure), so that a deep copy of the block recomputes the copy and the block
    pickles. Its class's forward, or the one the block was given before."""

    def __init__(self, block: Any) -> None:
        self.block = block
        self.given = block.__dict__.get("forward")  # a forward set on the block itself

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        if self.given is not None:
            return checkpoint(self.given, *args, use_reentrant=False, **kwargs)
        forward = type(self.block).forward
        return checkpoint(forward, self.block, *args, use_reentrant=False, **kwargs)


def _norms(block: Any) -> set[str]:
    """The kinds of norm in ``block`` that update running statistics in training (BatchNorm,
    and InstanceNorm with ``track_running_stats``)."""
    from torch.nn.modules.batchnorm import _NormBase

    return {
        type(m).__name__
        for m in block.modules()
        if isinstance(m, _NormBase) and m.track_running_stats
    }


def checkpoints_itself(model: Any) -> bool:
    """Whether ``model`` (inside its wrappers: ``unwrapped``) is a Hugging Face model with its
    own checkpointing on."""
    model = unwrapped(model)
    if not getattr(model, "supports_gradient_checkpointing", False):
        return False
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5: the old name warns
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def _hugging_face_layers(model: Any) -> list[Any]:
    """The layers a Hugging Face model's own checkpointing recomputes (transformers'
    ``GradientCheckpointingLayer``), or the model itself where it names none (older
    transformers checkpoint layers of their own choosing)."""
    layers = [m for m in model.modules() if m is not model and _layer_of_its_own(m)]
    return layers or [model]


def _layer_of_its_own(module: Any) -> bool:
    """Whether ``module`` is a layer a Hugging Face model checkpoints itself (transformers'
    ``GradientCheckpointingLayer``)."""
    return any(c.__name__ == "GradientCheckpointingLayer" for c in type(module).__mro__)


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
