"""The forward pass and the loss of one training step, for any batch: ``train_step(model,
batch) -> loss``. The probe does the rest of the step (autocast around this, backward, the
optimizer step).

``StructuredStep`` calls the model the way the batch's structure says:

=====================================  ===============================  ==================
batch                                  the model is called as           targets
=====================================  ===============================  ==================
a mapping (dict, ``BatchEncoding``)    ``model(**batch)``               none (see below)
``(inputs, targets)``                  ``model(inputs)``;               ``targets``
                                       ``model(*inputs)`` for a tuple
                                       or list, ``model(**inputs)``
                                       for a mapping;
                                       ``model(inputs, targets)`` where
                                       forward takes them (below)
``(a, b, ..., targets)``, 3 or more    ``model(a, b, ...)``             the last item
a tensor, ``(inputs,)``, other         ``model(batch)``                 none
=====================================  ===============================  ==================

A mapping's keys are passed as the model's ``forward`` takes them: keys it has no parameter
for are left out, as Hugging Face's Trainer leaves out dataset columns (a model whose forward
takes only ``**kwargs`` gets every key), and ``label`` or ``label_ids`` is passed as
``labels`` to a forward that takes ``labels``, as Hugging Face's collators rename it. With a
``loss_fn``, a mapping's ``labels`` (or ``label``, ``targets``, ``target``, ``y``) are its
targets and are not passed to the model; without one, such a key that the model's forward
takes no argument for (``{"x": ..., "label": ...}`` for a ``forward(self, x)``) is the
targets of the default loss, as the second item of ``(inputs, targets)`` is.

A tensor's targets go to the model as well where its ``forward`` has a second parameter
without a default (``forward(self, x, y)`` cannot run without them), or, with no
``loss_fn``, one named as targets are (``labels``, ``label``, ``targets``, ``target``, ``y``:
nanoGPT's ``forward(idx, targets=None)`` computes its own loss from them, and returns it last,
``(logits, loss)``, which is then its loss).

The loss, in this order: the model's own where it returns one (a 0-d tensor, ``outputs.loss``
of a Hugging Face ``ModelOutput``, a ``"loss"`` key, a tuple that starts with a 0-d tensor);
else ``loss_fn(outputs, targets)`` when one is given (``loss_fn(outputs, batch)`` where the
batch has no targets); else the default for its targets (``losses._default_loss``:
cross-entropy for integer classes, MSE otherwise) on a tensor output. A mapping's labels go
to ``loss_fn`` rather than to the model where one is given, so a Hugging Face model then
computes no loss of its own and ``loss_fn`` is what trains. Where none applies,
``WorkloadError`` says to give ``loss_fn`` or ``train_step``: never a traceback of ours. The
evidence records which it was (``loss_source``).

``UserStep`` is the user's own ``train_step(model, batch) -> loss``. Errors raised in the
user's code (their model, loss or step) are marked as theirs (``errors.blame_user_code``),
with how the model was called (``call_of``); errors in ours are ``WorkloadError``. Importing
this module does not import torch.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch_autotune.errors import USER_CODE_NOTE, WorkloadError, blame_user_code
from torch_autotune.probe.workloads.losses import _default_loss
from torch_autotune.probe.workloads.messages import _article, _exception, _listed

if TYPE_CHECKING:
    from torch import Tensor
    from torch.nn import Module

__all__ = ["LABEL_KEYS", "StructuredStep", "UserStep", "call_of", "model_loss"]

LABEL_KEYS = ("labels", "label", "targets", "target", "y")
"""A mapping's keys that hold the targets, in the order they are looked for."""
_RENAMED_TO_LABELS = ("label", "label_ids")
_CALL = "_torch_autotune_call"


def call_of(error: BaseException) -> str | None:
    """How the model was called when ``error`` was raised (``model(**batch)`` with the keys),
    for the line the command prints under the user's traceback; None where it was not."""
    found = getattr(error, _CALL, None)
    return found if isinstance(found, str) else None


