"""What a user's factory returns, checked and made a ``Workload`` (``as_workload``).

A ``Workload``, a mapping or an object with the protocol's fields (see the package docstring);
each field is checked, and the user's model and optimizer factories are wrapped so that their
failures and wrong results are ``WorkloadError``. Importing this module does not import torch.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torch_autotune.errors import WorkloadError, user_code_failed
from torch_autotune.probe.workloads.batches import _DatasetBatches, _RepeatedBatch
from torch_autotune.probe.workloads.losses import _default_loss
from torch_autotune.probe.workloads.messages import (
    _article,
    _describe_sample,
    _exception,
    _listed,
    _perhaps,
)
from torch_autotune.probe.workloads.workload import (
    KINDS,
    Kind,
    MapDataset,
    Workload,
    _is_positive_int,
)

if TYPE_CHECKING:
    from torch import Tensor
    from torch.nn import Module, Parameter
    from torch.optim import Optimizer

__all__ = ["as_workload"]

_README = "a factory returns model, optimizer and a dataset or example_batch (see the README)"


_FIELDS = ("model", "optimizer", "dataset", "example_batch", "loss_fn", "kind", "max_batch_size")


def as_workload(result: Any, *, name: str) -> Workload:
    """Check a factory's result and make it a ``Workload`` (see the module docstring).

    ``result`` is a ``Workload`` (returned as it is), a mapping, or an object with the
    protocol's attributes. ``name`` names the workload in reports and in error messages.
    """
    from torch import nn

    if isinstance(result, Workload):
        return result
    if isinstance(result, Mapping):
        fields = _mapping_fields(result, name)
    elif not isinstance(result, nn.Module) and any(hasattr(result, f) for f in _FIELDS):
        fields = {f: getattr(result, f) for f in _FIELDS if hasattr(result, f)}
    else:
        raise WorkloadError(
            f"'{name}' returned {_article(result)}; a factory returns a Workload or a dict"
            " with model, optimizer and a dataset or example_batch (see the README)"
        )
    return _user_workload({k: v for k, v in fields.items() if v is not None}, name, result)


def _mapping_fields(result: Mapping[Any, Any], name: str) -> dict[str, Any]:
    """The protocol's fields of a mapping; an unknown key is an error (likely a typo)."""
    for key in result:
        if key not in _FIELDS:
            raise WorkloadError(
                f"'{name}' returned a {type(result).__name__} with the unknown key {key!r}"
                f"{_perhaps(str(key), _FIELDS) or f'; the keys are {_listed(_FIELDS)}'}"
            )
    return dict(result)


def _user_workload(fields: dict[str, Any], name: str, result: object) -> Workload:
    """Build the ``Workload`` from the protocol's fields, checking each."""
    container = type(result).__name__
    for required in ("model", "optimizer"):
        if required not in fields:
            raise WorkloadError(f"'{name}' returned a {container} without '{required}'; {_README}")
    if "dataset" not in fields and "example_batch" not in fields:
        raise WorkloadError(
            f"'{name}' returned a {container} with neither 'dataset' nor 'example_batch'; {_README}"
        )
    dataset = _checked_dataset(fields["dataset"], name) if "dataset" in fields else None
    batches: _RepeatedBatch | _DatasetBatches
    if "example_batch" in fields:
        batches = _RepeatedBatch(*_checked_batch(fields["example_batch"], name))
        if dataset is not None:
            _DatasetBatches(dataset, name)(1)  # its samples are (inputs, targets) pairs
    else:
        batches = _DatasetBatches(fields["dataset"], name)
    inputs, targets = batches(2)  # two samples: a dataset's must also batch together
    return Workload(
        name=name,
        kind=_checked_kind(fields.get("kind", "other"), name),
        make_model=_model_builder(fields["model"], name),
        make_optimizer=_OptimizerBuilder(fields["optimizer"], name),
        make_batch=batches,
        dataset=dataset,
        loss_fn=_checked_callable(fields, "loss_fn", name) or _default_loss(targets),
        sample_shape=f"inputs {_describe_sample(inputs)}, targets {_describe_sample(targets)}",
        max_batch_size=_checked_max_batch_size(fields, dataset, name),
    )


def _checked_kind(kind: Any, name: str) -> Kind:
    if kind not in KINDS:
        raise WorkloadError(
            f"'{name}': kind {kind!r} is not one of {_listed(KINDS)}{_perhaps(str(kind), KINDS)}"
        )
    return kind  # type: ignore[no-any-return]


def _checked_callable(fields: Mapping[str, Any], key: str, name: str) -> Any:
    value = fields.get(key)
    if value is not None and not callable(value):
        raise WorkloadError(f"'{name}': '{key}' is {_article(value)}, not a function")
    return value


