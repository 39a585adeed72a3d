"""Lightning with no glue: a ``LightningModule`` tuned through its own ``training_step`` and
``configure_optimizers``, on the data of its ``LightningDataModule`` or its own
``train_dataloader()``.

``protocol.as_workload`` hands the fields here when the model is a ``LightningModule`` or a
``datamodule`` is given (``uses_lightning``, judged from the classes' modules: Lightning is
never imported for anyone else). What the Trainer would do first is done on a copy of the
module, so the user's own is never touched: ``prepare_data()``, ``setup("fit")`` and
``configure_model()``; a DataModule gets ``prepare_data()`` and ``setup("fit")`` itself, as
the Trainer calls them. Its ``train_dataloader()`` is then taken apart (its dataset and
collate_fn; its batch size is each trial's), and the arguments of its ``__init__`` that take
DataLoader settings (``LOADER_ARGUMENTS``) are kept for the export, which writes them in a
LightningCLI config's ``data:`` section.

The model the probe trains is ``lightning_step.TrainingStep``, whose ``forward`` is the
module's ``training_step``, so that ``torch.compile`` compiles the step as Lightning compiles
a compiled module's (that module says why, and why ``batch_idx`` is 1).
``configure_optimizers()`` runs on each copy (``ModelOptimizer``); it may return an optimizer,
a list, ``(optimizers, schedulers)`` or a dict with ``"optimizer"``. The schedulers are not
stepped: they do not change the speed of a step.

Not called: ``transfer_batch_to_device`` and the batch-transfer hooks (the batch is moved by
``apply.batch_to_device``), the ``on_*`` hooks, callbacks, ``optimizer_step`` and gradient
clipping; the evidence notes each such hook the module overrides. ``self.log()`` outside a
Trainer warns at every call; that one warning is silenced for the probe's steps. Refused in
one line: manual optimization and several optimizers (give ``train_step`` and ``optimizer``),
and a ``training_step`` that returns None or no loss. With ``train_step`` or ``loss_fn`` the
module is trained as a plain ``nn.Module`` through them.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from torch_autotune.errors import WorkloadError
from torch_autotune.evidence import WorkloadDetails
from torch_autotune.probe.workloads.given import not_finite
from torch_autotune.probe.workloads.lightning_step import (
    LightningStep,
    QuietStep,
    TrainingStep,
    copied,
    hook_failed,
)
from torch_autotune.probe.workloads.messages import _article, _listed
from torch_autotune.probe.workloads.optimizers import ModelOptimizer, RebuiltOptimizer
from torch_autotune.probe.workloads.workload import Workload

__all__ = [
    "LOADER_ARGUMENTS",
    "is_datamodule",
    "is_lightning_module",
    "lightning_workload",
    "uses_lightning",
]

LOADER_ARGUMENTS = (
    "batch_size",
    "num_workers",
    "pin_memory",
    "persistent_workers",
    "prefetch_factor",
)
"""A DataModule's ``__init__`` arguments that an export can set from the profile."""

_PACKAGES = ("lightning", "pytorch_lightning")
_UNCALLED_HOOKS = (
    "transfer_batch_to_device",
    "on_before_batch_transfer",
    "on_after_batch_transfer",
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "optimizer_step",
    "optimizer_zero_grad",
    "configure_gradient_clipping",
    "backward",
)
_FACTORY = "functools.partial(torch.optim.AdamW, lr=3e-4)"

# --- telling Lightning's objects apart, without importing it ---------------------------------


def _from_lightning(value: Any, class_name: str) -> bool:
    """Whether ``value`` (or a class) has Lightning's ``class_name`` among its bases."""
    kind = value if isinstance(value, type) else type(value)
    return any(
        k.__name__ == class_name and k.__module__.split(".")[0] in _PACKAGES for k in kind.__mro__
    )


def is_lightning_module(value: Any) -> bool:
    """Whether ``value`` is a ``LightningModule`` (of ``lightning`` or ``pytorch_lightning``),
    or such a class."""
    return _from_lightning(value, "LightningModule")


def is_datamodule(value: Any) -> bool:
    """Whether ``value`` is a ``LightningDataModule``."""
    return _from_lightning(value, "LightningDataModule")


def uses_lightning(fields: Mapping[str, Any]) -> bool:
    """Whether the protocol's ``fields`` need this module: a LightningModule or a datamodule."""
    return is_lightning_module(fields.get("model")) or fields.get("datamodule") is not None


def _overridden(obj: Any, hook: str) -> bool:
    """Whether ``obj``'s class defines ``hook`` itself, rather than inheriting Lightning's."""
    for klass in type(obj).__mro__:
        if hook in vars(klass):
            return klass.__module__.split(".")[0] not in _PACKAGES
    return False