def _mark(error: BaseException, call: str) -> None:
    """Mark ``error`` as the user's (``errors.blame_user_code``), with how the model was
    called, also as a note on it (Python 3.11+) for a caller of ``tune()``, who otherwise got
    their error with the probe's frames over it and no word of how the probe had called their
    code (the command line prints its own line, and leaves the note out)."""
    from torch_autotune.probe.oom import is_out_of_memory

    blame_user_code(error)
    with contextlib.suppress(AttributeError, TypeError):  # a type with __slots__
        setattr(error, _CALL, call)
        if is_out_of_memory(error) or not hasattr(error, "add_note"):
            return  # the probe's to handle: a batch that is too big
        if not getattr(error, "__notes__", None):
            fix = (
                "fix your train_step, the model or its data"
                if call.startswith("train_step")
                else "fix the model or its data, or give tune() train_step(model, batch) -> "
                "loss to call the model as your training does"
            )
            error.add_note(
                f"{USER_CODE_NOTE}the probe's training step raised this in {call} (not out of "
                f"memory, so not a batch that is too big): {fix}"
            )


def _unwrapped(model: Module) -> Module:
    """The module itself under ``torch.compile``'s wrapper and DistributedDataParallel's (its
    forward's signature): compile wraps DDP, which wraps the model."""
    module = getattr(model, "_orig_mod", model)
    if type(module).__name__ == "DistributedDataParallel":
        module = getattr(module, "module", module)
    return module


class _Keywords:
    """Which keyword arguments a model's ``forward`` takes, read once per model class."""

    def __init__(self) -> None:
        self._known: dict[type, tuple[frozenset[str], bool]] = {}
        self._required: dict[type, frozenset[str]] = {}
        self._second: dict[type, tuple[str, bool] | None] = {}

    def second(self, model: Module) -> tuple[str, bool] | None:
        """Forward's second positional parameter (its name, and whether it has no default);
        None where it takes one, or its signature cannot be read."""
        self.of(model)
        return self._second.get(type(_unwrapped(model)))

    def required(self, model: Module) -> frozenset[str]:
        """The named parameters of forward that have no default."""
        self.of(model)
        return self._required.get(type(_unwrapped(model)), frozenset())

    def of(self, model: Module) -> tuple[frozenset[str], bool]:
        """(the named parameters of forward, whether it also takes ``**kwargs``)."""
        module = _unwrapped(model)
        kind = type(module)
        if kind not in self._known:
            try:
                parameters = inspect.signature(module.forward).parameters.values()
            except (TypeError, ValueError):
                self._known[kind] = (frozenset(), True)
            else:
                named = frozenset(
                    p.name
                    for p in parameters
                    if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                )
                extra = any(p.kind is p.VAR_KEYWORD for p in parameters)
                self._known[kind] = (named, extra)
                self._required[kind] = frozenset(
                    p.name for p in parameters if p.name in named and p.default is p.empty
                )
                positional = [
                    p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                ]
                self._second[kind] = (
                    (positional[1].name, positional[1].default is positional[1].empty)
                    if len(positional) > 1
                    else None
                )
        return self._known[kind]


def _is_huggingface(model: Module) -> bool:
    """Whether ``model`` is a transformers ``PreTrainedModel`` (judged without importing it)."""
    return any(
        k.__name__ == "PreTrainedModel" and k.__module__.startswith("transformers")
        for k in type(_unwrapped(model)).__mro__
    )


