"""A step that raises only checkpointed (a block whose recompute differs from its forward, so
torch's non-reentrant checkpoint raises ``CheckpointError``): where the model fits without
checkpointing, checkpointing is not kept and the tune goes on; where it does not fit, the
does-not-fit error says checkpointing was tried and what it raised. An error the plain model
raises too is the user's, and ours and Ctrl-C go on, as they did. On real torch on the CPU,
and through the simulated seam where the other checkpointing tests run."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import pytest
import torch
from torch import nn

from tests.probe.fake_trials import recorded, tune_on, tune_ticking
from tests.probe.test_checkpointing import _growing  # fits 480 checkpointed: it would be kept
from torch_autotune.errors import (
    EXIT_DOES_NOT_FIT,
    DoesNotFitError,
    ProbeError,
    blame_user_code,
    raised_by_user_code,
    said_in_one_line,
)
from torch_autotune.probe.recompute import checkpointed_step_agrees
from torch_autotune.probe.search import Agreement
from torch_autotune.probe.simulated import SimulatedMachine, SimulatedTrials
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.workloads import Workload, resolve_workload
from torch_autotune.profile import Profile
from torch_autotune.settings import Source, torch_defaults

CPU = StepSettings(torch_defaults("cpu"))
H100 = recorded("h100-80gb-hbm3")
LAPTOP = recorded("cpu-laptop-linux")
RECOMPUTED = (
    "CheckpointError: torch.utils.checkpoint: Recomputed values for the following tensors have"
    " different metadata than during the forward pass"
)
"""What torch says where a recompute saves tensors of other shapes, as a note reads it."""


class Fickle(nn.Module):
    """A block that, called a second time in a step (checkpointing's recompute in backward)
    on a batch of at least ``from_batch``, doubles its input: the tensors its recompute saves
    are not the shape its forward saved. Called once a step, as without checkpointing, it is
    a plain layer."""

    def __init__(self, from_batch: int) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.from_batch = from_batch
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > 1 and len(x) >= self.from_batch:
            x = torch.cat([x, x])
        return torch.relu(self.linear(x))


class FickleTower(nn.Module):
    """Three ``Fickle`` blocks and a head; above ``fits_up_to`` the blocks' activations 'do not
    fit' (a MemoryError, as the CPU's allocator raises) unless they are checkpointed
    (checkpointing gives each block a forward of its own)."""

    def __init__(self, *, from_batch: int = 1, fits_up_to: int | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Fickle(from_batch) for _ in range(3))
        self.head = nn.Linear(16, 4)
        self.fits_up_to = fits_up_to

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:  # a new step
            block.calls = 0
        checkpointed = all("forward" in vars(block) for block in self.blocks)
        if self.fits_up_to is not None and len(x) > self.fits_up_to and not checkpointed:
            raise MemoryError("out of memory: every block's activations kept (simulated)")
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _workload(model: Any) -> Workload:
    """The mlp workload's step and loss on ``model`` (16 features in, 4 out)."""
    return dataclasses.replace(
        resolve_workload("mlp"),
        name="fickle",
        make_model=model,
        make_batch=lambda n: (torch.randn(n, 16), torch.randn(n, 4)),
        typical_batch=None,
        dataset=None,
        max_batch_size=None,
    )


def _tune_real(model: Any) -> Profile:
    """``tune()`` of ``model`` on this CPU, real steps on simulated time, one torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return tune_ticking(
            _workload(model),
            snapshot=LAPTOP,
            budget_s=30,
            max_batch_size=16,
            num_workers=0,
        )
    finally:
        torch.set_num_threads(threads)


# --- real torch: the check, the tune that fits, the tune that does not --------------------------


def test_the_check_says_what_the_checkpointed_step_raised() -> None:
    found = checkpointed_step_agrees(_workload(FickleTower), CPU, batch_size=4)
    assert not found.agrees
    assert found.raised == RECOMPUTED
    assert found.largest_difference == math.inf
    assert found.blocks == 3


def test_the_checks_plain_step_raises_the_models_own_error() -> None:
    """Raised without checkpointing too: the user's error, as it was, not a finding."""

    class Broken(FickleTower):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("the head expects 8 features")

    with pytest.raises(ValueError, match="the head expects 8 features") as raised:
        checkpointed_step_agrees(_workload(Broken), CPU, batch_size=4)
    assert raised_by_user_code(raised.value)


