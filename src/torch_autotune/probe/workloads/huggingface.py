"""Hugging Face objects as they are: a ``PreTrainedModel`` with its own loss, a
``datasets.Dataset``, a ``transformers.Trainer``.

Nothing here imports transformers or datasets unless the user's object comes from them: an
object is judged by the modules of its classes (``_comes_from``), and where it comes from a
package, that package is already imported. ``protocol`` calls two functions:

- ``trainer_fields(trainer, name)``: a ``Trainer`` given as the workload (``tune(trainer)``, a
  factory returning one) becomes the protocol's fields, taken from the Trainer as it trains:
  its model; its training DataLoader (``trainer.get_train_dataloader()``: the dataset with the
  columns the model takes, the data collator), taken apart like any loader, its batch size
  replaced by each trial's; its optimizer (the one given to it, else
  ``trainer.create_optimizer(model)`` over each copy the probe trains, as its
  ``TrainingArguments`` say: class, learning rate, betas, weight-decay groups); and its loss,
  ``trainer.compute_loss(model, batch)``, so that a subclass overriding it is honoured.
- ``adapt(fields, name, source)``: what a ``PreTrainedModel`` or a ``datasets.Dataset`` needs
  to train as the Trainer would train it, where the user gave nothing else:

  - no optimizer for a ``PreTrainedModel``: the Trainer's default, read from the installed
    transformers (``Trainer.get_optimizer_cls_and_kwargs`` of default ``TrainingArguments``:
    in transformers 5, AdamW with lr 5e-5, betas (0.9, 0.999), eps 1e-8, weight decay 0, the
    fused kernel from torch 2.8);
  - a ``datasets.Dataset``: the columns the model's forward takes no argument for are removed,
    as the Trainer's ``remove_unused_columns`` does (a text column cannot become a tensor);
    without a ``collate_fn``, rows of Python lists are read in torch format
    (``with_format("torch")``), so that torch's default collate stacks them instead of
    transposing their lists. Rows of different lengths need a padding collate
    (``DataCollatorWithPadding(tokenizer)``), given as ``collate_fn``; the search then trains
    on the longest rows (``batches.DatasetBatches``).

  It returns what it did (``Adapted``) for the evidence: the framework and the notes.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch_autotune.bounds import MAX_GLOBAL_BATCH
from torch_autotune.errors import WorkloadError, user_code_failed
from torch_autotune.probe.workloads.messages import _exception, _listed
from torch_autotune.probe.workloads.optimizers import ModelOptimizer, fused_by
from torch_autotune.probe.workloads.steps import LABEL_KEYS

if TYPE_CHECKING:
    from torch import Tensor
    from torch.nn import Module
    from torch.optim import Optimizer

__all__ = [
    "Adapted",
    "TrainerDefaultOptimizer",
    "TrainerStep",
    "adapt",
    "is_arrow_dataset",
    "is_pretrained_model",
    "is_trainer",
    "trainer_fields",
]


def _comes_from(value: Any, package: str, name: str) -> bool:
    """Whether ``value``'s class, or a class it derives from, is ``package``'s class ``name``
    (a user's subclass of ``transformers.Trainer`` is a Trainer); no import."""
    return any(
        kind.__name__ == name and kind.__module__.partition(".")[0] == package
        for kind in type(value).__mro__
    )


def _from_package(value: Any, package: str) -> bool:
    """Whether ``value`` (a function, an object such as a data collator, a subclass of one of
    ``package``'s as TRL's collators are, a ``functools.partial`` of any) comes from
    ``package``; no import."""
    while isinstance(value, functools.partial):
        value = value.func
    if inspect.isroutine(value):
        return str(getattr(value, "__module__", "")).partition(".")[0] == package
    return any(kind.__module__.partition(".")[0] == package for kind in type(value).__mro__)


def is_trainer(value: Any) -> bool:
    """Whether ``value`` is a ``transformers.Trainer`` (or a subclass, such as TRL's)."""
    return _comes_from(value, "transformers", "Trainer")


def is_pretrained_model(value: Any) -> bool:
    """Whether ``value`` is a ``transformers.PreTrainedModel`` instance."""
    return _comes_from(value, "transformers", "PreTrainedModel")


def is_arrow_dataset(value: Any) -> bool:
    """Whether ``value`` is a ``datasets.Dataset`` (map-style, backed by Arrow)."""
    return _comes_from(value, "datasets", "Dataset")


@dataclass(frozen=True)
class Adapted:
    """What was made of Hugging Face objects, for ``WorkloadDetails``: the framework
    (``transformers``, ``transformers Trainer``, or None for a ``datasets.Dataset`` under
    another model), what was adapted in words, and how the step calls the model and where its
    loss comes from, where a step of ours does not say it itself. ``update_samples``: the
    samples each process trains per optimizer step where a Trainer accumulates, and what says
    so (``Workload.update_samples``)."""

    framework: str | None
    notes: tuple[str, ...] = ()
    call: str | None = None
    loss: str | None = None
    update_samples: tuple[int, str] | None = None


# --- a PreTrainedModel and a datasets.Dataset -------------------------------------------------


def adapt(
    fields: Mapping[str, Any], name: str, source: str
) -> tuple[dict[str, Any], Adapted | None]:
    """``fields`` with what Hugging Face objects need filled in (see the module docstring),
    and what was done; ``fields`` as they are and None where nothing comes from Hugging Face.
    A ``DatasetDict`` (what ``load_dataset`` returns: splits) is refused with the fix."""
    dataset: Any = fields.get("dataset")
    if _comes_from(dataset, "datasets", "DatasetDict"):
        raise WorkloadError(
            f"'{name}': the dataset is a DatasetDict of splits ({_listed(dataset)}); give the"
            " split to train on, such as dataset['train']"
        )
    step = fields.get("train_step")
    if isinstance(step, TrainerStep):
        return dict(fields), step.adapted(name, source, fused_by(fields.get("optimizer")))
    model = fields.get("model")
    transformers_model = is_pretrained_model(model)
    if not transformers_model and not is_arrow_dataset(dataset):
        return dict(fields), None
    adapted = dict(fields)
    notes: list[str] = []
    if transformers_model and "optimizer" not in fields:
        default = TrainerDefaultOptimizer()
        adapted["optimizer"] = default
        notes.append(f"no optimizer given: {default.describe()}")
    collate = fields.get("collate_fn")
    if is_arrow_dataset(dataset) and _from_package(collate, "transformers"):
        adapted["dataset"] = _arrow_dataset(dataset, model, notes, formatted=False)
    elif is_arrow_dataset(dataset) and collate is None:
        adapted["dataset"] = _arrow_dataset(dataset, model, notes, formatted=True)
    elif is_arrow_dataset(dataset):  # the user's own collate: it may tokenize the raw text
        notes.append("the dataset's columns are kept as they are: the collate_fn reads them")
    if transformers_model and source == "objects":
        notes.append(_naming(name, "the model's class"))
    return adapted, Adapted("transformers" if transformers_model else None, tuple(notes))


def _naming(name: str, default: str) -> str:
    return (
        f"the workload is named '{name}' ({default} unless tune(name=...) gave another):"
        f" recommend(workload='{name}') returns this profile"
    )


class TrainerDefaultOptimizer:
    """``(params, **options) -> Optimizer``: the optimizer the Hugging Face Trainer builds with
    its default ``TrainingArguments``, read from the installed transformers
    (``Trainer.get_optimizer_cls_and_kwargs``) and the Trainer's weight decay (0 by default:
    torch's AdamW alone would decay by 0.01). ``options`` (the probe's ``fused``) win."""

    def __init__(self) -> None:
        from transformers import Trainer, TrainingArguments

        arguments = TrainingArguments(output_dir="trainer_output", report_to="none")
        self.klass, kwargs = Trainer.get_optimizer_cls_and_kwargs(arguments)
        self.kwargs = {**kwargs, "weight_decay": arguments.weight_decay}
        self.optim = str(getattr(arguments.optim, "value", arguments.optim))
        self.fused_words = f"the Hugging Face Trainer's default optim='{self.optim}'"

    def __call__(self, params: Any, **options: Any) -> Optimizer:
        optimizer: Optimizer = self.klass(params, **{**self.kwargs, **options})
        return optimizer

    def describe(self) -> str:
        """``AdamW(lr=5e-05, ...)``, as the Trainer's defaults make it, in words."""
        import transformers

        kwargs = ", ".join(f"{key}={value!r}" for key, value in self.kwargs.items())
        return (
            f"{self.klass.__name__}({kwargs}), the Hugging Face Trainer's default (optim"
            f" '{self.optim}' of TrainingArguments in transformers {transformers.__version__})"
        )


def _arrow_dataset(dataset: Any, model: Any, notes: list[str], *, formatted: bool) -> Any:
    """The ``datasets.Dataset`` without the columns ``model`` takes no argument for, as the
    Trainer hands it to its collator, and in torch format where ``formatted`` (no collator)
    and its rows are Python objects. A collate_fn of the user's own gets the dataset as it
    is: it may tokenize a text column on the fly."""
    unused = _unused_columns(dataset.column_names, model)
    if unused:
        dataset = dataset.remove_columns(unused)
        notes.append(
            f"dataset columns {type(model).__name__}.forward takes no argument for, removed as"
            f" the Trainer's remove_unused_columns does: {_listed(unused)}"
        )
    if formatted and dataset.format.get("type") is None:
        dataset = dataset.with_format("torch")
        notes.append(
            "the datasets.Dataset's rows are read in torch format (with_format('torch')), so"
            " that torch's default collate stacks them"
        )
    return dataset


def _unused_columns(columns: list[str], model: Any) -> list[str]:
    """The columns the model's forward takes no argument for (labels kept: the step passes
    them as ``labels``, or to ``loss_fn``); none where forward's arguments cannot be read, where
    it takes ``**kwargs`` (a Hugging Face model's are not batch columns), or where no column
    would be left (the step then names the mismatch)."""
    from torch import nn

    if not isinstance(model, nn.Module):
        return []
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    if any(p.kind is p.VAR_KEYWORD for p in parameters) and not is_pretrained_model(model):
        return []
    kept = {p.name for p in parameters} | set(LABEL_KEYS) | {"label_ids"}
    unused = [column for column in columns if column not in kept]
    return unused if len(unused) < len(columns) else []


# --- a Trainer ------------------------------------------------------------------------------


def trainer_fields(trainer: Any, name: str) -> dict[str, Any]:
    """The protocol's fields of a ``transformers.Trainer`` (see the module docstring)."""
    if trainer.train_dataset is None:
        raise WorkloadError(
            f"'{name}': the Trainer has no train_dataset; give Trainer(..., train_dataset=...):"
            " the probe trains on its samples"
        )
    try:
        loader = trainer.get_train_dataloader()
    except Exception as exc:
        raise user_code_failed(
            f"'{name}': the Trainer's get_train_dataloader() raised {_exception(exc)}", exc
        ) from exc
    with contextlib.suppress(AttributeError, ValueError):  # not prepared again by train()
        trainer.accelerator._dataloaders.remove(loader)
    step = TrainerStep(trainer, name)
    optimizer: Any = trainer.optimizer
    if optimizer is None:
        made = TrainerOptimizer(trainer)
        optimizer = ModelOptimizer(made, name, made(trainer.model))
    return {"model": trainer.model, "optimizer": optimizer, "loader": loader, "train_step": step}


def _overrides(trainer: Any, method: str) -> str | None:
    """The class of ``trainer`` that overrides the Trainer's ``method``, None where none does."""
    for kind in type(trainer).__mro__:
        if method in vars(kind):
            own = kind.__name__ == "Trainer" and kind.__module__.startswith("transformers")
            return None if own else kind.__name__
    return None


class TrainerOptimizer:
    """``make(model) -> Optimizer``: the Trainer's own ``create_optimizer(model)`` over the
    model given (a subclass that overrides it, ``optimizer_cls_and_kwargs`` and the
    weight-decay groups are honoured). The Trainer keeps the optimizer it creates as
    ``trainer.optimizer``; it is put back to None, so that the user's ``trainer.train()``
    builds its own over the model it trains."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.fused_words = f"your Trainer's optim='{_optim(trainer.args)}'"

    def __call__(self, model: Module) -> Optimizer:
        trainer = self.trainer
        if "model" not in inspect.signature(trainer.create_optimizer).parameters:
            return _grouped_optimizer(trainer, model)  # transformers before create_optimizer(model)
        try:
            optimizer: Optimizer = trainer.create_optimizer(model)
        finally:
            trainer.optimizer = None
        return optimizer


def _grouped_optimizer(trainer: Any, model: Module) -> Optimizer:
    """What ``Trainer.create_optimizer`` builds, for a transformers whose create_optimizer
    takes no model: the class and arguments its ``TrainingArguments`` name, weight decay on
    every parameter but biases and norms."""
    klass, kwargs = trainer.get_optimizer_cls_and_kwargs(trainer.args, model)
    decay = set(trainer.get_decay_parameter_names(model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if n in decay], "weight_decay": trainer.args.weight_decay},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]
    optimizer: Optimizer = klass([g for g in groups if g["params"]], **kwargs)
    return optimizer


class TrainerStep:
    """``train_step(model, batch)``: the Trainer's ``compute_loss(model, batch)``, on the copy
    of the model the probe trains. The batch is copied first: compute_loss may pop its
    ``labels`` (label smoothing, ``compute_loss_func``), and a trial steps the same batch
    again. A batch without labels, for which the model computes no loss, is one line that
    names the fix, not transformers' traceback."""

    def __init__(self, trainer: Any, name: str) -> None:
        self.trainer = trainer
        self.name = name
        self.overridden = _overrides(trainer, "compute_loss")

    def __call__(self, model: Module, batch: Any) -> Tensor:
        inputs = copy.copy(batch) if isinstance(batch, Mapping) else batch
        try:
            loss: Tensor = self.trainer.compute_loss(model, inputs)
        except ValueError as error:
            if self.overridden or "did not return a loss" not in str(error):
                raise
            keys = _listed(batch) if isinstance(batch, Mapping) else "none"
            raise WorkloadError(
                f"'{self.name}': the Trainer's compute_loss got no loss from"
                f" {type(getattr(model, '_orig_mod', model)).__name__}: its batch has no labels"
                f" (keys: {keys}); give the Trainer a dataset with labels, or a data collator"
                " that makes them (DataCollatorForLanguageModeling(tokenizer, mlm=False) for"
                " a causal LM)"
            ) from None
        return loss

    def adapted(self, name: str, source: str, fused: str | None = None) -> Adapted:
        """What the probe took from the Trainer, for the evidence; ``fused``: what builds its
        optimizer fused whatever the profile says (``optimizers.fused_by``), None where the
        profile decides the kernel."""
        trainer = self.trainer
        collator = type(trainer.data_collator).__name__
        if inspect.isfunction(trainer.data_collator):
            collator = trainer.data_collator.__name__
        notes = [
            "the Trainer's model, training DataLoader (its dataset as get_train_dataloader()"
            f" gives it, its data collator {collator}), optimizer and compute_loss; the"
            " DataLoader's batch size is each trial's",
            _optimizer_note(trainer, fused),
        ]
        update = _update_samples(trainer.args)
        if update is not None:
            notes.append(_accumulation_note(*update))
        if _checkpointing(trainer.args):
            notes.append(
                "the Trainer's arguments turn on activation checkpointing, which it applies when"
                " train() starts: the probe trains without it (call the model's"
                " gradient_checkpointing_enable() before tune() to measure with it)"
            )
        asked = [f for f in ("bf16", "fp16", "tf32") if getattr(trainer.args, f, None)]
        if asked:
            notes.append(
                f"the Trainer's arguments ask for {_listed(asked)}, which it applies when train()"
                " starts: the probe trains with the profile's precision instead (its own"
                " setting, with its reason), and the Hugging Face export sets these fields"
                " from it"
            )
        if source == "objects":
            notes.append(_naming(name, "the class of the Trainer's model"))
        owner = f"{self.overridden}.compute_loss" if self.overridden else "Trainer.compute_loss"
        return Adapted(
            "transformers Trainer",
            tuple(notes),
            call=f"trainer.compute_loss(model, batch) ({owner})",
            loss=f"{owner}" + ("" if self.overridden else " (the model's own loss)"),
            update_samples=update,
        )


def _accumulation_note(samples: int, words: str) -> str:
    """What the profile does with the global batch a Trainer accumulates to: the target of
    accumulation (``compose.workload_target``), where it is no more than ``MAX_GLOBAL_BATCH``."""
    said = f"{words} = {samples} samples per process per optimizer step"
    most = f"{MAX_GLOBAL_BATCH:,}, the most a target global batch may be"
    if samples > MAX_GLOBAL_BATCH:
        return (
            f"{said}: more than {most}, so the profile does not keep it: its batch is tuned as"
            " where the Trainer does not accumulate (batch.grad_accum_steps 1, rule L1, which"
            " the Hugging Face export writes), unless tune() is given a target"
            " (target_global_batch, --target-batch)"
        )
    return (
        f"{said}: the profile keeps that global batch (times its processes) as the target of its"
        " accumulation, unless tune() is given another (target_global_batch, --target-batch):"
        " the batch size measured, batch.grad_accum_steps the steps that make up the rest (rule"
        f" L1), and the Hugging Face export writes both; where its processes make it more than"
        f" {most}, it is not kept (rule L1 says so)"
    )


def _optimizer_note(trainer: Any, fused: str | None) -> str:
    """Where the optimizer the probe trains comes from, and whether its kernel is the profile's
    (``optimizer.fused``) or the Trainer's fused one, which the rules keep on (rule I6)."""
    if trainer.optimizer is not None:
        return "optimizer: the one given to the Trainer, rebuilt over each copy of the model"
    args = trainer.args
    made = (
        "optimizer: trainer.create_optimizer(model) over each copy of the model, as its"
        f" TrainingArguments say (optim '{_optim(args)}', learning rate {args.learning_rate},"
        f" weight decay {args.weight_decay})"
    )
    export = (
        " (the Hugging Face export writes optim where the profile decides the kernel, and says"
        " why where it does not)"
    )
    if fused is not None:
        return (
            f"{made}: it builds the fused kernel, which trains fused whatever the rules say, so"
            f" the profile's optimizer.fused is on, with why{export}"
        )
    return (
        f"{made}: it is not built fused, so the profile's optimizer.fused decides the kernel"
        " the probe trains (fused=True where it is on, torch's default where it is off), with"
        f" why{export}"
    )


def _update_samples(arguments: Any) -> tuple[int, str] | None:
    """The samples each process trains per optimizer step, as the Trainer's arguments set them,
    with what sets them in words; None where it does not accumulate: its batch size alone is
    then the tuned one (accumulation is only there to make up a global batch that was chosen)."""
    steps = getattr(arguments, "gradient_accumulation_steps", 1)
    batch = getattr(arguments, "per_device_train_batch_size", None)
    if not isinstance(steps, int) or not isinstance(batch, int) or steps <= 1 or batch < 1:
        return None
    return batch * steps, (
        f"your Trainer's per_device_train_batch_size {batch} x gradient_accumulation_steps {steps}"
    )


def _optim(arguments: Any) -> str:
    return str(getattr(arguments.optim, "value", arguments.optim))


def _checkpointing(arguments: Any) -> bool:
    """Whether the TrainingArguments ask for activation (gradient) checkpointing."""
    field = "activation_checkpointing" if hasattr(arguments, "activation_checkpointing") else ""
    return bool(getattr(arguments, field or "gradient_checkpointing", False))
