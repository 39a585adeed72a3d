"""The test suite itself: the CPU tier trains on the CPU whether or not the machine has a GPU,
the hardware guard fails our code and only ours, and warnings are errors for our code only.

The first GPU run of the suite (H100, torch 2.11.0+cu130; issue 10) failed 30 tests that pass
on a CPU machine. These tests run the same code paths here with the GPU machine simulated.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.conftest import as_gpu_machine
from tests.probe.fake_trials import mlp_machine
from tests.rules.helpers import snapshot
from torch_autotune import detect
from torch_autotune.api import bench, tune
from torch_autotune.bench import TrainConfig
from torch_autotune.detect import nvml
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe.loop import TrainingLoop
from torch_autotune.probe.simulated import SimulatedTrials
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.workloads import Workload, resolve_workload

TESTS = Path(__file__).parent
TORCH_DEPRECATION = (
    "`torch.jit.script_method` is deprecated. Please switch to `torch.compile` or `torch.export`."
)


def warn_from(module: str, message: str, category: type[Warning] = DeprecationWarning) -> None:
    """``warnings.warn`` as code in ``module`` calls it (the filters match on that name)."""
    code = compile("warnings.warn(message, category)", f"<{module}>", "exec")
    exec(code, {"__name__": module, "warnings": warnings, "message": message, "category": category})


def warn_as_torch_2_11_does() -> None:
    """torch 2.11 when torch.compile imports inductor: ``torch.jit.script_method`` decorates a
    class in torch.utils.mkldnn, and torch.jit._script warns about itself."""
    warn_from("torch.jit._script", TORCH_DEPRECATION)


@contextlib.contextmanager
def no_cuda_started() -> Iterator[None]:
    """The block starts no CUDA. Where CUDA had started before it (on a GPU machine, the GPU tier
    runs earlier in the same process; ``--as-gpu-machine`` simulates that), this cannot tell,
    and the devices the test checks are the evidence."""
    before = torch.cuda.is_initialized()
    yield
    assert before or not torch.cuda.is_initialized(), "the block started CUDA"


# --- the CPU tier on a GPU machine ---------------------------------------------------------------


def test_the_simulated_gpu_machine_has_a_gpu_and_a_cuda_build(
    gpu_machine: HardwareSnapshot,
) -> None:
    assert [a.name for a in detect().accelerators] == ["NVIDIA H100 80GB HBM3"]
    assert torch.accelerator.current_accelerator() == torch.device("cuda")
    # torch's own question reaches the guard, which answers as a CPU build would
    assert torch.accelerator.current_accelerator(check_available=True) is None
    assert torch.accelerator.is_available() is False


def test_on_a_gpu_machine_detecting_this_machine_asks_nvml_which_the_guard_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What ``--as-gpu-machine`` gives every unit and slow test: where the driver's files are
    present, detection asks the real NVML, as on the H100 where this failed 30 tests."""
    as_gpu_machine(monkeypatch)
    with pytest.raises(pytest.fail.Exception, match="reached real NVML"):
        detect()


def test_as_gpu_machine_puts_every_unit_test_on_the_simulated_gpu_machine(
    request: pytest.FixtureRequest,
) -> None:
    if not request.config.getoption("--as-gpu-machine"):
        pytest.skip("runs under --as-gpu-machine (CI's second pass over the unit and slow tiers)")
    assert nvml.nvidia_driver_present()
    assert torch.accelerator.current_accelerator() == torch.device("cuda")
    assert torch.accelerator.is_available() is False  # the guard's answer to torch
    assert torch.cuda.is_initialized()  # by the GPU tier, earlier in the same process


def test_the_guard_fails_our_code_asking_for_the_gpu() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"reached real CUDA \(torch.cuda.is_avail"):
        torch.cuda.is_available()


def test_on_a_gpu_machine_the_training_loop_trains_on_the_cpu(
    gpu_machine: HardwareSnapshot,
) -> None:
    built: list[torch.nn.Module] = []
    mlp = resolve_workload("mlp")

    def make_model() -> torch.nn.Module:
        built.append(mlp.make_model())
        return built[-1]

    workload = dataclasses.replace(mlp, make_model=make_model)
    loop = TrainingLoop(workload, "cpu", warmup_steps=1, min_steps=2)
    with no_cuda_started():
        assert loop.measure(TrainConfig(batch_size=16), 0.05) > 0
    assert {p.device.type for model in built for p in model.parameters()} == {"cpu"}


