"""The optimizer of each trial (``workloads.optimizers``): a factory called with the copy's
parameters, an optimizer object rebuilt over each copy of the model with its class, groups and
hyperparameters, the probe's options passed where taken, and an optimizer over another
model's parameters refused instead of training nothing."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import torch
from torch import nn

from torch_autotune.errors import WorkloadError, raised_by_user_code
from torch_autotune.probe.step import make_optimizer
from torch_autotune.probe.workloads import as_workload
from torch_autotune.probe.workloads.optimizers import (
    FactoryOptimizer,
    ModelOptimizer,
    RebuiltOptimizer,
    check_holds,
    fused_by,
    optimizer_builder,
    optimizer_kind,
    probe_kind,
)

REFUSED = (
    "the optimizer holds {what} that are not the model's being trained: it was built over"
    " another model (the probe trains a fresh copy of yours for every trial, and would train"
    " nothing); give the optimizer object itself (it is rebuilt over each copy) or a factory"
    " such as functools.partial(torch.optim.AdamW, lr=3e-4)"
)


class Net(nn.Module):
    """An embedding whose weight the head shares, a body, and a frozen part."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding = nn.Embedding(10, 4)
        self.body = nn.Linear(4, 4)
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embedding.weight  # tied

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.frozen(torch.relu(self.body(self.embedding(tokens)))))


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 2) -> None:
    for _ in range(steps):
        model(torch.arange(6).reshape(2, 3)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def held(optimizer: torch.optim.Optimizer) -> list[int]:
    return [id(p) for group in optimizer.param_groups for p in group["params"]]


# --- an optimizer object, rebuilt over each copy ------------------------------------------------


def _groups(model: Net, klass: type, **options: Any) -> torch.optim.Optimizer:
    return klass(
        [
            {"params": [model.embedding.weight], "lr": 0.01, "weight_decay": 0.0},
            {"params": list(model.body.parameters()), "lr": 0.1},
        ],
        lr=0.05,
        **options,
    )


@pytest.mark.parametrize(
    ("klass", "options"),
    [
        (torch.optim.Adam, {"betas": (0.8, 0.9), "eps": 1e-6}),
        (torch.optim.AdamW, {"weight_decay": 0.3, "amsgrad": True}),
        (torch.optim.SGD, {"momentum": 0.9, "nesterov": True}),
    ],
    ids=["Adam", "AdamW", "SGD-momentum"],
)
def test_an_optimizer_object_is_rebuilt_over_each_copy_with_its_groups(
    klass: type, options: dict[str, Any]
) -> None:
    model = Net()
    original = _groups(model, klass, **options)
    rebuilt_over = RebuiltOptimizer(original, model, "w")
    first, second = copy.deepcopy(model), copy.deepcopy(model)
    optimizer = rebuilt_over(first)
    assert type(optimizer) is klass
    assert rebuilt_over.built == klass.__name__
    assert held(optimizer) == [id(first.embedding.weight), *map(id, first.body.parameters())]
    assert id(first.frozen.weight) not in held(optimizer)  # frozen, as in the original
    for mine, theirs in zip(optimizer.param_groups, original.param_groups, strict=True):
        assert {k: v for k, v in mine.items() if k != "params"} == {
            k: v for k, v in theirs.items() if k != "params"
        }
    assert held(rebuilt_over(second)) != held(optimizer)  # each copy its own
    model_state = {k: v.clone() for k, v in model.state_dict().items()}
    train(first, optimizer)
    assert not torch.equal(first.body.weight, model.body.weight)  # the copy trained
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in model_state.items())
    assert original.state == {}  # the user's optimizer never stepped


def test_tied_weights_are_held_once_and_stay_tied_in_the_copy() -> None:
    model = Net()
    rebuilt_over = RebuiltOptimizer(torch.optim.AdamW(trainable(model), lr=0.1), model, "w")
    copied = copy.deepcopy(model)
    optimizer = rebuilt_over(copied)
    assert copied.head.weight is copied.embedding.weight
    assert held(optimizer).count(id(copied.embedding.weight)) == 1
    train(copied, optimizer)
    assert copied.head.weight is copied.embedding.weight


@pytest.mark.parametrize("klass", [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD])
def test_the_probes_options_reach_every_group_where_the_class_takes_them(klass: type) -> None:
    model = Net()
    rebuilt_over = RebuiltOptimizer(_groups(model, klass), model, "w")
    assert rebuilt_over.accepts(fused=True)
    assert not rebuilt_over.accepts(no_such_option=True)
    optimizer = rebuilt_over(copy.deepcopy(model), fused=True)
    assert optimizer.defaults["fused"] is True
    assert all(group["fused"] is True for group in optimizer.param_groups)
    assert [group["lr"] for group in optimizer.param_groups] == [0.01, 0.1]


