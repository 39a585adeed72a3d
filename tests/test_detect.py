"""detect() and LiveMachine: sources combined, torch only when needed, never a crash."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from tests.fake_nvml import FakeNvml, h100, jetson_orin, tesla_t4
from torch_autotune import (
    HardwareSnapshot,
    LiveMachine,
    RecordedMachine,
    SnapshotFileError,
    detect,
    load_snapshot,
)
from torch_autotune.detect import nvml
from torch_autotune.detect.host import HostSystem
from torch_autotune.detect.torch_env import TorchReading, read_torch, read_torch_elsewhere
from torch_autotune.errors import EXIT_BAD_INPUT
from torch_autotune.hardware import Architecture, Backend

GIB = 1 << 30
CAPTURED = datetime(2026, 11, 1, tzinfo=timezone.utc)


def host_system(
    tmp_path: Path, platform_name: str = "linux", machine: str = "x86_64"
) -> HostSystem:
    """A Linux host with recorded answers: 16 CPUs, 64 GiB, no cgroup limits."""
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "proc/cpuinfo").write_text("model name\t: AMD EPYC 7763 64-Core Processor\n")
    return HostSystem(
        platform_name=platform_name,
        root=tmp_path,
        machine=lambda: machine,
        release=lambda: "5.15.0-105-generic",
        mac_version=lambda: "14.5",
        libc=lambda: ("glibc", "2.35"),
        cpu_count=lambda: 16,
        affinity_count=lambda: 16,
        physical_cores=lambda: 8,
        virtual_memory=lambda: SimpleNamespace(total=64 * GIB, available=60 * GIB),
        disk_usage=lambda _path: SimpleNamespace(total=32 * GIB, free=32 * GIB),
        sysctl=lambda _name: "Apple M2 Pro",
    )


def torch_package(tmp_path: Path, version: str, cuda: str | None, hip: str | None = None) -> Path:
    directory = tmp_path / "site-packages" / "torch"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "version.py").write_text(
        "from typing import Optional\n"
        f"__version__ = {version!r}\n"
        f"cuda: Optional[str] = {cuda!r}\n"
        f"hip: Optional[str] = {hip!r}\n"
    )
    return directory


def no_torch_import() -> Any:
    pytest.fail("the fast path imported torch")


def machine(
    tmp_path: Path,
    binding: FakeNvml,
    torch_dir: Path | None,
    torch_loader: Any = no_torch_import,
    **host: Any,
) -> LiveMachine:
    def find(name: str) -> Path | None:
        return torch_dir if name == "torch" else None

    return LiveMachine(
        env={},
        nvml_binding=binding,
        host_system=host_system(tmp_path, **host),
        find_package_dir=find,
        torch_loader=torch_loader,
        clock=iter([10.0, 10.05]).__next__,
        now=lambda: CAPTURED,
    )


def fake_torch(*devices: SimpleNamespace, hip: str | None = None, cuda: str = "12.8") -> Any:
    """A torch module whose CUDA (or ROCm) build sees ``devices``."""
    return SimpleNamespace(
        version=SimpleNamespace(cuda=None if hip else cuda, hip=hip),
        get_num_threads=lambda: 8,
        backends=SimpleNamespace(
            cudnn=SimpleNamespace(version=lambda: 91002),
            mps=SimpleNamespace(is_available=lambda: False),
        ),
        cuda=SimpleNamespace(
            is_available=lambda: bool(devices),
            get_arch_list=lambda: ["sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
            device_count=lambda: len(devices),
            get_device_properties=lambda i: devices[i],
            mem_get_info=lambda i: (devices[i].total_memory // 2, devices[i].total_memory),
        ),
    )


def props(
    name: str, cc: tuple[int, int], memory_mib: int, sms: int, **extra: Any
) -> SimpleNamespace:
    return SimpleNamespace(
        name=name,
        major=cc[0],
        minor=cc[1],
        total_memory=memory_mib << 20,
        multi_processor_count=sms,
        is_integrated=False,
        **extra,
    )


def test_fast_detection_reads_nvml_and_metadata_without_torch(tmp_path: Path) -> None:
    torch_dir = torch_package(tmp_path, "2.8.0+cu128", "12.8")
    snapshot = detect(machine(tmp_path, FakeNvml([h100()]), torch_dir))

    assert snapshot.detection_depth == "fast"
    assert snapshot.captured_at == CAPTURED
    assert snapshot.detection_seconds == pytest.approx(0.05)
    assert [a.name for a in snapshot.accelerators] == ["NVIDIA H100 80GB HBM3"]
    software = snapshot.software
    assert (software.torch_version, software.torch_cuda_version) == ("2.8.0+cu128", "12.8")
    assert software.torch_build == "cuda"
    assert software.torch_cuda_arch_list is not None
    assert "sm_90" in software.torch_cuda_arch_list
    assert software.torch_cuda_arch_list_source == "release-table"
    assert software.nvidia_driver_version == "570.133.20"
    assert snapshot.host.cpus_usable == 16


def test_deep_detection_fills_what_nvml_could_not_read(tmp_path: Path) -> None:
    t4 = tesla_t4()
    t4.failures["nvmlDeviceGetNumGpuCores"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    torch_dir = torch_package(tmp_path, "2.8.0+cu128", "12.8")
    torch = fake_torch(props("Tesla T4", (7, 5), 15109, 40))
    live = machine(tmp_path, FakeNvml([t4]), torch_dir, torch_loader=lambda: torch)

    fast = live.snapshot()
    live.clock = iter([0.0, 2.5]).__next__
    deep = live.snapshot(deep=True)

    assert fast.accelerators[0].sm_count is None
    # No nvidia-cudnn wheel in this fake environment: only torch can tell the cuDNN version.
    assert {w.field for w in fast.warnings} == {
        "accelerators[0].sm_count",
        "software.cudnn_version",
    }
    assert deep.detection_depth == "deep"
    assert deep.accelerators[0].sm_count == 40
    assert deep.accelerators[0].memory_total_bytes == 15360 << 20  # NVML's value wins
    assert deep.warnings == ()
    assert deep.software.torch_cuda_arch_list_source == "torch"
    assert deep.software.cudnn_version == "9.10.2"
    assert deep.software.torch_num_threads == 8


def test_rocm_build_asks_torch_in_a_child_process_because_nothing_else_sees_amd_gpus(
    tmp_path: Path,
) -> None:
    """A fast detection imports no torch and starts no GPU runtime in this process, even where
    only torch sees the GPUs: the child it asks answers without free memory (asking it starts
    a context on every GPU)."""
    torch_dir = torch_package(tmp_path, "2.8.0+rocm6.4", None, hip="6.4.43482")
    mi300x = props("AMD Instinct MI300X OAM", (9, 4), 196592, 304, gcnArchName="gfx942:sramecc+")
    binding = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    asked: list[Mapping[str, str]] = []

    def elsewhere(env: Mapping[str, str]) -> TorchReading:
        asked.append(env)
        return read_torch(fake_torch(mi300x, hip="6.4"), free_memory=False)

    def here() -> Any:
        raise AssertionError("a fast detection imported torch in this process")

    live = machine(tmp_path, binding, torch_dir, torch_loader=here)
    live.torch_elsewhere = elsewhere
    live.env = {"HIP_VISIBLE_DEVICES": "0"}

    snapshot = live.snapshot()

    (gpu,) = snapshot.accelerators
    assert (gpu.backend, gpu.architecture, gpu.sm_count) == (Backend.ROCM, Architecture.CDNA3, 304)
    assert gpu.memory_free_bytes is None
    assert snapshot.detection_depth == "fast"
    assert snapshot.software.torch_build == "rocm"
    assert snapshot.software.torch_cuda_arch_list_source == "torch"
    assert asked == [{"HIP_VISIBLE_DEVICES": "0"}]


def test_torch_in_a_child_process_answers_or_says_why_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real child, with this machine's torch (no GPU here), run from a directory whose
    torch.py would shadow torch: its answer, asked once for the same variables; then one
    that cannot come in time, which costs the GPUs and says so."""
    (tmp_path / "torch.py").write_text("raise ImportError('a torch.py that shadows torch')\n")
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "TORCH_AUTOTUNE_TEST_CHILD": str(tmp_path)}
    answered = read_torch_elsewhere(env)
    assert answered.warnings == []
    assert answered.arch_list is not None
    assert read_torch_elsewhere(env) is answered  # asked once
    late = read_torch_elsewhere({**env, "TORCH_AUTOTUNE_TEST_CHILD": "late"}, timeout_s=0.001)
    assert late.accelerators == []
    (warning,) = late.warnings
    assert "did not answer (no answer within 0.001 s)" in warning.reason
    assert "'autotune detect --deep'" in warning.reason


