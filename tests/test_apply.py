"""Applying a profile with real torch on the CPU: the helpers a training script calls."""

from __future__ import annotations

import os
import pickle
import random
import warnings
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import numpy
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from tests.batchnorm import with_batch_one_raising
from tests.test_host import CGROUP_DIR, linux_system
from torch_autotune import apply
from torch_autotune.apply import apply_environment, apply_flags, global_flags, restore_flags
from torch_autotune.detect.host import read_host
from torch_autotune.errors import LateEnvironmentWarning, ProfileUseWarning
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Mode, Preferences, Profile
from torch_autotune.rules.engine import build_profile

SNAPSHOT_DIR = Path(__file__).parent / "fixtures" / "snapshots"


def profile_for(name: str, **preferences: object) -> Profile:
    snapshot = HardwareSnapshot.model_validate_json((SNAPSHOT_DIR / f"{name}.json").read_text())
    return build_profile(
        snapshot,
        preferences=Preferences(**preferences),  # type: ignore[arg-type]
        now=datetime(2026, 11, 1, tzinfo=timezone.utc),
        host_id="test",
    )


@pytest.fixture
def torch_state() -> Iterator[None]:
    """Put back every global torch setting and environment variable a test's apply() changes."""
    saved = (
        torch.get_num_threads(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cuda.matmul.fp32_precision,
        torch.backends.cudnn.conv.fp32_precision,
        torch.backends.cudnn.rnn.fp32_precision,
        torch.random.get_rng_state(),
        dict(os.environ),
    )
    yield
    torch.set_num_threads(saved[0])
    torch.backends.cudnn.benchmark = saved[1]
    torch.backends.cudnn.deterministic = saved[2]
    torch.use_deterministic_algorithms(saved[3])
    torch.backends.cuda.matmul.fp32_precision = saved[4]
    torch.backends.cudnn.conv.fp32_precision = saved[5]
    torch.backends.cudnn.rnn.fp32_precision = saved[6]
    torch.random.set_rng_state(saved[7])
    os.environ.clear()
    os.environ.update(saved[8])


def test_cpu_profile_trains_a_real_model(
    torch_state: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = profile_for("cpu-container-quota-4")
    usable = profile.provenance.snapshot.host.cpus_usable  # its threads fit the container's
    monkeypatch.setattr(apply, "process_cpus", lambda _system=None: usable)
    profile.apply()
    assert torch.get_num_threads() == profile.settings.cpu_threads
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=16, **profile.dataloader_kwargs())
    model = profile.prepare_model(torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), **profile.optimizer_kwargs())
    scaler = profile.grad_scaler()
    before = model.weight.detach().clone()
    for x, y in loader:
        with profile.autocast():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    assert not torch.equal(before, model.weight)


