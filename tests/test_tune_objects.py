"""``tune()`` on the objects a script already has: a model, its optimizer and its data (a
dataset, a DataLoader, an example batch), a collate, a loss or a step of its own; a dict of
them or a function that returns one. Real training steps on this CPU, on simulated time
(``fake_trials.tune_ticking``): the user's objects untouched afterwards, bad arguments one
line each, the result saved under its name and benched with the objects again."""

from __future__ import annotations

import functools
import random
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import torch_autotune
from tests.probe.fake_trials import recorded, tune_ticking
from torch_autotune import api
from torch_autotune.errors import WorkloadError
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe.workloads import resolve_workload
from torch_autotune.profile import Profile

LAPTOP = recorded("cpu-laptop-linux")
SGD = functools.partial(torch.optim.SGD, lr=0.1)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """One torch thread for a few dozen steps of a tiny model (a second thread only adds
    contention on a loaded 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class Samples(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """(features, class) samples made with the global RNG, as augmentations draw from it."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.randn(4) + index, index % 3


def quick(workload: Any = None, **options: Any) -> Profile:
    """``tune()`` with real steps on simulated time, on the laptop, without the workers."""
    options = {"budget_s": 30, "max_batch_size": 16, "num_workers": 0} | options
    return tune_ticking(workload, snapshot=LAPTOP, **options)


def details(profile: Profile) -> Any:
    assert profile.evidence is not None
    assert profile.evidence.details is not None
    return profile.evidence.details


def assert_measured(profile: Profile) -> None:
    evidence = profile.evidence
    assert evidence is not None
    assert profile.measured
    assert evidence.batch_size in {t.batch_size for t in evidence.search if t.fits}
    assert profile.settings.batch.batch_size == evidence.batch_size


# --- the objects, as keyword arguments ------------------------------------------------------


def test_a_model_an_optimizer_and_a_dataset() -> None:
    model = Classifier().eval()
    profile = quick(model=model, optimizer=SGD, dataset=Samples())
    assert_measured(profile)
    assert not model.training  # the probe trains copies, in training mode
    assert profile.evidence is not None
    assert profile.evidence.workload == "Classifier"
    found = details(profile)
    assert (found.source, found.model, found.optimizer) == ("objects", "Classifier", "SGD")
    assert found.call == "model(inputs) from (inputs, targets)"
    assert found.loss == "cross-entropy (the default for these targets)"
    assert profile.evidence.max_batch_size <= 16


def test_the_users_model_optimizer_and_random_streams_are_as_they_were() -> None:
    numpy = pytest.importorskip("numpy")
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()  # the user trained a step: momentum buffers exist
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    torch.manual_seed(7)
    random.seed(7)
    numpy.random.seed(7)
    expected = (torch.rand(3), random.random(), numpy.random.rand())
    torch.manual_seed(7)
    random.seed(7)
    numpy.random.seed(7)
    assert_measured(quick(model=model, optimizer=optimizer, dataset=Samples()))
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1]
    assert numpy.random.rand() == expected[2]
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())
    after = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(after, momentum, strict=True))
    assert [group["params"] for group in optimizer.param_groups] == [list(model.parameters())]
    assert model.training


def test_a_dataloader_is_taken_apart_its_collate_kept_and_its_batch_size_replaced() -> None:
    sizes: list[int] = []

    def collate(samples: list[tuple[torch.Tensor, int]]) -> dict[str, torch.Tensor]:
        sizes.append(len(samples))
        return {
            "x": torch.stack([x for x, _ in samples]),
            "label": torch.tensor([y for _, y in samples]),
        }

    loader = torch.utils.data.DataLoader(Samples(), batch_size=3, collate_fn=collate)
    workload = resolve_workload(objects={"model": Classifier(), "optimizer": SGD, "loader": loader})
    assert workload.dataset is loader.dataset
    assert workload.collate_fn is collate
    profile = quick(model=Classifier(), optimizer=SGD, loader=loader)
    assert_measured(profile)
    assert profile.evidence is not None
    assert {t.batch_size for t in profile.evidence.search} - {3}  # not the loader's size
    assert max(sizes) > 3  # the probe's batches went through the loader's collate
    assert details(profile).call == "model(**batch) with x ('label' is the default loss's targets)"


