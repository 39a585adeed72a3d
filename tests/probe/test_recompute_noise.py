"""The recompute check measures its own noise floor (found on an H200: under bfloat16 autocast
attention's backward sums in no fixed order, and the plain step run twice from the same weights
differed by about the 1.3e-2 the check then refused a 1.1B decoder's checkpointing for). The
plain step runs twice, and what it differs by from itself widens the tolerance
(``search.tolerance``); a recompute that is really different is still refused; a deterministic
step (the CPU) measures no noise and is said as before; each step draws alike from Python's
generator; the host keeps one copy of the gradients. On real torch on the CPU, a backward made
to differ from run to run on purpose, and through the simulated seam for the texts."""

from __future__ import annotations

import math
import random
import weakref
from typing import Any

import pytest
import torch

from tests.probe.test_checkpointing import _balanced, _growing, _off_unmeasured, _tiny
from tests.probe.test_checkpointing_raises import _workload  # the mlp's step on 16 -> 4
from tests.probe.test_recompute_blocks import Layer, Tower
from torch_autotune.probe.checkpoint_phase import checked_text, disagrees
from torch_autotune.probe.recompute import checkpointed_blocks_agree, checkpointed_step_agrees
from torch_autotune.probe.search import NOISE_CEILING, NOISE_FACTOR, RTOL, Agreement, tolerance
from torch_autotune.probe.trials import StepSettings
from torch_autotune.settings import torch_defaults

CPU = StepSettings(torch_defaults("cpu"))


class _Jolted(torch.autograd.Function):  # type: ignore[misc]
    """The identity forward; in backward, the gradient perturbed by ``scale`` (relative) from a
    generator of the block's own, which ``torch.manual_seed`` does not reach: as a GPU kernel
    that sums with atomics, a backward that differs from run to run from the same inputs."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, generator: torch.Generator, scale: float) -> Any:
        ctx.generator, ctx.scale = generator, scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        drawn = torch.randn(grad.shape, generator=ctx.generator)
        return grad * (1 + ctx.scale * drawn), None, None


class Unsteady(Layer):
    """A block whose backward differs from run to run by about 1e-3 an element (about 1e-2
    relative at the largest difference of a gradient): its recompute is its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Jolted.apply(super().forward(x), self.generator, 1e-3)


class UnsteadyAndJittery(Unsteady):
    """As ``Unsteady``, and its linear's input scaled by a draw of Python's generator, which
    checkpointing does not replay: the recompute saves another draw than the forward did."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x * (1 + random.gauss(0, 0.1)))


class Scaled(Layer):
    """Its output scaled by a draw of Python's generator: nothing it saves for its backward
    holds the draw, so its recompute is its forward whatever it draws."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * (1 + random.gauss(0, 0.1))


class Counting(Layer):
    """A block that changes state: each call's output is 10% larger than the last's. The
    second plain step is its second call, so the plain step differs from itself, by as much
    as the recompute is wrong."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x) * (1 + 0.1 * self.calls)


def _fitting(kind: type[Layer]) -> Any:
    """The mlp's workload on three blocks of ``kind`` and a head, the plain step fitting."""
    return _workload(lambda: Tower(kind, fits_checkpointed_only=False))


# --- the tolerance ---------------------------------------------------------------------------


def test_the_tolerance_grows_with_the_noise_up_to_the_ceiling() -> None:
    assert tolerance(0.0) == RTOL
    assert tolerance(1e-4) == RTOL  # 4x that is less: never below RTOL
    assert tolerance(9.8e-3) == pytest.approx(NOISE_FACTOR * 9.8e-3)
    assert tolerance(NOISE_CEILING) == pytest.approx(NOISE_FACTOR * NOISE_CEILING)
    assert tolerance(0.08) == RTOL  # beyond the kernels' noise: the forward's state, not counted
    assert tolerance(math.inf) == RTOL
    assert tolerance(math.nan) == RTOL


# --- on real torch ---------------------------------------------------------------------------


def test_a_step_that_differs_from_run_to_run_agrees_checkpointed() -> None:
    """Before, one plain step against the checkpointed one: 1e-2 apart, refused at 1e-3."""
    torch.manual_seed(0)
    found = checkpointed_step_agrees(_fitting(Unsteady), CPU, 4)
    assert found.agrees
    assert found.largest_difference > RTOL  # the old check refused it
    assert 0 < found.noise <= NOISE_CEILING
    assert found.largest_difference <= NOISE_FACTOR * found.noise
    assert (found.blocks, found.kinds, found.raised) == (3, 0, None)


