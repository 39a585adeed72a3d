"""The forward pass and the loss of one step, for any batch (``workloads.steps``): the model
called as the batch's structure says, the loss from loss_fn, the model's own or the default,
one WorkloadError of ours where nothing applies, and the user's errors marked as theirs with
how the model was called."""

from __future__ import annotations

import sys
import types
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torch_autotune.errors import WorkloadError, raised_by_user_code
from torch_autotune.probe.workloads.steps import StructuredStep, UserStep, call_of, model_loss

X = torch.randn(4, 3)
Y = torch.tensor([0, 1, 2, 1])


class Recorder(nn.Module):
    """Records how it was called; returns logits from its first tensor argument."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.calls.append((args, kwargs))
        first = next(v for v in [*args, *kwargs.values()] if isinstance(v, torch.Tensor))
        return self.linear(first.float())


class Keyed(nn.Module):
    """A forward with named arguments, that computes its own loss when given labels."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.seen: dict[str, Any] = {}

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, labels: torch.Tensor | None = None
    ) -> Any:
        self.seen = {"x": x, "mask": mask, "labels": labels}
        logits = self.linear(x)
        loss = None if labels is None else F.cross_entropy(logits, labels)
        return types.SimpleNamespace(loss=loss, logits=logits)


class Pair(NamedTuple):
    inputs: torch.Tensor
    targets: torch.Tensor


PAIR = Pair(X, Y)


def step(loss_fn: Any = None) -> StructuredStep:
    return StructuredStep(loss_fn, "w")


# --- the table: how the model is called ------------------------------------------------------


CALLS = {  # the batch: (positional arguments, keyword arguments, targets, the call in words)
    "mapping": ({"x": X, "mask": Y}, (), {"x": X, "mask": Y}, None, "model(**batch) with x, mask"),
    "inputs-targets": ((X, Y), (X,), {}, Y, "model(inputs) from (inputs, targets)"),
    "list-inputs-targets": ([X, Y], (X,), {}, Y, "model(inputs) from (inputs, targets)"),
    "tuple-inputs": (
        ((X, X), Y),
        (X, X),
        {},
        Y,
        "model(*inputs) (2 inputs from (inputs, targets))",
    ),
    "mapping-inputs": (({"x": X}, Y), (), {"x": X}, Y, "model(**inputs) with x, targets"),
    "several-inputs": (
        (X, X, Y),
        (X, X),
        {},
        Y,
        "model(*batch[:-1]) (2 inputs; the last item is the targets)",
    ),
    "tensor": (X, (X,), {}, None, "model(batch) (a Tensor, no targets)"),
    "one-item": ((X,), (X,), {}, None, "model(batch[0]) (a batch of one item, no targets)"),
    "named-tuple": (PAIR, (PAIR,), {}, None, "model(batch) (a Pair, no targets)"),
}


@pytest.mark.parametrize(("batch", "args", "kwargs", "targets", "call"), CALLS.values(), ids=CALLS)
def test_the_model_is_called_as_the_batch_says(
    batch: Any, args: tuple[Any, ...], kwargs: dict[str, Any], targets: Any, call: str
) -> None:
    model = Recorder()
    found_args, found_kwargs, found_targets, found_call = step().split(model, batch)
    assert found_call == call
    assert len(found_args) == len(args)
    assert all(a is b for a, b in zip(found_args, args, strict=True))
    assert found_kwargs.keys() == kwargs.keys()
    assert all(found_kwargs[k] is v for k, v in kwargs.items())
    assert found_targets is targets


def test_a_step_calls_the_model_once_and_records_the_call() -> None:
    model, structured = Recorder(), step()
    loss = structured(model, (X, X, Y))
    assert len(model.calls) == 1
    args, kwargs = model.calls[0]
    assert (len(args), kwargs) == (2, {})
    assert structured.call == "model(*batch[:-1]) (2 inputs; the last item is the targets)"
    assert torch.allclose(loss, F.cross_entropy(model.linear(X), Y))
    assert structured.loss_source == "cross-entropy (the default for these targets)"


# --- the loss, in its order ------------------------------------------------------------------


