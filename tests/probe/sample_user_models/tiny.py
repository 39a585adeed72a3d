"""A tiny user package for the factory-protocol tests: good factories and broken ones.

Imported as ``tiny`` with this directory on ``sys.path``, as a user's module next to their
training script would be (``autotune --model tiny:good_mapping``).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from torch_autotune.probe.workloads import Workload


def _model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.GELU(), nn.Linear(8, 3))


def _batch(size: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(size)
    return torch.randn(size, 1, 4, 4, generator=generator), torch.arange(size) % 3


class PairDataset:
    """Ten (1x4x4 float image, int label) samples: a map-style dataset like a user's."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < 10:
            raise IndexError(index)
        return torch.full((1, 4, 4), float(index)), index % 3


class RaggedDataset(PairDataset):
    """Samples of different lengths: they cannot be stacked into one batch."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.zeros(index + 1), 0


class DictDataset(PairDataset):
    """Samples that are dicts, not (inputs, targets) pairs."""

    def __getitem__(self, index: int) -> Any:  # type: ignore[override]
        return {"pixels": torch.zeros(4), "label": 0}


class FailingDataset(PairDataset):
    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        raise OSError("cannot open /data/train/0.png")


# --- good factories -------------------------------------------------------------------------------


def good_mapping() -> dict[str, Any]:
    """Model function, optimizer partial and an example batch of 4 samples (kind mlp)."""
    return {
        "model": _model,
        "optimizer": functools.partial(torch.optim.AdamW, lr=3e-4),
        "example_batch": _batch(4),
        "kind": "mlp",
    }


def good_workload() -> Workload:
    """A complete Workload, returned as it is."""
    return Workload(
        name="tiny-regression",
        kind="other",
        make_model=lambda: nn.Linear(5, 1),
        make_optimizer=lambda model, **kwargs: torch.optim.SGD(
            model.parameters(), lr=0.1, **kwargs
        ),
        make_batch=lambda n: (torch.ones(n, 5), torch.zeros(n, 1)),
        train_step=lambda model, batch: nn.functional.mse_loss(model(batch[0]), batch[1]),
        sample_shape="5 float32 -> 1 float32",
    )


def good_object() -> SimpleNamespace:
    """An object with attributes: a model instance, an optimizer class, a dataset."""
    return SimpleNamespace(model=_model(), optimizer=torch.optim.SGD, dataset=PairDataset())


def float_targets() -> dict[str, Any]:
    """Regression targets: the default loss is MSE."""
    inputs = torch.randn(2, 1, 4, 4)
    return {"model": _model, "optimizer": torch.optim.AdamW, "example_batch": (inputs, inputs)}


def lambda_optimizer() -> dict[str, Any]:
    """An optimizer factory that takes no keyword arguments (fused=True cannot be tried)."""
    return {
        "model": _model,
        "optimizer": lambda params: torch.optim.SGD(params, lr=0.1),
        "example_batch": _batch(2),
    }


# --- broken factories -----------------------------------------------------------------------------

NOT_A_FUNCTION = 3


def broken() -> dict[str, Any]:
    return {"optimizer": torch.optim.AdamW, "example_batch": _batch()}


def no_optimizer() -> dict[str, Any]:
    return {"model": _model, "example_batch": _batch()}


def no_data() -> dict[str, Any]:
    return {"model": _model, "optimizer": torch.optim.AdamW}


def raises() -> dict[str, Any]:
    raise RuntimeError("the data directory /data/imagenet is missing")


def exits() -> dict[str, Any]:
    raise SystemExit(2)


def needs_args(data_dir: str) -> dict[str, Any]:
    return good_mapping()


def wrong_type() -> int:
    return 42


def returns_module() -> nn.Module:
    return _model()


def unknown_key() -> dict[str, Any]:
    return {"modle": _model, "optimizer": torch.optim.AdamW, "example_batch": _batch()}


def bad_kind() -> dict[str, Any]:
    return {**good_mapping(), "kind": "transformers"}


def optimizer_instance() -> dict[str, Any]:
    """An optimizer built over the model given as an object: rebuilt over each copy."""
    model = _model()
    return {
        "model": model,
        "optimizer": torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.5),
        "example_batch": _batch(),
    }


def optimizer_of_another_model() -> dict[str, Any]:
    """An optimizer over another model than the one given: it would train nothing."""
    return {
        "model": _model(),
        "optimizer": torch.optim.AdamW(_model().parameters()),
        "example_batch": _batch(),
    }


def step_and_loss() -> dict[str, Any]:
    return {
        **good_mapping(),
        "train_step": lambda model, batch: model(batch[0]).sum(),
        "loss_fn": nn.functional.cross_entropy,
    }


def model_is_string() -> dict[str, Any]:
    return {**good_mapping(), "model": "resnet50"}


def model_function_returns_string() -> dict[str, Any]:
    return {**good_mapping(), "model": lambda: "resnet50"}


def mismatched_batch() -> dict[str, Any]:
    return {**good_mapping(), "example_batch": (torch.zeros(4, 16), torch.zeros(3))}


def batch_is_one_tensor() -> dict[str, Any]:
    """A batch of inputs alone: the model returns no loss, and there is no loss_fn."""
    return {**good_mapping(), "example_batch": torch.zeros(4, 16)}


def batch_without_tensors() -> dict[str, Any]:
    return {**good_mapping(), "example_batch": ["a", "b"]}


def ragged_dataset() -> dict[str, Any]:
    return {"model": _model, "optimizer": torch.optim.AdamW, "dataset": RaggedDataset()}


def dict_dataset() -> dict[str, Any]:
    return {"model": _model, "optimizer": torch.optim.AdamW, "dataset": DictDataset()}


def failing_dataset() -> dict[str, Any]:
    return {"model": _model, "optimizer": torch.optim.AdamW, "dataset": FailingDataset()}


def list_dataset() -> dict[str, Any]:
    return {"model": _model, "optimizer": torch.optim.AdamW, "dataset": 42}