def _checked_max_batch_size(
    fields: Mapping[str, Any], dataset: MapDataset | None, name: str
) -> int | None:
    size = fields.get("max_batch_size")
    if size is None:
        return len(dataset) if dataset is not None else None
    if not _is_positive_int(size):
        raise WorkloadError(f"'{name}': 'max_batch_size' must be a positive int, not {size!r}")
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


def _checked_batch(batch: Any, name: str) -> tuple[Tensor, Tensor]:
    """An ``(inputs, targets)`` pair of tensors with the same number of samples (dim 0)."""
    import torch

    if not (isinstance(batch, Sequence) and len(batch) == 2) or not all(
        isinstance(t, torch.Tensor) for t in batch
    ):
        raise WorkloadError(
            f"'{name}': 'example_batch' is {_article(batch)}; give an (inputs, targets) tuple"
            " of two tensors"
        )
    inputs, targets = batch
    if inputs.dim() == 0 or targets.dim() == 0 or inputs.shape[0] != targets.shape[0]:
        raise WorkloadError(
            f"'{name}': 'example_batch' has inputs {tuple(inputs.shape)} and targets"
            f" {tuple(targets.shape)}; both need the same number of samples on dim 0"
        )
    if inputs.shape[0] < 1:
        raise WorkloadError(f"'{name}': 'example_batch' holds no samples")
    return inputs.detach(), targets.detach()


def _model_builder(model: Any, name: str) -> Callable[[], Module]:
    """``make_model`` from a module (copied each call) or from a function that builds one."""
    from torch import nn

    if isinstance(model, nn.Module):
        return _ModelCopies(model, name)
    if callable(model):
        return _ModelBuilder(model, name)
    raise WorkloadError(
        f"'{name}': 'model' is {_article(model)}; give an nn.Module or a function that builds one"
    )


class _ModelCopies:
    """A fresh deep copy of the user's model at every call; the original is never trained."""

    def __init__(self, template: Module, name: str) -> None:
        self.template = template
        self.name = name

    def __call__(self) -> Module:
        try:
            return copy.deepcopy(self.template)
        except Exception as exc:
            raise WorkloadError(
                f"'{self.name}': the model cannot be copied ({_exception(exc)}); give 'model'"
                " as a function that builds a fresh model"
            ) from exc


class _ModelBuilder:
    """The user's model function, its failures and wrong results made ``WorkloadError``."""

    def __init__(self, build: Callable[[], Any], name: str) -> None:
        self.build = build
        self.name = name

    def __call__(self) -> Module:
        from torch import nn

        try:
            model = self.build()
        except Exception as exc:
            raise user_code_failed(
                f"'{self.name}': building the model raised {_exception(exc)}; fix the model"
                " function",
                exc,
            ) from exc
        if not isinstance(model, nn.Module):
            raise WorkloadError(
                f"'{self.name}': the model function returned {_article(model)}, not an nn.Module"
            )
        return model


class _OptimizerBuilder:
    """The user's optimizer factory, checked: keyword arguments, failures, result type.

    It carries the factory's signature, so ``Workload.optimizer_accepts`` reads the user's.
    """

    def __init__(self, factory: Any, name: str) -> None:
        import torch

        if isinstance(factory, torch.optim.Optimizer):
            raise WorkloadError(
                f"'{name}': 'optimizer' is {_article(factory)} already built; give a factory"
                " (params -> optimizer), e.g. functools.partial(torch.optim.AdamW, lr=3e-4):"
                " every trial builds a fresh one"
            )
        if not callable(factory):
            raise WorkloadError(
                f"'{name}': 'optimizer' is {_article(factory)}; give a function params ->"
                " optimizer, e.g. functools.partial(torch.optim.AdamW, lr=3e-4)"
            )
        self.factory = factory
        self.name = name
        # Unreadable (a builtin): no __signature__, so Workload.optimizer_accepts assumes yes.
        with contextlib.suppress(TypeError, ValueError):
            self.__signature__ = inspect.signature(factory)

    def __call__(self, params: Iterable[Parameter], /, **kwargs: Any) -> Optimizer:
        import torch

        signature = getattr(self, "__signature__", None)
        if kwargs and signature is not None:
            try:
                signature.bind(params, **kwargs)
            except TypeError as exc:
                raise WorkloadError(
                    f"'{self.name}': the optimizer factory does not take {_listed(kwargs)}"
                    " as keyword arguments; write it as e.g. functools.partial("
                    "torch.optim.AdamW, lr=3e-4) or lambda params, **kw: ...(params, **kw)"
                ) from exc
        try:
            optimizer = self.factory(params, **kwargs)
        except Exception as exc:
            raise user_code_failed(
                f"'{self.name}': the optimizer factory raised {_exception(exc)}", exc
            ) from exc
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise WorkloadError(
                f"'{self.name}': the optimizer factory returned {_article(optimizer)}, not a"
                " torch.optim.Optimizer"
            )
        return optimizer
