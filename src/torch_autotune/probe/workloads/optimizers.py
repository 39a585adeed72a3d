"""The optimizer of each trial, over the parameters of the model that trial trains.

Every trial trains a fresh copy of the user's model, so its optimizer must be built over that
copy: ``make_optimizer(model, **options)``, the probe's options (``fused=True``) passed where
the optimizer takes them. The user gives one of:

- a factory ``(params, **kwargs) -> Optimizer`` (``functools.partial(torch.optim.AdamW,
  lr=3e-4)``): ``FactoryOptimizer`` calls it with the copy's parameters;
- an optimizer object already built over their model: ``RebuiltOptimizer`` builds one of the
  same class over the copy, with the same parameter groups and hyperparameters, the copy's
  parameters put in the place of the original's (matched by their position in
  ``model.parameters()``);
- a function of the model (Lightning's ``configure_optimizers``): ``ModelOptimizer``.

Whatever it is, the optimizer must hold the parameters of the model being trained: one that
holds another model's (built over the original while the probe trains a copy) would train
nothing, silently. ``check_holds`` refuses it. ``optimizer_kind`` names the optimizer for
the rules (``adamw``, ``adam``, ``sgd``, ``other``). Importing this module does not import
torch.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch_autotune.errors import WorkloadError, user_code_failed
from torch_autotune.probe.workloads.messages import _article, _exception, _listed

if TYPE_CHECKING:
    from torch.nn import Module
    from torch.optim import Optimizer

__all__ = [
    "FactoryOptimizer",
    "ModelOptimizer",
    "RebuiltOptimizer",
    "check_holds",
    "fused_by",
    "optimizer_builder",
    "optimizer_kind",
    "probe_kind",
]

_KINDS = {"AdamW": "adamw", "Adam": "adam", "SGD": "sgd"}
_FACTORY_EXAMPLE = "functools.partial(torch.optim.AdamW, lr=3e-4)"


def optimizer_kind(optimizer: Any) -> str:
    """``adamw``, ``adam``, ``sgd`` for torch's own classes (and their subclasses), else
    ``other``; ``optimizer`` is an optimizer or its class."""
    kind = optimizer if isinstance(optimizer, type) else type(optimizer)
    for klass in kind.__mro__:
        if klass.__module__.startswith("torch.optim") and klass.__name__ in _KINDS:
            return _KINDS[klass.__name__]
    return "other"


def _unwrapped(model: Module) -> Module:
    return getattr(model, "_orig_mod", model)


def check_holds(optimizer: Any, model: Module, name: str) -> Any:
    """``optimizer`` if it is a torch optimizer over parameters of ``model``; WorkloadError
    for anything else, or for one that holds parameters of another model."""
    import torch

    if not isinstance(optimizer, torch.optim.Optimizer):
        raise WorkloadError(
            f"'{name}': the optimizer is {_article(optimizer)}, not a torch.optim.Optimizer"
        )
    own = {id(p) for p in _unwrapped(model).parameters()}
    held = [p for group in optimizer.param_groups for p in group["params"]]
    foreign = [p for p in held if id(p) not in own]
    if foreign or not held:
        what = "no parameters" if not held else f"{len(foreign)} of its {len(held)} parameters"
        raise WorkloadError(
            f"'{name}': the optimizer holds {what} that are not the model's being trained: it"
            " was built over another model (the probe trains a fresh copy of yours for every"
            " trial, and would train nothing); give the optimizer object itself (it is rebuilt"
            f" over each copy) or a factory such as {_FACTORY_EXAMPLE}"
        )
    return optimizer


class FactoryOptimizer:
    """The user's factory ``(params, **kwargs) -> Optimizer``, called with the copy's
    parameters. It carries the factory's signature, so ``accepts`` reads the user's."""

    def __init__(self, factory: Callable[..., Any], name: str) -> None:
        self.factory = factory
        self.name = name
        self.built: str | None = None  # the class of the last optimizer it made
        self.signature: inspect.Signature | None = None
        with contextlib.suppress(TypeError, ValueError):
            self.signature = inspect.signature(factory)

    def accepts(self, **kwargs: object) -> bool:
        """Whether the factory takes these keyword arguments (True where it cannot be read)."""
        if self.signature is None:
            return True
        try:
            self.signature.bind(object(), **kwargs)
        except TypeError:
            return False
        return True

    def __call__(self, model: Module, /, **kwargs: Any) -> Optimizer:
        if kwargs and not self.accepts(**kwargs):
            raise WorkloadError(
                f"'{self.name}': the optimizer factory does not take {_listed(kwargs)} as"
                f" keyword arguments; write it as e.g. {_FACTORY_EXAMPLE} or lambda params,"
                " **kw: ...(params, **kw)"
            )
        try:
            optimizer = self.factory(_unwrapped(model).parameters(), **kwargs)
        except Exception as exc:
            raise user_code_failed(
                f"'{self.name}': the optimizer factory raised {_exception(exc)}", exc
            ) from exc
        self.built = type(optimizer).__name__
        return check_holds(optimizer, model, self.name)


def _groups(optimizer: Any) -> list[dict[str, Any]]:
    """The optimizer's parameter groups as (hyperparameters, parameters) dicts."""
    return [dict(group) for group in optimizer.param_groups]


