"""What the user gives, checked and made a ``Workload`` (``as_workload``).

The user gives a ``Workload``, a mapping or an object with the protocol's fields (see the
package docstring), from a factory or as ``tune()``'s keyword arguments. Each field is
checked; the model, the optimizer, the data and the step are wrapped so that their failures
and wrong results are ``WorkloadError`` naming the problem and the fix. Importing this module
does not import torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from torch_autotune.errors import WorkloadError, user_code_failed
from torch_autotune.probe.workloads import huggingface
from torch_autotune.probe.workloads.batches import (
    DatasetBatches,
    RepeatedBatch,
    batch_samples,
    describe_batch,
)
from torch_autotune.probe.workloads.copies import model_builder
from torch_autotune.probe.workloads.given import Kept, as_it_is, loader_taken_apart, not_finite
from torch_autotune.probe.workloads.messages import _article, _exception, _listed, _perhaps
from torch_autotune.probe.workloads.optimizers import fused_by, optimizer_builder, probe_kind
from torch_autotune.probe.workloads.steps import StructuredStep, UserStep
from torch_autotune.probe.workloads.workload import (
    KINDS,
    Kind,
    MapDataset,
    Workload,
    _is_positive_int,
)

if TYPE_CHECKING:
    from torch import Tensor
    from torch.nn import Module

    from torch_autotune.evidence import WorkloadDetails

__all__ = ["FIELDS", "BlocksChecked", "as_workload", "checked_blocks", "default_name"]

_README = (
    "give model, optimizer and a dataset, a loader or an example_batch (see the README's"
    " 'Your own model')"
)

FIELDS = (
    "model",
    "optimizer",
    "dataset",
    "loader",
    "example_batch",
    "collate_fn",
    "loss_fn",
    "train_step",
    "kind",
    "max_batch_size",
    "min_batch_size",
    "datamodule",
    "blocks",
)
"""The keys a factory's mapping may hold, and ``tune()``'s keyword arguments for objects."""


Source = Literal["built-in", "factory", "objects"]


def as_workload(result: Any, *, name: str, source: Source = "factory") -> Workload:
    """Check what the user gave and make it a ``Workload`` (see the module docstring).

    ``result`` is a ``Workload`` (returned as it is), a mapping, or an object with the
    protocol's attributes. ``name`` names the workload in reports and in error messages;
    ``source`` says where it came from (``factory``, ``objects``) for the evidence.
    """
    from torch import nn

    from torch_autotune.probe.workloads import lightning

    if isinstance(result, Workload):
        return result
    if huggingface.is_trainer(result):
        fields = huggingface.trainer_fields(result, name)
    elif isinstance(result, Mapping):
        fields = _mapping_fields(result, name)
    elif lightning.is_lightning_module(result):  # trains with its own train_dataloader()
        fields = {"model": result}
    elif not isinstance(result, nn.Module) and any(hasattr(result, f) for f in FIELDS):
        fields = {f: getattr(result, f) for f in FIELDS if hasattr(result, f)}
    elif isinstance(result, nn.Module):
        raise WorkloadError(
            f"'{name}' is {_article(result)} alone: the probe also needs its data; {_README}"
        )
    else:
        raise WorkloadError(
            f"'{name}' returned {_article(result)}; a factory returns a Workload or a dict that"
            f" holds the model and its data: {_README}"
        )
    given = {k: v for k, v in fields.items() if v is not None}
    if lightning.uses_lightning(given):
        return lightning.lightning_workload(given, name, lambda f: _user_workload(f, name, source))
    return _user_workload(given, name, source)


def default_name(fields: Mapping[str, Any]) -> str:
    """The stable name of a workload given as objects: its model's class (``BertFor...``); a
    container of torch's own (``Sequential``) adds a hash of its architecture, so that two
    different ``nn.Sequential`` models keep profiles of their own (``Sequential-3f2a1c``)."""
    model = fields.get("model")
    if huggingface.is_trainer(model):  # a Trainer is named after the model it trains
        model = getattr(model, "model", None)
    if model is None:
        return "objects"
    kind = model if isinstance(model, type) else type(model)
    if callable(model) and not _is_module(model):
        return str(getattr(model, "__qualname__", getattr(kind, "__qualname__", "objects")))
    if kind.__module__.startswith("torch.nn"):
        architecture = hashlib.sha256(repr(model).encode()).hexdigest()[:6]
        return f"{kind.__name__}-{architecture}"
    return str(kind.__name__)


def _is_module(value: Any) -> bool:
    from torch import nn

    return isinstance(value, nn.Module)


def _mapping_fields(result: Mapping[Any, Any], name: str) -> dict[str, Any]:
    """The protocol's fields of a mapping; an unknown key is an error (likely a typo)."""
    for key in result:
        if key not in FIELDS:
            raise WorkloadError(
                f"'{name}' has the unknown key {key!r}"
                f"{_perhaps(str(key), FIELDS) or f'; the keys are {_listed(FIELDS)}'}"
            )
    return dict(result)


