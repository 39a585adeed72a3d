"""What the user's objects say of themselves beyond the fields they were given as: a
DataLoader taken apart (its dataset, its collate, and the samples an epoch of its sampler
draws; ``Kept``: what the probe keeps of its other settings, and the notes on those it does
not), and what a model does of its own that the profile's settings do not say (its
parameters' dtype, Hugging Face's own activation checkpointing).

A DataLoader's settings fall in three kinds. What the probe measures (``batch_size``,
``num_workers``, ``pin_memory``, ``persistent_workers``, ``prefetch_factor``) is replaced by
the profile's, and the notes name the loader's values. What its workers need to run as the
user's do (``worker_init_fn``, ``multiprocessing_context``) goes to every DataLoader the probe
starts workers in (``Workload.worker_options``). What decides which samples an epoch draws
(a sampler of the user's own, a ``generator``, ``drop_last``, a ``batch_sampler``) stays the
user's: the probe draws the dataset's samples in its own order, up to an epoch's draw, and the
notes say what to give the DataLoader again; a ``batch_sampler`` fixes the batch size, which
the profile's cannot then replace, and the exports say so too (``records``' batch_sampler).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch_autotune.errors import WorkloadError
from torch_autotune.probe.workloads.messages import _article
from torch_autotune.wrapping import checkpoints_itself

__all__ = ["Kept", "as_it_is", "loader_taken_apart", "not_finite"]


def as_it_is(model: Any) -> list[str]:
    """What the model does of its own that the profile's settings do not say: parameters in a
    dtype other than float32 (every trial trained in it, whatever autocast says), and Hugging
    Face's own activation checkpointing turned on (every trial recomputed)."""
    import torch

    said = []
    dtypes = {p.dtype for p in model.parameters()} if isinstance(model, torch.nn.Module) else set()
    if dtypes and dtypes != {torch.float32}:
        named = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        said.append(
            f"the model's parameters are {named}: every trial trained in it, whatever the"
            " profile's precision says (which is for a float32 model)"
        )
    if checkpoints_itself(model):
        said.append(
            "the model checkpoints its activations itself (Hugging Face's own, turned on"
            " before tune()): every trial recomputed, whatever the profile's"
            " activation_checkpointing says; turn it off before tune() to measure without it"
        )
    return said


def not_finite(loss: Any) -> list[str]:
    """What the last training step's loss says where it is NaN or infinite (read once, after
    the probe: a step of a model or data that trains to NaN is as fast, and learns nothing)."""
    import torch

    try:
        if not isinstance(loss, torch.Tensor) or bool(torch.isfinite(loss).all()):
            return []
        said = loss.item()
    except RuntimeError:  # a CUDA graph's output, overwritten by later replays: nothing to say
        return []
    return [
        f"the last training step's loss was {said}: a model or data that trains to NaN"
        " learns nothing, and its speed is that of NaN arithmetic; check them (a loss finite"
        " in float32 and not under fp16 autocast is the precision's)"
    ]


@dataclass(frozen=True)
class Kept:
    """What the probe keeps of a DataLoader given as ``loader``, beyond its dataset and
    collate_fn (see the module docstring): ``notes`` on its settings, for the evidence;
    ``worker_options``, the DataLoader arguments every loader of the probe's with workers
    takes; ``batch_sampler``, the class of a batch sampler of the user's (None: none)."""

    notes: tuple[str, ...] = ()
    worker_options: Mapping[str, Any] = field(default_factory=dict)
    batch_sampler: str | None = None


def loader_taken_apart(fields: dict[str, Any], name: str) -> tuple[dict[str, Any], Kept]:
    """A DataLoader given as ``loader`` (or as ``dataset``) becomes its dataset and its
    collate_fn; its batch size is replaced by each trial's; what else it says is ``Kept``."""
    from torch.utils.data import DataLoader, IterableDataset

    loader = fields.get("loader")
    if loader is None and isinstance(fields.get("dataset"), DataLoader):
        loader = fields["dataset"]
    if loader is None:
        return fields, Kept()
    if not isinstance(loader, DataLoader):
        raise WorkloadError(
            f"'{name}': 'loader' is {_article(loader)}, not a torch.utils.data.DataLoader"
        )
    if "dataset" in fields and fields["dataset"] is not loader:
        raise WorkloadError(f"'{name}': give 'dataset' or 'loader', not both")
    if loader.batch_size is None and loader.batch_sampler is None:  # no automatic batching
        raise WorkloadError(
            f"'{name}': the DataLoader has batch_size=None, so each item of its dataset is a"
            " whole batch, which the probe cannot resize; give a dataset of single samples"
            " (with its collate_fn), or example_batch=next(iter(loader))"
        )
    if isinstance(loader.dataset, IterableDataset):  # a stream
        raise WorkloadError(
            f"'{name}': the DataLoader reads {_article(loader.dataset)}, a stream the probe"
            " cannot draw samples of each size from; give a map-style dataset (with __len__"
            " and __getitem__), or example_batch=next(iter(loader))"
        )
    taken = {k: v for k, v in fields.items() if k != "loader"}
    taken["dataset"] = loader.dataset
    if "collate_fn" not in fields and not _is_default_collate(loader.collate_fn):
        taken["collate_fn"] = loader.collate_fn
    drawn = _sampled(loader)
    if drawn is not None and "max_batch_size" not in fields:
        taken["max_batch_size"] = drawn  # an epoch is what the sampler draws, not the dataset
    return taken, _kept(loader, drawn)


