"""The simulated machine that ships in the package (``probe.simulated``): in step with the seam
method by method, its presets reproduce the runs they were recorded from, and it runs ``tune()``
as documented."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from tests.probe.fake_trials import recorded
from torch_autotune.api import tune
from torch_autotune.probe.plan import ram_budget
from torch_autotune.probe.presets import PRESETS, preset
from torch_autotune.probe.seam import Trials
from torch_autotune.probe.simulated import SimulatedMachine, SimulatedTrials
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.workloads import resolve_workload
from torch_autotune.profile import Profile

H100 = recorded("h100-80gb-hbm3")


def _seam_methods() -> list[str]:
    """The methods ``Trials`` declares, ``__call__`` included, its own protocol machinery not."""
    return sorted(
        name
        for name, value in vars(Trials).items()
        if callable(value) and (not name.startswith("__") or name == "__call__")
    )


def test_the_seam_has_the_methods_the_probe_calls() -> None:
    # If this list changes, the test below compares the new methods too: it is here so that a
    # seam emptied by mistake does not pass the comparison vacuously.
    assert set(_seam_methods()) >= {"__call__", "point", "load", "fed", "memory_limit"}


@pytest.mark.parametrize("name", _seam_methods())
def test_the_simulation_implements_each_seam_method_with_its_signature(name: str) -> None:
    seam = inspect.signature(getattr(Trials, name))
    simulated = inspect.signature(getattr(SimulatedTrials, name))
    assert list(simulated.parameters.values()) == list(seam.parameters.values())
    returns = {"Trials": "SimulatedTrials"}  # a runner returns a runner of its own kind
    assert simulated.return_annotation == returns.get(
        seam.return_annotation, seam.return_annotation
    )


def test_the_simulation_has_each_attribute_of_the_seam() -> None:
    runner = SimulatedMachine().trials(resolve_workload("conv"), StepSettings())
    for attribute in Trials.__annotations__:
        assert hasattr(runner, attribute), attribute


def test_an_unknown_preset_names_the_known_ones() -> None:
    known = "h100-resnet50, h100-gpt2, h200-gpt2-large-24gib, h200-gpt2-large-16gib, cpu-conv"
    with pytest.raises(ValueError, match=known):
        preset("h100-resnet"), "a preset's name in full"


def test_a_preset_is_fresh_each_time_and_takes_changes() -> None:
    machine = preset("h100-gpt2", load_s=None)
    machine.advance(5.0)
    machine.log.append("trial 1")
    again = preset("h100-gpt2")
    assert (again.now, again.log, again.load_s) == (0.0, [], PRESETS["h100-gpt2"]().load_s)
    assert machine.load_s is None


def test_restart_is_a_fresh_process_on_the_same_machine() -> None:
    machine = preset("h100-resnet50")
    _speed(machine, "resnet50")
    assert machine.now > 0
    assert machine.log
    assert machine.started
    assert machine.compiled_once
    machine.restart()
    fresh = preset("h100-resnet50")
    assert dataclasses.asdict(machine) == dataclasses.asdict(fresh)


def _speed(machine: SimulatedMachine, workload: str) -> Profile:
    """``tune()`` in speed mode with its steps and clock on ``machine``, as the docstring of
    ``probe.simulated`` shows it; the workers phase loads nothing for real (``load_s``)."""
    model = dataclasses.replace(resolve_workload("conv"), dataset=None, name=workload)
    return tune(model, snapshot=H100, trials=machine.trials, clock=machine.clock, mode="speed")


@pytest.mark.parametrize(
    ("name", "workload", "largest", "batch", "speedup"),
    [
        # benchmarks/results/h100-2026-11-23: 1865 (1866 ran out), 832 compiled, 1.18x;
        # 155 (156 ran out), 136 compiled, 1.40x
        ("h100-resnet50", "resnet50", 1865, 832, 1.18),
        ("h100-gpt2", "gpt2", 155, 136, 1.40),
    ],
)
def test_the_h100_presets_reproduce_the_recorded_runs(
    name: str, workload: str, largest: int, batch: int, speedup: float
) -> None:
    profile = _speed(preset(name), workload)
    evidence = profile.evidence
    assert evidence is not None
    assert (evidence.max_batch_size, evidence.limited_by) == (largest, "memory")
    assert {t.batch_size for t in evidence.search if not t.fits} >= {largest + 1}
    assert (evidence.batch_size, profile.settings.compile.enabled) == (batch, True)
    assert evidence.compile is not None
    assert evidence.compile.kept
    eager = evidence.compile.eager_samples_per_s
    compiled = evidence.compile.compiled_samples_per_s
    assert eager is not None
    assert compiled is not None
    assert compiled / eager == pytest.approx(speedup, rel=0.01)
    assert evidence.elapsed_s <= evidence.budget_s


def test_the_resnet50_preset_measures_the_recorded_rates() -> None:
    """Eager 4,250, 4,213 and 4,096 samples/s at 1672, 832 and 416, within 1%."""
    evidence = _speed(preset("h100-resnet50"), "resnet50").evidence
    assert evidence is not None
    eager = {r.batch_size: r.samples_per_s for r in evidence.throughput if not r.compiled}
    assert eager == pytest.approx({1672: 4250, 832: 4213, 416: 4096}, rel=0.01)


def test_the_cpu_preset_is_limited_by_the_cap_and_its_throughput_falls_with_the_batch() -> None:
    machine = preset("cpu-conv", load_s=None)
    model = dataclasses.replace(resolve_workload("conv"), dataset=None)
    profile = tune(
        model,
        snapshot=recorded("cpu-laptop-linux"),
        trials=machine.trials,
        clock=machine.clock,
        mode="balanced",
    )
    evidence = profile.evidence
    assert evidence is not None
    assert (evidence.max_batch_size, evidence.limited_by) == (512, "cap")
    # no device memory on a CPU (None): the search is held by the host's RAM instead
    assert evidence.memory_limit_bytes == ram_budget(recorded("cpu-laptop-linux"))
    rates = {r.batch_size: r.samples_per_s for r in evidence.throughput}
    # recorded: 208, 265 and 299 samples/s at 512, 256 and 128
    assert rates[512] == pytest.approx(208, rel=0.03)
    assert rates[256] == pytest.approx(265, rel=0.03)
    assert rates[512] < rates[256] < rates[128]