def _user_workload(fields: dict[str, Any], name: str, source: Source) -> Workload:
    """Build the ``Workload`` from the protocol's fields, checking each."""
    if "model" not in fields:
        raise WorkloadError(f"'{name}' has no 'model'; {_README}")
    fields, kept = loader_taken_apart(fields, name)
    fields, adapted = huggingface.adapt(fields, name, source)
    if "dataset" not in fields and "example_batch" not in fields:
        raise WorkloadError(
            f"'{name}' has neither 'dataset', 'loader' nor 'example_batch'; {_README}"
        )
    template, make_model = model_builder(fields["model"], name)
    blocks = checked_blocks(fields.get("blocks"), template, name)
    if blocks and template is None:
        make_model = BlocksChecked(make_model, blocks, name)
    if "optimizer" not in fields:
        raise WorkloadError(f"'{name}' has no 'optimizer'; {_README}")
    builder = optimizer_builder(fields["optimizer"], template, name)
    collate = _checked_callable(fields, "collate_fn", name)
    dataset = _checked_dataset(fields["dataset"], name) if "dataset" in fields else None
    batches = _batches(fields, dataset, collate, name, kept)
    example = batches(2)  # two samples: a dataset's must also batch together
    if dataset is not None and isinstance(batches, RepeatedBatch):
        DatasetBatches(dataset, collate, name)(2)  # the dataset's samples batch too
    step = _step(fields, name)
    smallest = _checked_size(fields, "min_batch_size", name) or 1
    details = _Details(
        source,
        template,
        builder=builder,
        step=step,
        batches=batches,
        example=example,
        smallest=smallest,
        adapted=adapted,
        kept=kept,
    )
    return Workload(
        name=name,
        kind=_checked_kind(fields.get("kind"), template, name),
        make_model=make_model,
        make_optimizer=builder,
        make_batch=batches,
        train_step=step,
        dataset=dataset,
        collate_fn=collate,
        typical_batch=batches.typical if isinstance(batches, DatasetBatches) else None,
        sample_shape=describe_batch(example),
        max_batch_size=_checked_max_batch_size(fields, dataset, smallest, name),
        min_batch_size=smallest,
        optimizer=probe_kind(builder, template),  # type: ignore[arg-type]
        fused_by=fused_by(builder),
        update_samples=adapted.update_samples if adapted is not None else None,
        variable_shapes=isinstance(batches, DatasetBatches) and batches.variable,
        details=details,
        blocks=blocks,
        worker_options=kept.worker_options,
    )


def _batches(
    fields: Mapping[str, Any], dataset: MapDataset | None, collate: Any, name: str, kept: Kept
) -> RepeatedBatch | DatasetBatches:
    """``make_batch``: the example batch's samples where one is given, else the dataset's
    (read in this process, not in the DataLoader's workers: ``kept.worker_options``)."""
    if "example_batch" in fields:
        return _checked_example(fields["example_batch"], name)
    assert dataset is not None
    return DatasetBatches(dataset, collate, name, kept.worker_options)