def test_a_profile_made_for_more_cpus_is_not_applied_here(
    torch_state: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """apply() set 64 threads on 2 CPUs, where a bench baseline asking for as many is refused;
    a profile made for a larger machine is sound there, and refused here before it sets
    anything."""
    profile = profile_for("cpu-container-quota-4")
    threads = profile.settings.cpu_threads
    assert threads is not None
    monkeypatch.setattr(apply, "process_cpus", lambda _system=None: threads - 1)
    torch.set_num_threads(1)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with pytest.raises(ValueError, match="more than this machine can run") as refused:
        profile.apply()
    bound = f"at most {threads - 1} CPU threads (1 a CPU, more would take turns on them, slower)"
    assert str(refused.value) == (
        f"profile: cpu_threads {threads} is more than this machine can run: {threads - 1} usable "
        f"CPUs, {bound}; ask for {threads - 1} or fewer"
    )
    assert torch.get_num_threads() == 1
    assert "OMP_NUM_THREADS" not in os.environ  # nothing was set
    monkeypatch.setattr(apply, "process_cpus", lambda _system=None: threads)
    profile.apply()
    assert torch.get_num_threads() == threads


def test_apply_counts_a_containers_cpu_quota_as_detection_does(torch_state: None) -> None:
    """apply() held a profile's threads and workers to the affinity mask, which a container's
    CPU quota (cgroup cpu.max: Docker's --cpus, Kubernetes' limits.cpu) does not narrow: a
    profile made for 4 CPUs was applied in a pod of 2 on a 64-core node, 3 threads taking
    turns on 2 CPUs, where detection, the bench and the command line count 2."""
    for tree, usable in (("v2-docker-cpus4", 4), ("v2-k8s-nested", 2), ("v1-docker-quota", 1)):
        system = linux_system(CGROUP_DIR / tree)  # 64 CPUs in the affinity mask
        assert apply.process_cpus(system) == read_host(system)[0].cpus_usable == usable, tree
    profile = profile_for("cpu-container-quota-4")  # made in a --cpus=4 container
    threads = profile.settings.cpu_threads
    assert threads == 3  # its 4 CPUs less one for the loader
    torch.set_num_threads(1)
    with pytest.raises(ValueError, match="more than this machine can run") as refused:
        apply.apply_torch_settings(
            profile.settings, system=linux_system(CGROUP_DIR / "v2-k8s-nested")
        )
    assert str(refused.value).startswith(
        "profile: cpu_threads 3 is more than this machine can run: 2 usable CPUs"
    )
    assert torch.get_num_threads() == 1  # nothing was set
    apply.apply_torch_settings(
        profile.settings, system=linux_system(CGROUP_DIR / "v2-docker-cpus4")
    )
    assert torch.get_num_threads() == threads


def test_reproducible_profile_sets_determinism_and_seeds(torch_state: None) -> None:
    profile = profile_for("cpu-laptop-linux", mode=Mode.REPRODUCIBLE, seed=1234)
    profile.apply()
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic is True
    assert torch.initial_seed() == 1234
    kwargs = profile.dataloader_kwargs()
    if profile.settings.dataloader.num_workers:
        assert "worker_init_fn" in kwargs


class _Draws(Dataset[torch.Tensor]):
    """What a worker draws from Python's, NumPy's and torch's generators (an augmentation's
    randomness), and the mark the script's own ``worker_init_fn`` left in that worker."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        drawn = (random.random(), float(numpy.random.rand()), float(torch.rand(())))
        return torch.tensor((*drawn, _MARKS.get("worker", -1.0)), dtype=torch.float64)


_MARKS: dict[str, float] = {}  # 100 + the worker's id, in a worker where _mark_worker ran


def _mark_worker(worker_id: int) -> None:
    """A script's own worker_init_fn: it leaves a mark, and seeds nothing."""
    _MARKS["worker"] = 100.0 + worker_id


def _drawn(profile: Profile, **yours: object) -> torch.Tensor:
    kwargs = profile.dataloader_kwargs(num_workers=2, batch_size=2, **yours)
    return torch.cat(list(DataLoader(_Draws(), **kwargs)))


def test_the_scripts_worker_init_fn_runs_after_the_profiles_seeding() -> None:
    """A reproducible profile seeds its workers (worker_init_fn); the script's own replaced it
    without a word, and its workers drew other numbers from Python's and NumPy's generators
    than the profile's would: a worker_init_fn that only logs changed a reproducible run's
    augmentations. Now the seeding runs first, then the script's function, in real workers."""
    profile = profile_for("cpu-laptop-linux", mode=Mode.REPRODUCIBLE, seed=1234)
    assert profile.settings.dataloader.seed_workers
    alone = _drawn(profile)
    yours = _drawn(profile, worker_init_fn=_mark_worker)
    assert torch.equal(yours, _drawn(profile, worker_init_fn=_mark_worker))  # run to run
    assert torch.equal(yours[:, :3], alone[:, :3])  # the profile's seeding held
    assert set(yours[:, 3].tolist()) == {100.0, 101.0}  # and the script's function ran
    assert set(alone[:, 3].tolist()) == {-1.0}
    other = profile_for("cpu-laptop-linux", mode=Mode.REPRODUCIBLE, seed=4321)
    assert not torch.equal(_drawn(other, worker_init_fn=_mark_worker)[:, :3], yours[:, :3])
    chained = profile.dataloader_kwargs(worker_init_fn=_mark_worker)["worker_init_fn"]
    assert pickle.loads(pickle.dumps(chained)).yours is _mark_worker  # for spawn's workers
    assert profile.dataloader_kwargs(worker_init_fn=chained)["worker_init_fn"] is chained
    seeding = profile.dataloader_kwargs()["worker_init_fn"]
    assert profile.dataloader_kwargs(worker_init_fn=None)["worker_init_fn"] is seeding
    speed = profile_for("cpu-laptop-linux")  # no seeding of its own: yours as you gave it
    assert speed.dataloader_kwargs(worker_init_fn=_mark_worker)["worker_init_fn"] is _mark_worker


@pytest.mark.slow  # a spawned worker is a new interpreter that imports torch: seconds
def test_spawned_workers_get_the_seeding_and_the_scripts_worker_init_fn() -> None:
    """Where workers start by spawn, the two functions travel to them pickled, and draw what
    forked workers draw."""
    profile = profile_for("cpu-laptop-linux", mode=Mode.REPRODUCIBLE, seed=1234)
    spawned = _drawn(profile, worker_init_fn=_mark_worker, multiprocessing_context="spawn")
    assert torch.equal(spawned, _drawn(profile, worker_init_fn=_mark_worker))
    assert torch.equal(spawned[:, :3], _drawn(profile)[:, :3])


@pytest.fixture
def cuda_not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA not started in this process, as a first ``apply()`` finds it. On a GPU machine the
    GPU tier runs first and starts it, and ``apply()`` then rightly warns that the allocator's
    variables come too late (``test_environment_set_after_cuda_started_warns``)."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)


def test_gpu_profile_flags_apply_without_touching_cuda(
    torch_state: None, cuda_not_started: None
) -> None:
    profile = profile_for("h100-80gb-hbm3", model_kind="conv")
    profile.apply()  # the guard fails this test if it initialises CUDA
    assert torch.backends.cudnn.benchmark is True
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_tf32_uses_only_the_api_the_profile_names(
    torch_state: None, cuda_not_started: None
) -> None:
    h100 = profile_for("h100-80gb-hbm3")
    newer = h100.provenance.snapshot.software.model_copy(update={"torch_version": "2.9.0+cu128"})
    snapshot = h100.provenance.snapshot.model_copy(update={"software": newer})
    profile = build_profile(snapshot)
    assert profile.settings.matmul.api == "fp32_precision"
    profile.apply()
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.cudnn.conv.fp32_precision == "tf32"


def test_the_flags_are_read_and_put_back_after_a_profile_set_tf32_the_new_way(
    torch_state: None, cuda_not_started: None
) -> None:
    """Found on an H100 with torch 2.11: once a profile set TF32 through fp32_precision,
    torch.get_float32_matmul_precision() raises ("mix of the legacy and new APIs"), and the
    workers phase, which saves the flags again, failed the whole run."""
    h100 = profile_for("h100-80gb-hbm3")
    newer = h100.provenance.snapshot.software.model_copy(update={"torch_version": "2.9.0+cu128"})
    profile = build_profile(h100.provenance.snapshot.model_copy(update={"software": newer}))
    before = global_flags(torch)
    apply_flags(profile.settings, threads=False)
    during = global_flags(torch)  # raised here
    assert during["fp32_precision"] == ("tf32", "tf32", "tf32")
    restore_flags(torch, before)
    assert global_flags(torch) == before


def test_channels_last_is_applied_to_a_conv_model() -> None:
    profile = profile_for("h100-80gb-hbm3", model_kind="conv", mode=Mode.BALANCED)
    assert profile.settings.memory_format == "channels_last"
    assert profile.settings.compile.enabled is False
    model = profile.prepare_model(torch.nn.Conv2d(3, 8, 3))
    assert model.weight.is_contiguous(memory_format=torch.channels_last)


def test_environment_set_after_cuda_started_warns(
    torch_state: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.warns(LateEnvironmentWarning, match="PYTORCH_CUDA_ALLOC_CONF"):
        profile_for("h100-80gb-hbm3").apply()


def test_the_users_own_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")
    settings = profile_for("h100-80gb-hbm3").settings
    assert "PYTORCH_CUDA_ALLOC_CONF" not in apply_environment(settings)
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "backend:cudaMallocAsync"


def test_workerless_profile_passes_no_worker_options() -> None:
    kwargs = profile_for("rtx-3060-windows").dataloader_kwargs()
    assert kwargs == {"num_workers": 0, "pin_memory": True}


# --- the script's own DataLoader arguments, merged (yours win) -------------------------------


class _BatchNormNet(torch.nn.Module):
    """Raises on a training batch of 1, as BatchNorm does."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_the_scripts_own_drop_last_never_collides_with_the_profiles() -> None:
    """A BatchNorm profile sets drop_last=True; a script that writes its own beside
    ``**profile.dataloader_kwargs()`` raised TypeError (examples/train.py did). Given to the
    helper instead, the two merge; on 9 samples at batch 4 no batch of 1 reaches the model."""
    profile = with_batch_one_raising(profile_for("cpu-laptop-linux"), batch_size=4)
    data = TensorDataset(torch.randn(9, 8))
    with pytest.raises(TypeError, match="multiple values for keyword argument 'drop_last'"):
        DataLoader(data, drop_last=True, **profile.dataloader_kwargs())  # the old pattern
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kwargs = profile.dataloader_kwargs(batch_size=4, shuffle=True, drop_last=True)
    model = _BatchNormNet().train()
    sizes = [len(model(x)) for (x,) in DataLoader(data, **kwargs)]
    assert sizes == [4, 4]
    assert profile.dataloader_kwargs(batch_size=4)["drop_last"] is True  # the profile's


def test_the_users_drop_last_false_warns_on_a_training_loader_alone() -> None:
    profile = with_batch_one_raising(profile_for("cpu-laptop-linux"), batch_size=4)
    with pytest.warns(ProfileUseWarning) as caught:
        kwargs = profile.dataloader_kwargs(drop_last=False)
    assert kwargs["drop_last"] is False  # yours win, and the warning says what it costs
    (warning,) = caught
    message = str(warning.message)
    assert "\n" not in message
    assert "batch 1 raised ValueError: Expected more than 1 value per channel" in message
    assert "pass training=False for an evaluation loader" in message
    assert warning.filename == __file__  # it points at the script's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        evaluation = profile.dataloader_kwargs(training=False, batch_size=4)
        assert "drop_last" not in evaluation  # every sample scored
        assert profile.dataloader_kwargs(training=False, drop_last=False)["drop_last"] is False
        assert "drop_last" not in profile_for("cpu-laptop-linux").dataloader_kwargs()


def test_the_users_num_workers_0_takes_the_worker_options_with_it() -> None:
    """torch refuses persistent_workers and prefetch_factor without workers."""
    profile = profile_for("cpu-laptop-linux", mode=Mode.REPRODUCIBLE)
    loader = profile.settings.dataloader.model_copy(
        update={"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4}
    )
    profile = profile.model_copy(
        update={"settings": profile.settings.model_copy(update={"dataloader": loader})}
    )
    assert profile.dataloader_kwargs()["persistent_workers"] is True
    kwargs = profile.dataloader_kwargs(num_workers=0, batch_size=2)
    assert "persistent_workers" not in kwargs
    assert "prefetch_factor" not in kwargs
    assert len(list(DataLoader(TensorDataset(torch.randn(4, 1)), **kwargs))) == 2


# --- the optimizer's own arguments ----------------------------------------------------------


def _fused(profile: Profile) -> Profile:
    """``profile`` with the fused kernel on, as GPU profiles have it by default."""
    optimizer = profile.settings.optimizer.model_copy(update={"fused": True})
    settings = profile.settings.model_copy(update={"optimizer": optimizer})
    return profile.model_copy(update={"settings": settings})


@pytest.mark.parametrize(
    "optimizer",
    [torch.optim.RMSprop, torch.optim.Adamax, torch.optim.NAdam, torch.optim.LBFGS],
    ids=lambda cls: cls.__name__,
)
def test_an_optimizer_without_fused_gets_what_it_takes_and_one_warning(optimizer: type) -> None:
    """fused=True raised TypeError (unexpected keyword 'fused') in these optimizers."""
    profile = _fused(profile_for("cpu-laptop-linux"))
    assert profile.optimizer_kwargs() == {"fused": True}  # the documented form, unchanged
    with pytest.warns(ProfileUseWarning) as caught:
        kwargs = profile.optimizer_kwargs(optimizer)
    assert kwargs == {}
    optimizer(torch.nn.Linear(2, 2).parameters(), **kwargs)
    (warning,) = caught
    assert str(warning.message) == (
        f"{optimizer.__name__} takes no fused argument: the profile's fused=True is left out,"
        " and it steps with its own default kernel"
    )
    assert warning.filename == __file__


def test_an_optimizer_that_takes_fused_gets_it_without_a_word() -> None:
    profile = _fused(profile_for("cpu-laptop-linux"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for optimizer in (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD):
            assert profile.optimizer_kwargs(optimizer) == {"fused": True}
        assert profile_for("cpu-laptop-linux").optimizer_kwargs(torch.optim.RMSprop) == {}