def _takes(klass: type, **kwargs: object) -> bool:
    """Whether the optimizer class's constructor takes these keyword arguments."""
    try:
        inspect.signature(klass).bind(object(), **kwargs)
    except TypeError:
        return False
    except ValueError:
        return True
    return True


def rebuild(optimizer: Any, parameters: Mapping[int, Any], name: str, **kwargs: Any) -> Any:
    """An optimizer of ``optimizer``'s class and parameter groups, each parameter replaced by
    ``parameters[id(original)]``, with ``kwargs`` (``fused=True``) set in every group."""
    klass = type(optimizer)
    groups = []
    for group in _groups(optimizer):
        params = [parameters[id(p)] for p in group.pop("params")]
        groups.append({**group, **kwargs, "params": params})
    try:
        return klass(groups, **kwargs)
    except Exception as exc:
        raise WorkloadError(
            f"'{name}': a {klass.__name__} like yours cannot be built over the probe's copy of the"
            f" model ({_exception(exc)}); give a factory such as {_FACTORY_EXAMPLE}"
        ) from exc


class RebuiltOptimizer:
    """An optimizer object the user built over ``template``, rebuilt over each copy of it."""

    def __init__(self, optimizer: Any, template: Module, name: str) -> None:
        self.name = name
        check_holds(optimizer, template, name)
        self.optimizer = optimizer
        self.built = type(optimizer).__name__
        self.order = {id(p): i for i, p in enumerate(template.parameters())}

    def accepts(self, **kwargs: object) -> bool:
        return _takes(type(self.optimizer), **kwargs)

    def __call__(self, model: Module, /, **kwargs: Any) -> Optimizer:
        params = list(_unwrapped(model).parameters())
        if len(params) != len(self.order):
            raise WorkloadError(
                f"'{self.name}': the copy of the model has {len(params)} parameters and the"
                f" original {len(self.order)}; give the optimizer as a factory such as"
                f" {_FACTORY_EXAMPLE}"
            )
        mapping = {key: params[index] for key, index in self.order.items()}
        rebuilt = rebuild(self.optimizer, mapping, self.name, **kwargs)
        self.built = type(rebuilt).__name__
        return check_holds(rebuilt, model, self.name)