def _step(fields: Mapping[str, Any], name: str) -> StructuredStep | UserStep:
    """The user's ``train_step``, else the structured step with their ``loss_fn``."""
    train_step = _checked_callable(fields, "train_step", name)
    loss_fn = _checked_callable(fields, "loss_fn", name)
    if train_step is not None and loss_fn is not None:
        raise WorkloadError(
            f"'{name}': give 'train_step' or 'loss_fn', not both: train_step returns the loss"
        )
    if train_step is not None:
        return UserStep(train_step, name)
    return StructuredStep(loss_fn, name)


def _checked_kind(kind: Any, template: Module | None, name: str) -> Kind:
    if kind is None:
        return _inferred_kind(template)
    if kind not in KINDS:
        raise WorkloadError(
            f"'{name}': kind {kind!r} is not one of {_listed(KINDS)}{_perhaps(str(kind), KINDS)}"
        )
    return kind  # type: ignore[no-any-return]


def _inferred_kind(template: Module | None) -> Kind:
    """The model's kind from its layers, where the model is given as a module: ``conv`` with
    2-D or 3-D convolutions, ``transformer`` with attention, ``mlp`` with linear layers only;
    ``other`` otherwise (and for a function that builds the model: it is not built here)."""
    if template is None:
        return "other"
    from torch import nn

    classes = [type(m) for m in template.modules()]
    if any(issubclass(c, (nn.Conv2d, nn.Conv3d)) for c in classes):
        return "conv"
    if any("Attention" in c.__name__ or "Transformer" in c.__name__ for c in classes):
        return "transformer"
    plain = (nn.Linear, nn.Flatten, nn.Dropout, nn.Identity, nn.LayerNorm, nn.BatchNorm1d)
    leaves = [type(m) for m in template.modules() if not next(m.children(), None)]
    activation = "torch.nn.modules.activation"
    if leaves and all(issubclass(c, plain) or c.__module__ == activation for c in leaves):
        return "mlp"
    return "other"


def checked_blocks(given: Any, template: Module | None, name: str) -> tuple[str, ...]:
    """The names of the block classes ``given`` (a module class, or several), found in the
    model where it is given as a module (``wrapping.block_names``, ``model_blocks``)."""
    from torch_autotune.wrapping import block_names, model_blocks

    if given is None:
        return ()
    try:
        names = block_names(given)
    except TypeError:
        raise WorkloadError(
            f"'{name}': 'blocks' is {_article(given)}; give the classes of the model's repeated"
            " blocks, a module class or a list of them (blocks=[DecoderLayer])"
        ) from None
    if template is not None and not model_blocks(template, ",".join(names)):
        raise _no_such_blocks(names, name)
    return names


def _no_such_blocks(names: tuple[str, ...], name: str) -> WorkloadError:
    return WorkloadError(
        f"'{name}': the model has no module of the classes given as its blocks ({', '.join(names)})"
    )


class BlocksChecked:
    """``make_model()`` of a model given as a factory or a class, whose first model is checked
    for the blocks the user named (``checked_blocks`` checks a model in hand at once): a
    class it does not hold was saved in the profile, or ended the run as a model that does not
    fit with checkpointing 'not tried', not as the workload's error."""

    def __init__(self, make: Any, names: tuple[str, ...], name: str) -> None:
        self.make, self.names, self.name = make, names, name
        self.checked = False

    def __call__(self) -> Any:
        from torch_autotune.wrapping import model_blocks

        model = self.make()
        if not self.checked:
            if not model_blocks(model, ",".join(self.names)):
                raise _no_such_blocks(self.names, self.name)
            self.checked = True
        return model


def _checked_callable(fields: Mapping[str, Any], key: str, name: str) -> Any:
    value = fields.get(key)
    if value is not None and not callable(value):
        raise WorkloadError(f"'{name}': '{key}' is {_article(value)}, not a function")
    return value


def _checked_size(fields: Mapping[str, Any], key: str, name: str) -> int | None:
    size = fields.get(key)
    if size is not None and not _is_positive_int(size):
        raise WorkloadError(f"'{name}': '{key}' must be a positive int, not {size!r}")
    return size


