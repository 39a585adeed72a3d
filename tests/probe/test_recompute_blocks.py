"""Where the plain step does not fit (the model trains only checkpointed), the recompute is still
checked before it is kept: one block of each kind alone, plain then recomputed, on the inputs it
got in a step (``probe.recompute.checkpointed_blocks_agree``). A block that is not its recompute
(randomness of its own, a second call that differs) ends the tune as a model that does not fit,
saying so, rather than training with it. On real torch on the CPU (built-ins, users' models, a
Hugging Face model's own layers) and through the simulated seam."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.probe.fake_trials import recorded, tune_on
from tests.probe.test_checkpointing import _simulated_token_workload, _tiny
from tests.probe.test_checkpointing_raises import _workload  # the mlp's step on 16 -> 4
from torch_autotune.errors import EXIT_DOES_NOT_FIT, DoesNotFitError
from torch_autotune.probe.recompute import checkpointed_blocks_agree
from torch_autotune.probe.search import RTOL, Agreement
from torch_autotune.probe.simulated import BLOCKS_AGREE, SimulatedMachine
from torch_autotune.probe.trials import StepSettings, TrialRunner
from torch_autotune.probe.workloads import resolve_workload
from torch_autotune.settings import torch_defaults
from torch_autotune.wrapping import (
    block_names,
    checkpoint_blocks,
    is_checkpointed,
    recompute_calls,
)

CPU = StepSettings(torch_defaults("cpu"))
LAPTOP = recorded("cpu-laptop-linux")


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.norm(self.linear(x)))


class Jittery(Layer):
    """Noise from Python's own generator, which checkpointing does not replay, in what the
    block saves for its backward (its linear's input): the recompute saves another draw. (Its
    output scaled by a draw saves nothing of it: the check seeds Python's generator alike for
    each call, and such a block recomputes as it trains.)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x * (1 + random.gauss(0, 0.1)))


