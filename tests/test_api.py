"""The public surface: what `import torch_autotune` offers, and what importing it costs."""

from __future__ import annotations

import subprocess
import sys

import torch_autotune


def test_public_names_are_pinned() -> None:
    assert sorted(torch_autotune.__all__) == [
        "Accelerator",
        "Architecture",
        "AutotuneError",
        "Backend",
        "DetectionWarning",
        "HardwareSnapshot",
        "Host",
        "InputFileError",
        "LateEnvironmentWarning",
        "LiveMachine",
        "MeasuredProfileExistsError",
        "MigSlice",
        "Mode",
        "PlotUnavailableError",
        "Preferences",
        "ProbeError",
        "Profile",
        "ProfileFileError",
        "RecordedMachine",
        "SnapshotFileError",
        "Software",
        "StaleProfileWarning",
        "StoreError",
        "StoredProfileError",
        "StoredProfileWarning",
        "TrainConfig",
        "UnusableGpuWarning",
        "Vendor",
        "WorkloadError",
        "__version__",
        "bench",
        "detect",
        "load_profile",
        "load_snapshot",
        "recommend",
        "tune",
    ]
    for name in torch_autotune.__all__:
        assert hasattr(torch_autotune, name), name


def test_errors_share_one_root_and_carry_exit_codes() -> None:
    assert issubclass(torch_autotune.SnapshotFileError, torch_autotune.InputFileError)
    assert issubclass(torch_autotune.InputFileError, torch_autotune.AutotuneError)
    assert torch_autotune.SnapshotFileError("x").exit_code == 3


def test_importing_reads_no_hardware_and_imports_neither_torch_nor_nvml() -> None:
    code = (
        "import sys, torch_autotune, torch_autotune.cli, torch_autotune.render; "
        "print(sorted(m for m in ('torch', 'pynvml', 'psutil', 'yaml') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
