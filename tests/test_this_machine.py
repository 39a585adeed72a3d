"""System tier: the installed `autotune` command on this real machine, in a subprocess.

These check what unit tests cannot: that the console script is installed, that a fast detection
on a real machine imports no torch, and that what it reports matches the machine.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import psutil
import pytest
from packaging.version import Version

from torch_autotune.detect.cgroup import read_cgroup_limits
from torch_autotune.hardware import HardwareSnapshot

pytestmark = pytest.mark.system


def own_script() -> str | None:
    """The `autotune` script that runs this interpreter, or None where pip installed none for it:
    the first on PATH if it does (`pip install --target` puts it in the target's bin), else the
    one in this interpreter's scripts folder.

    The first `autotune` on PATH can belong to another Python with another torch (a virtual
    environment run by its path but not activated): this tier must test the torch it runs under.
    """
    on_path = shutil.which("autotune")
    if on_path is not None:
        with open(on_path, "rb") as script:
            first = script.readline(4096)
        runs = first[2:].decode(errors="replace").strip() if first.startswith(b"#!") else ""
        # a virtual environment's python links to its base: compare folders, not resolved files
        here = Path(os.path.abspath(sys.executable)).parent
        if runs and Path(os.path.abspath(runs)).parent == here:
            return on_path
    return shutil.which("autotune", path=sysconfig.get_path("scripts"))


def command() -> list[str]:
    script = own_script()
    return [script] if script else [sys.executable, "-m", "torch_autotune"]


def autotune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command(), *args], check=False, capture_output=True, text=True, timeout=120
    )


def recommended(check: str, env: dict[str, str]) -> str:
    """What `check` prints after `recommend()` in a fresh interpreter, failing with its stderr."""
    shown = subprocess.run(
        [sys.executable, "-c", f"import torch_autotune; p = torch_autotune.recommend(); {check}"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


@pytest.fixture(scope="module")
def snapshot() -> HardwareSnapshot:
    done = autotune("detect", "--json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return HardwareSnapshot.model_validate_json(done.stdout)


def test_console_script_is_installed() -> None:
    assert own_script() is not None, (
        f"pip install -e . installs the 'autotune' command for {sys.executable}"
    )


def test_the_installed_package_holds_every_module_of_the_checkout() -> None:
    """The package this interpreter imports (the checkout's own, or a built wheel installed
    apart, as CI's last pass runs it) holds every module the checkout has: a module left out
    of the wheel fails here, not on a user's first import of it."""
    import torch_autotune

    installed = Path(torch_autotune.__file__).parent
    checkout = Path(__file__).parent.parent / "src" / "torch_autotune"
    modules = {p.relative_to(checkout).as_posix() for p in checkout.rglob("*.py")}
    assert modules, "no checkout beside the tests"
    missing = sorted(m for m in modules if not (installed / m).is_file())
    assert not missing, f"{installed} lacks {missing}"
    assert (installed / "py.typed").is_file()


def test_json_round_trips(snapshot: HardwareSnapshot) -> None:
    again = HardwareSnapshot.model_validate_json(snapshot.model_dump_json())
    assert again == snapshot
    assert json.loads(snapshot.model_dump_json())["schema_version"] == 1


def test_reports_the_cpus_this_process_may_use(snapshot: HardwareSnapshot) -> None:
    host = snapshot.host
    if hasattr(os, "sched_getaffinity"):
        assert host.cpu_affinity_count == len(os.sched_getaffinity(0))
    assert host.cpu_cores_logical == os.cpu_count()
    if sys.platform.startswith("linux"):
        assert host.cpu_quota_cores == read_cgroup_limits(Path("/")).cpu_quota_cores
    assert 1 <= host.cpus_usable <= (host.cpu_affinity_count or host.cpu_cores_logical or 1)


def test_reports_the_ram_and_the_installed_torch(snapshot: HardwareSnapshot) -> None:
    assert snapshot.host.memory_total_bytes == psutil.virtual_memory().total
    # torch writes its build into its version ("2.11.0+cu130"); the wheels on PyPI leave it out
    # of the distribution's ("2.11.0"), the ones from download.pytorch.org keep it.
    reported = Version(snapshot.software.torch_version or "")
    installed = Version(importlib.metadata.version("torch"))
    assert reported.public == installed.public
    assert installed.local is None or reported.local == installed.local
    assert snapshot.software.python_version == ".".join(map(str, sys.version_info[:3]))


@pytest.mark.skipif(
    Path("/proc/driver/nvidia/version").exists(), reason="this machine has an NVIDIA driver"
)
def test_reports_no_gpu_where_there_is_none(snapshot: HardwareSnapshot) -> None:
    assert [a for a in snapshot.accelerators if a.vendor.value == "nvidia"] == []


def test_fast_detection_does_not_import_torch() -> None:
    code = (
        "import sys; from torch_autotune import detect; s = detect(); "
        "print('torch' in sys.modules, s.detection_depth)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["False", "fast"], done.stderr


def test_human_summary_and_deep_detection_run_cleanly() -> None:
    summary = autotune("detect")
    deep = autotune("detect", "--deep", "--json")
    assert summary.returncode == 0, summary.stderr
    assert "Host" in summary.stdout
    assert deep.returncode == 0, deep.stderr
    assert HardwareSnapshot.model_validate_json(deep.stdout).detection_depth == "deep"


def test_autotune_with_no_arguments_probes_saves_and_recommend_returns_it(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "TORCH_AUTOTUNE_HOME": str(tmp_path)}
    started = time.perf_counter()
    done = subprocess.run(
        command(), env=env, check=False, capture_output=True, text=True, timeout=600
    )
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "largest batch" in done.stdout
    shown = recommended(
        "import json; e = p.evidence; "
        "print(json.dumps([p.measured, p.settings.batch.batch_size, e.batch_size, e.budget_s]))",
        env,
    )
    measured, batch, evidence_batch, budget = json.loads(shown)
    assert measured is True
    assert batch == evidence_batch
    # the default budget (120 s; 180 s where torch.compile is measured), plus interpreter and
    # import time
    assert elapsed < budget + 30


def test_autotune_bench_tunes_first_then_benches_and_stores_the_evidence(tmp_path: Path) -> None:
    env = {**os.environ, "TORCH_AUTOTUNE_HOME": str(tmp_path)}
    args = ["bench", "-m", "mlp", "--budget", "10", "--rounds", "3", "--seconds", "0.2"]
    done = subprocess.run(
        [*command(), *args], env=env, check=False, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "tuning first" in done.stderr
    shown = recommended("b = p.evidence.bench; print(b.workload, b.rounds, b.device)", env)
    workload, rounds, device = shown.split()
    assert (workload, rounds) == ("mlp", "3")
    assert f"autotune bench: mlp on {device} (" in done.stdout  # cuda where there is a GPU
