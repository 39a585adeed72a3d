"""The recorded snapshots in tests/fixtures/snapshots: real machine types, built from catalog §R.

They load, round-trip byte for byte, agree with the architecture helpers in
``torch_autotune.hardware``, and together cover the machines the rules must handle.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from torch_autotune.hardware import (
    Accelerator,
    Architecture,
    Backend,
    HardwareSnapshot,
    Vendor,
    amd_architecture,
    nvidia_architecture,
    nvidia_has_tensor_cores,
    nvidia_unified_memory,
)

SNAPSHOT_DIR = Path(__file__).parent / "fixtures" / "snapshots"
FILES = sorted(SNAPSHOT_DIR.glob("*.json"))
ACCELERATOR_MEMORY_FIELDS = ("memory_total_bytes", "memory_free_bytes")


def load(path: Path) -> HardwareSnapshot:
    return HardwareSnapshot.model_validate_json(path.read_text(encoding="utf-8"))


def by_stem(stem: str) -> HardwareSnapshot:
    return load(SNAPSHOT_DIR / f"{stem}.json")


def nvidia_with_cc(snap: HardwareSnapshot) -> list[Accelerator]:
    nvidia = (a for a in snap.accelerators if a.vendor is Vendor.NVIDIA)
    return [a for a in nvidia if a.compute_capability is not None]


def features(snap: HardwareSnapshot) -> set[str]:
    """What one snapshot contributes to the coverage the fixture set must keep."""
    found: set[str] = set()
    for acc in snap.accelerators:
        if acc.backend is Backend.MPS:
            found.add("mps")
        if acc.backend is Backend.ROCM:
            found.add("rocm")
        if acc.mig is not None:
            found.add("mig")
    for acc in nvidia_with_cc(snap):
        cc = acc.compute_capability
        assert cc is not None
        found.add(f"cc {cc[0]}.{cc[1]}")
        if cc == (7, 5):
            found.add("cc 7.5 with tensor cores" if acc.tensor_cores else "cc 7.5 without")
        if acc.architecture is Architecture.BLACKWELL:
            found.add("blackwell")
        if acc.unified_memory:
            found.add("nvidia unified memory")
    if snap.gpu_count == 8:
        found.add("8 accelerators")
    if len({a.name for a in snap.accelerators}) > 1:
        found.add("mixed accelerator names")
    found.add(f"os {snap.host.os_name}")
    host = snap.host
    if (
        not snap.accelerators
        and host.cpu_quota_cores is not None
        and host.cpu_cores_logical is not None
        and host.cpu_quota_cores < host.cpu_cores_logical / 4
    ):
        found.add("cpu-only with a small quota")
    return found


REQUIRED_COVERAGE = {
    "cc 6.0", "cc 6.1", "cc 7.0", "cc 7.5", "cc 7.5 with tensor cores", "cc 7.5 without",
    "cc 8.0", "cc 8.6", "cc 8.9", "cc 9.0", "blackwell", "nvidia unified memory", "mig",
    "8 accelerators", "mixed accelerator names", "os windows", "mps", "rocm",
    "cpu-only with a small quota",
}  # fmt: skip

each_file = pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])


def test_there_are_enough_fixtures() -> None:
    assert len(FILES) >= 20


@each_file
def test_round_trips_byte_for_byte(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert load(path).model_dump_json(indent=2) + "\n" == text


@each_file
def test_nvidia_facts_agree_with_the_helpers(path: Path) -> None:
    for acc in nvidia_with_cc(load(path)):
        cc = acc.compute_capability
        assert cc is not None
        assert acc.architecture == nvidia_architecture(cc), acc.name
        assert acc.tensor_cores == nvidia_has_tensor_cores(cc, acc.name), acc.name
        assert acc.unified_memory == nvidia_unified_memory(cc, acc.name), acc.name


@each_file
def test_accelerators_are_indexed_in_order_with_distinct_ids(path: Path) -> None:
    accelerators = load(path).accelerators
    assert [a.index for a in accelerators] == list(range(len(accelerators)))
    for attr in ("uuid", "pci_bus_id"):
        ids = [getattr(a, attr) for a in accelerators if getattr(a, attr) is not None]
        assert len(ids) == len(set(ids)), attr


@each_file
def test_memory_and_cpu_counts_are_consistent(path: Path) -> None:
    snap = load(path)
    for acc in snap.accelerators:
        if acc.memory_total_bytes is not None and acc.memory_free_bytes is not None:
            assert acc.memory_free_bytes <= acc.memory_total_bytes, acc.name
    host = snap.host
    if host.cpu_affinity_count is not None:
        expected = host.cpu_affinity_count
        if host.cpu_quota_cores is not None:
            expected = max(1, min(expected, math.floor(host.cpu_quota_cores)))
        assert host.cpus_usable == expected


@each_file
def test_unknown_accelerator_memory_carries_a_warning(path: Path) -> None:
    snap = load(path)
    warned = {w.field for w in snap.warnings}
    for i, acc in enumerate(snap.accelerators):
        for field in ACCELERATOR_MEMORY_FIELDS:
            if getattr(acc, field) is None:
                assert f"accelerators[{i}].{field}" in warned


def test_fixtures_cover_the_machines_the_rules_must_handle() -> None:
    covered: set[str] = set()
    for path in FILES:
        covered |= features(load(path))
    assert REQUIRED_COVERAGE - covered == set()


def test_t4_is_turing_with_40_sms() -> None:
    (t4,) = by_stem("tesla-t4").accelerators
    assert t4.name == "Tesla T4"
    assert t4.sm_count == 40
    assert t4.architecture is Architecture.TURING  # not a bf16-class (Ampere+) part
    assert t4.tensor_cores is True


def test_gtx_1660_ti_has_no_tensor_cores_despite_cc_7_5() -> None:
    (gtx,) = by_stem("gtx-1660-ti").accelerators
    assert gtx.compute_capability == (7, 5)
    assert gtx.tensor_cores is False


def test_mi300x_cc_9_4_is_not_hopper() -> None:
    (mi300x,) = by_stem("mi300x-rocm").accelerators
    assert mi300x.backend is Backend.ROCM
    assert mi300x.compute_capability == (9, 4)
    assert mi300x.architecture is Architecture.CDNA3
    assert mi300x.architecture == amd_architecture("gfx942")
    assert mi300x.architecture != nvidia_architecture((9, 4))


def test_old_wheel_cannot_run_the_rtx_5090() -> None:
    snap = by_stem("rtx-5090-old-wheel")
    (gpu,) = snap.accelerators
    assert gpu.compute_capability == (12, 0)
    arch_list = snap.software.torch_cuda_arch_list or ()
    assert not any(a.startswith("sm_12") for a in arch_list)
    assert "sm_120" in (by_stem("rtx-5090").software.torch_cuda_arch_list or ())