def test_a_dataloader_with_the_default_collate_leaves_the_collate_to_torch() -> None:
    loader = torch.utils.data.DataLoader(Samples(), batch_size=5)
    workload = resolve_workload(objects={"model": Classifier(), "optimizer": SGD, "loader": loader})
    assert workload.collate_fn is None
    assert workload.dataset is loader.dataset


def test_a_dataloader_given_as_the_dataset_is_taken_apart_as_well() -> None:
    loader = torch.utils.data.DataLoader(Samples(), batch_size=7, collate_fn=list)
    workload = resolve_workload(
        objects={"model": Classifier(), "optimizer": SGD, "dataset": loader},
    )
    assert workload.dataset is loader.dataset
    assert workload.collate_fn is list
    assert workload.max_batch_size == 40  # the dataset's size, not the loader's batch


def test_a_dataloader_whose_sampler_draws_a_subset_caps_the_batch_at_an_epoch() -> None:
    """A sampler over 10 of the 40 samples (a train split): the largest batch is what an
    epoch draws; at the dataset's 40, the user's own loader with drop_last ran no step."""
    subset = torch.utils.data.SubsetRandomSampler(list(range(10)))
    loader = torch.utils.data.DataLoader(Samples(), batch_size=4, sampler=subset, drop_last=True)
    workload = resolve_workload(objects={"model": Classifier(), "optimizer": SGD, "loader": loader})
    assert workload.max_batch_size == 10
    capped = resolve_workload(
        objects={"model": Classifier(), "optimizer": SGD, "loader": loader, "max_batch_size": 8}
    )
    assert capped.max_batch_size == 8  # the user's own cap stands


def test_a_profile_for_several_processes_caps_the_batch_at_each_ones_share_of_the_data() -> None:
    """Each rank's DistributedSampler draws its share of the dataset: a batch above it gives
    an epoch one short step (none with drop_last). 40 samples over 3 processes: 14 a rank."""
    profile = quick(
        model=Classifier(), optimizer=SGD, dataset=Samples(), processes_per_node=3, budget_s=60
    )
    assert_measured(profile)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.max_batch_size == 14
    assert evidence.limited_by == "cap"
    assert evidence.limit_reason is not None
    assert (
        "each rank's share of the dataset's 40 samples over 3 ranks (14)" in evidence.limit_reason
    )
    alone = quick(model=Classifier(), optimizer=SGD, dataset=Samples(), max_batch_size=64)
    assert alone.evidence is not None
    assert alone.evidence.max_batch_size == 40  # one process: the whole dataset


def test_a_loss_that_is_nan_is_said_in_the_notes() -> None:
    """A step whose loss is NaN trains as fast and learns nothing: the notes say so (the
    profile was saved as measured without a word)."""
    import torch.nn.functional as F

    def nan_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets) * float("nan")

    objects = {"model": Classifier(), "optimizer": SGD, "dataset": Samples(), "loss_fn": nan_loss}
    workload = resolve_workload(objects=objects)
    assert workload.details is not None
    assert not any("loss was" in n for n in workload.details().notes)  # no step yet
    model = workload.make_model()
    workload.train_step(model, workload.make_batch(4))
    (note,) = [n for n in workload.details().notes if "loss was" in n]
    assert note.startswith("the last training step's loss was nan: ")


def test_a_dataloader_over_a_stream_names_the_loader_and_the_fix() -> None:
    """It said "'dataset' is a Stream", though the user gave no dataset, only the loader."""

    class Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(Samples()[i] for i in range(8))

    loader = torch.utils.data.DataLoader(Stream(), batch_size=4)
    with pytest.raises(WorkloadError) as raised:
        resolve_workload(objects={"model": Classifier(), "optimizer": SGD, "loader": loader})
    said = str(raised.value)
    assert "the DataLoader reads a Stream, a stream the probe cannot draw samples" in said
    assert "example_batch=next(iter(loader))" in said
    assert "'dataset' is" not in said


def test_a_dataloader_over_whole_batches_asks_for_samples_or_an_example_batch() -> None:
    """batch_size=None turns batching off: each item is a batch, which no trial can resize."""
    loader = torch.utils.data.DataLoader(Samples(), batch_size=None)
    with pytest.raises(WorkloadError) as raised:
        resolve_workload(objects={"model": Classifier(), "optimizer": SGD, "loader": loader})
    assert str(raised.value) == (
        "'Classifier': the DataLoader has batch_size=None, so each item of its dataset is a whole"
        " batch, which the probe cannot resize; give a dataset of single samples (with its"
        " collate_fn), or example_batch=next(iter(loader))"
    )


