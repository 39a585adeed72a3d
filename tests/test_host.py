"""read_host with every operating-system call answered from a recording, never the live machine.

Each ``HostSystem`` here is built by a factory that must answer every field of the dataclass, so
no default (``os.cpu_count``, psutil, ``shutil.disk_usage``) can leak the test machine's values.
Calls a platform never makes (libc on Windows, sysctl on Linux) fail the test if made.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from torch_autotune.detect.host import HostSystem, read_host
from torch_autotune.hardware import DetectionWarning, Host

CGROUP_DIR = Path(__file__).parent / "fixtures" / "cgroup"
GIB = 1 << 30
XEON = "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz"  # model name in the recorded cpuinfo


class VirtualMemory(NamedTuple):
    """The part of psutil.virtual_memory() that read_host uses."""

    total: int
    available: int


class DiskUsage(NamedTuple):
    """shutil.disk_usage()'s result."""

    total: int
    used: int
    free: int


RAM = VirtualMemory(total=256 * GIB, available=200 * GIB)
SHM = DiskUsage(total=64 * GIB, used=1 * GIB, free=63 * GIB)


def tree(name: str) -> Path:
    return CGROUP_DIR / name


def never(name: str) -> Callable[..., Any]:
    """An OS call this platform does not make: the test fails if read_host makes it."""

    def call(*_args: object, **_kwargs: object) -> Any:
        pytest.fail(f"read_host called {name}(), which this platform does not use", pytrace=False)

    return call


def raising(exc: BaseException) -> Callable[..., Any]:
    def call(*_args: object, **_kwargs: object) -> Any:
        raise exc

    return call


def answer(value: Any) -> Callable[..., Any]:
    return lambda *_args: value


def shm_at(root: Path, usage: DiskUsage = SHM) -> Callable[[str], DiskUsage]:
    """disk_usage that answers only for ``root``'s /dev/shm."""
    expected = str(root / "dev/shm")

    def disk_usage(path: str) -> DiskUsage:
        assert path == expected
        return usage

    return disk_usage


def recorded(answers: dict[str, Any], overrides: dict[str, Any]) -> HostSystem:
    """A HostSystem whose every field is given, so nothing falls back to the live machine."""
    merged = {**answers, **overrides}
    missing = {f.name for f in fields(HostSystem)} - merged.keys()
    assert not missing, f"these calls would read the live machine: {sorted(missing)}"
    return HostSystem(**merged)


def linux_system(root: Path, **overrides: Any) -> HostSystem:
    """A 64-CPU x86_64 Linux host (256 GiB RAM, 64 GiB /dev/shm) around the cgroup tree ``root``."""
    return recorded(
        {
            "platform_name": "linux",
            "root": root,
            "machine": answer("x86_64"),
            "release": answer("6.8.0-1015-aws"),
            "mac_version": never("mac_version"),
            "windows_version": never("windows_version"),
            "libc": answer(("glibc", "2.39")),
            "cpu_count": answer(64),
            "affinity_count": answer(64),
            "physical_cores": answer(32),
            "virtual_memory": answer(RAM),
            "disk_usage": shm_at(root),
            "sysctl": never("sysctl"),
            "processor": never("processor"),
        },
        overrides,
    )


def windows_system(root: Path, **overrides: Any) -> HostSystem:
    """A Windows 11 desktop (Core i7-12700K: 12 cores, 20 threads, 32 GiB)."""
    return recorded(
        {
            "platform_name": "win32",
            "root": root,
            "machine": answer("AMD64"),
            "release": never("release"),
            "mac_version": never("mac_version"),
            "windows_version": answer("10.0.22631"),
            "libc": never("libc"),
            "cpu_count": answer(20),
            "affinity_count": answer(20),
            "physical_cores": answer(12),
            "virtual_memory": answer(VirtualMemory(total=32 * GIB, available=20 * GIB)),
            "disk_usage": never("disk_usage"),
            "sysctl": never("sysctl"),
            "processor": answer("Intel64 Family 6 Model 151 Stepping 2, GenuineIntel"),
        },
        overrides,
    )


def mac_sysctl(name: str) -> str | None:
    assert name == "machdep.cpu.brand_string"
    return "Apple M2 Pro"