class Alternating(Layer):
    """Every second call doubles its input along the batch: the recompute, a second call of a
    checkpointed forward, saves tensors of another shape (torch's ``CheckpointError``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(torch.cat([x, x]) if self.calls % 2 == 0 else x)


class Tower(nn.Module):
    """Three blocks of ``kind`` and a head; with ``fits_checkpointed_only``, every block's
    activations kept at once 'do not fit' (a MemoryError, as the CPU's allocator raises), and
    with ``never_fits``, not even checkpointed."""

    def __init__(
        self,
        kind: type[nn.Module] = Layer,
        *,
        fits_checkpointed_only: bool = True,
        never_fits: bool = False,
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(kind() for _ in range(3))
        self.head = nn.Linear(16, 4)
        self.fits_checkpointed_only = fits_checkpointed_only
        self.never_fits = never_fits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        checkpointed = all(is_checkpointed(b) for b in self.blocks)
        if self.never_fits or (self.fits_checkpointed_only and not checkpointed):
            raise MemoryError("out of memory: every block's activations kept (simulated)")
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class _Decoder(Layer):
    pass


class TwoKinds(nn.Module):
    """An encoder's layers, then a decoder's: two kinds of block, both named."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.ModuleList(Layer() for _ in range(2))
        self.decoder = nn.ModuleList(_Decoder() for _ in range(2))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in [*self.encoder, *self.decoder]:
            x = block(x)
        return self.head(x)


# --- the check on real torch ---------------------------------------------------------------------


@pytest.mark.parametrize("key", ["gpt2", "llama-1b"])
def test_the_built_ins_blocks_recompute_as_they_train(key: str) -> None:
    found = checkpointed_blocks_agree(_tiny(key), CPU, 4)
    assert found is not None
    assert found.agrees
    assert found.largest_difference <= RTOL
    assert (found.blocks, found.kinds) == (3, 1)  # three layers wrapped, one of them checked


def test_each_kind_of_block_named_is_checked() -> None:
    named = torch_defaults("cpu").model_copy(
        update={"blocks": ",".join(block_names([Layer, _Decoder]))}
    )
    found = checkpointed_blocks_agree(_workload(TwoKinds), StepSettings(named), 4)
    assert found is not None
    assert found.agrees
    assert (found.blocks, found.kinds) == (4, 2)


def test_a_block_with_randomness_of_its_own_differs() -> None:
    found = checkpointed_blocks_agree(_workload(lambda: Tower(Jittery)), CPU, 4)
    assert found is not None
    assert not found.agrees
    assert found.largest_difference > RTOL
    assert found.raised is None


def test_a_block_whose_recompute_raises_says_what_it_raised() -> None:
    found = checkpointed_blocks_agree(_workload(lambda: Tower(Alternating)), CPU, 4)
    assert found is not None
    assert not found.agrees
    assert found.raised is not None
    assert found.raised.startswith("CheckpointError: torch.utils.checkpoint: Recomputed values")


def test_where_the_plain_step_runs_out_of_memory_the_runner_checks_the_blocks() -> None:
    runner = TrialRunner(_workload(Tower), CPU)
    found = runner.recompute_check(4)
    assert found == Agreement(True, 0.0, 3, kinds=1)
    never = TrialRunner(_workload(lambda: Tower(never_fits=True)), CPU)
    assert never.recompute_check(4) is None  # out of memory either way: not checked


class _Wide(nn.Module):
    """A block that keeps 16 MiB a sample for its backward (a square of a wide tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = self.linear(x).unsqueeze(-1) * torch.ones(1, 1, 1 << 18)
        return x + wide.square().mean(-1)


class _WideTower(Tower):
    def __init__(self) -> None:
        super().__init__(_Wide, fits_checkpointed_only=False)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")
def test_where_the_plain_step_takes_more_than_the_limit_on_the_cpu_the_blocks_are_checked() -> None:
    """On the CPU nothing raises past --memory-limit: the check of the whole step took about
    460 MiB beyond what the process held, one block alone about 320; under 0.38 GiB the
    runner checks the blocks (it compared the whole plain step, over the cap)."""
    capped = StepSettings(torch_defaults("cpu"), memory_limit_bytes=int(0.38 * (1 << 30)))
    found = TrialRunner(_workload(_WideTower), capped).recompute_check(4)
    assert found is not None
    assert (found.agrees, found.kinds) == (True, 1)
    assert TrialRunner(_workload(_WideTower), CPU).recompute_check(4) == Agreement(True, 0.0, 3)


def test_the_check_counts_what_its_steps_take_beyond_its_model_as_a_search_trial_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check builds a model of its own: its weights were counted against --memory-limit
    (the high-water mark was reset before the model was built), which a search trial's growth
    beyond the model it holds is not. The mark is now reset once the model exists."""
    from torch_autotune.probe import trials

    said: list[str] = []
    workload = _workload(_WideTower)
    make = workload.make_model

    def built() -> nn.Module:
        said.append("built")
        return make()

    def reset(_torch: object, _device: str) -> int:
        said.append("reset")
        return 1 << 20

    monkeypatch.setattr(trials, "held_now", reset)
    monkeypatch.setattr(trials, "grown_since", lambda _torch, _device, _held: 0)
    capped = StepSettings(torch_defaults("cpu"), memory_limit_bytes=1 << 30)
    runner = TrialRunner(dataclasses.replace(workload, make_model=built), capped)
    assert runner.recompute_check(1) == Agreement(True, 0.0, 3)
    assert said[:2] == ["built", "reset"]


def test_a_hugging_face_models_own_layers_are_checked_with_its_switch_restored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("transformers")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # transformers asks
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    from tests.probe.test_huggingface import gpt2, token_rows

    workload = resolve_workload(None, objects={"model": gpt2(), "dataset": token_rows()})
    found = checkpointed_blocks_agree(workload, CPU, 4)
    assert found is not None
    assert found.agrees
    assert (found.blocks, found.kinds) == (1, 1)  # its own switch, one kind of layer
    model = workload.make_model()
    checkpoint_blocks(model)
    layers = recompute_calls(model)
    assert layers
    block, plain, _ = layers[0]
    plain(torch.randn(2, 8, model.config.n_embd))
    assert block.gradient_checkpointing is True  # switched off for the plain call only


# --- what the tune does with it ------------------------------------------------------------------


def _fits_only_checkpointed(recompute_blocks: Agreement | None) -> SimulatedMachine:
    machine = SimulatedMachine(limit=0, checkpointed_limit=12, leaves=1)
    machine.recompute_blocks = recompute_blocks
    return machine


def test_a_model_that_fits_only_checkpointed_whose_blocks_differ_does_not_fit() -> None:
    machine = _fits_only_checkpointed(Agreement(False, 0.25, 3, kinds=2))
    with pytest.raises(DoesNotFitError) as raised:
        tune_on(machine, _simulated_token_workload(), LAPTOP, mode="balanced", budget_s=60)
    error = raised.value
    assert (error.batch_size, error.exit_code) == (1, EXIT_DOES_NOT_FIT)
    assert error.fact == (
        "the decoder workload does not train even at batch size 1 on cpu: it runs out of memory;"
        " activation checkpointing was tried, and a block recomputed differs from its plain"
        " forward and backward (trained alone: one block of each of its 2 kinds) by 2.5e-01 (an"
        " output or a gradient, relative), more than 0.001: a checkpointed block's forward"
        " depends on more than its inputs (state it changes, randomness not from torch's"
        " generators)"
    )


def test_a_model_that_fits_only_checkpointed_whose_block_raises_does_not_fit() -> None:
    raised_text = "CheckpointError: recomputed values differ"
    machine = _fits_only_checkpointed(Agreement(False, math.inf, 3, raised=raised_text, kinds=1))
    with pytest.raises(DoesNotFitError) as raised:
        tune_on(machine, _simulated_token_workload(), LAPTOP, mode="balanced", budget_s=60)
    assert raised.value.fact.endswith(
        "; activation checkpointing was tried, and a checkpointed block, trained alone, raised"
        " CheckpointError: recomputed values differ"
    )


def test_a_model_that_fits_only_checkpointed_and_cannot_be_checked_says_so() -> None:
    profile = tune_on(
        _fits_only_checkpointed(None),
        _simulated_token_workload(),
        LAPTOP,
        mode="balanced",
        budget_s=60,
    )
    decision = profile.decision("activation_checkpointing")
    assert decision is not None
    assert profile.settings.activation_checkpointing
    assert decision.reason.endswith(
        "; its recomputed step was not checked (the plain step at batch 1 ran out of memory or"
        " took more than --memory-limit, and no block could be trained alone)"
    )


@pytest.mark.slow  # real tune() on the CPU: seconds
def test_on_real_torch_a_model_that_needs_checkpointing_with_a_jittery_block_does_not_fit() -> None:
    from torch_autotune.api import tune

    model = {
        "model": lambda: Tower(Jittery),
        "optimizer": lambda params: torch.optim.AdamW(params, lr=1e-3),
        "example_batch": (torch.randn(4, 16), torch.randn(4, 4)),
    }
    with pytest.raises(DoesNotFitError) as raised:
        tune(model, snapshot=LAPTOP, budget_s=15, max_batch_size=16)
    assert "activation checkpointing was tried, and a block recomputed differs" in (
        raised.value.fact
    )


@pytest.mark.slow  # real tune() on the CPU: seconds
def test_on_real_torch_a_model_needing_checkpointing_with_a_stateful_block_does_not_fit() -> None:
    """Its block's recompute matches its first plain call to the bit, but its plain call run
    twice differs by 0.5: before, checkpointing was kept, and training with it diverged."""
    from tests.probe.test_recompute_noise import Toggling
    from torch_autotune.api import tune

    model = {
        "model": lambda: Tower(Toggling),
        "optimizer": lambda params: torch.optim.AdamW(params, lr=1e-3),
        "example_batch": (torch.randn(4, 16), torch.randn(4, 4)),
    }
    with pytest.raises(DoesNotFitError) as raised:
        tune(model, snapshot=LAPTOP, budget_s=15, max_batch_size=16)
    assert raised.value.exit_code == EXIT_DOES_NOT_FIT
    assert (
        "activation checkpointing was tried, and the plain block run twice on the same inputs"
        " differed by 5.0e-01 (an output or a gradient, relative), more than the 0.05 kernels'"
        " noise is taken to reach"
    ) in raised.value.fact


def test_a_model_that_came_checkpointed_is_still_held_to_its_blocks_check() -> None:
    """Its blocks were wrapped before (the check wrapped none), but alone, plain against
    recomputed, they were compared all the same: a difference is not 'checkpointed already'."""
    from torch_autotune.errors import RecomputeDiffersError
    from torch_autotune.probe.checkpoint_phase import ALREADY, _refusal, checked_on

    class Base:
        def recompute_check(self, batch_size: int) -> Agreement:
            return Agreement(False, 0.25, 0, kinds=1)

    assert _refusal(Agreement(True, 0.0, 0)) == ALREADY  # the whole step, twice the same
    with pytest.raises(RecomputeDiffersError, match="a block recomputed differs"):
        checked_on(Base(), 1, lambda _phase, _what: None)  # type: ignore[arg-type]


def _logged_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each recompute check said in the machine's log, in order with its trials."""
    from torch_autotune.probe.simulated import SimulatedTrials

    checked = SimulatedTrials.recompute_check

    def logged(runner: SimulatedTrials, batch_size: int) -> Agreement | None:
        runner.machine.log.append(f"check {batch_size}")
        return checked(runner, batch_size)

    monkeypatch.setattr(SimulatedTrials, "recompute_check", logged)


def test_where_it_fits_only_checkpointed_the_recompute_is_checked_before_the_search_grows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, the check ran after the whole checkpointed search (batches 1 to 12 trained with
    a recompute it then refused); now right after the smallest batch's trial, and no other
    size runs once it refuses."""
    _logged_checks(monkeypatch)
    machine = _fits_only_checkpointed(Agreement(False, 0.25, 3, kinds=1))
    with pytest.raises(DoesNotFitError, match="a block recomputed differs"):
        tune_on(machine, _simulated_token_workload(), LAPTOP, mode="balanced", budget_s=60)
    assert machine.log == ["trial 1", "trial 1", "check 1"]  # without it, then the probe again
    agreeing = _fits_only_checkpointed(BLOCKS_AGREE)
    tune_on(agreeing, _simulated_token_workload(), LAPTOP, mode="balanced", budget_s=60)
    assert agreeing.log[:4] == ["trial 1", "trial 1", "check 1", "trial 8"]
    assert agreeing.log.count("check 1") == 1


def test_the_check_counts_in_the_searchs_time_and_is_said_where_it_does_not_fit() -> None:
    """Its model of its own (30 s to build here) is the search's time, where before it ran
    outside every phase; where the budget left cannot hold it, the run says so (exit 6)."""
    from torch_autotune.errors import EXIT_PROBE, ProbeError

    machine = dataclasses.replace(_fits_only_checkpointed(BLOCKS_AGREE), build_s=30.0)
    profile = tune_on(machine, _simulated_token_workload(), LAPTOP, mode="balanced", budget_s=300)
    assert profile.evidence is not None
    search = [p.seconds for p in profile.evidence.phases if p.name == "search"]
    assert search
    assert search[-1] >= 30.0  # the check's model of its own
    slow = dataclasses.replace(_fits_only_checkpointed(BLOCKS_AGREE), fixed_s=8.0)  # 32 s
    with pytest.raises(ProbeError) as raised:
        tune_on(slow, _simulated_token_workload(), LAPTOP, mode="balanced", budget_s=60)
    assert raised.value.exit_code == EXIT_PROBE
    assert "ran out before activation checkpointing's recompute could be checked" in str(
        raised.value
    )