def test_a_dataloader_with_a_batch_sampler_is_taken_apart_too() -> None:
    sampler = torch.utils.data.BatchSampler(range(40), batch_size=6, drop_last=False)
    loader = torch.utils.data.DataLoader(Samples(), batch_sampler=sampler)
    workload = resolve_workload(objects={"model": Classifier(), "optimizer": SGD, "loader": loader})
    inputs, targets = workload.make_batch(9)
    assert (tuple(inputs.shape), tuple(targets.shape)) == ((9, 4), (9,))


def test_an_example_batch_of_any_structure() -> None:
    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 3)

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return self.linear(ids * mask)

    batch = ((torch.randn(6, 4), torch.ones(6, 4)), torch.randint(0, 3, (6,)))
    profile = quick(model=TwoInputs(), optimizer=SGD, example_batch=batch)
    assert_measured(profile)
    assert details(profile).call == "model(*inputs) (2 inputs from (inputs, targets))"
    assert details(profile).batch == "((4 float32; 4 float32); int64)"
    assert profile.evidence is not None
    assert profile.evidence.max_batch_size == 16  # an example batch is repeated to any size


class TwoTowers(nn.Module):
    """A model of two inputs (an image-like and a metadata vector), as two-tower nets are."""

    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Linear(8, 16)
        self.meta = nn.Linear(4, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, image: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.image(image) + self.meta(meta)))


@pytest.mark.parametrize("nested", [True, False], ids=["((a, b), y)", "(a, b, y)"])
def test_a_two_input_model_with_tuple_samples_and_a_custom_loss(nested: bool) -> None:
    """Issue 18: '(a, b, y)' and '((a, b), y)' samples were refused as 'not an (inputs,
    targets) pair'; both train with no glue, the model called with both inputs and the
    user's loss taking the targets."""
    seen: list[tuple[int, ...]] = []

    def smoothed(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(targets.shape))
        return nn.functional.cross_entropy(outputs, targets, label_smoothing=0.1)

    rows = [(torch.randn(8), torch.randn(4), i % 3) for i in range(40)]
    samples = [((a, b), y) if nested else (a, b, y) for a, b, y in rows]
    profile = quick(model=TwoTowers(), optimizer=SGD, dataset=samples, loss_fn=smoothed)
    assert_measured(profile)
    found = details(profile)
    assert found.loss == "loss_fn(outputs, targets)"
    assert found.call == (
        "model(*inputs) (2 inputs from (inputs, targets))"
        if nested
        else "model(*batch[:-1]) (2 inputs; the last item is the targets)"
    )
    assert seen
    assert all(len(shape) == 1 for shape in seen)  # the labels, one per sample


