"""Activation checkpointing on the model forms users train (issue 21 on the forms of issue 18):
a model of several inputs fed a dict batch through a collate, a LightningModule whose
training_step computes its own loss, a user's own loss function and a user's own train step;
each recomputed step is the step (the same loss and gradients from the same weights), the
parameters keep their names, so the weights of a checkpointed model load into a plain one."""

from __future__ import annotations

import io
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from torch_autotune.apply import prepare_model
from torch_autotune.probe.recompute import checkpointed_step_agrees
from torch_autotune.probe.search import RTOL
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.workloads import resolve_workload
from torch_autotune.settings import torch_defaults

CPU = StepSettings(torch_defaults("cpu"))
CHECKPOINTED = torch_defaults("cpu").model_copy(update={"activation_checkpointing": True})


class Block(nn.Module):
    """A residual block with dropout: the recompute must draw the same mask."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Dropout(0.2))
        self.out = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out(self.mlp(self.norm(x)))


class Towers(nn.Module):
    """Two inputs by name (features and a mask), repeated blocks, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(16, 3)

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(features * mask)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _samples(count: int = 64) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        {
            "features": torch.randn(8, generator=generator),
            "mask": torch.ones(8),
            "labels": torch.tensor(i % 3),
        }
        for i in range(count)
    ]


def _collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}


class LitTowers(pl.LightningModule):
    """The same model as a LightningModule: its training_step takes the dict batch."""

    def __init__(self) -> None:
        super().__init__()
        self.model = Towers()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self.model(batch["features"], batch["mask"])
        loss = nn.functional.cross_entropy(logits, batch["labels"])
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _smoothed(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(outputs, labels, label_smoothing=0.1)


def _train_step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["features"], batch["mask"])
    return nn.functional.cross_entropy(logits, batch["labels"]) + 0.01 * logits.square().mean()


FORMS = {
    "dict batch through a collate, the user's loss": lambda: {
        "model": Towers(),
        "optimizer": torch.optim.AdamW,
        "dataset": _samples(),
        "collate_fn": _collate,
        "loss_fn": _smoothed,
    },
    "the user's train step": lambda: {
        "model": Towers(),
        "optimizer": torch.optim.AdamW,
        "dataset": _samples(),
        "collate_fn": _collate,
        "train_step": _train_step,
    },
}


def _workload(form: str) -> Any:
    if form == "LightningModule":
        loader = torch.utils.data.DataLoader(_samples(), batch_size=8, collate_fn=_collate)
        return resolve_workload(LitTowers(), objects={"loader": loader})
    return resolve_workload(objects=FORMS[form]())


@pytest.mark.parametrize("form", [*FORMS, "LightningModule"])
def test_the_recomputed_step_of_a_users_model_is_the_step(form: str) -> None:
    agreement = checkpointed_step_agrees(_workload(form), CPU, batch_size=8)
    assert agreement.blocks == 3  # the repeated Block, found inside the user's model
    assert agreement.agrees
    assert agreement.largest_difference <= RTOL


@pytest.mark.parametrize("form", [*FORMS, "LightningModule"])
def test_a_checkpointed_users_model_saves_weights_a_plain_one_loads(form: str) -> None:
    workload = _workload(form)
    model = prepare_model(CHECKPOINTED, workload.make_model())
    names = [name for name, _ in workload.make_model().named_parameters()]
    assert [name for name, _ in model.named_parameters()] == names
    saved = io.BytesIO()
    torch.save(model.state_dict(), saved)
    plain = workload.make_model()
    plain.load_state_dict(torch.load(io.BytesIO(saved.getvalue())))  # exported and reloaded
    reloaded = plain.state_dict()
    for name, mine in model.state_dict().items():
        assert torch.equal(mine, reloaded[name]), name