def test_a_mappings_labels_go_to_loss_fn_so_the_model_computes_none_of_its_own() -> None:
    model = Keyed()
    calls: list[Any] = []

    def loss_fn(outputs: Any, targets: Any) -> torch.Tensor:
        calls.append(targets)
        return outputs.logits.pow(2).mean()

    structured = step(loss_fn)
    loss = structured(model, {"x": X, "labels": Y})
    assert calls[0] is Y  # the labels are loss_fn's targets
    assert model.seen["labels"] is None  # ... and are not passed to the model
    assert torch.allclose(loss, model.linear(X).pow(2).mean())
    assert structured.loss_source == "loss_fn(outputs, targets)"
    assert structured.call == "model(**batch) with x (the labels are loss_fn's targets)"


class TeacherForced(nn.Module):
    """A decoder that reads the targets it predicts (teacher forcing): ``targets`` has no
    default, so forward needs it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.seen: dict[str, Any] = {}

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.seen = {"x": x, "targets": targets}
        return self.linear(x) + targets.float().unsqueeze(1)


def test_targets_a_forward_needs_go_to_it_and_to_loss_fn() -> None:
    """With loss_fn, a label key goes to loss_fn alone where forward may do without it (the
    test above), and to both where forward needs it (it was taken away, and forward raised
    'missing 1 required positional argument')."""
    model = TeacherForced()
    calls: list[Any] = []

    def loss_fn(outputs: Any, targets: Any) -> torch.Tensor:
        calls.append(targets)
        return outputs.pow(2).mean()

    structured = step(loss_fn)
    structured(model, {"x": X, "targets": Y})
    assert calls[0] is Y
    assert model.seen["targets"] is Y
    assert structured.call == "model(**batch) with x, targets ('targets' is loss_fn's targets too)"


def test_a_label_a_forward_needs_as_labels_goes_to_it_renamed_and_to_loss_fn() -> None:
    """forward(x, labels) with no default and a batch's 'label': renamed, as Hugging Face's
    collators do, before loss_fn takes its targets (it was taken first, and forward raised)."""

    class NeedsLabels(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return self.linear(x) + labels.float().unsqueeze(1)

    calls: list[Any] = []
    structured = step(lambda outputs, targets: calls.append(targets) or outputs.pow(2).mean())
    structured(NeedsLabels(), {"x": X, "label": Y})
    assert calls[0] is Y
    assert structured.call == "model(**batch) with x, labels ('labels' is loss_fn's targets too)"


def test_a_tensors_targets_go_to_a_forward_that_needs_them_positionally() -> None:
    """``(inputs, targets)`` and ``forward(self, x, targets)``: the model was called
    ``model(inputs)`` and raised 'missing 1 required positional argument', blamed on the
    model, where a loop of the user's own calls ``model(x, y)``."""
    model = TeacherForced()
    structured = step()
    loss = structured(model, (X, Y))
    assert model.seen["targets"] is Y
    assert structured.call == "model(inputs, targets) from (inputs, targets) (forward's 'targets')"
    assert structured.loss_source is not None
    assert "default" in structured.loss_source  # a prediction: the default loss on the targets
    assert torch.isfinite(loss)