def _kept(loader: Any, drawn: int | None) -> Kept:
    """What the probe keeps of ``loader``'s settings, and the notes on each that differs from
    torch's default (the module docstring)."""
    options: dict[str, Any] = {}
    if loader.worker_init_fn is not None:
        options["worker_init_fn"] = loader.worker_init_fn
    if loader.multiprocessing_context is not None:
        options["multiprocessing_context"] = loader.multiprocessing_context
    notes = _replaced(loader)
    if options:
        notes.append(_workers_keep(options))
    own_batches = loader.batch_size is None  # a batch_sampler of the user's
    if own_batches:
        notes.append(_batch_sampler_note(loader.batch_sampler))
    else:
        notes += _drawn_notes(loader, drawn)
    batch_sampler = type(loader.batch_sampler).__name__ if own_batches else None
    return Kept(tuple(notes), options, batch_sampler)


def _replaced(loader: Any) -> list[str]:
    """The note on the loader's settings the probe measures, with the loader's values, where
    any but its batch size (which the probe varies, as documented) differs from torch's."""
    values = [f"num_workers={loader.num_workers}"] if loader.num_workers else []
    if loader.pin_memory:
        values.append("pin_memory=True")
    if loader.num_workers > 0 and loader.persistent_workers:
        values.append("persistent_workers=True")
    if loader.num_workers > 0 and loader.prefetch_factor not in (None, 2):
        values.append(f"prefetch_factor={loader.prefetch_factor}")
    if not values:
        return []
    if loader.batch_size is not None:
        values.insert(0, f"batch_size={loader.batch_size}")
    return [
        f"the DataLoader's {', '.join(values)} are replaced by what the probe measured: the"
        " profile's batch size and DataLoader settings (profile.dataloader_kwargs())"
    ]


def _workers_keep(options: Mapping[str, Any]) -> str:
    said = []
    if "worker_init_fn" in options:
        function = options["worker_init_fn"]
        said.append(f"worker_init_fn ({getattr(function, '__qualname__', _article(function))})")
    if "multiprocessing_context" in options:
        context = options["multiprocessing_context"]
        method = getattr(context, "get_start_method", lambda: context)()
        said.append(f"multiprocessing_context ({method!r})")
    return (
        f"the DataLoader's {' and '.join(said)} went to every DataLoader the probe started"
        " workers in, as yours; give them to your DataLoader again beside the profile's"
        " arguments (yours win over profile.dataloader_kwargs()'s)"
    )


def _batch_sampler_note(batch_sampler: Any) -> str:
    size = getattr(batch_sampler, "batch_size", None)
    of = f", batches of {size}" if isinstance(size, int) else ""
    return (
        f"the DataLoader's batch_sampler ({_article(batch_sampler)}{of}) makes batches of its"
        " own size, so the profile's batch size cannot be given to a DataLoader built with it"
        " (torch refuses batch_size beside a batch_sampler); the probe trained batches of each"
        " size from its dataset in its own order: build your batch sampler with"
        " profile.batch_size, and the DataLoader with"
        " profile.dataloader_kwargs(batch_sampler=yours)"
    )


def _drawn_notes(loader: Any, drawn: int | None) -> list[str]:
    """The notes on what decides which samples the loader draws: its sampler where it is not
    torch's own, its generator, drop_last; each stays the user's."""
    from torch.utils.data import RandomSampler, SequentialSampler

    said = []
    sampler = loader.sampler
    if not isinstance(sampler, (RandomSampler, SequentialSampler)):
        cap = "" if drawn is None else f", up to the {drawn} samples an epoch of it draws"
        said.append(
            f"the DataLoader's sampler ({_article(sampler)}) is not the probe's, which draws"
            f" the dataset's samples in its own order{cap}; give it to your DataLoader again:"
            " profile.dataloader_kwargs(sampler=yours, batch_size=profile.batch_size)"
        )
    if loader.generator is not None:
        said.append(
            "the DataLoader's generator orders what its sampler draws, which the probe does not"
            " use; give it to your DataLoader again (profile.dataloader_kwargs(generator=yours))"
        )
    if loader.drop_last:
        said.append(
            "the DataLoader's drop_last=True is yours to keep (the probe's training batches were"
            " whole too): profile.dataloader_kwargs(drop_last=True)"
        )
    return said


def _sampled(loader: Any) -> int | None:
    """How many samples an epoch of ``loader`` draws, where its sampler says so and draws fewer
    than its dataset holds (a SubsetRandomSampler, a WeightedRandomSampler's num_samples):
    the largest batch it can train; None otherwise."""
    try:
        drawn, held = len(loader.sampler), len(loader.dataset)
    except TypeError:  # no len(): an IterableDataset's sampler, a sampler of its own
        return None
    return drawn if 0 < drawn < held else None


def _is_default_collate(collate: Any) -> bool:
    from torch.utils.data import default_collate

    return collate is default_collate or getattr(collate, "__name__", "") == "default_collate"