def test_on_a_gpu_machine_tune_of_a_cpu_snapshot_asks_for_trials_on_the_cpu(
    gpu_machine: HardwareSnapshot,
) -> None:
    machine = mlp_machine()
    devices: list[str] = []

    def trials(workload: Workload, step: StepSettings) -> SimulatedTrials:
        devices.append(step.device)
        return SimulatedTrials(machine, step, workload=workload)

    laptop = snapshot("cpu-laptop-linux")
    with no_cuda_started():
        profile = tune("mlp", snapshot=laptop, budget_s=5, clock=machine.clock, trials=trials)
    assert devices == ["cpu"]
    assert profile.settings.device == "cpu"


@pytest.mark.slow
def test_on_a_gpu_machine_tune_and_bench_of_a_cpu_snapshot_train_on_the_cpu(
    gpu_machine: HardwareSnapshot,
) -> None:
    with no_cuda_started():
        profile = tune("mlp", snapshot=snapshot("cpu-laptop-linux"), budget_s=5, max_batch_size=16)
        benched = bench(profile, rounds=1, seconds=0.05)
    assert profile.settings.device == "cpu"
    assert benched.evidence is not None
    assert benched.evidence.device == "cpu"
    assert benched.evidence.bench is not None
    assert benched.evidence.bench.device == "cpu"


def test_on_a_gpu_machine_a_test_that_trains_on_the_detected_device_fails(
    gpu_machine: HardwareSnapshot,
) -> None:
    """What the CPU tier must not do: tune() without a snapshot detects the GPU and trains there."""
    with pytest.raises(pytest.fail.Exception, match="reached real CUDA"):
        tune("mlp", budget_s=5, max_batch_size=16)


def test_detection_can_be_pinned_to_a_machine_without_gpus(
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    laptop = detected_as("cpu-laptop-linux")
    assert detect() == laptop
    assert laptop.accelerators == ()


def _sets_pythonpath(node: ast.AST) -> bool:
    """``{"PYTHONPATH": ...}`` or ``setenv("PYTHONPATH", ...)``: a value that replaces it."""
    if isinstance(node, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value == "PYTHONPATH" for k in node.keys)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        first = node.args[0] if node.args else None
        return (
            node.func.attr == "setenv"
            and isinstance(first, ast.Constant)
            and (first.value == "PYTHONPATH")
        )
    return False


def test_no_test_replaces_the_pythonpath_a_child_interpreter_needs() -> None:
    """A GPU image has torch but not our dependencies: they are installed with pip's --target
    and found only through PYTHONPATH, which 6 tests replaced with the checkout's ``src``. A
    child interpreter gets ``conftest.env_importing_from``, which puts ``src`` first and keeps
    the rest."""
    offenders = [
        f"{path.relative_to(TESTS)}:{node.lineno}"
        for path in sorted(TESTS.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if _sets_pythonpath(node)
    ]
    assert offenders == []
    assert _sets_pythonpath(ast.parse('{**os.environ, "PYTHONPATH": src}', mode="eval").body)
    assert _sets_pythonpath(ast.parse('monkeypatch.setenv("PYTHONPATH", src)', mode="eval").body)


# --- warnings as errors for our code only --------------------------------------------------------


def test_a_deprecation_inside_another_package_is_shown_not_raised() -> None:
    with warnings.catch_warnings(record=True) as caught:  # the filters stay as pytest set them
        warn_as_torch_2_11_does()
    assert [str(w.message) for w in caught] == [TORCH_DEPRECATION]


@pytest.mark.parametrize("module", ["torch_autotune.probe.loop", "tests.test_the_suite"])
@pytest.mark.parametrize("category", [DeprecationWarning, PendingDeprecationWarning, UserWarning])
def test_our_own_warnings_stay_errors(module: str, category: type[Warning]) -> None:
    with pytest.raises(category, match="ours"):
        warn_from(module, "ours", category)


def test_pytest_benchmark_turning_itself_off_under_xdist_is_no_error() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warn_from(
            "pytest_benchmark.logger",
            "Benchmarks are automatically disabled because xdist plugin is active.",
            UserWarning,
        )
    assert caught == []