def _checked_max_batch_size(
    fields: Mapping[str, Any], dataset: MapDataset | None, smallest: int, name: str
) -> int | None:
    size = _checked_size(fields, "max_batch_size", name)
    if size is None and dataset is not None:
        size = len(dataset)
    if size is not None and size < smallest:
        raise WorkloadError(
            f"'{name}': the largest batch ({size}"
            f"{'' if 'max_batch_size' in fields else ', the dataset size'}) is below"
            f" min_batch_size {smallest}"
        )
    return size


def _checked_dataset(dataset: Any, name: str) -> MapDataset:
    """A map-style dataset with at least one sample."""
    from torch.utils.data import IterableDataset

    if isinstance(dataset, IterableDataset) or not (
        hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
    ):
        raise WorkloadError(
            f"'{name}': 'dataset' is {_article(dataset)}, not a map-style dataset (one with"
            " __len__ and __getitem__); give one, or an example_batch instead"
        )
    try:
        length = len(dataset)
    except Exception as exc:
        raise user_code_failed(f"'{name}': len(dataset) raised {_exception(exc)}", exc) from exc
    if length < 1:
        raise WorkloadError(f"'{name}': the dataset is empty; give one with samples")
    return dataset  # type: ignore[no-any-return]


def _checked_example(batch: Any, name: str) -> RepeatedBatch:
    """An example batch of any structure that holds a tensor with a batch dimension."""
    from torch_autotune.apply import map_tensors

    count = batch_samples(batch)
    if count is None or count < 1:
        raise WorkloadError(
            f"'{name}': 'example_batch' is {_article(batch)} that holds no tensor with samples"
            " on dim 0; give a batch as your DataLoader yields it"
        )
    counts: list[int] = []

    def detached(tensor: Tensor) -> Tensor:
        if tensor.dim() > 0 and tensor.shape[0] not in counts:
            counts.append(int(tensor.shape[0]))
        return tensor.detach()

    kept = map_tensors(batch, detached)
    if len(counts) > 1:
        raise WorkloadError(
            f"'{name}': 'example_batch' holds tensors with {' and '.join(map(str, counts))}"
            " samples on dim 0; every tensor of a batch holds its samples on dim 0"
        )
    return RepeatedBatch(kept, count)


class _Details:
    """``Workload.details``: what the probe made of the user's objects, read after the run
    (the step learns how the model is called at its first call)."""

    def __init__(
        self,
        source: Source,
        template: Module | None,
        *,
        builder: Any,
        step: StructuredStep | UserStep,
        batches: RepeatedBatch | DatasetBatches,
        example: Any,
        smallest: int,
        adapted: huggingface.Adapted | None = None,
        kept: Kept | None = None,
    ) -> None:
        self.source = source
        self.template = template
        self.builder = builder
        self.step = step
        self.batches = batches
        self.example = example
        self.smallest = smallest
        self.adapted = adapted or huggingface.Adapted(None)
        self.kept = kept or Kept()

    def __call__(self) -> WorkloadDetails:
        from torch_autotune.evidence import WorkloadDetails

        notes: list[str] = []
        if isinstance(self.batches, DatasetBatches) and self.batches.note:
            notes.append(self.batches.note)
        step = self.step
        if isinstance(step, StructuredStep) and step.dropped:
            notes.append(
                f"batch keys the model's forward takes no argument for, left out:"
                f" {_listed(sorted(step.dropped))}"
            )
        notes += as_it_is(self.template) + not_finite(getattr(step, "last_loss", None))
        model = None if self.template is None else type(self.template).__qualname__
        structured = step if isinstance(step, StructuredStep) else None
        adapted = self.adapted
        return WorkloadDetails(
            source=self.source,
            framework=adapted.framework,
            model=model,
            optimizer=getattr(self.builder, "built", None),
            batch=describe_batch(self.example),
            call=adapted.call or (structured.call if structured else "train_step(model, batch)"),
            loss=adapted.loss or (structured.loss_source if structured else "train_step"),
            min_batch_size=self.smallest,
            variable_shapes=isinstance(self.batches, DatasetBatches) and self.batches.variable,
            notes=(*adapted.notes, *self.kept.notes, *notes),
            batch_sampler=self.kept.batch_sampler,
        )
