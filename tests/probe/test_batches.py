"""Batches of any structure: repeated to any size (``repeat_batch``, ``RepeatedBatch``),
collated from a dataset's largest or random samples (``DatasetBatches``), and described for
reports. Moving them to the device: ``tests/test_batch_to_device.py``."""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_batch_to_device import Batch, Encoding, Pair
from torch_autotune.errors import WorkloadError, raised_by_user_code
from torch_autotune.probe.workloads import as_workload
from torch_autotune.probe.workloads.batches import (
    DatasetBatches,
    RepeatedBatch,
    batch_samples,
    collate_samples,
    describe_batch,
    repeat_batch,
)

# --- repeat_batch and RepeatedBatch --------------------------------------------------------------

Leaf = Callable[[int], Any]


def _batched(trailing: tuple[int, ...], dtype: torch.dtype) -> Leaf:
    def make(count: int) -> torch.Tensor:
        return torch.arange(count * max(1, _numel(trailing))).reshape(count, *trailing).to(dtype)

    return make


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


LEAVES = st.one_of(
    st.builds(
        _batched,
        st.lists(st.integers(1, 3), max_size=2).map(tuple),
        st.sampled_from([torch.float32, torch.int64]),
    ),
    st.just(lambda count: [f"text {i}" for i in range(count)]),  # one string per sample
    st.just(lambda count: torch.tensor(0.5)),  # a scalar: not per sample
    st.just(lambda count: "a name"),
    st.just(lambda count: 3),
)


def _tree(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, min_size=1, max_size=3).map(lambda items: ("tuple", items)),
        st.lists(children, min_size=1, max_size=3).map(lambda items: ("list", items)),
        st.lists(children, min_size=1, max_size=3).map(lambda items: ("dict", items)),
        st.tuples(children, children).map(lambda items: ("pair", list(items))),
        st.lists(children, min_size=1, max_size=3).map(lambda items: ("encoding", items)),
    )


SHAPES = st.recursive(LEAVES.map(lambda leaf: ("leaf", leaf)), _tree, max_leaves=6)


def _build(shape: tuple[str, Any], count: int) -> Any:
    kind, content = shape
    if kind == "leaf":
        return content(count)
    items = [_build(child, count) for child in content]
    if kind == "tuple":
        return tuple(items)
    if kind == "list":  # a list that holds a batched tensor: the batch's structure
        return [*items, torch.arange(count)]
    if kind == "pair":
        return Pair(*items)
    keyed = {f"key{i}": item for i, item in enumerate(items)}
    return keyed if kind == "dict" else Encoding(keyed)


def _assert_repeated(original: Any, repeated: Any, count: int, size: int) -> None:
    """``repeated`` has ``original``'s structure, ``size`` samples wherever ``original`` had
    ``count``, taken cyclically; everything else kept as it was."""
    assert type(repeated) is type(original)
    if isinstance(original, torch.Tensor):
        if original.dim() > 0 and original.shape[0] == count:
            assert repeated.shape == (size, *original.shape[1:])
            for i in range(size):
                assert torch.equal(repeated[i], original[i % count])
        else:
            assert torch.equal(repeated, original)
    elif isinstance(original, list) and original and all(isinstance(v, str) for v in original):
        assert repeated == [original[i % count] for i in range(size)]
    elif isinstance(original, Mapping):
        assert list(repeated) == list(original)
        for key in original:
            _assert_repeated(original[key], repeated[key], count, size)
    elif isinstance(original, (tuple, list)):
        assert len(repeated) == len(original)
        for before, after in zip(original, repeated, strict=True):
            _assert_repeated(before, after, count, size)
    else:
        assert repeated == original


@settings(max_examples=150, deadline=None)
@given(shape=SHAPES, count=st.integers(1, 4), size=st.integers(1, 9))
def test_any_nested_batch_repeats_to_any_size_keeping_its_structure(
    shape: tuple[str, Any], count: int, size: int
) -> None:
    batch = _build(shape, count)
    _assert_repeated(batch, repeat_batch(batch, count, size), count, size)