def mac_system(root: Path, **overrides: Any) -> HostSystem:
    """A MacBook Pro with an M2 Pro (12 cores, no affinity masks, 32 GiB)."""
    return recorded(
        {
            "platform_name": "darwin",
            "root": root,
            "machine": answer("arm64"),
            "release": never("release"),
            "mac_version": answer("14.5"),
            "windows_version": never("windows_version"),
            "libc": never("libc"),
            "cpu_count": answer(12),
            "affinity_count": answer(None),
            "physical_cores": answer(12),
            "virtual_memory": answer(VirtualMemory(total=32 * GIB, available=14 * GIB)),
            "disk_usage": never("disk_usage"),
            "sysctl": mac_sysctl,
            "processor": never("processor"),
        },
        overrides,
    )


def fields_warned(warnings: list[DetectionWarning]) -> list[str]:
    return [w.field for w in warnings]


# --- Linux ------------------------------------------------------------------------------------


def test_linux_docker_container() -> None:
    host, warnings = read_host(linux_system(tree("v2-docker-cpus4")))
    assert host == Host(
        os_name="linux",
        os_version="6.8.0-1015-aws",
        wsl=False,
        libc="glibc 2.39",
        cpu_architecture="x86_64",
        cpu_model=XEON,
        cpu_cores_physical=32,
        cpu_cores_logical=64,
        cpu_affinity_count=64,
        cpu_quota_cores=4.0,
        cpus_usable=4,
        memory_total_bytes=256 * GIB,
        memory_available_bytes=200 * GIB,
        memory_limit_bytes=16 * GIB,
        shm_total_bytes=64 * GIB,
        shm_free_bytes=63 * GIB,
    )
    assert warnings == []


def test_linux_host_round_trips_through_json() -> None:
    host, _ = read_host(linux_system(tree("v2-docker-cpus4")))
    assert Host.model_validate_json(host.model_dump_json()) == host


def test_linux_kubernetes_pod_limit_and_cpuset() -> None:
    # A cpuset of 16 CPUs on a 64-CPU node, under a pod limit of 2 CPUs and 8 GiB.
    host, warnings = read_host(linux_system(tree("v2-k8s-nested"), affinity_count=answer(16)))
    assert (host.cpu_affinity_count, host.cpu_quota_cores, host.cpus_usable) == (16, 2.0, 2)
    assert host.memory_limit_bytes == 8 * GIB
    assert warnings == []


def test_an_affinity_mask_larger_than_the_cpu_count_read_is_no_crash() -> None:
    """CPUs brought online between the two reads: a Host whose affinity mask exceeds its
    logical CPUs is refused as inconsistent (a hand-edited snapshot), so detection raises the
    count it read first to the mask's instead of failing."""
    host, _ = read_host(linux_system(tree("v2-k8s-nested"), affinity_count=answer(80)))
    assert (host.cpu_affinity_count, host.cpu_cores_logical, host.cpus_usable) == (80, 80, 2)


@pytest.mark.parametrize(
    ("counts", "said"),
    [
        (
            {"cpus_usable": 4, "cpu_affinity_count": 2},
            "cpus_usable 4 is more than cpu_affinity_count 2",
        ),
        (
            {"cpus_usable": 8, "cpu_cores_logical": 4, "cpu_affinity_count": None},
            "cpus_usable 8 is more than cpu_cores_logical 4",
        ),
        (
            {"cpus_usable": 2, "cpu_affinity_count": 8, "cpu_cores_logical": 4},
            "cpu_affinity_count 8 is more than cpu_cores_logical 4",
        ),
    ],
)
def test_a_host_whose_cpu_counts_contradict_each_other_is_refused(
    counts: dict[str, int | None], said: str
) -> None:
    """A hand-edited snapshot of 4 usable CPUs in an affinity mask of 2 got reasons that said
    both ('4 usable CPU(s) (affinity mask of 2 of the host's 4)') and 3 workers."""
    host, _ = read_host(linux_system(tree("v2-docker-cpus4")))
    data = {**host.model_dump(), **counts}
    with pytest.raises(ValueError, match=re.escape(said)):
        Host.model_validate(data)


def test_linux_bare_metal_without_cgroup_fs_uses_affinity() -> None:
    host, warnings = read_host(linux_system(tree("no-cgroupfs"), affinity_count=answer(48)))
    assert (host.cpu_quota_cores, host.memory_limit_bytes, host.cpus_usable) == (None, None, 48)
    assert warnings == []


@pytest.mark.parametrize(
    ("release", "wsl"),
    [
        pytest.param("5.15.153.1-microsoft-standard-WSL2", True, id="wsl2"),
        pytest.param("4.4.0-19041-Microsoft", True, id="wsl1"),
        pytest.param("6.8.0-1015-aws", False, id="native"),
    ],
)
def test_wsl_from_kernel_release(release: str, wsl: bool) -> None:
    host, _ = read_host(linux_system(tree("v2-no-limit"), release=answer(release)))
    assert (host.os_name, host.os_version, host.wsl) == ("linux", release, wsl)


