"""Real training steps on the CPU: OOM at any phase is recovered, other errors surface, and
the user's model, optimizer, RNG and torch flags come back bit-identical."""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from torch_autotune.apply import optimizer_kwargs
from torch_autotune.errors import raised_by_user_code
from torch_autotune.probe import step as step_module
from torch_autotune.probe import trials
from torch_autotune.probe.search import find_max_batch_size
from torch_autotune.probe.state import preserved
from torch_autotune.probe.trials import StepSettings, TrialRunner
from torch_autotune.probe.variants import BASE, compiled
from torch_autotune.probe.workloads import Workload

LIMIT = 12  # the injected allocator "runs out" above this batch size


class OomAt(torch.nn.Module):
    """A small MLP whose forward, backward or optimizer step runs out of memory above LIMIT."""

    def __init__(self, phase: str = "none", width: int = 16) -> None:
        super().__init__()
        self.phase = phase
        self.body = torch.nn.Sequential(
            torch.nn.Linear(width, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.phase == "forward" and x.shape[0] > LIMIT:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        out = self.body(x)
        if self.phase == "backward" and x.shape[0] > LIMIT:
            out = _FailingBackward.apply(out)
        return out


class _FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0)")


class OomInStep(torch.optim.SGD):
    """An optimizer whose step runs out of memory while the batch is large."""

    big_batch = False

    def step(self, closure: Any = None) -> Any:
        if OomInStep.big_batch:
            raise torch.OutOfMemoryError("CUDA out of memory in optimizer step")
        return super().step(closure)


@dataclass
class Tiny:
    """The workload protocol, by duck typing: just what TrialRunner uses."""

    model: torch.nn.Module
    optimizer: Callable[..., torch.optim.Optimizer]
    width: int = 16

    def make_model(self) -> torch.nn.Module:
        return self.model

    typical_batch = None
    builds_on_device = False
    model_on = Workload.model_on

    def make_optimizer(self, model: torch.nn.Module, **kwargs: Any) -> torch.optim.Optimizer:
        return self.optimizer(model.parameters(), **kwargs)

    def make_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        OomInStep.big_batch = batch_size > LIMIT
        return torch.randn(batch_size, self.width), torch.randint(0, 4, (batch_size,))

    def train_step(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        return torch.nn.functional.cross_entropy(model(inputs), targets)


def adam(params: Iterable[Any], **kwargs: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=1e-2, **kwargs)


def test_a_trial_trains_real_steps_and_times_them() -> None:
    workload = Tiny(OomAt(), adam)
    before = [p.detach().clone() for p in workload.model.parameters()]
    outcome = TrialRunner(workload, StepSettings())(8)
    assert outcome.fits
    assert outcome.seconds is not None
    assert outcome.seconds > 0
    # The CPU allocator keeps no peak: the process's resident high-water mark stands in.
    assert outcome.peak_memory_bytes is not None
    assert outcome.peak_memory_bytes > 0
    after = list(workload.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_a_runner_says_how_long_its_model_took_to_build() -> None:
    """What the plan charges a variant with a model of its own for each it builds."""
    ticks = iter(range(100))
    runner = TrialRunner(Tiny(OomAt(), adam), StepSettings(), clock=lambda: float(next(ticks)))
    assert runner.built_s is None
    assert runner(8).fits
    assert runner.built_s == 1.0  # one tick: the build alone, not the steps after it


@pytest.mark.parametrize("phase", ["forward", "backward", "step"])
def test_oom_in_any_phase_is_recovered_and_the_limit_found(phase: str) -> None:
    def optimizer(params: Iterable[Any], **kwargs: Any) -> torch.optim.Optimizer:
        if phase == "step":
            return OomInStep(params, lr=1e-2, **kwargs)
        return adam(params, **kwargs)

    workload = Tiny(OomAt(phase), optimizer)
    runner = TrialRunner(workload, StepSettings())
    assert runner(LIMIT + 1).fits is False
    assert runner(LIMIT).fits is True  # the failed trial left nothing behind
    result = find_max_batch_size(runner, cap=64)
    assert result.max_batch_size == LIMIT


def test_a_shape_bug_surfaces_as_the_users_own_error() -> None:
    workload = Tiny(OomAt(width=16), adam, width=15)  # inputs of the wrong width
    with pytest.raises(RuntimeError, match="cannot be multiplied") as caught:
        find_max_batch_size(TrialRunner(workload, StepSettings()), cap=64)
    frames = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert "forward" in frames  # the user's model is in the traceback, not hidden by ours
    assert raised_by_user_code(caught.value)  # and the command blames it on the model (exit 5)


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    tensors = [t.detach().clone() for t in model.state_dict().values()]
    for state in optimizer.state_dict()["state"].values():
        tensors += [v.clone() for v in state.values() if isinstance(v, torch.Tensor)]
    return tensors


def _trained_user_setup() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = OomAt("forward")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()  # the user's optimizer already has state
    return model, optimizer


@pytest.mark.parametrize("ending", ["success", "error", "interrupt"])
def test_model_optimizer_rng_and_flags_come_back_bit_identical(ending: str) -> None:
    model, optimizer = _trained_user_setup()
    before = _state(model, optimizer)
    torch.manual_seed(7)
    random.seed(7)
    expected_draws = (torch.rand(3), random.random())
    torch.manual_seed(7)
    random.seed(7)
    benchmark, threads = torch.backends.cudnn.benchmark, torch.get_num_threads()

    def probe() -> None:
        with preserved(model, optimizer):
            torch.backends.cudnn.benchmark = not benchmark
            torch.set_num_threads(1)
            find_max_batch_size(TrialRunner(Tiny(model, adam), StepSettings()), cap=32)
            if ending == "error":
                raise ValueError("the probe failed")
            if ending == "interrupt":
                raise KeyboardInterrupt

    if ending == "success":
        probe()
    else:
        with pytest.raises((ValueError, KeyboardInterrupt)):
            probe()

    after = _state(model, optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert (torch.rand(3).tolist(), random.random()) == (
        expected_draws[0].tolist(),
        expected_draws[1],
    )
    assert torch.backends.cudnn.benchmark is benchmark
    assert torch.get_num_threads() == threads


def test_step_settings_follow_the_profile() -> None:
    from pathlib import Path

    from torch_autotune.hardware import HardwareSnapshot
    from torch_autotune.profile import Preferences
    from torch_autotune.rules.engine import build_profile

    snapshot_dir = Path(__file__).parent.parent / "fixtures" / "snapshots"
    snapshot = HardwareSnapshot.model_validate_json((snapshot_dir / "tesla-t4.json").read_text())
    profile = build_profile(snapshot, preferences=Preferences(model_kind="conv"))
    step = StepSettings.from_profile(profile)
    assert step.settings == profile.settings  # trials train with the profile's own settings
    assert step.device == "cuda"
    precision = step.settings.precision
    assert (precision.dtype, precision.autocast, precision.grad_scaler) == ("float16", True, True)
    assert step.settings.memory_format == "channels_last"
    assert optimizer_kwargs(step.settings) == {"fused": True}
    assert step.steps >= 2
    on = step.with_variant(compiled("default"))
    assert (on.compile_mode, on.with_variant(BASE).compile_mode) == ("default", None)
    assert on.with_variant(BASE).settings == step.settings.model_copy(
        update={
            "compile": step.settings.compile.model_copy(update={"enabled": False, "mode": None})
        }
    )


@pytest.mark.parametrize("helper", ["autocast", "batch_to_device", "optimizer_kwargs"])
def test_a_bug_in_our_own_step_code_is_not_blamed_on_the_user(
    helper: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the user's code earns exit 5: the settings' autocast, the batch's move to the
    device and the optimizer's options are torch-autotune's, and a failure there is ours
    (exit 1, a bug to report), where it was marked as the user's model failing."""

    def ours(*_args: object, **_kwargs: object) -> Any:
        raise TypeError(f"a bug in {helper}")

    monkeypatch.setattr(step_module if helper == "autocast" else trials, helper, ours)
    with pytest.raises(TypeError, match="a bug in") as caught:
        TrialRunner(Tiny(OomAt(), adam), StepSettings())(8)
    assert not raised_by_user_code(caught.value)


@dataclass
class Timed(Tiny):
    """``Tiny`` on a simulated clock (``now``): its first step takes ``first_s`` (a warm-up
    and a step), each later one ``step_s``; ``began``: when each step began."""

    step_s: float = 0.1
    first_s: float = 0.6
    now: float = 0.0
    began: list[float] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def train_step(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        self.began.append(self.now)
        self.now += self.step_s if self.began[1:] else self.first_s
        return super().train_step(model, batch)


def _point(workload: Timed, until: float, deadline: float) -> trials.PointOutcome:
    runner = TrialRunner(workload, StepSettings(), clock=workload.clock)
    return runner.point(8, until=until, deadline=deadline)


@pytest.mark.parametrize(
    ("step_s", "first_s", "until", "deadline", "ends"),
    [
        (0.1, 0.6, 0.7, 0.85, 0.8),  # blocks of 3 steps: the first cut to the 1 that ends by it
        (0.1, 0.6, 0.65, 0.75, 0.7),  # none of them ends by it: the sizing step is the block
        (1.0, 1.5, 2.0, 3.0, 2.5),  # a step is a block: the sizing step is the one timed block
    ],
)
def test_a_point_whose_steps_run_slow_ends_by_its_phases_end(
    step_s: float, first_s: float, until: float, deadline: float, ends: float
) -> None:
    """The defect: a point ran its warm-up, a sizing step and a whole first block before it
    looked at the clock, so on a busy CPU, whose steps ran 1.5-20x slower than the search
    measured, the throughput phase took 14.04 s of its 11.6 s and the workers phase lost the
    difference. Its first block now ends by the phase's end (``deadline``), cut to the steps
    that do; the point ends unsteady, with the one block that ran."""
    workload = Timed(OomAt(), adam, step_s=step_s, first_s=first_s)
    point = _point(workload, until, deadline)
    assert point.fits
    assert not point.steady
    assert point.blocks == 1
    assert point.samples_per_s == pytest.approx(8 / step_s)
    assert workload.now == pytest.approx(ends)
    assert all(began < deadline for began in workload.began)  # no step began past it


@pytest.mark.parametrize("deadline", [14.6, 5.0])
def test_a_warm_up_past_its_share_times_a_block_where_the_phase_has_time(
    deadline: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first step that pays the cuDNN autotuner (8 s) spends the point's share (2 s). Where
    the phase's end (``deadline``) is still ahead, the point times its first block whole and
    is kept, as before: cutting it at its share left such points out of a GPU's runs. Where
    the warm-up ran past the phase's end, the one step after it is timed, the point's one
    block (its 8 s are paid; a step more makes them a point), and nothing more runs."""
    monkeypatch.setattr(trials, "one_off_warmup", lambda _settings: True)  # a GPU's autotuner
    workload = Timed(OomAt(), adam, step_s=0.1, first_s=8.0)
    point = _point(workload, 2.0, deadline)
    assert point.fits
    assert point.blocks == 1
    assert point.samples_per_s == pytest.approx(8 / 0.1)
    if deadline > workload.first_s:
        assert all(began < deadline for began in workload.began)  # no step began past it
        assert workload.now == pytest.approx(8.0 + 0.1 + 3 * 0.1)  # sizing, a block of 3
    else:
        assert len(workload.began) == 2  # the warm-up and the sizing step
        assert workload.now == pytest.approx(8.0 + 0.1)


def test_a_cpu_warm_up_past_the_phases_end_times_no_step() -> None:
    """On a CPU in eager mode the first step pays nothing of its own: where it ran past the
    phase's end (a neighbour's load made steps 20x slower), the step after it would be as long
    again, so none runs, and the point has no rate."""
    workload = Timed(OomAt(), adam, step_s=4.0, first_s=4.0)
    point = _point(workload, 2.0, 3.0)
    assert point.fits
    assert point.samples_per_s is None
    assert len(workload.began) == 1
    assert point.seconds == pytest.approx(4.0)


def test_a_first_step_pays_a_cost_of_its_own_where_it_compiles_or_the_autotuner_times() -> None:
    defaults = StepSettings().settings
    on_gpu = defaults.model_copy(update={"device": "cuda"})
    autotuner = on_gpu.model_copy(
        update={"backends": on_gpu.backends.model_copy(update={"cudnn_benchmark": True})}
    )
    compiles = defaults.model_copy(
        update={"compile": defaults.compile.model_copy(update={"enabled": True})}
    )
    assert trials.one_off_warmup(StepSettings(autotuner))
    assert trials.one_off_warmup(StepSettings(compiles))
    assert not trials.one_off_warmup(StepSettings(on_gpu))  # no autotuner: a step
    assert not trials.one_off_warmup(StepSettings(defaults))  # the CPU, eager