# --- the user's hooks ------------------------------------------------------------------------


def _call_hook(obj: Any, hook: str, name: str, *args: Any) -> Any:
    """``obj.hook(*args)``, as the Trainer calls it before fitting; a failure is the user's."""
    what = f"{type(obj).__name__}.{hook}({', '.join(map(repr, args))})"
    try:
        return getattr(obj, hook)(*args)
    except Exception as error:
        fix = "give the probe what it needs without it (dataset=..., optimizer=...)"
        raise hook_failed(name, what, error, fix) from error


def _prepared(module: nn.Module, name: str) -> nn.Module:
    """A copy of the user's module after the hooks the Trainer calls before fitting."""
    prepared = copied(module, name)
    _call_hook(prepared, "prepare_data", name)
    _call_hook(prepared, "setup", name, "fit")
    _call_hook(prepared, "configure_model", name)
    return prepared.train()


# --- the optimizer from configure_optimizers ---------------------------------------------------


def _optimizers(result: Any, name: str) -> list[Any]:
    """The optimizers in what ``configure_optimizers()`` returned, in any form Lightning
    takes: an optimizer, a list of them, ``(optimizers, schedulers)``, a dict with
    ``"optimizer"`` (and ``"lr_scheduler"``), a list of such dicts; None: none."""
    if result is None:
        return []
    if isinstance(result, torch.optim.Optimizer):
        return [result]
    if isinstance(result, Mapping) and "optimizer" in result:
        return [result["optimizer"]]
    if isinstance(result, (list, tuple)):
        items = list(result)
        if len(items) == 2 and isinstance(items[0], (list, tuple)):
            items = list(items[0])
        if items and all(isinstance(i, Mapping) and "optimizer" in i for i in items):
            items = [i["optimizer"] for i in items]
        if all(isinstance(i, torch.optim.Optimizer) for i in items):
            return items
    raise WorkloadError(
        f"'{name}': configure_optimizers returned {_article(result)} that holds no optimizer"
        " Lightning knows; return an optimizer, a list of them, (optimizers, schedulers) or a"
        " dict with 'optimizer'"
    )


def _module_of(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, TrainingStep) else model


class _Configured:
    """``make(model) -> Optimizer`` for ``ModelOptimizer``: the one optimizer of the module's
    ``configure_optimizers()`` (the LightningModule inside a ``TrainingStep``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, model: nn.Module) -> Any:
        found = self.optimizers(_module_of(model))
        if len(found) != 1:
            kinds = _listed(type(o).__name__ for o in found) or "none"
            raise WorkloadError(
                f"'{self.name}': configure_optimizers returned {len(found)} optimizers"
                f" ({kinds}); the probe steps one over the whole model: give optimizer=... (such"
                f" as {_FACTORY}) and train_step(model, batch) -> loss"
            )
        return found[0]

    def optimizers(self, module: nn.Module) -> list[Any]:
        try:
            result = module.configure_optimizers()
        except Exception as error:
            fix = f"give optimizer=... (such as {_FACTORY}): a scheduler does not change the speed"
            raise hook_failed(self.name, "configure_optimizers", error, fix) from error
        return _optimizers(result, self.name)


def _model_optimizer(prepared: nn.Module, name: str) -> ModelOptimizer:
    """``configure_optimizers`` as the workload's optimizer, checked once on ``prepared``."""
    make = _Configured(name)
    return ModelOptimizer(make, name, make(prepared))


# --- the data --------------------------------------------------------------------------------


def _loader_arguments(datamodule: Any) -> tuple[str, ...]:
    """``LOADER_ARGUMENTS`` that the DataModule's ``__init__`` takes by name."""
    try:
        taken = inspect.signature(type(datamodule).__init__).parameters
    except (TypeError, ValueError):
        return ()
    return tuple(a for a in LOADER_ARGUMENTS if a in taken)


def _train_loader(owner: Any, name: str) -> Any:
    """``owner.train_dataloader()``: one DataLoader (a LightningModule's or a DataModule's)."""
    from torch.utils.data import DataLoader

    loader = _call_hook(owner, "train_dataloader", name)
    if not isinstance(loader, DataLoader):
        raise WorkloadError(
            f"'{name}': {type(owner).__name__}.train_dataloader() returned {_article(loader)},"
            " not one torch DataLoader; the probe measures one: give dataset=... (or loader=...)"
        )
    return loader


