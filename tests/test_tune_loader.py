"""``tune(loader=my_dataloader)``: the DataLoader is taken apart into its dataset and collate,
and what it says beyond them is kept where the probe can keep it and said where it cannot
(``probe.workloads.given``). Its batch size, workers and pinning are what the probe measures:
replaced, the notes name the loader's values. Its ``worker_init_fn`` and
``multiprocessing_context`` go to the probe's DataLoaders with workers. Its sampler,
generator and drop_last stay the user's, said in the notes; a ``batch_sampler`` fixes the batch
size, which the notes and every export say. Real steps on this CPU, on simulated time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    SequentialSampler,
    WeightedRandomSampler,
    get_worker_info,
)

from tests.batchnorm import with_batch_one_raising
from tests.test_tune_objects import SGD, Classifier, Samples, assert_measured, details, quick
from torch_autotune.errors import WorkloadError
from torch_autotune.integrations import tool_notes
from torch_autotune.probe.loader import measure_loader
from torch_autotune.probe.workloads import resolve_workload


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def notes_of(loader: DataLoader[Any]) -> tuple[str, ...]:
    workload = resolve_workload(objects={"model": Classifier(), "optimizer": SGD, "loader": loader})
    assert workload.details is not None
    return workload.details().notes


class OpenedInWorkers(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A dataset whose workers need the worker_init_fn to have run (as one that sets up a
    per-worker shard or handle checks); in the main process it reads as it is."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        worker = get_worker_info()
        if worker is not None and not getattr(worker.dataset, "opened", False):
            raise RuntimeError("worker_init_fn did not run in this worker")
        return torch.randn(4) + index, index % 3


def open_in_worker(worker_id: int) -> None:
    info = get_worker_info()
    assert info is not None
    info.dataset.opened = True


class OnlyInWorkers(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """An HDF5/LMDB-style dataset: its handle is opened in each worker by worker_init_fn, and
    is None anywhere else."""

    def __init__(self) -> None:
        self.handle: torch.Tensor | None = None

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.handle[index], index % 3  # type: ignore[index]


def open_handle(worker_id: int) -> None:
    info = get_worker_info()
    assert info is not None
    info.dataset.handle = torch.randn(40, 4)


# --- replaced: what the probe measures ---------------------------------------------------------


def test_the_settings_the_probe_measures_are_replaced_and_the_notes_name_the_loaders() -> None:
    loader = DataLoader(
        Samples(),
        batch_size=3,
        num_workers=2,
        pin_memory=True,
        persistent_workers=True,
        prefetch_factor=4,
    )
    assert notes_of(loader)[0] == (
        "the DataLoader's batch_size=3, num_workers=2, pin_memory=True, persistent_workers=True,"
        " prefetch_factor=4 are replaced by what the probe measured: the profile's batch size"
        " and DataLoader settings (profile.dataloader_kwargs())"
    )
    assert notes_of(DataLoader(Samples(), batch_size=3)) == ()  # the batch alone: documented


# --- kept: what the workers need -----------------------------------------------------------------


def test_the_worker_init_fn_and_the_start_method_go_to_the_probes_workers() -> None:
    loader = DataLoader(
        OpenedInWorkers(),
        batch_size=4,
        num_workers=1,
        worker_init_fn=open_in_worker,
        multiprocessing_context="fork",
    )
    assert [len(x) for x, _ in loader] == [4] * 10  # the user's loader works
    workload = resolve_workload(objects={"model": Classifier(), "optimizer": SGD, "loader": loader})
    trial = measure_loader(
        workload.dataset,  # type: ignore[arg-type]
        batch_size=4,
        num_workers=1,
        batches=2,
        **workload.loading(),
    )
    assert trial.ok, trial.error
    assert workload.details is not None
    assert (
        "the DataLoader's worker_init_fn (open_in_worker) and multiprocessing_context ('fork')"
        " went to every DataLoader the probe started workers in, as yours; give them to your"
        " DataLoader again beside the profile's arguments (yours win over"
        " profile.dataloader_kwargs()'s)"
    ) in workload.details().notes


def test_a_tune_with_workers_runs_the_loaders_worker_init_fn() -> None:
    """The fed passes' DataLoader with a worker: the user's worker_init_fn runs in it, where
    without it the dataset raised in the worker and the tune failed."""
    loader = DataLoader(OpenedInWorkers(), batch_size=4, worker_init_fn=open_in_worker)
    profile = quick(model=Classifier(), optimizer=SGD, loader=loader, num_workers=1)
    assert_measured(profile)
    assert profile.settings.dataloader.num_workers == 1
    assert any("worker_init_fn (open_in_worker)" in note for note in details(profile).notes)


def test_a_dataset_opened_only_in_worker_init_fn_names_it_and_the_fix() -> None:
    """It said "dataset[0] raised ...; fix the dataset", of a dataset the user's own loader
    reads: the probe reads samples in this process, where worker_init_fn never runs."""
    loader = DataLoader(OnlyInWorkers(), batch_size=4, num_workers=1, worker_init_fn=open_handle)
    assert [len(x) for x, _ in loader] == [4] * 10  # the user's loader works
    with pytest.raises(WorkloadError) as raised:
        quick(model=Classifier(), optimizer=SGD, loader=loader)
    said = str(raised.value)
    assert said.startswith("'Classifier': dataset[0] raised TypeError: ")
    assert said.endswith(
        " in the main process, where the DataLoader's worker_init_fn (open_handle) does not run:"
        " the probe reads the samples of its training steps there, and measures loading without"
        " workers too; open what the dataset needs on its first use in __getitem__ (once in each"
        " process) rather than in worker_init_fn"
    )
    assert "fix the dataset" not in said


# --- the user's: what decides the samples drawn ------------------------------------------------


def test_a_sampler_a_generator_and_drop_last_are_the_users_and_said_to_be() -> None:
    sampler = WeightedRandomSampler([1.0] * 40, num_samples=20)
    loader = DataLoader(
        Samples(), batch_size=4, sampler=sampler, drop_last=True, generator=torch.Generator()
    )
    assert notes_of(loader) == (
        "the DataLoader's sampler (a WeightedRandomSampler) is not the probe's, which draws the"
        " dataset's samples in its own order, up to the 20 samples an epoch of it draws; give it"
        " to your DataLoader again: profile.dataloader_kwargs(sampler=yours,"
        " batch_size=profile.batch_size)",
        "the DataLoader's generator orders what its sampler draws, which the probe does not use;"
        " give it to your DataLoader again (profile.dataloader_kwargs(generator=yours))",
        "the DataLoader's drop_last=True is yours to keep (the probe's training batches were"
        " whole too): profile.dataloader_kwargs(drop_last=True)",
    )
    assert notes_of(DataLoader(Samples(), batch_size=4, shuffle=True)) == ()  # torch's own


def test_a_batch_sampler_says_in_the_notes_and_the_exports_that_the_batch_cannot_be_given() -> None:
    """DataLoader refuses batch_size beside a batch_sampler: the tuned batch could not be
    applied to the user's loader, and nothing said so."""
    sampler = BatchSampler(SequentialSampler(range(40)), batch_size=6, drop_last=False)
    loader = DataLoader(Samples(), batch_sampler=sampler)
    profile = quick(model=Classifier(), optimizer=SGD, loader=loader)
    assert_measured(profile)
    found = details(profile)
    assert found.batch_sampler == "BatchSampler"
    assert found.notes == (
        "the DataLoader's batch_sampler (a BatchSampler, batches of 6) makes batches of its own"
        " size, so the profile's batch size cannot be given to a DataLoader built with it (torch"
        " refuses batch_size beside a batch_sampler); the probe trained batches of each size"
        " from its dataset in its own order: build your batch sampler with profile.batch_size,"
        " and the DataLoader with profile.dataloader_kwargs(batch_sampler=yours)",
    )
    size = profile.batch_size
    line = (
        f"batch_sampler: your DataLoader's BatchSampler fixes its batch size, and torch refuses"
        f" batch_size beside a batch_sampler: build the BatchSampler with batch size {size}, and"
        " give it to the profile's arguments: profile.dataloader_kwargs(batch_sampler=yours)"
        " (DataLoader(..., **profile.dataloader_kwargs()))"
    )
    for tool in ("hf", "lightning", "accelerate", "env"):
        assert line in tool_notes(profile, tool), tool  # type: ignore[arg-type]
    assert not any(
        n.startswith("batch_sampler:")
        for n in tool_notes(quick(dataset=Samples(), model=Classifier(), optimizer=SGD), "hf")
    )


def test_the_profiles_loader_arguments_take_a_batch_sampler_where_it_drops_the_last_batch() -> None:
    """drop_last=True beside a batch_sampler is refused by torch: the batch sampler says it."""
    profile = with_batch_one_raising(quick(model=Classifier(), optimizer=SGD, dataset=Samples()), 8)
    assert profile.evidence is not None
    assert profile.evidence.details is not None
    measured = profile.evidence.details.model_copy(update={"batch_sampler": "BatchSampler"})
    evidence = profile.evidence.model_copy(update={"details": measured})
    profile = profile.model_copy(update={"evidence": evidence})
    assert profile.drops_last
    assert any(
        n.startswith("batch_sampler: ") and "with batch size 8 and drop_last=True, and" in n
        for n in tool_notes(profile, "hf")
    )
    sampler = BatchSampler(SequentialSampler(range(40)), batch_size=8, drop_last=True)
    loader = DataLoader(Samples(), **profile.dataloader_kwargs(batch_sampler=sampler))
    assert [len(y) for _, y in loader] == [8] * 5