@pytest.mark.parametrize("count", [2, 3])
def test_a_list_batch_of_as_many_fields_as_samples_repeats_its_fields(count: int) -> None:
    """torch's default collate batches (inputs, targets) samples as a list [inputs, targets]:
    with two samples that list has two items, and it is the batch's structure, not a list of
    samples."""
    fields = [torch.arange(count * 2).reshape(count, 2) + 10 * i for i in range(count)]
    repeated = repeat_batch(list(fields), count, 5)
    assert type(repeated) is list
    assert len(repeated) == count
    for before, after in zip(fields, repeated, strict=True):
        assert tuple(after.shape) == (5, 2)
        assert torch.equal(after[count], before[0])


def test_an_example_batch_from_a_loader_of_two_samples_trains_at_every_size() -> None:
    """``next(iter(loader))`` of (inputs, targets) samples at batch size 2 is a list of two
    tensors: the workload trains on it as (inputs, targets) at any size."""
    samples = [(torch.randn(3), 1), (torch.randn(3), 0)]
    example = next(iter(torch.utils.data.DataLoader(samples, batch_size=2)))
    assert isinstance(example, list)
    workload = as_workload(
        {
            "model": torch.nn.Linear(3, 2),
            "optimizer": functools.partial(torch.optim.SGD, lr=0.1),
            "example_batch": example,
        },
        name="two",
    )
    model = workload.make_model()
    for size in (1, 2, 5):
        inputs, targets = workload.make_batch(size)
        assert inputs.shape == (size, 3)
        assert workload.train_step(model, [inputs, targets]).dim() == 0
    assert workload.train_step.call == "model(inputs) from (inputs, targets)"


def test_an_example_batch_of_the_users_own_batch_class_trains_at_every_size() -> None:
    """A dataclass batch, as map_tensors moves it: repeated field by field, given to the
    model as it is."""

    class Reads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(3, 2)

        def forward(self, batch: Batch) -> Any:
            return torch.nn.functional.cross_entropy(self.linear(batch.pixels), batch.labels)

    example = Batch(torch.randn(2, 3), torch.tensor([0, 1]), source="val")
    workload = as_workload(
        {"model": Reads(), "optimizer": torch.optim.SGD, "example_batch": example}, name="mine"
    )
    batch = workload.make_batch(5)
    assert type(batch) is Batch
    assert (batch.size, batch.source) == (5, "val")
    assert workload.train_step(workload.make_model(), batch).dim() == 0


def test_per_sample_lists_are_repeated_wherever_they_are() -> None:
    batch = (["a", "b"], {"ids": ["x", "y"]}, torch.tensor([0, 1]))
    texts, mapping, labels = repeat_batch(batch, 2, 3)
    assert texts == ["a", "b", "a"]
    assert mapping["ids"] == ["x", "y", "x"]
    assert labels.tolist() == [0, 1, 0]


def test_a_repeated_batch_cuts_to_fewer_samples_and_refuses_a_size_that_is_not_one() -> None:
    make = RepeatedBatch((torch.arange(4), torch.arange(4) * 2), 4)
    inputs, targets = make(2)
    assert inputs.tolist() == [0, 1]
    assert targets.tolist() == [0, 2]
    for bad in (0, -3, 1.5, True):
        with pytest.raises(ValueError, match="batch size must be a positive int"):
            make(bad)


def test_batch_samples_is_the_first_dimension_of_the_first_tensor() -> None:
    assert batch_samples({"text": ["a"], "ids": (torch.tensor(1.0), torch.zeros(5, 2))}) == 5
    assert batch_samples(Batch(torch.zeros(3, 2), torch.zeros(3))) == 3
    assert batch_samples(torch.tensor(3.0)) is None
    assert batch_samples(["a", "b"]) is None


# --- DatasetBatches ----------------------------------------------------------------------------


class Sequences:
    """Token sequences of the lengths given, each labelled with its index; counts reads."""

    def __init__(self, lengths: list[int], *, read_s: float = 0.0) -> None:
        self.lengths = lengths
        self.read_s = read_s
        self.reads: list[int] = []

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        self.reads.append(index)
        if self.read_s:
            time.sleep(self.read_s)
        return torch.full((self.lengths[index],), index, dtype=torch.int64), index