def test_an_optimizer_over_another_model_is_refused_when_given() -> None:
    model, other = Net(), Net()
    with pytest.raises(WorkloadError) as raised:
        RebuiltOptimizer(torch.optim.SGD(trainable(other), lr=0.1), model, "w")
    assert str(raised.value) == "'w': " + REFUSED.format(what="3 of its 3 parameters")


def test_an_optimizer_over_part_of_another_model_is_refused_too() -> None:
    model, other = Net(), Net()
    mixed = torch.optim.SGD([model.body.weight, other.body.bias], lr=0.1)
    with pytest.raises(WorkloadError, match="holds 1 of its 2 parameters that are not"):
        check_holds(mixed, model, "w")


def test_a_copy_with_another_parameter_count_is_refused() -> None:
    model = Net()
    rebuilt_over = RebuiltOptimizer(torch.optim.SGD(trainable(model), lr=0.1), model, "w")
    with pytest.raises(WorkloadError, match="the copy of the model has 2 parameters"):
        rebuilt_over(nn.Linear(2, 2))


def test_an_optimizer_class_that_cannot_be_rebuilt_asks_for_a_factory() -> None:
    class NeedsASchedule(torch.optim.SGD):
        def __init__(self, params: Any, schedule: list[float]) -> None:
            super().__init__(params, lr=schedule[0])

    model = Net()
    rebuilt_over = RebuiltOptimizer(NeedsASchedule(trainable(model), [0.1]), model, "w")
    with pytest.raises(WorkloadError) as raised:
        rebuilt_over(copy.deepcopy(model))
    assert str(raised.value).startswith(
        "'w': a NeedsASchedule like yours cannot be built over the probe's copy of the model"
    )
    assert str(raised.value).endswith(
        "give a factory such as functools.partial(torch.optim.AdamW, lr=3e-4)"
    )


# --- a factory ---------------------------------------------------------------------------------


def test_a_factory_is_called_with_the_copys_parameters_and_the_options_it_takes() -> None:
    factory = FactoryOptimizer(functools.partial(torch.optim.AdamW, lr=3e-4), "w")
    model = Net()
    optimizer = factory(model, fused=True)
    assert held(optimizer) == [id(p) for p in model.parameters()]
    assert optimizer.defaults["fused"] is True
    assert optimizer.defaults["lr"] == 3e-4
    assert factory.built == "AdamW"
    assert factory.accepts(fused=True)


def test_a_factory_without_keyword_arguments_is_not_given_options() -> None:
    factory = FactoryOptimizer(lambda params: torch.optim.SGD(params, lr=0.1), "w")
    assert not factory.accepts(fused=True)
    assert factory.accepts()
    assert isinstance(factory(Net()), torch.optim.SGD)
    with pytest.raises(WorkloadError, match="the optimizer factory does not take fused"):
        factory(Net(), fused=True)


def test_a_trial_passes_the_profiles_options_only_to_an_optimizer_that_takes_them() -> None:
    def workload(optimizer: Any) -> Any:
        return as_workload(
            {
                "model": Net(),
                "optimizer": optimizer,
                "example_batch": torch.arange(6).reshape(2, 3),
                "loss_fn": lambda outputs, batch: outputs.pow(2).mean(),
            },
            name="w",
        )

    takes = workload(functools.partial(torch.optim.AdamW, lr=1e-3))
    assert make_optimizer(takes, Net(), {"fused": True}).defaults["fused"] is True
    plain = workload(lambda params: torch.optim.AdamW(params, lr=1e-3))
    assert make_optimizer(plain, Net(), {"fused": True}).defaults["fused"] is None


def test_a_factory_that_ignores_its_parameters_is_refused() -> None:
    elsewhere = Net()
    factory = FactoryOptimizer(lambda params: torch.optim.SGD(trainable(elsewhere), lr=0.1), "w")
    with pytest.raises(WorkloadError) as raised:
        factory(Net())
    assert str(raised.value) == "'w': " + REFUSED.format(what="3 of its 3 parameters")


def test_a_factory_that_raises_is_the_users_error() -> None:
    def factory(params: Any, **kwargs: Any) -> torch.optim.Optimizer:
        raise ValueError("no learning rate")

    with pytest.raises(WorkloadError) as raised:
        FactoryOptimizer(factory, "w")(Net())
    assert str(raised.value) == "'w': the optimizer factory raised ValueError: no learning rate"
    assert raised_by_user_code(raised.value.__cause__)


def test_a_factory_that_returns_no_optimizer_is_refused() -> None:
    with pytest.raises(WorkloadError) as raised:
        FactoryOptimizer(list, "w")(Net())
    assert str(raised.value) == "'w': the optimizer is a list, not a torch.optim.Optimizer"


# --- an optimizer made from the model ----------------------------------------------------------