class StructuredStep:
    """Forward and loss for any batch, as the module docstring's table says.

    ``loss_fn``: the user's ``(outputs, targets) -> loss``, or None (the model's own loss, else
    the default for the targets). ``name`` names the workload in messages. ``dropped`` collects
    the mapping keys left out because the model's forward takes no such argument.
    """

    marks_user_code = True  # what the user's model or loss_fn raises is marked in here

    def __init__(self, loss_fn: Callable[..., Any] | None, name: str) -> None:
        self.loss_fn = loss_fn
        self.name = name
        self.dropped: set[str] = set()
        self.call: str | None = None  # how the model was last called, in words
        self.loss_source: str | None = None  # where the last loss came from, in words
        self.last_loss: Tensor | None = None  # detached: read once, at the end (no sync here)
        self._keywords = _Keywords()

    def __call__(self, model: Module, batch: Any) -> Tensor:
        args, kwargs, targets, call = self.split(model, batch)
        self.call = call
        try:
            outputs = model(*args, **kwargs)
        except Exception as error:
            _mark(error, call)
            raise
        passed = targets is not None and len(args) == 2 and args[1] is targets
        loss = self.loss(outputs, targets, batch, call, passed=passed)
        self.last_loss = loss.detach()
        return loss

    # --- calling the model -------------------------------------------------------------------

    def split(self, model: Module, batch: Any) -> tuple[tuple[Any, ...], dict[str, Any], Any, str]:
        """(positional arguments, keyword arguments, targets or None, the call in words)."""
        import torch

        if isinstance(batch, Mapping):
            return self._mapping(model, batch)
        if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields") and batch:
            if len(batch) == 1:
                return (batch[0],), {}, None, "model(batch[0]) (a batch of one item, no targets)"
            *inputs, targets = batch
            if len(inputs) > 1:
                call = f"model(*batch[:-1]) ({len(inputs)} inputs; the last item is the targets)"
                return tuple(inputs), {}, targets, call
            first = inputs[0]
            if isinstance(first, Mapping):
                _, kwargs, _, call = self._mapping(model, first, targets_known=True)
                return (), kwargs, targets, call.replace("batch", "inputs") + ", targets"
            if isinstance(first, (tuple, list)) and not isinstance(first, torch.Tensor):
                call = f"model(*inputs) ({len(first)} inputs from (inputs, targets))"
                return tuple(first), {}, targets, call
            taken = self._targets_taken(model)
            if taken is not None:
                call = f"model(inputs, targets) from (inputs, targets) (forward's '{taken}')"
                return (first, targets), {}, targets, call
            return (first,), {}, targets, "model(inputs) from (inputs, targets)"
        return (batch,), {}, None, f"model(batch) ({_article(batch)}, no targets)"

    def _targets_taken(self, model: Module) -> str | None:
        """Forward's parameter that takes the targets of ``(inputs, targets)`` as well (the
        module docstring), by name; None where they go to the loss alone."""
        second = self._keywords.second(model)
        if second is None:
            return None
        name, required = second
        return name if required or (self.loss_fn is None and name in LABEL_KEYS) else None

    def _mapping(
        self, model: Module, batch: Mapping[Any, Any], *, targets_known: bool = False
    ) -> tuple[tuple[Any, ...], dict[str, Any], Any, str]:
        kwargs = {str(k): v for k, v in batch.items()}
        targets = shared = None
        named, extra = self._keywords.of(model)
        if named and "labels" in named and "labels" not in kwargs:
            for key in _RENAMED_TO_LABELS:
                if key in kwargs and key not in named:
                    kwargs["labels"] = kwargs.pop(key)
                    break
        if self.loss_fn is not None and not targets_known:
            label_key = next((k for k in LABEL_KEYS if k in kwargs), None)
            if label_key is not None and label_key in self._keywords.required(model):
                targets, shared = kwargs[label_key], label_key  # forward needs it too
            elif label_key is not None:
                targets = kwargs.pop(label_key)
        label = None
        if named and (not extra or _is_huggingface(model)):
            unused = [k for k in kwargs if k not in named]
            if self.loss_fn is None and not targets_known:
                label = next((k for k in LABEL_KEYS if k in unused), None)
                if label is not None:  # the default loss's targets, as in (inputs, targets)
                    targets = kwargs[label]
                    unused.remove(label)
            self.dropped.update(unused)
            kwargs = {k: v for k, v in kwargs.items() if k in named}
            if not kwargs:
                raise WorkloadError(
                    f"'{self.name}': none of the batch's keys ({_listed(batch)}) is an argument"
                    f" of {type(_unwrapped(model)).__name__}.forward ({_listed(sorted(named))});"
                    " name them as forward does, or give train_step(model, batch)"
                )
        call = f"model(**batch) with {_listed(kwargs)}"
        if label is not None:
            call += f" ('{label}' is the default loss's targets)"
        elif shared is not None:
            call += f" ('{shared}' is loss_fn's targets too)"
        elif targets is not None:
            call += " (the labels are loss_fn's targets)"
        return (), kwargs, targets, call

    # --- the loss ----------------------------------------------------------------------------

    def loss(
        self, outputs: Any, targets: Any, batch: Any, call: str, *, passed: bool = False
    ) -> Tensor:
        """The step's loss (the module docstring's order); ``passed``: the targets went to
        the model too, so a tuple's last 0-d tensor is its loss as well."""
        import torch

        own = model_loss(outputs, last=passed)
        if own is not None:
            self.loss_source = "the model's own"
            return _checked_loss(own, self.name, "the model's loss")
        if self.loss_fn is not None:
            second = batch if targets is None else targets
            try:
                value = self.loss_fn(outputs, second)
            except Exception as error:
                _mark(error, f"loss_fn(outputs, {'batch' if targets is None else 'targets'})")
                raise
            self.loss_source = f"loss_fn(outputs, {'batch' if targets is None else 'targets'})"
            return _checked_loss(value, self.name, "what loss_fn returned")
        if isinstance(outputs, torch.Tensor) and isinstance(targets, torch.Tensor):
            default = _default_loss(targets)
            try:
                value = default(outputs, targets)
            except Exception as error:  # shapes the default loss cannot take: not a bug of theirs
                raise WorkloadError(
                    f"'{self.name}': the default loss ({_loss_name(default)}) cannot take outputs"
                    f" {tuple(outputs.shape)} {_dtype(outputs)} and targets"
                    f" {tuple(targets.shape)} {_dtype(targets)} ({_exception(error)}); give"
                    " loss_fn(outputs, targets)"
                ) from None
            self.loss_source = f"{_loss_name(default)} (the default for these targets)"
            return _checked_loss(value, self.name, "what the default loss returned")
        raise WorkloadError(_no_loss(self.name, outputs, targets, call))