def test_a_block_that_differs_from_run_to_run_agrees_recomputed_alone() -> None:
    torch.manual_seed(0)
    found = checkpointed_blocks_agree(_workload(lambda: Tower(Unsteady)), CPU, 4)
    assert found is not None
    assert found.agrees
    assert found.largest_difference > RTOL
    assert 0 < found.noise <= NOISE_CEILING
    assert (found.blocks, found.kinds) == (3, 1)


def test_a_recompute_that_is_different_is_refused_though_the_step_is_noisy() -> None:
    """Python's generator is seeded alike for each plain step (each draws the same), not for
    the recompute: the noise floor is the backward's, and the recompute's other draw is 0.1."""
    torch.manual_seed(0)
    found = checkpointed_step_agrees(_fitting(UnsteadyAndJittery), CPU, 4)
    assert 0 < found.noise <= NOISE_CEILING
    assert not found.agrees
    assert found.largest_difference > tolerance(found.noise) > RTOL
    assert disagrees(found) == (
        "not used: a step with it differs from the plain step from the same weights by"
        f" {found.largest_difference:.1e} (loss or a gradient, relative), more than"
        f" {tolerance(found.noise):.1e} (4x the {found.noise:.1e} by which the plain step run"
        " twice differed; at least 0.001): a checkpointed block's forward depends on more than"
        " its inputs (state it changes, randomness not from torch's generators)"
    )


def test_python_draws_are_seeded_alike_for_each_step() -> None:
    """Before, each step drew anew from Python's generator: the checkpointed step's forward
    drew other values than the plain one's, and a block whose recompute is its forward was
    refused (by what the plain step run twice would differ by too)."""
    found = checkpointed_step_agrees(_fitting(Scaled), CPU, 4)
    assert found.agrees
    assert (found.largest_difference, found.noise) == (0.0, 0.0)
    state = random.getstate()
    checkpointed_step_agrees(_fitting(Scaled), CPU, 4)
    assert random.getstate() == state  # the caller's stream goes on as it was


@pytest.mark.parametrize("alone", [False, True])
def test_a_block_that_changes_state_is_refused_though_the_plain_step_differs_too(
    alone: bool,
) -> None:
    """The plain step run twice differs by the state's change (its second call), more than
    kernels' noise reaches: it widens nothing, where 4x it would let the recompute through."""
    torch.manual_seed(0)
    if alone:
        found = checkpointed_blocks_agree(_workload(lambda: Tower(Counting)), CPU, 4)
    else:
        found = checkpointed_step_agrees(_fitting(Counting), CPU, 4)
    assert found is not None
    assert found.noise > NOISE_CEILING
    assert found.largest_difference <= NOISE_FACTOR * found.noise  # let through, uncapped
    assert not found.agrees
    twice = "the plain block run twice" if alone else "the plain step run twice"
    assert (
        f"{twice} on the same inputs" if alone else f"{twice} from the same weights and batch"
    ) + f" differed by {found.noise:.1e}" in disagrees(found)