def test_an_optimizer_made_from_the_model_is_rebuilt_with_the_options() -> None:
    made = ModelOptimizer(
        lambda module: torch.optim.AdamW(module.parameters(), lr=0.02), "w", torch.optim.AdamW
    )
    model = Net()
    assert made.accepts(fused=True)
    plain = made(model)
    assert plain.defaults["lr"] == 0.02
    assert plain.defaults["fused"] is None
    fused = made(model, fused=True)
    assert fused.defaults["fused"] is True
    assert fused.param_groups[0]["lr"] == 0.02
    assert held(fused) == [id(p) for p in model.parameters()]


def test_an_optimizer_made_from_the_model_over_another_is_refused() -> None:
    other = Net()
    made = ModelOptimizer(lambda module: torch.optim.SGD(trainable(other), lr=0.1), "w")
    with pytest.raises(WorkloadError, match="it was built over another model"):
        made(Net())


# --- what the user gives, and the kind the rules are told ---------------------------------------


def test_an_optimizer_object_beside_a_model_function_asks_for_a_factory() -> None:
    with pytest.raises(WorkloadError) as raised:
        optimizer_builder(torch.optim.AdamW(trainable(Net()), lr=0.1), None, "w")
    assert str(raised.value) == (
        "'w': 'optimizer' is an AdamW already built, but 'model' is a function that builds a new"
        " model; give the optimizer as a factory such as functools.partial(torch.optim.AdamW,"
        " lr=3e-4)"
    )


def test_an_optimizer_that_is_neither_object_nor_function_is_refused() -> None:
    with pytest.raises(WorkloadError, match="'w': 'optimizer' is a str; give an optimizer"):
        optimizer_builder("adamw", Net(), "w")


def test_a_workload_of_objects_rebuilds_the_optimizer_and_tells_the_rules_its_kind() -> None:
    model = Net()
    optimizer = torch.optim.SGD(trainable(model), lr=0.1, momentum=0.9)
    workload = as_workload(
        {
            "model": model,
            "optimizer": optimizer,
            "example_batch": torch.arange(6).reshape(2, 3),
            "loss_fn": lambda outputs, batch: outputs.pow(2).mean(),
        },
        name="w",
    )
    assert workload.optimizer == "sgd"
    assert workload.optimizer_accepts(fused=True)
    copied = workload.make_model()
    rebuilt = workload.make_optimizer(copied)
    assert held(rebuilt) == [id(p) for p in trainable(copied)]
    assert rebuilt.param_groups[0]["momentum"] == 0.9


@pytest.mark.parametrize(
    ("optimizer", "kind"),
    [
        (torch.optim.AdamW, "adamw"),
        (torch.optim.Adam, "adam"),
        (torch.optim.SGD, "sgd"),
        (torch.optim.Adagrad, "other"),
        (type("MyAdamW", (torch.optim.AdamW,), {}), "adamw"),  # a subclass of torch's
        (type("AdamW", (), {}), "other"),  # only the name: not torch's
        (torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), "sgd"),  # an object
    ],
    ids=["AdamW", "Adam", "SGD", "Adagrad", "subclass", "namesake", "object"],
)
def test_optimizer_kind_names_torchs_classes_and_their_subclasses(
    optimizer: Any, kind: str
) -> None:
    assert optimizer_kind(optimizer) == kind


def test_probe_kind_asks_a_factory_over_a_throwaway_parameter() -> None:
    model = Net()
    assert probe_kind(FactoryOptimizer(torch.optim.Adam, "w"), None) == "adam"
    needs_model = FactoryOptimizer(lambda params: torch.optim.SGD(model.foo, lr=0.1), "w")
    assert probe_kind(needs_model, None) == "other"  # cannot be asked without training
    rebuilt_over = RebuiltOptimizer(torch.optim.AdamW(trainable(model)), model, "w")
    assert probe_kind(rebuilt_over, model) == "adamw"


def test_an_optimizer_object_or_factory_built_fused_fixes_the_kernel() -> None:
    """An optimizer built with fused=True trains fused whatever the profile says: the probe
    passes fused=True or nothing (``fused_by``, told to the rules); one built otherwise leaves
    the kernel to the profile."""
    model = Net()
    given = torch.optim.AdamW(trainable(model), fused=True)
    assert fused_by(optimizer_builder(given, model, "net")) == (
        "your optimizer, an AdamW built with fused=True"
    )
    factory = functools.partial(torch.optim.AdamW, lr=3e-4, fused=True)
    assert fused_by(optimizer_builder(factory, model, "net")) == (
        "your optimizer factory, which builds AdamW(..., fused=True)"
    )
    for plain in (torch.optim.AdamW(trainable(model)), functools.partial(torch.optim.SGD, lr=0.1)):
        assert fused_by(optimizer_builder(plain, model, "net")) is None