class NanoGPT(nn.Module):
    """nanoGPT's forward: ``targets=None``, and with them ``(logits, loss)``, the loss last."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 7)
        self.own: list[torch.Tensor] = []

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> Any:
        logits = self.embed(idx)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, 7), targets.view(-1)) * 2.0  # its own, not ours
        self.own.append(loss)
        return logits, loss


def test_a_forward_with_optional_targets_computes_its_own_loss_from_them() -> None:
    tokens = torch.randint(0, 7, (4, 5))
    model, structured = NanoGPT(), step()
    loss = structured(model, (tokens, tokens))
    assert model.own
    assert loss.item() == model.own[-1].item()
    assert structured.loss_source == "the model's own"
    assert structured.call == "model(inputs, targets) from (inputs, targets) (forward's 'targets')"
    # with loss_fn, optional targets go to loss_fn alone, as before
    seen: list[Any] = []
    model = NanoGPT()
    step(lambda outputs, targets: seen.append(targets) or outputs[0].float().mean())(
        model, (tokens, tokens)
    )
    assert seen[0] is tokens
    assert not model.own


def test_a_second_parameter_that_is_not_the_targets_and_optional_is_left_alone() -> None:
    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 3)
            self.masks: list[Any] = []

        def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
            self.masks.append(mask)
            return self.linear(x)

    model, structured = Masked(), step()
    structured(model, (X, Y))
    assert model.masks == [None]
    assert structured.call == "model(inputs) from (inputs, targets)"


def test_a_loss_the_model_returns_comes_before_loss_fn() -> None:
    """The issue's order: the model's own loss, else loss_fn, else the default; the summary
    says which trained (``loss_source``)."""
    model = Returns(lambda loss, logits: {"loss": loss, "logits": logits})
    unused: list[Any] = []
    structured = step(lambda outputs, targets: unused.append(1) or outputs["logits"].sum())
    loss = structured(model, (X, Y))
    assert torch.allclose(loss, model.linear(X).pow(2).mean())
    assert unused == []
    assert structured.loss_source == "the model's own"


def test_loss_fn_takes_the_batch_where_it_has_no_targets() -> None:
    seen: list[Any] = []

    def loss_fn(outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        seen.append(batch)
        return outputs.mean()

    structured = step(loss_fn)
    structured(Recorder(), X)
    assert seen[0] is X
    assert structured.loss_source == "loss_fn(outputs, batch)"


class Returns(nn.Module):
    """A model that returns what ``wrap`` makes of its loss and logits."""

    def __init__(self, wrap: Any) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.wrap = wrap

    def forward(self, x: torch.Tensor) -> Any:
        logits = self.linear(x)
        return self.wrap(logits.pow(2).mean(), logits)


@pytest.mark.parametrize(
    "wrap",
    [
        lambda loss, logits: loss,
        lambda loss, logits: types.SimpleNamespace(loss=loss, logits=logits),
        lambda loss, logits: {"loss": loss, "logits": logits},
        lambda loss, logits: (loss, logits),
        lambda loss, logits: types.SimpleNamespace(loss=loss.reshape(1), logits=logits),
    ],
    ids=["scalar", "attribute", "key", "tuple", "attribute-of-shape-1"],
)
def test_the_models_own_loss_in_every_form_comes_before_the_default(wrap: Any) -> None:
    model, structured = Returns(wrap), step()
    loss = structured(model, (X, Y))  # targets the default loss could take
    assert loss.dim() == 0
    assert torch.allclose(loss, model.linear(X).pow(2).mean())
    assert structured.loss_source == "the model's own"


def test_model_loss_finds_nothing_in_outputs_without_a_scalar() -> None:
    assert model_loss(torch.randn(4, 3)) is None
    assert model_loss({"loss": torch.randn(4)}) is None
    assert model_loss((torch.randn(4, 3),)) is None
    # a prediction of shape (1,) at batch 1 first in a tuple: no loss (only a 0-d tensor is)
    assert model_loss([torch.randn(1), torch.randn(1, 3)]) is None
    assert model_loss(types.SimpleNamespace(loss=None)) is None
    assert model_loss("text") is None


@pytest.mark.parametrize(
    ("targets", "default", "source"),
    [
        (Y, F.cross_entropy, "cross-entropy"),
        (torch.randn(4, 3), F.mse_loss, "mean squared error"),
        (torch.randint(0, 3, (4, 3)).float(), F.mse_loss, "mean squared error"),
    ],
    ids=["classes", "regression", "float-classes"],
)
def test_the_default_loss_is_cross_entropy_for_classes_and_mse_otherwise(
    targets: torch.Tensor, default: Any, source: str
) -> None:
    model, structured = Recorder(), step()
    loss = structured(model, (X, targets))
    assert torch.allclose(loss, default(model.linear(X), targets))
    assert structured.loss_source == f"{source} (the default for these targets)"


def test_a_default_loss_that_cannot_take_the_shapes_is_our_one_line() -> None:
    with pytest.raises(WorkloadError) as raised:
        step()(Recorder(), (X, torch.randn(4, 7)))
    assert str(raised.value).startswith(
        "'w': the default loss (mean squared error) cannot take outputs (4, 3) float32 and"
        " targets (4, 7) float32 ("
    )
    assert str(raised.value).endswith("); give loss_fn(outputs, targets)")
    assert raised.value.__cause__ is None
    assert not raised_by_user_code(raised.value)


@pytest.mark.parametrize(
    ("model", "batch", "why"),
    [
        (
            Recorder(),
            X,
            "no loss for the step (model(batch) (a Tensor, no targets)): the model returned a"
            " Tensor and the batch has no targets",
        ),
        (
            Keyed(),
            {"x": X},
            "no loss for the step (model(**batch) with x): the model returned a SimpleNamespace"
            " whose loss is None (the batch has no 'labels' for the model to compute one)",
        ),
        (
            Returns(lambda loss, logits: {"logits": logits}),
            (X, {"boxes": Y}),
            "no loss for the step (model(inputs) from (inputs, targets)): the model returned a"
            " dict, which the default loss cannot take",
        ),
    ],
    ids=["no-targets", "loss-none", "targets-not-a-tensor"],
)
def test_where_no_loss_applies_one_line_says_to_give_loss_fn(
    model: nn.Module, batch: Any, why: str
) -> None:
    with pytest.raises(WorkloadError) as raised:
        step()(model, batch)
    fix = "give loss_fn(outputs, targets), or train_step(model, batch) -> loss"
    if "loss is None" in why:  # the model computes its loss from labels the batch lacks
        fix = (
            "give the samples 'labels' (a causal LM's are its input_ids, as"
            " DataCollatorForLanguageModeling(tokenizer, mlm=False) makes them), or"
            " loss_fn(outputs, batch), or train_step(model, batch) -> loss"
        )
    assert str(raised.value) == f"'w': {why}; {fix}"
    assert not raised_by_user_code(raised.value)


# --- mapping keys: filtered, labels renamed ------------------------------------------------------


def test_keys_the_forward_has_no_argument_for_are_left_out_and_recorded() -> None:
    model, structured = Keyed(), step()
    structured(model, {"x": X, "labels": Y, "idx": Y, "text": ["a"] * 4})
    assert model.seen["labels"] is Y
    assert structured.dropped == {"idx", "text"}
    assert structured.call == "model(**batch) with x, labels"
    assert structured.loss_source == "the model's own"


def test_a_forward_that_takes_kwargs_gets_every_key() -> None:
    model, structured = Recorder(), step(lambda outputs, batch: outputs.mean())
    structured(model, {"x": X, "anything": Y})
    assert set(model.calls[0][1]) == {"x", "anything"}
    assert structured.dropped == set()


@pytest.mark.parametrize("key", ["label", "label_ids"])
def test_label_is_passed_as_labels_to_a_forward_that_takes_labels(key: str) -> None:
    model, structured = Keyed(), step()
    loss = structured(model, {"x": X, key: Y})
    assert model.seen["labels"] is Y
    assert torch.allclose(loss, F.cross_entropy(model.linear(X), Y))
    assert structured.dropped == set()


def test_label_is_kept_as_it_is_where_the_forward_takes_label() -> None:
    class TakesLabel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor, label: torch.Tensor, labels: Any = None) -> Any:
            assert labels is None
            return F.cross_entropy(self.linear(x), label)

    assert step()(TakesLabel(), {"x": X, "label": Y}).dim() == 0


@pytest.mark.parametrize("key", ["labels", "label", "target", "y"])
def test_labels_a_plain_forward_does_not_take_are_the_default_losss_targets(key: str) -> None:
    """{"x": ..., "label": ...} samples for a forward(self, x) train as (x, label) would."""

    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x)

    model, structured = Plain(), step()
    loss = structured(model, {"x": X, key: Y, "idx": Y})
    assert torch.allclose(loss, F.cross_entropy(model.linear(X), Y))
    assert structured.call == f"model(**batch) with x ('{key}' is the default loss's targets)"
    assert structured.loss_source == "cross-entropy (the default for these targets)"
    assert structured.dropped == {"idx"}


def test_a_mapping_none_of_whose_keys_the_forward_takes_is_our_one_line() -> None:
    with pytest.raises(WorkloadError) as raised:
        step()(Keyed(), {"pixels": X, "target": Y})
    assert str(raised.value) == (
        "'w': none of the batch's keys (pixels, target) is an argument of Keyed.forward (labels,"
        " mask, x); name them as forward does, or give train_step(model, batch)"
    )
    assert not raised_by_user_code(raised.value)


def _tiny_bert() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=3,
    )
    return transformers.BertForSequenceClassification(config).train()


def test_a_hugging_face_model_gets_its_own_keys_its_labels_and_computes_its_own_loss() -> None:
    model = _tiny_bert()
    ids = torch.randint(0, 50, (4, 8))
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones(4, 8, dtype=torch.int64),
        "token_type_ids": torch.zeros(4, 8, dtype=torch.int64),
        "label": Y,  # as a datasets column is named; the collators rename it
        "idx": torch.arange(4),  # forward takes **kwargs, but not this column
    }
    structured = step()
    torch.manual_seed(1)
    loss = structured(model, batch)
    torch.manual_seed(1)
    expected = model(
        input_ids=ids,
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"],
        labels=Y,
    ).loss
    assert torch.allclose(loss, expected)
    assert structured.dropped == {"idx"}
    assert structured.loss_source == "the model's own"
    assert structured.call == (
        "model(**batch) with input_ids, attention_mask, token_type_ids, labels"
    )


# --- the user's errors, and ours ---------------------------------------------------------------


def test_an_error_in_the_model_is_the_users_with_how_it_was_called() -> None:
    model = nn.Linear(5, 2)  # the batch has 3 features
    with pytest.raises(RuntimeError, match="mat1 and mat2") as raised:
        step()(model, (X, Y))
    assert raised_by_user_code(raised.value)
    assert call_of(raised.value) == "model(inputs) from (inputs, targets)"
    notes = getattr(raised.value, "__notes__", None)  # Python 3.11+: a caller of tune() reads
    if sys.version_info >= (3, 11):
        assert notes == [
            "torch-autotune: the probe's training step raised this in model(inputs) from "
            "(inputs, targets) (not out of memory, so not a batch that is too big): fix the model "
            "or its data, or give tune() train_step(model, batch) -> loss to call the model as "
            "your training does"
        ]


def test_an_error_in_loss_fn_is_the_users_with_how_it_was_called() -> None:
    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        raise KeyError("weights")

    with pytest.raises(KeyError) as raised:
        step(loss_fn)(Recorder(), (X, Y))
    assert raised_by_user_code(raised.value)
    assert call_of(raised.value) == "loss_fn(outputs, targets)"


def test_an_error_in_the_users_step_is_theirs() -> None:
    def train_step(model: nn.Module, batch: Any) -> torch.Tensor:
        raise ValueError("no such column")

    with pytest.raises(ValueError, match="no such column") as raised:
        UserStep(train_step, "w")(Recorder(), X)
    assert raised_by_user_code(raised.value)
    assert call_of(raised.value) == "train_step(model, batch)"
    assert call_of(ValueError("raised elsewhere")) is None
    if sys.version_info >= (3, 11):  # not 'give train_step' to a user who gave one
        (note,) = raised.value.__notes__
        assert note.endswith(
            "not a batch that is too big): fix your train_step, the model or its data"
        )


def test_out_of_memory_in_the_model_gets_no_note_that_says_it_is_not() -> None:
    class Huge(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(torch.OutOfMemoryError) as raised:
        step()(Huge(), (X, Y))
    assert raised_by_user_code(raised.value)
    assert not getattr(raised.value, "__notes__", None)


def test_the_users_step_returns_the_loss_it_computed() -> None:
    model = Recorder()
    loss = UserStep(lambda m, b: F.cross_entropy(m(b[0]), b[1]), "w")(model, (X, Y))
    assert torch.allclose(loss, F.cross_entropy(model.linear(X), Y))
    one_element = UserStep(lambda m, b: m(b).mean().reshape(1, 1), "w")(model, X)
    assert one_element.shape == ()  # a loss of one element is made a scalar


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            lambda out: out.pow(2).mean(dim=1),
            "'w': train_step's return value is a Tensor of shape (4,), not a scalar tensor;"
            " return the loss to minimise (e.g. loss.mean())",
        ),
        (
            lambda out: 1.5,
            "'w': train_step's return value is a float, not a scalar tensor; return the loss to"
            " minimise (e.g. loss.mean())",
        ),
        (
            lambda out: out.detach().mean(),
            "'w': train_step's return value does not depend on the model's parameters (a float32"
            " tensor without grad); return the loss computed from the model's outputs",
        ),
        (
            lambda out: out.argmax(),
            "'w': train_step's return value does not depend on the model's parameters (an int64"
            " tensor without grad); return the loss computed from the model's outputs",
        ),
    ],
    ids=["per-sample", "float", "no-grad", "integer"],
)
def test_a_loss_that_is_no_scalar_to_minimise_is_our_one_line(value: Any, message: str) -> None:
    with pytest.raises(WorkloadError) as raised:
        UserStep(lambda m, b: value(m(b)), "w")(Recorder(), X)
    assert str(raised.value) == message
    assert not raised_by_user_code(raised.value)


def test_loss_fn_results_are_checked_too() -> None:
    said = "'w': what loss_fn returned is a Tensor of shape \\(4,\\)"
    with pytest.raises(WorkloadError, match=said):
        step(lambda out, y: F.cross_entropy(out, y, reduction="none"))(Recorder(), (X, Y))