class ModelOptimizer:
    """An optimizer made from the model itself: ``make(module) -> Optimizer`` (Lightning's
    ``configure_optimizers``), rebuilt with the probe's options where they are asked for.
    ``sample``: one it made, checked when the workload was built (its class, and its kernel:
    ``fused_by``)."""

    def __init__(self, make: Callable[[Any], Any], name: str, sample: Any = None) -> None:
        self.make = make
        self.name = name
        self.sample = sample
        self.klass = None if sample is None else type(sample)
        self.built = None if self.klass is None else self.klass.__name__

    def accepts(self, **kwargs: object) -> bool:
        return self.klass is None or _takes(self.klass, **kwargs)

    def __call__(self, model: Module, /, **kwargs: Any) -> Optimizer:
        module = _unwrapped(model)
        optimizer = check_holds(self.make(module), model, self.name)
        self.built = type(optimizer).__name__
        if not kwargs:
            return optimizer
        own = {id(p): p for p in module.parameters()}
        return check_holds(rebuild(optimizer, own, self.name, **kwargs), model, self.name)


def optimizer_builder(value: Any, template: Module | None, name: str) -> Any:
    """The builder for what the user gave as ``optimizer``: an object (rebuilt over each
    copy of ``template``) or a factory; a builder of this module is returned as it is."""
    import torch

    if isinstance(value, (FactoryOptimizer, RebuiltOptimizer, ModelOptimizer)):
        return value  # a builder already (Lightning's configure_optimizers)
    if isinstance(value, torch.optim.Optimizer):
        if template is None:
            raise WorkloadError(
                f"'{name}': 'optimizer' is {_article(value)} already built, but 'model' is a"
                " function that builds a new model; give the optimizer as a factory such as"
                f" {_FACTORY_EXAMPLE}"
            )
        return RebuiltOptimizer(value, template, name)
    if not callable(value):
        raise WorkloadError(
            f"'{name}': 'optimizer' is {_article(value)}; give an optimizer, or a function"
            f" params -> optimizer such as {_FACTORY_EXAMPLE}"
        )
    return FactoryOptimizer(value, name)


def probe_kind(builder: Any, template: Module | None) -> str:
    """The kind of optimizer ``builder`` makes (``optimizer_kind``), asked without training:
    from the object it rebuilds, or by building one over a throwaway parameter."""
    import torch

    if isinstance(builder, RebuiltOptimizer):
        return optimizer_kind(builder.optimizer)
    if isinstance(builder, ModelOptimizer) and builder.klass is not None:
        return optimizer_kind(builder.klass)
    if isinstance(builder, FactoryOptimizer):
        with contextlib.suppress(Exception):  # a factory that needs the real model: unknown
            return optimizer_kind(builder.factory([torch.nn.Parameter(torch.zeros(1))]))
    return "other"


def fused_by(builder: Any) -> str | None:
    """What builds the workload's optimizer with the fused kernel whatever the profile says,
    in words ("your Trainer's optim='adamw_torch_fused'"); None where the profile decides.

    An optimizer built with ``fused=True`` keeps it: the probe passes ``fused=True`` where the
    profile fuses and nothing where it does not (``probe.step.make_optimizer``), so it trains fused
    either way, and the profile must say so. Read from the object given, the one a model's
    ``configure_optimizers`` or a Trainer made (``ModelOptimizer.sample``), or one a factory
    builds over a throwaway parameter. The words are the maker's own (``fused_words``) where it
    has them."""
    import torch

    maker: Any = builder
    sample: Any = None
    if isinstance(builder, RebuiltOptimizer):
        sample = builder.optimizer
    elif isinstance(builder, ModelOptimizer):
        maker, sample = builder.make, builder.sample
    elif isinstance(builder, FactoryOptimizer):
        maker = builder.factory
        with contextlib.suppress(Exception):  # a factory that needs the real model: unknown
            sample = builder.factory([torch.nn.Parameter(torch.zeros(1))])
    defaults = getattr(sample, "defaults", None)
    if not isinstance(defaults, Mapping) or defaults.get("fused") is not True:
        return None
    words = getattr(maker, "fused_words", None)
    if isinstance(words, str):
        return words
    klass = type(sample).__name__
    if isinstance(builder, RebuiltOptimizer):
        return f"your optimizer, {_article(sample)} built with fused=True"
    if isinstance(builder, ModelOptimizer):
        return f"the model's configure_optimizers, which builds {klass}(..., fused=True)"
    return f"your optimizer factory, which builds {klass}(..., fused=True)"