def pad(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A padding collate: sequences padded with -1 to the longest of the batch."""
    longest = max(len(tokens) for tokens, _ in samples)
    padded = torch.full((len(samples), longest), -1, dtype=torch.int64)
    for row, (tokens, _) in enumerate(samples):
        padded[row, : len(tokens)] = tokens
    return padded, torch.tensor([label for _, label in samples])


def test_samples_of_one_size_are_read_once_and_cycled() -> None:
    dataset = Sequences([4] * 100)
    batches = DatasetBatches(dataset, None, "fixed")
    tokens, labels = batches.worst(70)
    assert tuple(tokens.shape) == (70, 4)
    assert labels.tolist() == [i % DatasetBatches.DISTINCT for i in range(70)]
    assert not batches.variable
    assert batches.note == ""
    assert torch.equal(batches.typical(70)[0], tokens)  # nothing varies: the same batches
    batches.worst(3)
    # the first samples, kept, and a few spread up to the last: each read once
    assert len(dataset.reads) == len(set(dataset.reads))
    assert len(dataset.reads) == DatasetBatches.DISTINCT + DatasetBatches.SPREAD
    assert max(dataset.reads) == 99


def test_samples_that_differ_only_beyond_the_first_ones_are_found() -> None:
    """A dataset sorted by length: its first samples are alike, its longest are at the end."""
    lengths = [2] * 700 + [3] * 200 + [40] * 100
    batches = DatasetBatches(Sequences(lengths), pad, "sorted")
    tokens, labels = batches.worst(8)
    assert batches.variable
    assert tokens.shape[1] == 40
    assert all(lengths[i] == 40 for i in labels.tolist())


def test_samples_that_keep_their_text_are_ranked_by_their_tokens() -> None:
    """A sample's text beside its tokens: the longest tokens are the largest sample, not the
    longest text (the search trained at width 8, never on the one 64-token sample)."""

    class Texts:
        rows = [{"text": "w" * 500, "input_ids": [1] * 8}] * 20 + [
            {"text": "short", "input_ids": [1] * 64}
        ]

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, index: int) -> dict[str, Any]:
            return self.rows[index]

    def tokens_only(rows: list[dict[str, Any]]) -> torch.Tensor:
        longest = max(len(row["input_ids"]) for row in rows)
        return torch.tensor(
            [row["input_ids"] + [0] * (longest - len(row["input_ids"])) for row in rows]
        )

    batches = DatasetBatches(Texts(), tokens_only, "texts")
    assert batches.worst(2).shape == (2, 64)

    import numpy as np

    class Arrays(Texts):  # a datasets.Dataset in numpy format
        rows: ClassVar[list[dict[str, Any]]] = [
            {"text": r["text"], "input_ids": np.array(r["input_ids"])} for r in Texts.rows
        ]

    def arrays_only(rows: list[dict[str, Any]]) -> torch.Tensor:
        return tokens_only([{"input_ids": list(row["input_ids"])} for row in rows])

    assert DatasetBatches(Arrays(), arrays_only, "arrays").worst(2).shape == (2, 64)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=2, max_size=300).filter(
        lambda lengths: len(set(lengths)) > 1
    ),
    size=st.integers(1, 16),
)
def test_the_search_trains_on_the_longest_samples_through_the_collate(
    lengths: list[int], size: int
) -> None:
    batches = DatasetBatches(Sequences(lengths), pad, "variable")
    tokens, labels = batches.worst(size)
    assert batches.variable
    assert tokens.shape[1] == max(lengths)  # padded to the longest sample of the dataset
    longest = sorted(lengths, reverse=True)[: min(size, DatasetBatches.DISTINCT)]
    taken = sorted((lengths[i] for i in labels.tolist()[: len(longest)]), reverse=True)
    assert taken == longest


def test_the_throughput_points_train_on_random_samples_the_same_every_time() -> None:
    lengths = [2, 3] * 250 + [50] * 5 + [2, 3] * 245
    batches = DatasetBatches(Sequences(lengths), pad, "variable")
    worst, typical = batches.worst(8), batches.typical(8)
    assert worst[0].shape[1] == 50
    assert sorted(worst[1].tolist()[:5]) == [500, 501, 502, 503, 504]  # the longest first
    assert set(typical[1].tolist()) != set(worst[1].tolist())
    assert torch.equal(batches.typical(8)[0], typical[0])
    again = DatasetBatches(Sequences(lengths), pad, "variable")
    assert torch.equal(again.typical(8)[1], typical[1])  # seeded: the same draw every run
    assert "the search trains on the largest of" in batches.note
    assert f"samples read (of {len(lengths)})" in batches.note


def test_a_large_dataset_is_scanned_within_bounds() -> None:
    lengths = [random.Random(i).randint(1, 30) for i in range(200_000)]
    dataset = Sequences(lengths)
    batches = DatasetBatches(dataset, pad, "large")
    batches.worst(4)
    assert (
        DatasetBatches.DISTINCT
        < len(set(dataset.reads))
        <= (DatasetBatches.DISTINCT + DatasetBatches.SCAN)
    )
    spread = sorted(set(dataset.reads))
    assert spread[-1] > len(lengths) * 0.9  # spread over the whole dataset, not its start


def test_a_slow_dataset_is_scanned_for_at_most_the_scan_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(DatasetBatches, "SCAN_S", 0.05)
    dataset = Sequences([1 + i % 7 for i in range(5000)], read_s=0.002)
    began = time.perf_counter()
    DatasetBatches(dataset, pad, "slow").worst(2)
    assert time.perf_counter() - began < 1.0
    assert len(dataset.reads) < DatasetBatches.DISTINCT + 200


def test_a_dataset_that_raises_is_the_users_error_naming_the_index() -> None:
    class Broken:
        def __len__(self) -> int:
            return 10

        def __getitem__(self, index: int) -> Any:
            raise OSError(f"cannot open {index}.png")

    with pytest.raises(WorkloadError) as raised:
        DatasetBatches(Broken(), None, "broken").worst(2)
    assert (
        str(raised.value)
        == "'broken': dataset[0] raised OSError: cannot open 0.png; fix the dataset"
    )
    assert raised_by_user_code(raised.value.__cause__)
    assert not raised_by_user_code(raised.value)


def test_a_collate_that_raises_is_the_users_error() -> None:
    def collate(samples: list[Any]) -> Any:
        raise KeyError("pad_token_id")

    with pytest.raises(WorkloadError) as raised:
        collate_samples([1, 2], collate, "mine")
    assert str(raised.value) == (
        "'mine': the collate_fn raised KeyError: 'pad_token_id' on 2 samples; fix it"
    )
    assert raised_by_user_code(raised.value.__cause__)


def test_samples_the_default_collate_cannot_batch_ask_for_a_collate_fn() -> None:
    with pytest.raises(WorkloadError) as raised:
        collate_samples([torch.zeros(2), torch.zeros(3)], None, "ragged")
    assert "give a collate_fn that batches them" in str(raised.value)
    assert not raised_by_user_code(raised.value.__cause__)  # torch's collate, not theirs


# --- describe_batch ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "described"),
    [
        (torch.zeros(8, 3, 64, 64), "3x64x64 float32"),
        (torch.zeros(8, dtype=torch.int64), "int64"),
        ((torch.zeros(8, 4), torch.zeros(8, dtype=torch.int64)), "(4 float32; int64)"),
        (
            {"input_ids": torch.zeros(2, 128, dtype=torch.int64), "text": ["a", "b"]},
            "{input_ids: 128 int64, text: (text; text)}",
        ),
        ({"a": {"b": {"c": {"d": torch.zeros(1)}}}}, "{a: {b: {c: ...}}}"),
        (Pair(torch.zeros(2, 5), 3), "(5 float32; int)"),
    ],
)
def test_describe_batch_says_what_one_sample_is(batch: Any, described: str) -> None:
    assert describe_batch(batch) == described
