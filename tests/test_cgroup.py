"""Container CPU quota and memory limit from recorded cgroup trees (catalog D8, S7).

Every tree under tests/fixtures/cgroup is a root laid out as on a real machine; see its README for
what each one records. ``os.cpu_count()`` and ``sched_getaffinity`` ignore the CFS quota, so these
readers are the only place a Docker ``--cpus`` or Kubernetes ``limits.cpu`` shows up.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_autotune.detect.cgroup import CgroupLimits, read_cgroup_limits, usable_cpus

CGROUP_DIR = Path(__file__).parent / "fixtures" / "cgroup"
GIB = 1 << 30


class Case(NamedTuple):
    tree: str
    quota: float | None
    memory: int | None
    version: int | None
    usable: int  # usable_cpus with an affinity mask of 8 CPUs on a 64-CPU host


CASES = (
    Case("v2-docker-cpus4", quota=4.0, memory=16 * GIB, version=2, usable=4),
    Case("v2-no-limit", quota=None, memory=None, version=2, usable=8),
    Case("v2-fractional", quota=1.5, memory=None, version=2, usable=1),
    Case("v2-k8s-nested", quota=2.0, memory=8 * GIB, version=2, usable=2),
    Case("v1-docker-quota", quota=0.5, memory=2 * GIB, version=1, usable=1),
    Case("v1-no-quota", quota=None, memory=None, version=1, usable=8),
    Case("v1-host-path", quota=2.0, memory=4 * GIB, version=1, usable=2),
    Case("hybrid-v1-cpu", quota=2.5, memory=4 * GIB, version=1, usable=2),
    Case("no-cgroupfs", quota=None, memory=None, version=None, usable=8),
)
CORRUPT_TREES = ("v2-corrupt-cpu-max",)


def tree(name: str) -> Path:
    return CGROUP_DIR / name


def copy_tree(name: str, tmp_path: Path) -> Path:
    """A writable copy of a recorded tree, for tests that change one file of it."""
    return Path(shutil.copytree(tree(name), tmp_path / name))


def test_every_recorded_tree_has_a_row() -> None:
    recorded = {p.name for p in CGROUP_DIR.iterdir() if p.is_dir()}
    assert recorded == {c.tree for c in CASES} | set(CORRUPT_TREES)


@pytest.mark.parametrize("case", CASES, ids=[c.tree for c in CASES])
def test_read_cgroup_limits(case: Case) -> None:
    limits = read_cgroup_limits(tree(case.tree))
    assert limits == CgroupLimits(case.quota, case.memory, case.version)


@pytest.mark.parametrize("case", CASES, ids=[c.tree for c in CASES])
def test_usable_cpus_from_recorded_quota(case: Case) -> None:
    quota = read_cgroup_limits(tree(case.tree)).cpu_quota_cores
    assert usable_cpus(affinity_count=8, logical_count=64, quota=quota) == case.usable


def test_k8s_pod_limit_on_an_ancestor_caps_an_unlimited_container() -> None:
    root = tree("v2-k8s-nested")
    own = (root / "proc/self/cgroup").read_text().strip().removeprefix("0::/")
    assert (root / "sys/fs/cgroup" / own / "cpu.max").read_text() == "max 100000\n"
    assert read_cgroup_limits(root).cpu_quota_cores == 2.0


def test_k8s_container_memory_limit_is_the_tightest_of_the_ancestors() -> None:
    # kubepods.slice has the node's allocatable memory (~62 GiB); the container scope has 8 GiB.
    assert read_cgroup_limits(tree("v2-k8s-nested")).memory_limit_bytes == 8 * GIB


def test_v1_host_path_absent_under_the_mount_reads_the_mount_root() -> None:
    root = tree("v1-host-path")
    lines = (root / "proc/self/cgroup").read_text().splitlines()
    host_path = next(line for line in lines if ":cpu,cpuacct:" in line).split(":", 2)[2]
    assert host_path.startswith("/docker/")
    assert not (root / "sys/fs/cgroup/cpu,cpuacct" / host_path.lstrip("/")).exists()
    assert read_cgroup_limits(root) == CgroupLimits(2.0, 4 * GIB, 1)


def test_hybrid_host_reads_v1_and_ignores_the_unified_mount() -> None:
    root = tree("hybrid-v1-cpu")
    assert (root / "sys/fs/cgroup/unified/cgroup.controllers").exists()
    assert read_cgroup_limits(root).version == 1


def test_tighter_v2_ancestor_limit_wins_over_the_container_limit(tmp_path: Path) -> None:
    root = copy_tree("v2-k8s-nested", tmp_path)
    scope = root / (
        "sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/pod123.slice/"
        "cri-containerd-abc.scope"
    )
    (scope / "cpu.max").write_text("300000 100000\n")  # the pod's 2 CPUs stay tighter
    (scope.parent / "memory.max").write_text(f"{4 * GIB}\n")
    assert read_cgroup_limits(root) == CgroupLimits(2.0, 4 * GIB, 2)


def test_v2_quota_below_one_cpu_still_leaves_one_usable(tmp_path: Path) -> None:
    root = copy_tree("v2-fractional", tmp_path)
    (root / "sys/fs/cgroup/cpu.max").write_text("50000 100000\n")
    quota = read_cgroup_limits(root).cpu_quota_cores
    assert quota == 0.5
    assert usable_cpus(64, 64, quota) == 1


def test_v2_custom_period(tmp_path: Path) -> None:
    root = copy_tree("v2-fractional", tmp_path)
    (root / "sys/fs/cgroup/cpu.max").write_text("150000 50000\n")
    assert read_cgroup_limits(root).cpu_quota_cores == 3.0


def test_v1_memory_unlimited_on_64k_pages_is_no_limit(tmp_path: Path) -> None:
    # LONG_MAX rounded down to a 64 KiB page (arm64 kernels with 64K pages).
    root = copy_tree("v1-no-quota", tmp_path)
    (root / "sys/fs/cgroup/memory/memory.limit_in_bytes").write_text("9223372036854710272\n")
    assert read_cgroup_limits(root).memory_limit_bytes is None


def test_missing_proc_self_cgroup_reads_the_mount_root(tmp_path: Path) -> None:
    root = copy_tree("v2-docker-cpus4", tmp_path)
    (root / "proc/self/cgroup").unlink()
    assert read_cgroup_limits(root) == CgroupLimits(4.0, 16 * GIB, 2)


def test_empty_root_has_no_cgroup(tmp_path: Path) -> None:
    assert read_cgroup_limits(tmp_path) == CgroupLimits(None, None, None)


def test_corrupt_cpu_max_raises_value_error() -> None:
    # Documented: a non-numeric cgroup file raises ValueError; read_host turns it into a None
    # field plus a DetectionWarning (tests/test_host.py).
    root = tree("v2-corrupt-cpu-max")
    with pytest.raises(ValueError, match="invalid literal"):
        read_cgroup_limits(root)


@pytest.mark.parametrize(
    ("affinity", "logical", "quota", "expected"),
    [
        pytest.param(64, 64, None, 64, id="no-quota-uses-affinity"),
        pytest.param(8, 64, None, 8, id="affinity-below-logical"),
        pytest.param(None, 12, None, 12, id="no-affinity-uses-logical"),
        pytest.param(None, None, None, 1, id="nothing-known-is-one"),
        pytest.param(None, None, 3.0, 1, id="quota-alone-does-not-raise-the-floor"),
        pytest.param(64, 64, 4.0, 4, id="quota-caps-affinity"),
        pytest.param(2, 64, 4.0, 2, id="affinity-tighter-than-quota"),
        pytest.param(64, 64, 2.5, 2, id="fractional-quota-rounds-down"),
        pytest.param(64, 64, 0.25, 1, id="quota-below-one-gives-one"),
        pytest.param(None, 12, 4.0, 4, id="quota-caps-logical"),
    ],
)
def test_usable_cpus_table(
    affinity: int | None, logical: int | None, quota: float | None, expected: int
) -> None:
    assert usable_cpus(affinity, logical, quota) == expected


@settings(database=None)
@given(
    affinity=st.integers(1, 1024) | st.none(),
    logical=st.integers(1, 1024) | st.none(),
    quota=st.none() | st.floats(0, 2048, exclude_min=True, allow_nan=False),
)
def test_usable_cpus_property(
    affinity: int | None, logical: int | None, quota: float | None
) -> None:
    result = usable_cpus(affinity, logical, quota)
    assert result >= 1
    assert result <= (affinity or logical or 1)
    if quota is not None and quota >= 1:
        assert result <= math.floor(quota)