def _decision(profile: Profile) -> str:
    decision = profile.decision("activation_checkpointing")
    assert decision is not None
    assert decision.source is Source.MEASURED
    return decision.reason


@pytest.mark.parametrize(
    "from_batch", [1, 2], ids=["in-the-check", "in-its-own-trials-after-the-check-at-1"]
)
def test_on_real_torch_a_model_that_fits_keeps_checkpointing_off_and_says_why(
    from_batch: int,
) -> None:
    profile = _tune_real(functools.partial(FickleTower, from_batch=from_batch, fits_up_to=4))
    assert not profile.settings.activation_checkpointing
    assert profile.evidence is not None
    assert profile.evidence.max_batch_size == 4
    assert profile.settings.batch.batch_size == profile.evidence.batch_size <= 4
    assert _decision(profile) == f"off: not kept: the checkpointed step raised {RECOMPUTED}"


def test_on_real_torch_a_model_that_does_not_fit_says_what_checkpointing_raised() -> None:
    with pytest.raises(DoesNotFitError) as raised:
        _tune_real(functools.partial(FickleTower, fits_up_to=0))
    error = raised.value
    assert (error.batch_size, error.exit_code) == (1, EXIT_DOES_NOT_FIT)
    assert error.fact == (
        "the fickle workload does not train even at batch size 1 on cpu: it runs out of memory;"
        f" activation checkpointing was tried, and the checkpointed step raised {RECOMPUTED}"
    )
    assert str(error) == f"{error.fact}; use a smaller model or a larger device"


# --- through the simulated seam -----------------------------------------------------------------


def _decoder() -> Workload:
    """A tiny decoder as the simulated machine's workload (no DataLoader)."""
    from torch_autotune.probe.workloads import models
    from torch_autotune.probe.workloads.synthetic import SyntheticTokens

    tokens = SyntheticTokens(seq_len=32, vocab_size=64)
    return dataclasses.replace(
        resolve_workload("gpt2"),
        name="decoder",
        make_model=lambda: models.GPT(vocab_size=64, max_len=32, d_model=32, nhead=4, num_layers=3),
        make_batch=tokens.batch,
        dataset=None,
    )


