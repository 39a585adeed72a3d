"""Regenerate the reference profiles in this folder from the recorded machine snapshots.

    python profiles/regenerate.py          # rewrite the files
    python profiles/regenerate.py --check  # exit 1 when a file differs from what the engine gives

Each reference profile is the rules engine's output (speed mode, default preferences) for one
snapshot in tests/fixtures/snapshots. ``created_at`` is the snapshot's capture time and the
machine id is "reference", so the files change only when the engine or a snapshot does.
"""

from __future__ import annotations

import sys
from pathlib import Path

from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile_io import dump_profile
from torch_autotune.rules.engine import build_profile

HERE = Path(__file__).resolve().parent
SNAPSHOTS = HERE.parent / "tests" / "fixtures" / "snapshots"

MACHINES = (
    "tesla-p100-pcie-16gb",
    "gtx-1080-ti",
    "tesla-v100-sxm2-16gb",
    "tesla-t4",
    "gtx-1660-ti",
    "rtx-3060-windows",
    "rtx-3090",
    "rtx-4090",
    "a100-sxm4-80gb-8x",
    "a100-sxm4-40gb-mig-1g5gb",
    "l4",
    "h100-80gb-hbm3",
    "b200",
    "rtx-5090",
    "jetson-agx-orin-32gb",
    "rtx-4090-plus-rtx-3060",
    "mi300x-rocm",
    "apple-m2-pro-mps",
    "cpu-container-quota-4",
)


def expected(machine: str) -> str:
    """The YAML the engine gives for one reference machine."""
    snapshot = HardwareSnapshot.model_validate_json((SNAPSHOTS / f"{machine}.json").read_text())
    profile = build_profile(snapshot, now=snapshot.captured_at, host_id="reference")
    return dump_profile(profile, "yaml")


def main(argv: list[str]) -> int:
    check = "--check" in argv
    drifted = []
    for machine in MACHINES:
        path = HERE / f"{machine}.yaml"
        text = expected(machine)
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                drifted.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
    if drifted:
        print(f"out of date: {', '.join(drifted)}; run python profiles/regenerate.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