def test_the_users_train_step_is_the_step() -> None:
    calls: list[int] = []

    def train_step(model: nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        calls.append(len(targets))
        return (
            nn.functional.cross_entropy(model(inputs), targets) + 0.1 * model(inputs).pow(2).mean()
        )

    profile = quick(model=Classifier(), optimizer=SGD, dataset=Samples(), train_step=train_step)
    assert_measured(profile)
    assert profile.evidence is not None
    assert set(calls) >= {t.batch_size for t in profile.evidence.search if t.fits}
    assert (details(profile).call, details(profile).loss) == (
        "train_step(model, batch)",
        "train_step",
    )


def test_variable_length_samples_with_a_padding_collate_are_searched_at_their_longest() -> None:
    lengths = [3 + (7 * i) % 29 for i in range(60)]  # 3 to 31 tokens, the longest at index 4

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return len(lengths)

        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            return torch.randint(1, 50, (lengths[index],)), index % 3

    def pad(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = nn.utils.rnn.pad_sequence([t for t, _ in samples], batch_first=True)
        return tokens, torch.tensor([y for _, y in samples])

    class Bag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.EmbeddingBag(50, 3)
            self.seen: list[tuple[int, int]] = []

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            self.seen.append(tuple(tokens.shape))
            return self.embedding(tokens)

    model = Bag()
    steps: list[tuple[int, int]] = []

    def train_step(copy: nn.Module, batch: Any) -> torch.Tensor:
        steps.append(tuple(batch[0].shape))
        return nn.functional.cross_entropy(copy(batch[0]), batch[1])

    profile = quick(
        model=model, optimizer=SGD, dataset=Tokens(), collate_fn=pad, train_step=train_step
    )
    assert_measured(profile)
    assert profile.evidence is not None
    trials = [
        t for t in profile.evidence.search if t.fits and t.step != "confirm (its throughput point)"
    ]
    searched = steps[: 3 * len(trials)]  # the search's trials came first, 3 steps each
    assert [size for size, _ in searched] == [t.batch_size for t in trials for _ in range(3)]
    assert {length for _, length in searched} == {max(lengths)}  # every one at the longest
    assert {length for _, length in steps[len(searched) :]} - {max(lengths)}  # points: ordinary
    assert details(profile).variable_shapes
    assert not profile.provenance.preferences.fixed_shapes  # the rules are told


# --- a dict, a factory, an object, and what is refused ----------------------------------------


def make_workload() -> dict[str, Any]:
    """A factory as a script defines one: what the user already has, in a dict."""
    return {"model": Classifier(), "optimizer": SGD, "dataset": Samples()}


def test_a_dict_of_the_objects() -> None:
    profile = quick(make_workload())
    assert_measured(profile)
    assert profile.evidence is not None
    assert profile.evidence.workload == "Classifier"
    assert details(profile).source == "objects"


def test_a_factory_function_is_called_and_named_as_autotune_m_names_it() -> None:
    profile = quick(make_workload)
    assert_measured(profile)
    assert profile.evidence is not None
    assert profile.evidence.workload == "tests.test_tune_objects:make_workload"
    assert details(profile).source == "factory"


def test_name_names_the_objects_and_the_saved_profile(
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    detected_as("cpu-laptop-linux")  # recommend() finds the machine the profile was made on
    profile = quick(model=Classifier(), optimizer=SGD, dataset=Samples(), name="my-classifier")
    assert profile.evidence is not None
    assert profile.evidence.workload == "my-classifier"
    saved = api.save(profile)
    assert saved.exists()
    again = torch_autotune.recommend(workload="my-classifier")
    assert again.measured
    assert again.settings.batch.batch_size == profile.settings.batch.batch_size


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: quick(Classifier()),
            "'Classifier' is a Classifier alone: the probe also needs its data; give model,"
            " optimizer and a dataset, a loader or an example_batch (see the README's 'Your own"
            " model')",
        ),
        (
            lambda: quick("conv", model=Classifier()),
            "give the workload (a str) or its objects (model), not both",
        ),
        (
            lambda: quick(model=Classifier(), dataset=Samples()),
            "'Classifier' has no 'optimizer'; give model, optimizer and a dataset, a loader or an"
            " example_batch (see the README's 'Your own model')",
        ),
        (
            lambda: quick(model=Classifier(), optimizer="adamw", dataset=Samples()),
            "'Classifier': 'optimizer' is a str; give an optimizer, or a function params ->"
            " optimizer such as functools.partial(torch.optim.AdamW, lr=3e-4)",
        ),
        (
            lambda: quick(model=Classifier(), optimizer=SGD, dataset=40),
            "'Classifier': 'dataset' is an int, not a map-style dataset (one with __len__ and"
            " __getitem__); give one, or an example_batch instead",
        ),
        (
            lambda: quick(model=Classifier(), optimizer=SGD, loader=Samples()),
            "'Classifier': 'loader' is a Samples, not a torch.utils.data.DataLoader",
        ),
    ],
    ids=["model-alone", "workload-and-objects", "no-optimizer", "optimizer-name", "int", "loader"],
)
def test_what_cannot_be_tuned_is_one_line(call: Any, message: str) -> None:
    with pytest.raises(WorkloadError) as raised:
        call()
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("min_batch_size", "2", "min_batch_size must be an int, got '2'"),
        ("max_batch_size", 2.5, "max_batch_size must be an int, got 2.5"),
        ("num_workers", True, "num_workers must be an int, got True"),
        ("min_batch_size", 0, "min_batch_size must be in [1, "),
    ],
)
def test_a_count_that_is_not_an_int_in_range_is_a_value_error(
    option: str, value: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        torch_autotune.tune(model=Classifier(), optimizer=SGD, dataset=Samples(), **{option: value})


def test_a_min_batch_size_above_the_datasets_size_says_so() -> None:
    with pytest.raises(WorkloadError) as raised:
        quick(
            model=Classifier(),
            optimizer=SGD,
            dataset=Samples(),
            min_batch_size=64,
            max_batch_size=None,  # the dataset's size alone is the largest batch
        )
    assert str(raised.value) == (
        "workload 'Classifier': min_batch_size 64 is above its largest batch, 40 (the number of"
        " samples in its dataset)"
    )


# --- the bench, with the objects again ------------------------------------------------------


def test_the_bench_takes_the_objects_again_and_names_them_as_the_profile() -> None:
    profile = quick(model=Classifier(), optimizer=SGD, dataset=Samples(), name="mine")
    benched = torch_autotune.bench(
        profile,
        workload={"model": Classifier(), "optimizer": SGD, "dataset": Samples()},
        rounds=1,
        seconds=0.05,
        measure=lambda config, seconds: 100.0 * (config.batch_size or 1) ** 0.5,
    )
    assert benched.evidence is not None
    assert benched.evidence.bench is not None
    assert benched.evidence.bench.workload == "mine"


def test_the_bench_without_the_objects_asks_for_them_in_one_line() -> None:
    profile = quick(model=Classifier(), optimizer=SGD, dataset=Samples(), name="mine")
    with pytest.raises(WorkloadError) as raised:
        torch_autotune.bench(profile, rounds=1, seconds=0.05, measure=lambda c, s: 1.0)
    assert str(raised.value) == (
        "the profile was measured on objects given to tune() ('mine'), which cannot be built"
        " again from their name; give them to the bench too: bench(profile,"
        " workload={'model': ..., 'optimizer': ..., 'dataset': ...})"
    )


def test_the_bench_of_a_dataset_smaller_than_the_baselines_batch_ends() -> None:
    """The baseline trains at batch 32; 20 samples make no batch of 32 with drop_last, and the
    loop went through empty epochs forever. The arm fails and says why; the others run."""

    class Twenty(Samples):
        def __len__(self) -> int:
            return 20

    objects = {"model": Classifier(), "optimizer": SGD, "dataset": Twenty()}
    profile = quick(**objects)
    results: list[Profile] = []
    bench = threading.Thread(
        target=lambda: results.append(
            torch_autotune.bench(profile, workload=objects, rounds=1, seconds=0.05)
        ),
        daemon=True,
    )
    bench.start()
    bench.join(timeout=120)
    assert not bench.is_alive(), "the bench did not end"
    assert results[0].evidence is not None
    assert results[0].evidence.bench is not None
    baseline = next(a for a in results[0].evidence.bench.arms if "baseline" in a.names)
    assert baseline.samples_per_s == (None,)
    assert baseline.error == (
        "batch 32 is larger than the dataset (20 samples): the DataLoader, which drops an"
        " incomplete last batch, yields none"
    )
    tuned = next(a for a in results[0].evidence.bench.arms if "tuned" in a.names)
    assert tuned.samples_per_s[0] is not None


def test_a_workload_built_fused_is_profiled_and_benched_as_it_trained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tune(trainer) with optim='adamw_torch_fused' on a CPU recorded fused_optimizer: off in
    the profile and in every variant of the evidence, while the Trainer's fused AdamW trained
    (the probe passes no fused where the profile keeps torch's default). The profile, the
    evidence and the bench now say what trained, with what fixed it."""
    from dataclasses import replace

    from tests.probe.fake_trials import mlp_machine, tune_on
    from torch_autotune.compose import bench_plan
    from torch_autotune.probe import workers_phase

    fixed = "your Trainer's optim='adamw_torch_fused'"
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 1)
    workload = replace(resolve_workload("mlp"), fused_by=fixed)
    profile = tune_on(mlp_machine(), workload, recorded("cpu-laptop-linux"), budget_s=15)
    assert profile.settings.optimizer.fused
    decision = profile.decision("optimizer.fused")
    assert decision is not None
    assert decision.reason.startswith(f"fixed by {fixed}")
    assert profile.evidence is not None
    assert {v.settings["fused_optimizer"] for v in profile.evidence.variants} == {"on"}
    plan, not_ablated = bench_plan(profile, None, has_dataset=True, workload="mlp")
    assert plan.baseline.fused_optimizer  # every arm's optimizer is built fused
    assert all(knob.name != "fused_optimizer" for knob in plan.knobs)
    assert f"fused optimizer: fixed by {fixed}, which trains every arm fused" in not_ablated