def test_torch_that_fails_to_import_leaves_a_fast_snapshot_and_says_so(tmp_path: Path) -> None:
    torch_dir = torch_package(tmp_path, "2.8.0+cu128", "12.8")
    live = machine(tmp_path, FakeNvml([h100()]), torch_dir, torch_loader=lambda: None)

    snapshot = live.snapshot(deep=True)

    assert snapshot.detection_depth == "fast"
    assert {w.field for w in snapshot.warnings} == {"detection_depth", "software.cudnn_version"}
    assert snapshot.accelerators[0].sm_count == 132


def test_apple_silicon_gpu_is_described_from_the_host(tmp_path: Path) -> None:
    torch_dir = torch_package(tmp_path, "2.8.0", None)
    binding = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    live = machine(tmp_path, binding, torch_dir, platform_name="darwin", machine="arm64")

    (gpu,) = live.snapshot().accelerators

    assert (gpu.backend, gpu.name, gpu.unified_memory) == (Backend.MPS, "Apple M2 Pro", True)
    assert gpu.memory_total_bytes == 64 * GIB


def test_jetson_keeps_its_gpu_and_explains_the_missing_memory(tmp_path: Path) -> None:
    torch_dir = torch_package(tmp_path, "2.5.0a0+872d972e41.nv24.08", "12.6")
    snapshot = detect(machine(tmp_path, FakeNvml([jetson_orin()]), torch_dir, machine="aarch64"))

    (orin,) = snapshot.accelerators
    assert orin.unified_memory is True
    assert orin.memory_total_bytes is None
    assert "accelerators[0].memory_total_bytes" in {w.field for w in snapshot.warnings}