def _data(fields: dict[str, Any], prepared: nn.Module | None, name: str) -> tuple[str, ...]:
    """Put the train DataLoader in ``fields`` (as ``loader``): the datamodule's, else the
    module's own; the DataModule's loader arguments for the export."""
    datamodule = fields.pop("datamodule", None)
    given = [key for key in ("dataset", "loader", "example_batch") if key in fields]
    if datamodule is not None:
        if given:
            raise WorkloadError(f"'{name}': give 'datamodule' or {_listed(given)}, not both")
        if not callable(getattr(datamodule, "train_dataloader", None)):
            raise WorkloadError(
                f"'{name}': 'datamodule' is {_article(datamodule)}, not a LightningDataModule"
                " (one with train_dataloader())"
            )
        _call_hook(datamodule, "prepare_data", name)
        _call_hook(datamodule, "setup", name, "fit")
        fields["loader"] = _train_loader(datamodule, name)
        return _loader_arguments(datamodule)
    if given or prepared is None:
        return ()
    if not _overridden(prepared, "train_dataloader"):
        raise WorkloadError(
            f"'{name}': {type(prepared).__name__} has no train_dataloader() of its own; give its"
            " LightningDataModule: tune(module, datamodule=dm), or {'model': module,"
            " 'datamodule': dm} from a factory"
        )
    fields["loader"] = _train_loader(prepared, name)
    return ()


# --- the workload ----------------------------------------------------------------------------


def lightning_workload(
    fields: Mapping[str, Any], name: str, build: Callable[[dict[str, Any]], Workload]
) -> Workload:
    """The ``Workload`` of a LightningModule and/or a DataModule (the module docstring):
    ``fields`` are the protocol's, ``build`` makes a Workload of plain fields
    (``protocol._user_workload``); what is Lightning's is put in before and after."""
    own = dict(fields)
    module = own.get("model") if is_lightning_module(own.get("model")) else None
    if isinstance(module, type):
        raise WorkloadError(
            f"'{name}': 'model' is the class {module.__name__}; give the LightningModule itself"
            f" ({module.__name__}(...)), as you would give it to trainer.fit()"
        )
    prepared = None if module is None else _prepared(module, name)
    arguments = _data(own, prepared, name)
    custom = "train_step" in own or "loss_fn" in own
    if prepared is not None:
        if not custom and not prepared.automatic_optimization:
            raise WorkloadError(
                f"'{name}': {type(prepared).__name__} uses manual optimization"
                " (automatic_optimization = False): its training_step steps its own optimizers,"
                " which the probe cannot time apart; give train_step(model, batch) -> loss and"
                f" optimizer=... (such as {_FACTORY})"
            )
        own["model"] = prepared if custom else TrainingStep(prepared, name)
        if "optimizer" not in own:
            own["optimizer"] = _model_optimizer(prepared, name)
        elif isinstance(own["optimizer"], torch.optim.Optimizer):  # over the user's module
            own["optimizer"] = RebuiltOptimizer(own["optimizer"], module, name)
    workload = build(own)
    if prepared is None or custom:
        step: Any = workload.train_step if prepared is None else QuietStep(workload.train_step)
    else:
        step = LightningStep(name)
    details = _LightningDetails(workload.details, prepared, arguments, custom)
    details.own_step = step if isinstance(step, LightningStep) else None
    return dataclasses.replace(workload, train_step=step, details=details)


class _LightningDetails:
    """``Workload.details`` with what is Lightning's: the framework, the module's class, how it
    is called, the DataModule's loader arguments, and the hooks not called."""

    def __init__(
        self,
        inner: Callable[[], WorkloadDetails] | None,
        prepared: nn.Module | None,
        arguments: tuple[str, ...],
        custom: bool,
    ) -> None:
        self.inner = inner
        self.prepared = prepared
        self.arguments = arguments
        self.custom = custom
        self.own_step: LightningStep | None = None  # training_step's, where it trains

    def __call__(self) -> WorkloadDetails:
        found = (
            self.inner() if self.inner is not None else WorkloadDetails(source="objects", batch="")
        )
        update: dict[str, Any] = {"framework": "lightning", "loader_arguments": self.arguments}
        module = self.prepared
        if module is not None:
            update["model"] = type(module).__qualname__
            uncalled = [hook for hook in _UNCALLED_HOOKS if _overridden(module, hook)]
            notes = list(found.notes)
            if uncalled:
                notes.append(
                    f"hooks of the module the probe does not call (it moves the batch and steps"
                    f" the optimizer itself): {_listed(uncalled)}"
                )
            if self.own_step is not None:  # the inner details read a step that never ran
                notes += not_finite(self.own_step.last_loss)
            update["notes"] = tuple(notes)
            if not self.custom:
                update["call"] = "training_step(batch, batch_idx)"
                update["loss"] = "training_step's"
        return found.model_copy(update=update)
