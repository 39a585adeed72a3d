"""Which workload to probe, from any form the user gives it in: a built-in name, a factory
reference or function, a mapping, objects, or the profile a workload was measured on.

Importing this module does not import torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch_autotune.errors import ProbeError, WorkloadError
from torch_autotune.probe.workloads.builtins import (
    BUILTIN_WORKLOADS,
    DEFAULT_WORKLOAD,
    default_workload,
)
from torch_autotune.probe.workloads.factory import call_factory, load_workload
from torch_autotune.probe.workloads.messages import _article, _listed, _perhaps
from torch_autotune.probe.workloads.protocol import (
    BlocksChecked,
    _is_module,
    as_workload,
    checked_blocks,
    default_name,
)
from torch_autotune.probe.workloads.workload import Workload

if TYPE_CHECKING:
    from torch_autotune.profile import Profile

__all__ = ["measured_on", "objects_name", "resolve_workload", "workload_of"]


def resolve_workload(
    choice: Any = None,
    *,
    device: str | None = None,
    objects: Mapping[str, Any] | None = None,
    name: str | None = None,
    min_batch_size: int | None = None,
    blocks: Any = None,
) -> Workload:
    """The workload to probe, from any form the user gives it in.

    ``choice``: a built-in name, ``"package.module:factory"``, a ``Workload``, a factory
    function (called with no arguments; named ``module:function`` as ``autotune -m`` names
    it), a mapping of the protocol's fields, or an object that holds them. ``objects``: the
    protocol's fields as ``tune()``'s keyword arguments (``model=..., dataset=...``), instead of
    ``choice``, or beside a module given as ``choice`` (``tune(module, datamodule=dm)``).
    ``name`` names a workload given as objects (default: its model's class). With neither, the
    default built-in for ``device`` (``default_workload``), or ``DEFAULT_WORKLOAD`` when no
    device is named. The user's code that runs here (their factory, the copy of their model,
    their dataset's first samples) may draw from the RNG: every RNG is put back, so ``tune()``
    leaves the script's random stream as it was. ``min_batch_size`` replaces the workload's own,
    and ``blocks`` (the classes of the model's blocks) its own, checked against the model where
    it is given as a module.
    """
    chosen = _resolved(choice, device=device, objects=objects, name=name)
    if min_batch_size is not None:
        chosen = dataclasses.replace(chosen, min_batch_size=min_batch_size)
    if blocks is not None:
        model = (objects or {}).get("model", choice)
        template = model if _is_module(model) else None
        names = checked_blocks(blocks, template, chosen.name)
        make = chosen.make_model
        if template is None:  # a factory's or a built-in's model: checked when first built
            make = BlocksChecked(make, names, chosen.name)
        chosen = dataclasses.replace(chosen, blocks=names, make_model=make)
    return chosen


def _resolved(
    choice: Any, *, device: str | None, objects: Mapping[str, Any] | None, name: str | None
) -> Workload:
    if objects and choice is not None and "model" not in objects and _is_module(choice):
        objects, choice = {"model": choice, **objects}, None  # tune(module, datamodule=dm)
    if objects and choice is not None:
        raise WorkloadError(
            f"give the workload ({_article(choice)}) or its objects ({_listed(objects)}), not both"
        )
    if isinstance(choice, Workload):
        return choice
    if choice is None and not objects:
        chosen = DEFAULT_WORKLOAD if device is None else default_workload(device)
        return dataclasses.replace(BUILTIN_WORKLOADS[chosen](), rebuild=chosen)
    if isinstance(choice, str) and ":" not in choice:
        return _named(choice)
    from torch_autotune.probe.state import preserved

    with preserved():  # the user's factory, model and dataset run here: every RNG put back
        return _users(choice, objects, name)


def _users(choice: Any, objects: Mapping[str, Any] | None, name: str | None) -> Workload:
    """The workload from the user's objects, mapping, factory or object (``resolve_workload``)."""
    if objects:
        return as_workload(dict(objects), name=name or default_name(objects), source="objects")
    if isinstance(choice, str):
        return load_workload(choice)
    if isinstance(choice, Mapping):
        return as_workload(choice, name=name or default_name(choice), source="objects")
    if _is_function(choice):
        spec = f"{getattr(choice, '__module__', '?')}:{getattr(choice, '__qualname__', '?')}"
        made = as_workload(call_factory(spec, choice), name=name or spec)
        importable = not spec.startswith(("__main__:", "?")) and "<" not in spec
        return dataclasses.replace(made, rebuild=spec) if importable else made
    return as_workload(choice, name=name or default_name({"model": choice}), source="objects")


def _is_function(value: Any) -> bool:
    """Whether ``value`` is a factory to call (a function, a method, a ``functools.partial``),
    not an object to train: an ``nn.Module`` or a Trainer is callable too."""
    import functools
    import inspect

    return (
        inspect.isfunction(value) or inspect.ismethod(value) or isinstance(value, functools.partial)
    )


def _named(choice: str) -> Workload:
    if choice in BUILTIN_WORKLOADS:
        return dataclasses.replace(BUILTIN_WORKLOADS[choice](), rebuild=choice)
    raise WorkloadError(
        f"'{choice}' is neither a built-in workload ({_listed(BUILTIN_WORKLOADS)}) nor a"
        f" package.module:factory reference{_perhaps(choice, BUILTIN_WORKLOADS)}"
    )


def workload_of(profile: Profile) -> Workload:
    """The workload ``profile`` was measured on, built again from its name; a profile measured
    on objects given to ``tune()`` cannot be: they are asked for."""
    name = measured_on(profile)
    details = profile.evidence.details if profile.evidence is not None else None
    if details is not None and details.source == "objects":
        raise WorkloadError(
            f"the profile was measured on objects given to tune() ('{name}'), which cannot be"
            " built again from their name; give them to the bench too: bench(profile,"
            " workload={'model': ..., 'optimizer': ..., 'dataset': ...})"
        )
    return resolve_workload(name)


def objects_name(profile: Profile | None) -> str | None:
    """The name ``profile`` was measured under where it was measured on objects given to
    ``tune()``: the same objects given to the bench are named as the profile names them."""
    evidence = None if profile is None else profile.evidence
    if evidence is None or evidence.details is None or evidence.details.source != "objects":
        return None
    return evidence.workload


def measured_on(profile: Profile) -> str:
    """The workload ``profile`` was measured on; a rules-only profile cannot be benched."""
    if profile.evidence is None:
        raise ProbeError(
            "this profile was not measured (rules only): the bench needs the batch size the "
            "probe ran; run 'autotune' first"
        )
    return profile.evidence.workload