def test_machine_where_everything_fails_still_gives_a_snapshot(tmp_path: Path) -> None:
    def broken() -> Any:
        raise OSError("permission denied")

    live = machine(tmp_path, FakeNvml([], init_error=pynvml.NVML_ERROR_UNKNOWN), None)
    assert live.host_system is not None
    live.host_system.cpu_count = broken
    live.host_system.affinity_count = broken
    live.host_system.virtual_memory = broken

    snapshot = live.snapshot()

    assert snapshot.accelerators == ()
    assert snapshot.host.cpus_usable == 1
    assert snapshot.software.torch_version is None
    assert {"accelerators", "host.cpu_cores_logical", "software.torch_version"} <= {
        w.field for w in snapshot.warnings
    }


def test_live_snapshot_round_trips_through_json(tmp_path: Path) -> None:
    torch_dir = torch_package(tmp_path, "2.8.0+cu128", "12.8")
    snapshot = detect(machine(tmp_path, FakeNvml([h100(), jetson_orin()]), torch_dir))
    assert HardwareSnapshot.model_validate_json(snapshot.model_dump_json()) == snapshot


def test_recorded_machine_returns_its_snapshot(snapshot_path: Path) -> None:
    recorded = RecordedMachine.from_file(snapshot_path / "tesla-t4.json")
    assert detect(recorded, deep=True).accelerators[0].name == "Tesla T4"


def _raw(snapshot_path: Path) -> dict[str, Any]:
    return json.loads((snapshot_path / "tesla-t4.json").read_text())


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param("{not json", "is not valid JSON (line 1, column 2", id="corrupt"),
        pytest.param('{"schema_version": 1,', "is not valid JSON", id="truncated"),
        pytest.param("[1, 2]", "is a list, not a snapshot", id="list"),
        pytest.param("42", "is a number, not a snapshot", id="number"),
        pytest.param("null", "is empty, not a snapshot", id="null"),
        pytest.param("", "is not valid JSON", id="empty"),
    ],
)
def test_unusable_snapshot_text_gives_one_clear_error(
    tmp_path: Path, content: str, expected: str
) -> None:
    path = tmp_path / "machine.json"
    path.write_text(content)
    with pytest.raises(SnapshotFileError) as caught:
        load_snapshot(path)
    assert expected in str(caught.value)
    assert caught.value.exit_code == EXIT_BAD_INPUT


def test_snapshot_with_a_wrong_value_names_the_field(tmp_path: Path, snapshot_path: Path) -> None:
    raw = _raw(snapshot_path)
    raw["accelerators"][0]["sm_count"] = -40
    path = tmp_path / "machine.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(SnapshotFileError, match=r"accelerators\.0\.sm_count: Input should be"):
        load_snapshot(path)


def test_snapshot_with_an_unknown_key_is_refused(tmp_path: Path, snapshot_path: Path) -> None:
    raw = _raw(snapshot_path)
    raw["host"]["cpu_count"] = 4
    path = tmp_path / "machine.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(SnapshotFileError, match=r"host\.cpu_count: Extra inputs"):
        load_snapshot(path)


def test_snapshot_from_a_newer_release_asks_for_an_upgrade(
    tmp_path: Path, snapshot_path: Path
) -> None:
    raw = _raw(snapshot_path)
    raw["schema_version"] = 2
    path = tmp_path / "machine.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(SnapshotFileError, match="pip install -U torch-autotune"):
        load_snapshot(path)


def test_missing_snapshot_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(SnapshotFileError, match="autotune detect --json >"):
        load_snapshot(tmp_path / "absent.json")


def test_the_guard_stops_a_unit_test_that_reaches_real_nvml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nvml, "nvidia_driver_present", lambda: True)  # as on a GPU machine
    with pytest.raises(pytest.fail.Exception, match="reached real NVML"):
        detect()
