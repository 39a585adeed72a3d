"""The public surface: what `import torch_autotune` offers, and what importing it costs."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import torch_autotune
from tests.probe.fake_trials import mlp_machine, recorded, tune_on
from torch_autotune import RecordedMachine, api
from torch_autotune.rules.engine import UNKNOWN_HOST, build_profile
from torch_autotune.store import machine_id


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


def test_tune_and_bench_are_the_front_doors_own_functions() -> None:
    """``torch_autotune.tune`` and ``bench`` are real functions of ``torch_autotune.api``, with
    the parameters the README documents, not names a module ``__getattr__`` hands out."""
    assert "__getattr__" not in vars(torch_autotune)
    for name in ("detect", "recommend", "tune", "bench"):
        function = getattr(torch_autotune, name)
        assert inspect.isfunction(function), name
        assert function is getattr(api, name)
    tune = inspect.signature(torch_autotune.tune).parameters
    assert list(tune)[:1] == ["workload"]
    assert {"budget_s", "snapshot", "mode", "max_batch_size", "trials", "clock"} <= set(tune)
    bench = inspect.signature(torch_autotune.bench).parameters
    assert list(bench)[:2] == ["profile", "workload"]
    assert {"baseline", "rounds", "seconds", "budget_s", "measure", "clock"} <= set(bench)


TYPED_USE = """\
import torch_autotune
from torch_autotune import Profile, TrainConfig

profile: Profile = torch_autotune.tune("mlp", budget_s=30.0, max_batch_size=64)
benched: Profile = torch_autotune.bench(profile, baseline=TrainConfig(batch_size=64), rounds=3)
snapshot: torch_autotune.HardwareSnapshot = torch_autotune.detect()
torch_autotune.tune("mlp", budget_s="soon")  # type: ignore[arg-type]
torch_autotune.bench(profile, rounds="five")  # type: ignore[arg-type]
"""


@pytest.mark.slow
def test_mypy_strict_sees_the_real_signatures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A typed script checks against ``tune`` and ``bench`` as they are: a wrong argument is an
    error (its ``type: ignore`` is used), and the results are profiles. Were either ``Any``,
    the ignores would be unused; were either ``object``, the calls would not type-check."""
    if importlib.util.find_spec("mypy") is None:  # a skip would hide it in CI, as ruff's
        pytest.fail("mypy is not installed: pip install -e '.[test]' (the test extra brings it)")
    from mypy import api as mypy_api

    script = tmp_path / "uses_the_api.py"
    script.write_text(TYPED_USE)
    # the package under test, wherever it is imported from (a checkout, an editable install, a
    # folder of `pip install --target`), alone: its neighbours in a site folder would shadow the
    # libraries mypy knows (typing_extensions among them)
    alone = tmp_path / "package"
    package = Path(torch_autotune.__file__).parent
    shutil.copytree(package, alone / "torch_autotune", ignore=shutil.ignore_patterns("*.pyc"))
    monkeypatch.setenv("MYPYPATH", str(alone))
    # mypy's cache of what the script reads is kept in the checkout between runs: a run that
    # finds it takes a second, not 20 s (CI's wheel pass, after the first), and mypy checks
    # again every module whose source or options changed, the package's copy included
    cache = request.config.rootpath / ".mypy_cache" / "typed-script"
    out, err, status = mypy_api.run(
        ["--strict", f"--cache-dir={cache}", "--follow-imports=silent", str(script)]
    )
    assert status == 0, out + err


def test_the_rules_engine_reads_no_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine is pure: the machine id is the caller's to give, and without one the profile
    says it is unknown instead of the engine reading the host name."""

    def no_host_name() -> str:
        raise AssertionError("the rules engine read the host name")

    monkeypatch.setattr(platform, "node", no_host_name)
    monkeypatch.setattr(socket, "gethostname", no_host_name)
    laptop = recorded("cpu-laptop-linux")
    assert build_profile(laptop).provenance.machine_id == UNKNOWN_HOST
    assert build_profile(laptop, host_id="abc").provenance.machine_id == "abc"


def test_the_front_door_gives_its_profiles_this_machines_id(tmp_path: Path) -> None:
    """recommend() and tune() pass this host's id, so that the store can tell a stale profile
    of this machine from another machine's."""
    laptop = RecordedMachine(recorded("cpu-laptop-linux"))
    assert torch_autotune.recommend(store=tmp_path, machine=laptop).provenance.machine_id == (
        machine_id()
    )
    tuned = tune_on(mlp_machine(), "mlp", recorded("cpu-laptop-linux"), budget_s=5)
    assert tuned.provenance.machine_id == machine_id()


MEASURING = ("probe/run.py", "probe/workers_phase.py", "probe/ablation.py")
NOT_FOR_MEASURING = ("api", "compose", "detect", "rules", "store", "cli", "render")


def test_the_probe_and_the_bench_runner_only_measure() -> None:
    """The measuring modules take the machine and the rules-only profile as arguments: they
    import neither detection, the rules, the store nor the front door."""
    package = Path(torch_autotune.__file__).parent
    for name in MEASURING:
        tree = ast.parse((package / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {
            alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names
        }
        assert imported, name
        for module in imported:
            parts = module.split(".")
            if parts[0] == "torch_autotune" and len(parts) > 1:
                assert parts[1] not in NOT_FOR_MEASURING, f"{name} imports {module}"


@pytest.mark.parametrize("call", ["tune", "bench", "bench-a-profile"])
def test_without_torch_the_probe_and_the_bench_say_so(
    call: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ProbeError (exit 6) naming the fix, as the README says, from the bench as from tune():
    the bench imported torch first and failed with ModuleNotFoundError (exit 1, a bug)."""
    from tests.test_bench import measured
    from torch_autotune.errors import ProbeError

    monkeypatch.setitem(sys.modules, "torch", None)  # find_spec: None; import: refused
    run = {
        "tune": lambda: api.tune("mlp"),
        "bench": lambda: api.bench(workload="mlp"),
        "bench-a-profile": lambda: api.bench(measured("cpu-laptop-linux")),
    }[call]
    with pytest.raises(ProbeError, match="torch is not installed"):
        run()
