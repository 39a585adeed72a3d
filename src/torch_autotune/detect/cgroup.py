"""Container limits from Linux control groups (v1 and v2).

``os.cpu_count()`` and ``os.sched_getaffinity()`` both ignore the CFS quota that Docker
``--cpus`` and Kubernetes ``limits.cpu`` set, so a 4-CPU pod on a 64-core node looks like 64
CPUs to them (rules catalog D8, S7). These functions read the quota and the memory limit from
the cgroup files themselves. Every path is taken relative to ``root`` so tests run them against
recorded file trees.

A limit can sit on any ancestor of the process's cgroup (a Kubernetes pod-level limit above the
container's own), so each reader walks from the process's cgroup up to the mount point and
takes the tightest limit it finds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from torch_autotune.bounds import MAX_BYTES, MAX_CPUS

# cgroup v1 writes this for "no memory limit": LONG_MAX rounded down to the page size.
_V1_UNLIMITED_FLOOR = 1 << 60


@dataclass(frozen=True)
class CgroupLimits:
    """The tightest CPU quota (in CPUs) and memory limit (bytes); None means no limit."""

    cpu_quota_cores: float | None
    memory_limit_bytes: int | None
    version: int | None  # 1, 2, or None when no cgroup file system was found


def _membership(root: Path) -> dict[str, PurePosixPath]:
    """Controller -> cgroup path of this process, from /proc/self/cgroup ('' key for v2)."""
    try:
        text = (root / "proc/self/cgroup").read_text()
    except OSError:
        return {}
    paths: dict[str, PurePosixPath] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = PurePosixPath(path or "/")
    return paths


def _candidate_dirs(mount: Path, cgroup_path: PurePosixPath | None) -> list[Path]:
    """The process's cgroup directory and its ancestors inside ``mount``, deepest first.

    In a container with its own cgroup namespace /proc/self/cgroup shows '/', and in one without
    it shows the host's path, which does not exist under the container's mount: both cases end
    at the mount point itself.
    """
    dirs: list[Path] = []
    if cgroup_path is not None:
        parts = [p for p in cgroup_path.parts if p != "/"]
        for depth in range(len(parts), 0, -1):
            candidate = mount.joinpath(*parts[:depth])
            if candidate.is_dir():
                dirs.append(candidate)
    dirs.append(mount)
    return dirs


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _v2_cpu_quota(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")  # "<quota> <period>" or "max <period>"
    if not text:
        return None
    fields = text.split()
    if fields[0] == "max":
        return None
    period = int(fields[1]) if len(fields) > 1 else 100_000
    quota = int(fields[0])
    return quota / period if quota > 0 and period > 0 else None


def _v1_cpu_quota(directory: Path) -> float | None:
    quota_text = _read(directory / "cpu.cfs_quota_us")
    period_text = _read(directory / "cpu.cfs_period_us")
    if quota_text is None or period_text is None:
        return None
    quota, period = int(quota_text), int(period_text)
    return quota / period if quota > 0 and period > 0 else None  # -1 means no quota


def _v2_memory_limit(directory: Path) -> int | None:
    text = _read(directory / "memory.max")
    return None if not text or text == "max" else int(text)


def _v1_memory_limit(directory: Path) -> int | None:
    text = _read(directory / "memory.limit_in_bytes")
    if not text:
        return None
    value = int(text)
    return None if value >= _V1_UNLIMITED_FLOOR else value


def _tightest(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


@dataclass(frozen=True)
class _Layout:
    """Where this process's CPU and memory limits live, and which hierarchy holds them."""

    version: int | None
    cpu_dirs: list[Path]
    memory_dirs: list[Path]


def _layout(root: Path) -> _Layout:
    sys_cgroup = root / "sys/fs/cgroup"
    membership = _membership(root)
    if (sys_cgroup / "cgroup.controllers").exists():  # unified hierarchy (v2)
        dirs = _candidate_dirs(sys_cgroup, membership.get(""))
        return _Layout(2, dirs, dirs)
    # v1, or a hybrid host whose controllers are still v1 (the v2 mount there holds none)
    cpu_mount = next(
        (sys_cgroup / n for n in ("cpu,cpuacct", "cpu") if (sys_cgroup / n).is_dir()), None
    )
    memory_mount = sys_cgroup / "memory"
    if cpu_mount is None and not memory_mount.is_dir():
        return _Layout(None, [], [])
    return _Layout(
        1,
        [] if cpu_mount is None else _candidate_dirs(cpu_mount, membership.get("cpu")),
        _candidate_dirs(memory_mount, membership.get("memory")) if memory_mount.is_dir() else [],
    )


def read_cpu_quota(root: Path = Path("/")) -> float | None:
    """The tightest CFS CPU quota in CPUs, or None. ValueError for a file that is not a number."""
    layout = _layout(root)
    read = _v2_cpu_quota if layout.version == 2 else _v1_cpu_quota
    quota = _tightest([read(d) for d in layout.cpu_dirs])
    return None if quota is None or quota > MAX_CPUS else quota  # above every machine: no limit


def read_memory_limit(root: Path = Path("/")) -> int | None:
    """The tightest memory limit in bytes, or None. ValueError for a file that is not a number."""
    layout = _layout(root)
    read = _v2_memory_limit if layout.version == 2 else _v1_memory_limit
    memory = _tightest([read(d) for d in layout.memory_dirs])
    return None if memory is None or memory > MAX_BYTES else int(memory)  # no limit, as above


def read_cgroup_limits(root: Path = Path("/")) -> CgroupLimits:
    """Both limits and the hierarchy version. Raises ValueError if either file is garbage;
    ``read_host`` calls the two readers separately so one bad file costs one field."""
    return CgroupLimits(read_cpu_quota(root), read_memory_limit(root), _layout(root).version)


def usable_cpus(affinity_count: int | None, logical_count: int | None, quota: float | None) -> int:
    """CPUs this process can keep busy: the affinity mask capped by the quota, at least 1.

    A fractional quota is rounded down (2.5 CPUs of quota keep 2 workers busy without
    throttling), the rule Go's automaxprocs and vLLM's thread cap follow (catalog S-vllm34462).
    """
    base = affinity_count or logical_count or 1
    if quota is not None:
        base = min(base, max(1, math.floor(quota)))
    return max(1, base)
