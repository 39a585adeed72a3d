"""What the user's objects say of themselves beyond the fields they were given as: a
DataLoader taken apart (its dataset, its collate, and the samples an epoch of its sampler
draws), and what a model does of its own that the profile's settings do not say (its
parameters' dtype, Hugging Face's own activation checkpointing)."""

from __future__ import annotations

from typing import Any

from torch_autotune.errors import WorkloadError
from torch_autotune.probe.workloads.messages import _article
from torch_autotune.wrapping import checkpoints_itself

__all__ = ["as_it_is", "loader_taken_apart", "not_finite"]


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


def loader_taken_apart(fields: dict[str, Any], name: str) -> dict[str, Any]:
    """A DataLoader given as ``loader`` (or as ``dataset``) becomes its dataset and its
    collate_fn; its batch size is replaced by each trial's."""
    from torch.utils.data import DataLoader, IterableDataset

    loader = fields.get("loader")
    if loader is None and isinstance(fields.get("dataset"), DataLoader):
        loader = fields["dataset"]
    if loader is None:
        return fields
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
    return taken


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
