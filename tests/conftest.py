"""Test tiers and the guard that keeps unit tests off real hardware.

Tiers: unit tests (the default) use recorded snapshots and fakes; ``@pytest.mark.system`` runs
the installed command on this machine in a subprocess; ``@pytest.mark.gpu`` needs a real GPU and
is skipped where there is none. A unit test that reaches real NVML or CUDA fails.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SNAPSHOT_DIR = Path(__file__).parent / "fixtures" / "snapshots"


def _gpu_present() -> bool:
    """Whether an NVIDIA driver is loaded, judged from files alone (no NVML, no CUDA)."""
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/dxg").exists()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_present():
        return
    skip = pytest.mark.skip(reason="no GPU on this machine (the GPU tier runs where one is)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def _refuse(what: str):  # type: ignore[no-untyped-def]
    def refuse(*_args: object, **_kwargs: object) -> None:
        pytest.fail(
            f"a unit test reached real {what}: inject a fake (LiveMachine(nvml_binding=..., "
            "torch_loader=...)) or mark the test 'system' or 'gpu'",
            pytrace=False,
        )

    return refuse


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
        for name in ("_lazy_init", "init", "is_available", "device_count", "mem_get_info"):
            monkeypatch.setattr(torch.cuda, name, _refuse("CUDA"))
    yield


@pytest.fixture
def snapshot_path() -> Path:
    """Directory of the recorded machine snapshots."""
    return SNAPSHOT_DIR
