"""Batches of any structure on the device (``apply.batch_to_device``, ``map_tensors``): every
container rebuilt as it was, channels_last for 4-D floating tensors only, and the batch
dimension of every tensor marked dynamic when the settings compile."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import pytest
import torch

from torch_autotune.apply import batch_to_device, map_tensors
from torch_autotune.settings import Compile, Settings, torch_defaults


class Pair(NamedTuple):
    inputs: Any
    targets: Any


class Encoding(collections.UserDict):  # type: ignore[type-arg]
    """A mapping type built from a dict, as transformers' BatchEncoding is."""


class Columns(Mapping):  # type: ignore[type-arg]
    """A mapping type that cannot be built from a dict (it takes keyword arguments only)."""

    def __init__(self, *, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Any:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


@dataclasses.dataclass(frozen=True)
class Batch:
    """A batch class of the user's: tensors, a name, and a field set in __post_init__."""

    pixels: torch.Tensor
    labels: torch.Tensor
    source: str = "train"
    size: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", int(self.pixels.shape[0]))


def settings_with(**update: Any) -> Settings:
    return torch_defaults("cpu").model_copy(update=update)


CHANNELS_LAST = settings_with(memory_format="channels_last")
COMPILED = settings_with(compile=Compile(enabled=True, mode="default"))


# --- map_tensors and batch_to_device: every structure -------------------------------------------


def test_every_container_keeps_its_type_and_every_tensor_is_mapped() -> None:
    x, y = torch.ones(2, 3), torch.zeros(2, dtype=torch.int64)
    batch = {
        "pair": Pair(x, y),
        "list": [x, (y, "text")],
        "encoding": Encoding({"input_ids": y}),
        "nested": {"deeper": {"deepest": x}},
        "count": 7,
        "none": None,
    }
    doubled = map_tensors(batch, lambda t: t * 2)
    assert type(doubled) is dict
    assert type(doubled["pair"]) is Pair
    assert torch.equal(doubled["pair"].inputs, x * 2)
    assert type(doubled["list"]) is list
    assert type(doubled["list"][1]) is tuple
    assert doubled["list"][1][1] == "text"
    assert type(doubled["encoding"]) is Encoding
    assert torch.equal(doubled["encoding"]["input_ids"], y * 2)
    assert torch.equal(doubled["nested"]["deeper"]["deepest"], x * 2)
    assert doubled["count"] == 7
    assert doubled["none"] is None


def test_a_lone_tensor_and_plain_values_map_as_themselves() -> None:
    assert torch.equal(map_tensors(torch.ones(2), lambda t: t + 1), torch.full((2,), 2.0))
    assert map_tensors("text", lambda t: t + 1) == "text"
    assert map_tensors(3.5, lambda t: t + 1) == 3.5


def test_a_mapping_type_not_built_from_a_dict_becomes_a_dict() -> None:
    mapped = map_tensors(Columns(data={"x": torch.ones(2)}), lambda t: t * 3)
    assert type(mapped) is dict
    assert torch.equal(mapped["x"], torch.full((2,), 3.0))


def test_a_dataclass_is_rebuilt_with_its_tensors_mapped() -> None:
    batch = Batch(torch.ones(4, 3), torch.zeros(4, dtype=torch.int64), source="val")
    mapped = map_tensors(batch, lambda t: t[:2])
    assert type(mapped) is Batch
    assert tuple(mapped.pixels.shape) == (2, 3)
    assert tuple(mapped.labels.shape) == (2,)
    assert mapped.source == "val"
    assert mapped.size == 2  # __post_init__ ran again on the new tensors


def test_a_real_batch_encoding_keeps_its_type() -> None:
    transformers = pytest.importorskip("transformers")
    encoding = transformers.BatchEncoding({"input_ids": torch.ones(2, 5, dtype=torch.int64)})
    moved = batch_to_device(torch_defaults("cpu"), encoding)
    assert isinstance(moved, transformers.BatchEncoding)
    assert torch.equal(moved["input_ids"], encoding["input_ids"])


def test_an_object_with_a_to_method_is_moved_only_when_a_device_is_given() -> None:
    class Moves:
        def __init__(self) -> None:
            self.moved_to: str | None = None

        def to(self, device: str) -> Moves:
            self.moved_to = device
            return self

    kept = Moves()
    assert map_tensors([kept], lambda t: t)[0].moved_to is None
    moved = batch_to_device(torch_defaults("cpu"), [Moves()])[0]
    assert moved.moved_to == "cpu"


@pytest.mark.parametrize(
    ("tensor", "channels_last"),
    [
        (torch.randn(2, 3, 8, 8), True),  # an image batch
        (torch.randn(2, 3, 8, 8, dtype=torch.float64), True),
        (torch.randint(0, 5, (2, 3, 8, 8)), False),  # integer: a mask or labels, not an image
        (torch.randn(2, 3, 8), False),
        (torch.randn(2, 3, 4, 8, 8), False),
    ],
    ids=["float32-4d", "float64-4d", "int64-4d", "3d", "5d"],
)
def test_channels_last_applies_to_four_dimensional_floating_tensors_only(
    tensor: torch.Tensor, channels_last: bool
) -> None:
    moved = batch_to_device(CHANNELS_LAST, {"x": tensor, "y": [tensor]})
    for result in (moved["x"], moved["y"][0]):
        assert torch.equal(result, tensor)
        if channels_last:
            assert result.is_contiguous(memory_format=torch.channels_last)
            assert not result.is_contiguous()
        else:
            assert result.is_contiguous()


def test_contiguous_settings_leave_images_contiguous() -> None:
    images = torch.randn(2, 3, 8, 8)
    assert batch_to_device(torch_defaults("cpu"), (images,))[0].is_contiguous()


def _dynamic(tensor: torch.Tensor) -> set[int]:
    """The dims dynamo was told may vary (``maybe_mark_dynamic``, or ``mark_dynamic``)."""
    weak = getattr(tensor, "_dynamo_weak_dynamic_indices", set())
    strong = getattr(tensor, "_dynamo_dynamic_indices", set())
    return set(weak) | set(strong)


def test_compiling_marks_the_batch_dimension_of_every_tensor_dynamic() -> None:
    batch = {
        "input_ids": torch.ones(4, 7, dtype=torch.int64),
        "nested": (torch.randn(4, 3, 8, 8), [torch.zeros(4)]),
        "scale": torch.tensor(2.0),  # no dim 0 to mark
    }
    moved = batch_to_device(COMPILED, batch)
    for tensor in (moved["input_ids"], moved["nested"][0], moved["nested"][1][0]):
        assert _dynamic(tensor) == {0}
    assert _dynamic(moved["scale"]) == set()


def test_eager_settings_mark_nothing() -> None:
    moved = batch_to_device(torch_defaults("cpu"), {"x": torch.ones(4, 2)})
    assert _dynamic(moved["x"]) == set()
