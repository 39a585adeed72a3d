"""The host: OS, CPUs this process may really use, RAM, shared memory.

Reads the operating system through psutil, ``os`` and a few files. Everything platform-specific
goes through ``HostSystem``, whose default reads the live machine; tests pass one whose answers
were recorded on other machines (platformdirs' pattern: one narrow seam, every OS testable
anywhere).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from torch_autotune.detect.cgroup import read_cpu_quota, read_memory_limit, usable_cpus
from torch_autotune.hardware import DetectionWarning, Host

OsName = Literal["linux", "windows", "darwin", "other"]


def _os_name(platform_name: str) -> OsName:
    if platform_name.startswith("linux"):
        return "linux"
    if platform_name in ("win32", "cygwin"):
        return "windows"
    if platform_name == "darwin":
        return "darwin"
    return "other"


def _affinity_count() -> int | None:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    import psutil  # Windows has no sched_getaffinity; psutil reads the process mask

    process = psutil.Process()
    if not hasattr(process, "cpu_affinity"):
        return None  # macOS has no affinity masks: every CPU is available
    cpus = process.cpu_affinity()
    return len(cpus) if cpus else None


def _sysctl(name: str) -> str | None:
    import subprocess  # macOS only: keep it off the import path elsewhere

    try:
        done = subprocess.run(
            ["sysctl", "-n", name], capture_output=True, text=True, timeout=2, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _disk_usage(path: str) -> Any:
    import shutil  # only Linux asks (for /dev/shm)

    return shutil.disk_usage(path)


@dataclass
class HostSystem:
    """The operating-system calls host detection makes. Override any of them in tests."""

    platform_name: str = sys.platform
    root: Path = Path("/")
    machine: Callable[[], str] = platform.machine
    release: Callable[[], str] = platform.release
    mac_version: Callable[[], str] = lambda: platform.mac_ver()[0]
    windows_version: Callable[[], str] = platform.version
    libc: Callable[[], tuple[str, str]] = platform.libc_ver
    cpu_count: Callable[[], int | None] = os.cpu_count
    affinity_count: Callable[[], int | None] = _affinity_count
    physical_cores: Callable[[], int | None] = field(default_factory=lambda: _physical_cores)
    virtual_memory: Callable[[], Any] = field(default_factory=lambda: _virtual_memory)
    disk_usage: Callable[[str], Any] = field(default_factory=lambda: _disk_usage)
    sysctl: Callable[[str], str | None] = _sysctl
    processor: Callable[[], str] = platform.processor


@dataclass(frozen=True)
class _Memory:
    total: int
    available: int


# On Linux both answers are two small files away, and psutil (whose Linux back end reads the
# same files) costs ~20 ms to import, a tenth of a fast detection. Elsewhere psutil answers.
def _virtual_memory() -> Any:
    if sys.platform.startswith("linux"):
        fields: dict[str, int] = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in ("MemTotal", "MemAvailable"):
                fields[name] = int(rest.split()[0]) * 1024  # the file counts kB
        if "MemTotal" in fields and "MemAvailable" in fields:
            return _Memory(fields["MemTotal"], fields["MemAvailable"])
    import psutil

    return psutil.virtual_memory()


def _physical_cores() -> int | None:
    """Physical cores: distinct sets of hardware threads that share a core (psutil's method)."""
    if sys.platform.startswith("linux"):
        topology = Path("/sys/devices/system/cpu")
        for name in ("core_cpus_list", "thread_siblings_list"):
            cores = {p.read_text().strip() for p in topology.glob(f"cpu[0-9]*/topology/{name}")}
            if cores:
                return len(cores)
    import psutil

    count = psutil.cpu_count(logical=False)
    return int(count) if count else None


class _Reader:
    """Calls one OS function; an OSError becomes None plus a warning for that field."""

    def __init__(self) -> None:
        self.warnings: list[DetectionWarning] = []

    def get(self, field_name: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (OSError, ValueError, RuntimeError, NotImplementedError) as exc:
            self.warnings.append(
                DetectionWarning(field=f"host.{field_name}", reason=f"{type(exc).__name__}: {exc}")
            )
            return None


def _linux_cpu_model(root: Path) -> str | None:
    try:
        text = (root / "proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    for key in ("model name", "Hardware", "Model", "cpu model"):
        for line in text.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key and value.strip():
                return value.strip()
    return None


def _positive(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and value > 0 else None


def read_host(system: HostSystem | None = None) -> tuple[Host, list[DetectionWarning]]:
    """Describe the host as this process sees it, quota and affinity included."""
    system = system or HostSystem()
    reader = _Reader()
    os_name = _os_name(system.platform_name)
    os_version = _os_version(reader, system, os_name)
    libc = _libc(reader, system) if os_name == "linux" else None
    cpu_model = _cpu_model(reader, system, os_name)
    physical = _positive(reader.get("cpu_cores_physical", system.physical_cores))
    logical, affinity, quota = _cpu_counts(reader, system, os_name)
    total, available, memory_limit = _memory(reader, system, os_name)
    shm_total, shm_free = _shm(reader, system, os_name)
    host = Host(
        os_name=os_name,
        os_version=os_version,
        wsl=os_name == "linux" and "microsoft" in (os_version or "").lower(),
        libc=libc,
        cpu_architecture=(reader.get("cpu_architecture", system.machine) or "unknown").lower(),
        cpu_model=cpu_model,
        cpu_cores_physical=physical,
        cpu_cores_logical=logical,
        cpu_affinity_count=affinity,
        cpu_quota_cores=quota,
        cpus_usable=usable_cpus(affinity, logical, quota),
        memory_total_bytes=total,
        memory_available_bytes=available,
        memory_limit_bytes=memory_limit,
        shm_total_bytes=shm_total,
        shm_free_bytes=shm_free,
    )
    return host, reader.warnings


def _cpu_counts(
    reader: _Reader, system: HostSystem, os_name: str
) -> tuple[int | None, int | None, float | None]:
    """The logical CPUs, the affinity mask's and the container's CPU quota (Linux's cgroup)."""
    logical = _positive(reader.get("cpu_cores_logical", system.cpu_count))
    affinity = _positive(reader.get("cpu_affinity_count", system.affinity_count))
    if logical is not None and affinity is not None and affinity > logical:
        logical = affinity  # CPUs brought online since os.cpu_count() read them: never a crash
    quota: float | None = None
    if os_name == "linux":
        quota = reader.get("cpu_quota_cores", lambda: read_cpu_quota(system.root))
    return logical, affinity, quota


def cpus_usable_here(system: HostSystem | None = None) -> int:
    """The CPUs this process may use, quota and affinity included, as ``read_host`` counts
    them (``cpus_usable``), without reading the rest of the host. ``system``: the OS calls
    (a test's, recorded on another machine; this one's by default)."""
    system = system or HostSystem()
    counts = _cpu_counts(_Reader(), system, _os_name(system.platform_name))
    return usable_cpus(counts[1], counts[0], counts[2])


def _os_version(reader: _Reader, system: HostSystem, os_name: str) -> str | None:
    if os_name == "darwin":
        return reader.get("os_version", system.mac_version) or None
    if os_name == "windows":
        return reader.get("os_version", system.windows_version) or None
    return reader.get("os_version", system.release) or None


def _libc(reader: _Reader, system: HostSystem) -> str | None:
    lib, version = reader.get("libc", system.libc) or ("", "")
    return f"{lib} {version}".strip() or None


def _cpu_model(reader: _Reader, system: HostSystem, os_name: str) -> str | None:
    if os_name == "linux":
        cpu_model = _linux_cpu_model(system.root)
    elif os_name == "darwin":
        cpu_model = system.sysctl("machdep.cpu.brand_string")
    else:
        cpu_model = reader.get("cpu_model", system.processor) or None
    if cpu_model is None:
        reader.warnings.append(DetectionWarning(field="host.cpu_model", reason="not reported"))
    return cpu_model


def _memory(
    reader: _Reader, system: HostSystem, os_name: str
) -> tuple[int | None, int | None, int | None]:
    """RAM (total, available) and the container's memory limit where it limits anything."""
    memory_limit: int | None = None
    if os_name == "linux":
        memory_limit = reader.get("memory_limit_bytes", lambda: read_memory_limit(system.root))
    memory = reader.get("memory_total_bytes", system.virtual_memory)
    total = _positive(getattr(memory, "total", None))
    available = getattr(memory, "available", None)
    if memory is not None and total is None:
        reader.warnings.append(
            DetectionWarning(field="host.memory_total_bytes", reason="psutil reported no total")
        )
    if memory_limit is not None and total is not None and memory_limit >= total:
        memory_limit = None  # a limit above the RAM there is limits nothing
    return total, None if available is None else int(available), memory_limit


def _shm(reader: _Reader, system: HostSystem, os_name: str) -> tuple[int | None, int | None]:
    """/dev/shm (total, free) on Linux: where DataLoader workers hand batches over."""
    if os_name != "linux":
        return None, None
    shm = reader.get("shm_total_bytes", lambda: system.disk_usage(str(system.root / "dev/shm")))
    if shm is None:
        return None, None
    return int(shm.total), int(shm.free)
