"""Test tiers and the guard that keeps unit tests off real hardware.

Tiers: unit tests (the default) use recorded snapshots and fakes, and real torch on the CPU for
a few steps at most; ``@pytest.mark.slow`` runs real torch on the CPU for seconds (a real
``tune()`` or bench, the full-size GPT-2); ``@pytest.mark.system`` runs the installed command
on this machine in a subprocess; ``@pytest.mark.gpu`` needs a real GPU and is skipped where
there is none. A unit or slow test that reaches real NVML or CUDA fails. ``python -m pytest``
runs them all; the quick loop leaves out the last three
(``-m "not slow and not system and not gpu"``).

Unit tests that train with real torch do so on the CPU, and say so (the device, a profile built for
the CPU, or a snapshot without GPUs), so they pass alike on a machine with a GPU. There torch itself
asks whether CUDA is available (the optimizer does, before every step); the guard tells torch "no
GPU", as a CPU build would, and fails the test only when our own code asks.

``--as-gpu-machine`` runs the unit and slow tiers as a machine with an NVIDIA GPU sees them: the
driver's files are there (so detecting this machine asks NVML, which the guard refuses), torch
is a CUDA build, and CUDA has started: ``python -m pytest`` runs ``test_gpu.py`` before most test
files, in the same process (or the same ``pytest -n`` worker). CI runs them so too, which keeps a
test that needs this machine to have no GPU from passing here and failing on the next GPU machine
(issue 10: 30 such failures on an H100, and 5 more due there once the GPU tier had run).
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from torch_autotune.detect import LiveMachine, load_snapshot
from torch_autotune.hardware import HardwareSnapshot

SNAPSHOT_DIR = Path(__file__).parent / "fixtures" / "snapshots"


def env_importing_from(src: Path | str, **extra: str) -> dict[str, str]:
    """This process's environment for a child interpreter that imports torch-autotune from
    ``src`` first. PYTHONPATH keeps what it had after ``src``: packages installed with
    ``pip install --target`` are found only through it."""
    paths = [str(src), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _gpu_present() -> bool:
    """Whether an NVIDIA driver is loaded, judged from files alone (no NVML, no CUDA)."""
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/dxg").exists()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--as-gpu-machine",
        action="store_true",
        help="run the unit and slow tiers as on a machine with an NVIDIA GPU: its driver's "
        "files present, torch a CUDA build (the hardware guard still keeps the GPU out of reach)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The system tier first, the rest in order: pytest-xdist hands each process a run of
    # consecutive tests, and the installed command's runs (up to its 120 s default budget)
    # and the jobs of two ranks (20-30 s each), collected late by their files' names, ran on
    # one process while the other, done, sat idle: 80-150 s of a 16-19 minute run on a loaded
    # 2-core machine. Started first, they leave the short tests for the end.
    items.sort(key=lambda item: item.get_closest_marker("system") is None)
    if _gpu_present():
        return
    skip = pytest.mark.skip(reason="no GPU on this machine (the GPU tier runs where one is)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def _long_lived_objects_frozen() -> None:
    """Keep the objects that outlive a test (torch, hypothesis, pydantic, the test modules and
    what their first use imports: 255,000 after collection) out of every later
    ``gc.collect()``. The probe collects after each trial (``oom.release_memory``); walking
    them cost 0.17 s a trial, and a test runs 10 to 30. Garbage is collected first, once a
    module, so only live objects are frozen."""
    gc.collect()
    gc.freeze()


def _refuse(what: str):  # type: ignore[no-untyped-def]
    def refuse(*_args: object, **_kwargs: object) -> None:
        pytest.fail(
            f"a unit test reached real {what}: inject a fake (LiveMachine(nvml_binding=..., "
            "torch_loader=...)) or mark the test 'system' or 'gpu'",
            pytrace=False,
        )

    return refuse


def _no_gpu_for_torch(what: str, answer: object):  # type: ignore[no-untyped-def]
    """``torch.cuda.<what>`` that answers torch's own code with ``answer`` (no GPU, as on a CPU
    build) and refuses any other caller: our code must not ask the real machine in a unit test."""
    refuse = _refuse(f"CUDA (torch.cuda.{what})")

    def ask(*args: object, **kwargs: object) -> object:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller == "torch" or caller.startswith("torch."):
            return answer
        return refuse(*args, **kwargs)

    return ask


def _torch():  # type: ignore[no-untyped-def]
    """torch, imported once per session so that the guard covers tests importing it later."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch


@pytest.fixture(autouse=True)
def _no_real_hardware(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Fail any unit test that initialises NVML or CUDA."""
    if request.node.get_closest_marker("gpu") or request.node.get_closest_marker("system"):
        yield
        return
    import pynvml

    for name in ("nvmlInit", "nvmlInitWithFlags"):
        monkeypatch.setattr(pynvml, name, _refuse("NVML"))
    torch = _torch()
    if torch is not None:
        # and the allocator's own calls, which reach the device without _lazy_init (a CPU
        # build has none of them: an AttributeError, where the guard's failure is the answer)
        for name in (
            "_lazy_init",
            "init",
            "mem_get_info",
            "reset_peak_memory_stats",
            "max_memory_reserved",
            "memory_reserved",
            "set_per_process_memory_fraction",
        ):
            _guard_everywhere(monkeypatch, torch, name, _refuse("CUDA"))
        _guard_everywhere(
            monkeypatch, torch, "is_available", _no_gpu_for_torch("is_available", False)
        )
        _guard_everywhere(monkeypatch, torch, "device_count", _no_gpu_for_torch("device_count", 0))
    yield


def _guard_everywhere(monkeypatch: pytest.MonkeyPatch, torch: Any, name: str, guard: Any) -> None:
    """``torch.cuda.<name>`` replaced by ``guard``, and so is every binding of it that torch's
    own modules made at import (``torch.cuda.random`` imports ``device_count`` and
    ``_lazy_init`` by name): on a real GPU machine those answered 1 GPU to torch's seeding
    while CUDA passed for started and had no generators, an IndexError in 4 tests on an H100."""
    real = getattr(torch.cuda, name)
    monkeypatch.setattr(torch.cuda, name, guard)
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("torch.cuda.") and getattr(module, name, None) is real:
            monkeypatch.setattr(module, name, guard)


def read_only_for_this_user(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """``path`` mode 444, and read-only to ``os.access`` even where the tests run as root
    (who may write any file): asked as a user who may not."""
    path.chmod(0o444)
    if os.geteuid() != 0:
        return
    real_access = os.access

    def as_a_user(target: Any, mode: int, **kwargs: Any) -> bool:
        if Path(str(target)) == path and mode & os.W_OK:
            return False
        return real_access(target, mode, **kwargs)

    monkeypatch.setattr(os, "access", as_a_user)


def as_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on this machine looks like one with an NVIDIA GPU, as far as files and torch's
    build can tell: the driver's files are present (detection asks NVML), torch is a CUDA build
    (torch's own code asks ``torch.cuda``), and an earlier test in this process started CUDA
    (``torch.cuda.is_initialized()``). The guard still stands between a test and the GPU: NVML
    refuses our code, and ``torch.cuda`` answers torch "no GPU" and refuses our code."""
    import torch

    from torch_autotune.detect import nvml

    monkeypatch.setattr(nvml, "nvidia_driver_present", lambda *_args, **_kwargs: True)
    # torch >= 2.6 asks torch.accelerator, whose compile-time answer is the CUDA build's
    accelerator = torch.device("cuda")
    monkeypatch.setattr(torch._C, "_accelerator_getAccelerator", lambda: accelerator, raising=False)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)  # older torch asks this
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)


@pytest.fixture(autouse=True)
def _on_a_gpu_machine_if_asked(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--as-gpu-machine``: every unit and slow test runs on the simulated GPU machine."""
    if not request.config.getoption("--as-gpu-machine"):
        return
    if request.node.get_closest_marker("gpu") or request.node.get_closest_marker("system"):
        return
    as_gpu_machine(monkeypatch)


@pytest.fixture(autouse=True)
def _own_profile_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test has a profile store of its own (``TORCH_AUTOTUNE_HOME``): no test reads or
    writes the user's, and tests run in parallel (``pytest -n``) share no files."""
    monkeypatch.setenv("TORCH_AUTOTUNE_HOME", str(tmp_path / "autotune-home"))


@pytest.fixture(autouse=True)
def _allocator_as_a_shell_starts_it(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulated runs start without the allocator's settings, whatever the shell that runs
    the tests has (torch reads ``PYTORCH_ALLOC_CONF`` first from 2.9): the probe asks the real
    environment whether this process started with ``expandable_segments``, and a developer's
    ``PYTORCH_ALLOC_CONF=expandable_segments:True`` failed 7 allocator tests. A test that
    wants the setting sets it; the GPU and system tiers keep the machine's own."""
    if request.node.get_closest_marker("gpu") or request.node.get_closest_marker("system"):
        return
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _no_terminal_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Output goes to a pipe that asks for no width, with or without ``pytest -n``: the
    workers of pytest-xdist 3.8 run with ``COLUMNS=80`` and ``LINES=24``, and ``autotune``
    wraps at ``COLUMNS`` where it is set."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture
def snapshot_path() -> Path:
    """Directory of the recorded machine snapshots."""
    return SNAPSHOT_DIR


@pytest.fixture
def detected_as(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], HardwareSnapshot]:
    """``detected_as("cpu-laptop-linux")``: from then on, detecting this machine (``detect()``,
    as ``tune()`` and ``autotune`` do) gives that recorded machine, here and on a GPU machine."""

    def detect_as(name: str) -> HardwareSnapshot:
        recorded = load_snapshot(SNAPSHOT_DIR / f"{name}.json")
        monkeypatch.setattr(LiveMachine, "snapshot", lambda _self, *, deep=False: recorded)
        return recorded

    return detect_as


@pytest.fixture
def gpu_machine(
    monkeypatch: pytest.MonkeyPatch, detected_as: Callable[[str], HardwareSnapshot]
) -> HardwareSnapshot:
    """This machine as the CPU tier sees a GPU machine: detection finds the recorded H100, and
    torch is a CUDA build, so torch's own code asks ``torch.cuda`` whether a GPU is there (the
    guard answers). Real CUDA stays out of reach: a test that trains on the detected GPU fails."""
    as_gpu_machine(monkeypatch)
    return detected_as("h100-80gb-hbm3")


@pytest.fixture
def inductor_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor asks CUDA for its cache key (``torch._inductor.codecache.CacheBase
    .get_system``), which the hardware guard refuses: torch's own callers get the answer of a
    CPU build of torch (an AssertionError, which inductor catches); ours still fail."""

    def not_compiled_with_cuda(*_args: object, **_kwargs: object) -> None:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("torch."):
            raise AssertionError("Torch not compiled with CUDA enabled")
        pytest.fail("a unit test reached real CUDA (torch.cuda._lazy_init)", pytrace=False)

    import torch

    monkeypatch.setattr(torch.cuda, "_lazy_init", not_compiled_with_cuda)