ARM64_CPUINFO = "".join(
    f"processor\t: {i}\nBogoMIPS\t: 62.50\n"
    "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
    "asimdrdm lrcpc dcpop asimddp uscat ilrcpc flagm paca pacg\n"
    "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd42\n"
    "CPU revision\t: 1\n\n"
    for i in range(2)
)


@pytest.mark.parametrize(
    ("trailer", "model"),
    [
        pytest.param(
            "Model\t\t: NVIDIA Jetson AGX Orin Developer Kit\n",
            "NVIDIA Jetson AGX Orin Developer Kit",
            id="model-line",
        ),
        pytest.param("Hardware\t: NVIDIA Tegra Orin\n", "NVIDIA Tegra Orin", id="hardware-line"),
    ],
)
def test_arm64_cpu_model_without_model_name(tmp_path: Path, trailer: str, model: str) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(ARM64_CPUINFO + trailer)
    host, warnings = read_host(linux_system(tmp_path, machine=answer("aarch64")))
    assert (host.cpu_architecture, host.cpu_model) == ("aarch64", model)
    assert "host.cpu_model" not in fields_warned(warnings)


def test_arm64_cpuinfo_without_any_name_warns(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(ARM64_CPUINFO)
    host, warnings = read_host(linux_system(tmp_path, machine=answer("aarch64")))
    assert host.cpu_model is None
    assert warnings == [DetectionWarning(field="host.cpu_model", reason="not reported")]


@pytest.mark.parametrize(
    ("ram_total", "limit"),
    [
        pytest.param(256 * GIB, 16 * GIB, id="limit-below-ram-kept"),
        pytest.param(16 * GIB, None, id="limit-equal-to-ram-dropped"),
        pytest.param(8 * GIB, None, id="limit-above-ram-dropped"),
    ],
)
def test_memory_limit_above_physical_ram_is_dropped(ram_total: int, limit: int | None) -> None:
    memory = answer(VirtualMemory(total=ram_total, available=ram_total // 2))
    host, warnings = read_host(linux_system(tree("v2-docker-cpus4"), virtual_memory=memory))
    assert host.memory_limit_bytes == limit
    assert warnings == []


# --- one OS call fails: that field is None with a warning, the rest is still read -------------

BASELINE_ROOT = tree("v2-docker-cpus4")


@pytest.mark.parametrize(
    ("call", "error", "field", "emptied"),
    [
        pytest.param(
            "cpu_count", OSError("no /proc"), "cpu_cores_logical", {}, id="cpu-count-oserror"
        ),
        pytest.param(
            "physical_cores",
            RuntimeError("couldn't find /sys/devices/system/cpu"),
            "cpu_cores_physical",
            {},
            id="physical-cores-runtimeerror",
        ),
        pytest.param(
            "affinity_count",
            OSError(22, "Invalid argument"),
            "cpu_affinity_count",
            {},
            id="affinity-oserror",
        ),
        pytest.param(
            "virtual_memory",
            FileNotFoundError(2, "No such file or directory", "/proc/meminfo"),
            "memory_total_bytes",
            {"memory_available_bytes": None},
            id="virtual-memory-missing-meminfo",
        ),
        pytest.param(
            "virtual_memory",
            RuntimeError("virtual_memory failed"),
            "memory_total_bytes",
            {"memory_available_bytes": None},
            id="virtual-memory-runtimeerror",
        ),
        pytest.param(
            "disk_usage",
            FileNotFoundError(2, "No such file or directory", "/dev/shm"),
            "shm_total_bytes",
            {"shm_free_bytes": None},
            id="shm-missing",
        ),
        pytest.param("release", OSError("uname failed"), "os_version", {}, id="release-oserror"),
        pytest.param("libc", OSError("no ldd"), "libc", {}, id="libc-oserror"),
    ],
)
def test_one_failing_call_empties_one_field(
    call: str, error: Exception, field: str, emptied: dict[str, Any]
) -> None:
    baseline, _ = read_host(linux_system(BASELINE_ROOT))
    host, warnings = read_host(linux_system(BASELINE_ROOT, **{call: raising(error)}))
    assert isinstance(host, Host)
    assert fields_warned(warnings) == [f"host.{field}"]
    assert warnings[0].reason.startswith(type(error).__name__)
    assert host == baseline.model_copy(update={field: None, **emptied})


def test_cpu_count_failure_still_caps_by_affinity_and_quota() -> None:
    system = linux_system(BASELINE_ROOT, cpu_count=raising(OSError("no /proc")))
    host, _ = read_host(system)
    assert (host.cpu_cores_logical, host.cpus_usable) == (None, 4)


def test_failing_machine_reports_unknown_architecture() -> None:
    host, warnings = read_host(linux_system(BASELINE_ROOT, machine=raising(OSError("uname"))))
    assert host.cpu_architecture == "unknown"
    assert fields_warned(warnings) == ["host.cpu_architecture"]


def test_memory_limit_kept_when_ram_is_unknown() -> None:
    system = linux_system(BASELINE_ROOT, virtual_memory=raising(OSError("no meminfo")))
    host, _ = read_host(system)
    assert (host.memory_total_bytes, host.memory_limit_bytes) == (None, 16 * GIB)


def test_psutil_without_total_warns() -> None:
    memory = answer(VirtualMemory(total=0, available=0))
    host, warnings = read_host(linux_system(BASELINE_ROOT, virtual_memory=memory))
    assert host.memory_total_bytes is None
    assert warnings == [
        DetectionWarning(field="host.memory_total_bytes", reason="psutil reported no total")
    ]


def test_corrupt_cpu_max_becomes_none_quota_and_a_warning() -> None:
    host, warnings = read_host(linux_system(tree("v2-corrupt-cpu-max")))
    assert host.cpu_quota_cores is None
    assert host.cpus_usable == 64
    assert fields_warned(warnings) == ["host.cpu_quota_cores"]
    assert warnings[0].reason.startswith("ValueError")


def test_corrupt_cpu_max_keeps_the_memory_limit() -> None:
    host, _ = read_host(linux_system(tree("v2-corrupt-cpu-max")))
    assert host.memory_limit_bytes == 8 * GIB


def test_corrupt_memory_max_keeps_the_quota_and_names_the_memory_field(tmp_path: Path) -> None:
    root = Path(shutil.copytree(tree("v2-docker-cpus4"), tmp_path / "root"))
    (root / "sys/fs/cgroup/memory.max").write_text("garbage text\n")
    host, warnings = read_host(linux_system(root))
    assert host.cpu_quota_cores == 4.0
    assert fields_warned(warnings) == ["host.memory_limit_bytes"]


# --- Windows and macOS --------------------------------------------------------------------------


def test_windows_host() -> None:
    # The root holds a cgroup tree and a cpuinfo: Windows must read neither.
    host, warnings = read_host(windows_system(tree("v2-docker-cpus4")))
    assert host == Host(
        os_name="windows",
        os_version="10.0.22631",
        wsl=False,
        libc=None,
        cpu_architecture="amd64",
        cpu_model="Intel64 Family 6 Model 151 Stepping 2, GenuineIntel",
        cpu_cores_physical=12,
        cpu_cores_logical=20,
        cpu_affinity_count=20,
        cpu_quota_cores=None,
        cpus_usable=20,
        memory_total_bytes=32 * GIB,
        memory_available_bytes=20 * GIB,
        memory_limit_bytes=None,
        shm_total_bytes=None,
        shm_free_bytes=None,
    )
    assert warnings == []


def test_windows_affinity_restricted() -> None:
    host, _ = read_host(windows_system(tree("no-cgroupfs"), affinity_count=answer(4)))
    assert host.cpus_usable == 4


def test_windows_empty_processor_warns() -> None:
    host, warnings = read_host(windows_system(tree("no-cgroupfs"), processor=answer("")))
    assert host.cpu_model is None
    assert fields_warned(warnings) == ["host.cpu_model"]


def test_macos_host() -> None:
    host, warnings = read_host(mac_system(tree("v2-docker-cpus4")))
    assert host == Host(
        os_name="darwin",
        os_version="14.5",
        wsl=False,
        libc=None,
        cpu_architecture="arm64",
        cpu_model="Apple M2 Pro",
        cpu_cores_physical=12,
        cpu_cores_logical=12,
        cpu_affinity_count=None,
        cpu_quota_cores=None,
        cpus_usable=12,
        memory_total_bytes=32 * GIB,
        memory_available_bytes=14 * GIB,
        memory_limit_bytes=None,
        shm_total_bytes=None,
        shm_free_bytes=None,
    )
    assert warnings == []


def test_macos_sysctl_without_answer_warns() -> None:
    host, warnings = read_host(mac_system(tree("no-cgroupfs"), sysctl=answer(None)))
    assert host.cpu_model is None
    assert fields_warned(warnings) == ["host.cpu_model"]