def model_loss(outputs: Any, *, last: bool = False) -> Any:
    """The loss a model returned itself, or None: a 0-d tensor, ``outputs.loss`` or a
    ``"loss"`` key holding one value, or a tuple or list whose first item is a 0-d tensor (a
    prediction of shape ``(1,)``, at batch 1, is no loss), or with ``last`` (the model was
    given the targets) whose last item is one, as nanoGPT's ``(logits, loss)``."""
    import torch

    def single(value: Any) -> bool:
        return isinstance(value, torch.Tensor) and value.numel() == 1 and value.dim() <= 1

    if isinstance(outputs, torch.Tensor):
        return outputs if outputs.dim() == 0 else None
    if isinstance(outputs, Mapping):
        value = outputs.get("loss")
        return value if single(value) else None
    value = getattr(outputs, "loss", None)
    if single(value):
        return value
    items = list(outputs) if isinstance(outputs, (tuple, list)) else []
    for item in items[:1] + items[-1:] * last:
        if isinstance(item, torch.Tensor) and item.dim() == 0:
            return item
    return None


def _no_loss(name: str, outputs: Any, targets: Any, call: str) -> str:
    """Why no loss applies, in one line with the fix."""
    fix = "give loss_fn(outputs, targets), or train_step(model, batch) -> loss"
    if hasattr(outputs, "loss") or (isinstance(outputs, Mapping) and "loss" in outputs):
        why = f"the model returned {_article(outputs)} whose loss is None"
        if targets is None:
            why += " (the batch has no 'labels' for the model to compute one)"
            fix = (
                "give the samples 'labels' (a causal LM's are its input_ids, as"
                " DataCollatorForLanguageModeling(tokenizer, mlm=False) makes them), or"
                " loss_fn(outputs, batch), or train_step(model, batch) -> loss"
            )
    elif targets is None:
        why = f"the model returned {_article(outputs)} and the batch has no targets"
    else:
        why = f"the model returned {_article(outputs)}, which the default loss cannot take"
    return f"'{name}': no loss for the step ({call}): {why}; {fix}"


def _checked_loss(value: Any, name: str, what: str) -> Tensor:
    """``value`` if it is a floating-point scalar tensor to call backward on."""
    import torch

    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        shape = f" of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""
        raise WorkloadError(
            f"'{name}': {what} is {_article(value)}{shape}, not a scalar tensor; return the"
            " loss to minimise (e.g. loss.mean())"
        )
    if not (value.is_floating_point() or value.is_complex()) or not value.requires_grad:
        dtype = _dtype(value)
        raise WorkloadError(
            f"'{name}': {what} does not depend on the model's parameters"
            f" ({'an' if dtype[0] in 'aeiou' else 'a'} {dtype}"
            f" tensor{'' if value.requires_grad else ' without grad'}); return the loss computed"
            " from the model's outputs"
        )
    return value.reshape(())


def _dtype(tensor: Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _loss_name(loss: Callable[..., Any]) -> str:
    return "cross-entropy" if "cross" in getattr(loss, "__name__", "") else "mean squared error"


class UserStep:
    """The user's ``train_step(model, batch) -> loss``: forward and loss as they wrote them."""

    marks_user_code = True

    def __init__(self, step: Callable[[Any, Any], Any], name: str) -> None:
        self.step = step
        self.name = name
        self.last_loss: Tensor | None = None  # detached: read once, at the end (no sync here)

    def __call__(self, model: Module, batch: Any) -> Tensor:
        try:
            value = self.step(model, batch)
        except Exception as error:
            _mark(error, "train_step(model, batch)")
            raise
        loss = _checked_loss(value, self.name, "train_step's return value")
        self.last_loss = loss.detach()
        return loss