class Toggling(Layer):
    """A block that changes state: every second call's output is 1.5x the others'. Its
    recompute (the third call, in backward) saves what its first call saved, and the scale its
    forward multiplied by stays in the graph: the recompute matches the first plain call
    exactly, while training without it (each step one call) is another computation."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x) * (1 + 0.5 * (self.calls % 2))


@pytest.mark.parametrize("alone", [False, True])
def test_a_block_whose_plain_run_twice_differs_is_refused_though_its_recompute_matches(
    alone: bool,
) -> None:
    """Before, the recompute was compared with the first plain call alone: 0.0 apart, kept,
    though the plain run twice differed by 0.5 (the ceiling 0.05) and training checkpointed
    then diverged from training without it."""
    torch.manual_seed(0)
    if alone:
        found = checkpointed_blocks_agree(_workload(lambda: Tower(Toggling)), CPU, 4)
    else:
        found = checkpointed_step_agrees(_fitting(Toggling), CPU, 4)
    assert found is not None
    assert found.largest_difference <= RTOL  # what the recompute was compared with: the same
    assert found.noise > NOISE_CEILING
    assert not found.agrees
    plain = (
        "the plain block run twice on the same inputs differed by 5.0e-01 (an output"
        if alone
        else f"the plain step run twice from the same weights and batch differed by"
        f" {found.noise:.1e} (loss"
    )
    assert disagrees(found) == (
        f"not used: {plain} or a gradient, relative), more than the 0.05 kernels' noise is taken"
        " to reach: a checkpointed block's forward depends on more than its inputs (state it"
        " changes, randomness not from torch's generators), and a recompute runs it once more,"
        " so the step with it cannot be the step without it"
    )


def test_a_refusal_for_the_plain_steps_own_difference_keeps_checkpointing_off() -> None:
    reason = _off_unmeasured(Agreement(False, 0.0, 4, noise=0.5))
    assert reason.startswith(
        "off: not used: the plain step run twice from the same weights and batch differed by"
        " 5.0e-01 (loss or a gradient, relative), more than the 0.05 kernels' noise"
    )
    shapes = disagrees(Agreement(False, 0.0, 4, kinds=1, noise=math.inf))
    assert shapes.startswith(
        "not used: the plain block run twice on the same inputs differed without bound"
        " (tensors of another shape or number), more than the 0.05 kernels' noise"
    )


@pytest.mark.parametrize("key", ["gpt2", "llama-1b"])
def test_a_deterministic_step_measures_no_noise(key: str) -> None:
    """On the CPU the plain step run twice is the same to the bit: nothing widens, and the
    texts say what they said."""
    step = checkpointed_step_agrees(_tiny(key), CPU, 4)
    blocks = checkpointed_blocks_agree(_tiny(key), CPU, 4)
    assert blocks is not None
    assert (step.agrees, step.noise, blocks.agrees, blocks.noise) == (True, 0.0, True, 0.0)
    assert checked_text(step, 4) == (
        "its recomputed step matched the plain one at batch 4 (loss and gradients within"
        f" {step.largest_difference:.1e}, relative)"
    )


def test_the_host_holds_one_copy_of_the_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first plain step's loss and gradients are kept on the host; the second's and the
    checkpointed step's are compared with them one tensor at a time (before: a second full
    copy, 8.8 GB for a 1.1B model's two). Counted: the copies ``.cpu()`` made alive at once."""
    alive: list[weakref.ref[torch.Tensor]] = []
    most = [0]
    cpu = torch.Tensor.cpu

    def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        copy = cpu(tensor, *args, **kwargs)
        alive.append(weakref.ref(copy))
        most[0] = max(most[0], sum(1 for kept in alive if kept() is not None))
        return copy

    monkeypatch.setattr(torch.Tensor, "cpu", counted)
    workload = _fitting(Layer)
    tensors = 1 + sum(1 for p in workload.make_model().parameters() if p.requires_grad)
    found = checkpointed_step_agrees(workload, CPU, 4)
    assert found.agrees
    assert most[0] == tensors + 1  # the plain step's, and one of the step compared


# --- the texts ---------------------------------------------------------------------------------


def test_an_agreement_within_the_noise_says_the_noise() -> None:
    machine = _growing(1.05)
    machine.recompute = Agreement(True, 1.1e-2, 4, noise=9.8e-3)
    decision = _balanced(machine).decision("activation_checkpointing")
    assert decision is not None
    assert decision.reason.startswith(
        "on: its recomputed step matched the plain one at batch 1 (loss and gradients within"
        " 1.1e-02, relative, where the plain step run twice differed by 9.8e-03); measured"
        " faster: "
    )
    alone = Agreement(True, 1.1e-2, 3, kinds=2, noise=9.8e-3)
    assert checked_text(alone, 2) == (
        "its recomputed blocks matched their plain forward and backward (one block of each of"
        " its 2 kinds trained alone on the inputs it got in a step at batch 2: outputs and"
        " gradients within 1.1e-02, relative, where the plain blocks run twice differed by"
        " 9.8e-03; the whole plain step ran out of memory, or took more than --memory-limit,"
        " in the check)"
    )


def test_a_refusal_says_the_tolerance_it_held_to_and_why() -> None:
    reason = _off_unmeasured(Agreement(False, 0.13, 4, noise=9.8e-3))
    assert reason.startswith(
        "off: not used: a step with it differs from the plain step from the same weights by"
        " 1.3e-01 (loss or a gradient, relative), more than 3.9e-02 (4x the 9.8e-03 by which"
        " the plain step run twice differed; at least 0.001): a checkpointed block's forward"
        " depends on more than its inputs"
    )
    quiet = disagrees(Agreement(False, 2e-3, 4, noise=1e-4))
    assert "more than 0.001 (the plain step run twice differed by 1.0e-04; 4x that is less" in (
        quiet
    )
    alone = disagrees(Agreement(False, 0.2, 3, kinds=1, noise=0.02))
    assert alone == (
        "not used: a block recomputed differs from its plain forward and backward (trained"
        " alone: one block) by 2.0e-01 (an output or a gradient, relative), more than 8.0e-02"
        " (4x the 2.0e-02 by which the plain block run twice differed; at least 0.001): a"
        " checkpointed block's forward depends on more than its inputs (state it changes,"
        " randomness not from torch's generators)"
    )