def _checkpointed_steps_raise(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """Every step of a checkpointed runner of the simulated machine raises ``error``."""
    step = SimulatedTrials.__call__

    def raising(self: SimulatedTrials, batch_size: int) -> Any:
        if self.settings.settings.activation_checkpointing:
            raise error
        return step(self, batch_size)

    monkeypatch.setattr(SimulatedTrials, "__call__", raising)


def _theirs(error: BaseException) -> BaseException:
    blame_user_code(error)  # as the step marks what the model, its backward included, raises
    return error


def test_a_check_that_found_the_checkpointed_step_raising_keeps_it_off() -> None:
    machine = _growing(1.05)
    machine.recompute = Agreement(False, math.inf, 3, raised=RECOMPUTED)
    profile = tune_on(machine, _decoder(), H100, mode="balanced", budget_s=120)
    assert not profile.settings.activation_checkpointing
    assert profile.evidence is not None
    assert not any(r.variant == "checkpointed" for r in profile.evidence.throughput)
    assert _decision(profile) == f"off: not kept: the checkpointed step raised {RECOMPUTED}"


def test_checkpointed_trials_that_raise_keep_it_off_and_the_tune_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _checkpointed_steps_raise(monkeypatch, _theirs(RuntimeError("recompute differs\nmore")))
    profile = tune_on(_growing(1.05), _decoder(), H100, mode="balanced", budget_s=120)
    assert not profile.settings.activation_checkpointing
    assert profile.evidence is not None
    assert profile.evidence.batch_choice is not None
    assert profile.evidence.batch_choice.variant != "checkpointed"
    assert profile.settings.batch.batch_size == profile.evidence.batch_size <= 120
    assert _decision(profile) == (
        "off: not kept: the checkpointed step raised RuntimeError: recompute differs"
    )


def test_a_model_that_fits_only_checkpointed_where_it_raises_does_not_fit_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _checkpointed_steps_raise(monkeypatch, _theirs(RuntimeError("recompute differs")))
    machine = SimulatedMachine(limit=0, checkpointed_limit=12, leaves=1)
    with pytest.raises(DoesNotFitError) as raised:
        tune_on(machine, _decoder(), LAPTOP, mode="balanced", budget_s=60)
    error = raised.value
    assert (error.batch_size, error.exit_code) == (1, EXIT_DOES_NOT_FIT)
    assert error.fact == (
        "the decoder workload does not train even at batch size 1 on cpu: it runs out of memory;"
        " activation checkpointing was tried, and the checkpointed step raised RuntimeError:"
        " recompute differs"
    )


@pytest.mark.slow  # the FSDP2 estimate of the tiny decoder at three world sizes
def test_on_a_gpu_the_plan_follows_what_checkpointing_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _checkpointed_steps_raise(monkeypatch, _theirs(RuntimeError("recompute differs")))
    machine = SimulatedMachine(limit=0, checkpointed_limit=12, leaves=1)
    with pytest.raises(DoesNotFitError) as raised:
        tune_on(machine, _decoder(), H100, mode="balanced", budget_s=60)
    error = raised.value
    assert error.fact.endswith(
        "; activation checkpointing was tried, and the checkpointed step raised RuntimeError:"
        " recompute differs"
    )
    fact, *plan = str(error).splitlines()
    assert fact == f"{error.fact}."
    assert plan[0].startswith("Batch 1 needs about ")
    assert plan[1] == "What is left, each one step at batch 1:"
    assert any(line.startswith("  - sharded with FSDP2 over 2 GPUs: about ") for line in plan)


@pytest.mark.parametrize(
    "error",
    [KeyboardInterrupt(), ProbeError("rank 1 stopped")],
    ids=["ctrl-c", "ours"],
)
@pytest.mark.parametrize("limit", [120, 0], ids=["fits", "does-not-fit"])
def test_ctrl_c_and_our_errors_in_a_checkpointed_step_go_on(
    monkeypatch: pytest.MonkeyPatch, error: BaseException, limit: int
) -> None:
    _checkpointed_steps_raise(monkeypatch, error)
    machine = _growing(1.05)
    machine.limit = limit
    with pytest.raises(type(error)) as raised:
        tune_on(machine, _decoder(), LAPTOP if limit == 0 else H100, mode="balanced", budget_s=120)
    assert raised.value is error


def test_the_checks_plain_step_error_goes_on_as_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    """Raised before the check found anything: the plain model's own error, not checkpointing's."""
    theirs = _theirs(ValueError("the plain step raised"))

    def check(self: SimulatedTrials, batch_size: int) -> Agreement | None:
        raise theirs

    monkeypatch.setattr(SimulatedTrials, "recompute_check", check)
    with pytest.raises(ValueError, match="the plain step raised") as raised:
        tune_on(_growing(1.05), _decoder(), H100, mode="balanced", budget_s=120)
    assert raised.value is theirs


# --- the one line of an error --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (RuntimeError("first line.\nsecond line"), "RuntimeError: first line"),
        (RuntimeError("  \n"), "RuntimeError"),
        (ValueError("wait..."), "ValueError: wait..."),
        (ValueError("x" * 300), "ValueError: " + "x" * 200),
    ],
)
def test_an_error_in_one_line(error: BaseException, said: str) -> None:
    assert said_in_one_line(error) == said
