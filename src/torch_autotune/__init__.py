"""torch-autotune: hardware-aware configuration tuning for PyTorch training.

Importing this package is free: it reads no hardware, starts no NVML session and does not
import torch. Detection happens when ``detect()`` is called; ``tune()`` and ``bench()`` import
torch when they run. All four are defined in ``torch_autotune.api``, the one front door.
"""

from __future__ import annotations

from torch_autotune.api import bench, detect, recommend, save, tune
from torch_autotune.bench import TrainConfig
from torch_autotune.detect import LiveMachine, RecordedMachine, load_snapshot
from torch_autotune.errors import (
    AutotuneError,
    InputFileError,
    LateEnvironmentWarning,
    MeasuredProfileExistsError,
    PlotUnavailableError,
    ProbeError,
    ProfileFileError,
    ProfileUseWarning,
    RulesOnlyWarning,
    SnapshotFileError,
    StaleProfileWarning,
    StoredProfileError,
    StoredProfileWarning,
    StoreError,
    UnusableGpuWarning,
    WorkloadError,
)
from torch_autotune.hardware import (
    Accelerator,
    Architecture,
    Backend,
    DetectionWarning,
    HardwareSnapshot,
    Host,
    MigSlice,
    Software,
    Vendor,
)
from torch_autotune.profile import Mode, Preferences, Profile
from torch_autotune.profile_io import load_profile
from torch_autotune.version import __version__

__all__ = [
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
    "ProfileUseWarning",
    "RecordedMachine",
    "RulesOnlyWarning",
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
    "save",
    "tune",
]
