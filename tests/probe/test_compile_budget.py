"""Compile's activation memory budget (issue 21, point 1's cheaper alternative): measured on the
simulated H100 where compile is kept and memory limits the compiled batch, kept only where the
larger batch it allows trains faster; on real torch on the CPU, the budget makes the compiled
graphs save less for the same loss and gradients, and a model compiled without it first is
compiled again under it."""

from __future__ import annotations

import io
import re
import shutil
from typing import Any

import pytest
import torch
from rich.console import Console
from torch import nn

from tests.probe.fake_trials import recorded, tune_on
from tests.probe.test_checkpointing import _simulated_token_workload
from tests.rules.helpers import context, run
from torch_autotune import api
from torch_autotune.apply import compile_model
from torch_autotune.bench import ArmFailed, TrainConfig
from torch_autotune.compose import bench_plan
from torch_autotune.probe.checkpoint_phase import why_not_measured
from torch_autotune.probe.compile_budget import BUDGETED, MEMORY_BUDGET
from torch_autotune.probe.recompute_phase import COMPILE_KEPT, COMPILE_UNMEASURED
from torch_autotune.probe.simulated import SimulatedMachine
from torch_autotune.profile import Profile, ThroughputRecord
from torch_autotune.render import render_run
from torch_autotune.rules.compile import compile_settings
from torch_autotune.rules.context import Finding, Measurements
from torch_autotune.rules.precision import precision
from torch_autotune.settings import Settings, Source

H100 = recorded("h100-80gb-hbm3")
LIMIT = 120  # the largest batch eager; compiled fits 100, under the budget 360


def _machine(factor: float, *, fixed_s: float = 0.05) -> SimulatedMachine:
    """A decoder on the H100 whose throughput still grows at its memory limit (a fixed cost a
    step that a larger batch spreads); compiled under the budget it fits 360 at ``factor``
    times the compiled step."""
    return SimulatedMachine(
        limit=LIMIT,
        compiled_limit=100,
        budgeted_limit=360,
        budget_factor=factor,
        compile_s=20.0,
        compiled_speedup=1.3,
        fixed_s=fixed_s,
        per_sample_s=0.0005,
        first_s=1.0,
        new_shape_s=0.05,
        autotune_s=0.0,
        per_sample_bytes=600 << 20,
        memory_bytes=(2 << 30) + (600 << 20) * (LIMIT + 1),
        leaves=1,
    )


def _speed(machine: SimulatedMachine, budget_s: float = 300) -> Profile:
    return tune_on(machine, _simulated_token_workload(), H100, mode="speed", budget_s=budget_s)


def test_the_budget_is_kept_where_the_larger_batch_it_allows_is_faster() -> None:
    machine = _machine(1.05)
    profile = _speed(machine)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.batch_choice is not None
    assert profile.settings.compile.enabled
    assert profile.settings.compile.memory_budget == MEMORY_BUDGET
    assert evidence.batch_choice.variant == BUDGETED
    batch = profile.settings.batch.batch_size
    assert batch is not None
    assert batch > 100
    assert machine.budgets_compiled == {MEMORY_BUDGET}  # compiled again, under the budget
    decision = profile.decision("compile.memory_budget")
    assert decision is not None
    assert (decision.value, decision.rule, decision.source) == (0.5, "L2", Source.MEASURED)
    assert decision.reason.startswith("0.5: measured faster: ")
    assert "samples/s memory-budgeted at batch " in decision.reason
    assert re.search(r"against [\d,]+ compiled at batch \d+\)", decision.reason)
    assert "compile again" not in decision.reason  # only the probe compiles twice
    assert "pays off" not in decision.reason  # training compiles once, with it or without
    assert decision.reason.endswith("the largest batch was 360 with it and 100 without")
    budgeted = {v.name: v.settings for v in evidence.variants}[BUDGETED]
    assert budgeted["compile_memory_budget"] == "0.5"
    assert batch in evidence.ran(budgeted)  # the batch handed out ran with the budget
    checkpointing = profile.decision("activation_checkpointing")
    assert checkpointing is not None
    assert checkpointing.value is False
    assert checkpointing.reason == f"off: {COMPILE_KEPT}"


def test_a_budget_that_costs_more_than_its_batch_gains_is_measured_and_dropped() -> None:
    profile = _speed(_machine(1.8))
    evidence = profile.evidence
    assert evidence is not None
    assert profile.settings.compile.enabled
    assert profile.settings.compile.memory_budget is None
    assert any(r.variant == BUDGETED for r in evidence.throughput)  # it was measured
    decision = profile.decision("compile.memory_budget")
    assert decision is not None
    assert decision.source is Source.MEASURED
    assert decision.reason.startswith("default: measured 0.")
    assert decision.reason.endswith("compiled at batch 88), not faster beyond the 3% noise")
    batch = profile.settings.batch.batch_size
    assert batch is not None
    assert batch <= 100


def test_the_budget_is_not_measured_where_throughput_stopped_growing() -> None:
    machine = _machine(1.05, fixed_s=0.0)  # no fixed cost: the rate is flat in the batch
    profile = _speed(machine)
    assert profile.settings.compile.memory_budget is None
    assert machine.budgets_compiled == set()
    decision = profile.decision("compile.memory_budget")
    assert decision is not None
    assert decision.source is Source.INFERRED
    assert decision.reason.startswith("default: not measured: ")


def test_without_the_time_for_a_second_compile_the_budget_is_not_measured_and_says_so() -> None:
    machine = _machine(1.05)
    profile = _speed(machine, budget_s=40)
    assert profile.settings.compile.enabled  # the first compile was measured and kept
    assert machine.budgets_compiled == set()
    decision = profile.decision("compile.memory_budget")
    assert decision is not None
    assert re.fullmatch(
        r"default: not measured: compile's memory budget of 0\.5 was predicted to take "
        r"about \d+ s to compile again and \d+ s to measure, and \d+ s were left for it; give it"
        r" more time with --budget",
        decision.reason,
    ), decision.reason


def test_the_summary_shows_the_budgets_row_and_its_own_series() -> None:
    profile = _speed(_machine(1.05))
    out = io.StringIO()
    render_run(profile, Console(file=out, width=400, color_system=None), saved=None)
    text = out.getvalue()
    row = re.search(r"^activation memory budget\s+(.*)$", text, re.MULTILINE)
    assert row is not None
    assert row.group(1).startswith("0.5: measured faster: ")
    evidence = profile.evidence
    assert evidence is not None
    budgeted = [r for r in evidence.throughput if r.variant == BUDGETED]
    assert budgeted
    for record in budgeted:
        line = rf"^\s+{record.batch_size}\s+{record.samples_per_s:.1f}\s+\d+%\s+{BUDGETED}"
        assert re.search(line, text, re.MULTILINE), (record, text)


def test_the_bench_turns_the_budget_off_at_the_batch_that_ran_compiled_without_it() -> None:
    profile = _speed(_machine(1.05))
    evidence = profile.evidence
    assert evidence is not None
    plan, _ = bench_plan(profile, None, has_dataset=False, workload="decoder")
    arms = {name: c for c, names in zip(plan.configs, plan.names, strict=True) for name in names}
    off = arms["tuned - compile_memory_budget"]
    assert "compile.memory_budget" not in off.settings
    assert off.compile_mode == "default"
    compiled = [r for r in evidence.throughput if r.variant == "compiled" and r.steady]
    assert off.batch_size == max(compiled, key=lambda r: r.samples_per_s).batch_size
    eager = arms["tuned - compile"]  # compile goes with its budget, to the eager batch
    assert eager.compile_mode is None
    assert "compile.memory_budget" not in eager.settings
    plain = [r for r in evidence.throughput if r.variant == "eager" and r.steady]
    assert eager.batch_size == max(plain, key=lambda r: r.samples_per_s).batch_size


def _compile_rules(machine: str, measured: Measurements | None = None) -> dict[str, Finding]:
    ctx = context(machine, precision)
    ctx.measurements = measured
    return run(ctx, compile_settings)


def test_the_rule_keeps_torchs_default_unless_measured_and_none_without_compile() -> None:
    found = _compile_rules("h100-80gb-hbm3")["compile.memory_budget"]
    assert (found.value, found.rule, found.source) == (None, "L2", Source.INFERRED)
    assert "set only where the probe measured" in found.reason
    off = _compile_rules("tesla-p100-pcie-16gb")
    assert off["compile.enabled"].value is False
    assert off["compile.memory_budget"].value is None
    assert "only compiled graphs read" in off["compile.memory_budget"].reason
    measured = Measurements(
        compile_enabled=True, memory_budget=0.5, memory_budget_reason="measured faster: 1.5x"
    )
    kept = _compile_rules("h100-80gb-hbm3", measured)
    budget = kept["compile.memory_budget"]
    assert (budget.value, budget.source) == (0.5, Source.MEASURED)
    assert budget.reason == "0.5: measured faster: 1.5x"


def test_a_budget_without_compile_is_refused_by_the_profile_invariants() -> None:
    from torch_autotune.invariants import settings_problems

    settings = Settings.model_validate({"compile": {"memory_budget": 0.5}})
    problems = settings_problems(settings, H100, "2.13.0")
    assert any(
        p.startswith("settings.compile.memory_budget: only compiled graphs") for p in problems
    )


def test_the_exports_say_where_the_budget_is_set() -> None:
    from tests.test_bench import measured
    from torch_autotune.integrations import tool_notes

    profile = measured("h100-80gb-hbm3")
    assert profile.settings.compile.enabled
    compile_ = profile.settings.compile.model_copy(update={"memory_budget": 0.5})
    on = profile.model_copy(
        update={"settings": profile.settings.model_copy(update={"compile": compile_})}
    )
    for tool in ("hf", "lightning", "accelerate"):
        said = [n for n in tool_notes(on, tool) if n.startswith("activation memory budget: 0.5")]
        assert len(said) == 1, (tool, tool_notes(on, tool))
        assert "torch._functorch.config.activation_memory_budget = 0.5" in said[0]
        assert not any("activation memory budget" in n for n in tool_notes(profile, tool))


# --- real torch on the CPU: what the budget does to a compiled model ---------------------------


class _Residual(nn.Module):
    """Matmuls and GELUs whose activations the compiled graph saves by default."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = nn.functional.gelu(layer(x)) + x
        return x


def _step(model: nn.Module, x: torch.Tensor) -> tuple[int, float, list[torch.Tensor]]:
    """One step: (the elements autograd saved for backward, the loss, the gradients)."""
    saved = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[0] += tensor.numel()
        return tensor

    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).square().mean()
        loss.backward()
    return saved[0], loss.item(), [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]


def _compiled(budget: float | None) -> Settings:
    return Settings.model_validate(
        {"compile": {"enabled": True, "mode": "default", "memory_budget": budget}}
    )


@pytest.mark.slow  # three Inductor compiles on the CPU: seconds
@pytest.mark.usefixtures("inductor_on_the_cpu")
@pytest.mark.skipif(shutil.which("c++") is None, reason="Inductor on the CPU needs a C++ compiler")
def test_on_real_torch_the_budget_saves_less_for_the_same_step() -> None:
    torch.manual_seed(0)
    model, x = _Residual(), torch.randn(256, 64)
    plain_saved, plain_loss, plain_grads = _step(compile_model(_compiled(None), model), x)
    saved, loss, grads = _step(compile_model(_compiled(0.0), model), x)  # after the plain one
    assert saved < plain_saved / 2  # recomputed, not served from the plain compile's cache
    assert loss == pytest.approx(plain_loss, rel=1e-5)
    for got, want in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    again, *_ = _step(compile_model(_compiled(None), model), x)
    assert again == plain_saved  # the budget stayed with its own compile
    assert torch._functorch.config.activation_memory_budget == 1.0  # torch's own, untouched


def _point(batch: int, rate: float, variant: str = "compiled") -> ThroughputRecord:
    return ThroughputRecord(
        batch_size=batch, samples_per_s=rate, relative_spread=0.01, steady=True, variant=variant
    )


@pytest.mark.parametrize(
    ("half", "measured"),
    [(650.0, True), (660.0, False), (400.0, True)],  # 674 at 136: +3.4%, +1.9%, +52% a doubling
)
def test_a_variant_that_recomputes_is_measured_only_where_the_last_doubling_gained(
    half: float, measured: bool
) -> None:
    best = _point(136, 674.0)
    points = [_point(32, 300.0), _point(64, half), best, _point(64, 900.0, "eager")]
    why = why_not_measured(best, "memory", [136, 64, 32], "a memory budget", points)
    assert (why is None) is measured
    if not measured:
        assert why == (
            "throughput grew 1.9% a doubling of the batch up to the largest (batch 64 to 136), "
            "within the 3% noise, so the larger batch a memory budget allows would not pay for "
            "its recompute"
        )


# --- the bench: the budget's arms and drops ---------------------------------------------------


def _arms_on(machine: SimulatedMachine, *, budget_slowdown: float = 1.0) -> Any:
    """The bench's ``measure`` on ``machine``: an arm's samples/s, or ArmFailed where its batch
    does not fit; ``budget_slowdown``: how many times slower a budgeted step is on the bench
    than the probe measured (3: the off arms of both compile and its budget win)."""

    def measure(config: TrainConfig, _seconds: float) -> float:
        compiled = config.compile_mode is not None
        budgeted = compiled and BUDGET in config.settings
        how = {"compiled": compiled, "budgeted": budgeted}
        if not machine.fits(config.batch_size, **how):
            raise ArmFailed(f"out of memory at batch {config.batch_size}")
        step = machine.step_s(config.batch_size, **how) * (budget_slowdown if budgeted else 1)
        return config.batch_size / step

    return measure


BUDGET = "compile.memory_budget"


def test_the_budgets_on_alone_arm_compiles_with_it() -> None:
    plan, _ = bench_plan(_speed(_machine(1.05)), None, has_dataset=False, workload="decoder")
    arms = {name: c for c, names in zip(plan.configs, plan.names, strict=True) for name in names}
    on = arms["baseline + compile_memory_budget"]
    assert on.settings.get(BUDGET) == 0.5
    assert on.compile_mode == "default"  # not a budget on an eager model, which reads none
    assert on.batch_size == plan.baseline.batch_size


def test_dropping_compile_and_its_budget_hands_out_the_eager_batch_that_ran() -> None:
    machine = _machine(1.05)
    profile = _speed(machine)
    evidence = profile.evidence
    assert evidence is not None
    benched = api.bench(
        profile,
        _simulated_token_workload(),
        measure=_arms_on(machine, budget_slowdown=3.0),
        seconds=0.01,
    )
    assert not benched.settings.compile.enabled
    assert benched.settings.compile.memory_budget is None
    eager = [r for r in evidence.throughput if r.variant == "eager" and r.steady]
    assert benched.settings.batch.batch_size == max(eager, key=lambda r: r.samples_per_s).batch_size
    assert benched.evidence is not None
    assert benched.evidence.bench is not None
    dropped = {s.setting for s in benched.evidence.bench.settings if s.outcome == "dropped"}
    assert {"compile", "compile_memory_budget"} <= dropped  # both, each measured slower
    budget = benched.decision(BUDGET)
    assert budget is not None
    assert budget.reason.startswith("only compiled graphs read it, and compile was dropped: ")
    batch = benched.decision("batch.batch_size")
    assert batch is not None
    assert batch.reason.startswith("compile was dropped, and this batch ran without it: ")
    assert benched.evidence is not None
    assert benched.evidence.bench is not None
    assert benched.evidence.bench.final is not None  # the profile as handed out ran


def test_an_arm_recorded_before_the_budget_existed_still_counts_for_the_batch() -> None:
    """A bench arm written before the setting existed has no 'compile_memory_budget' in its
    memory: it ran at torch's default, so its batch counts for a profile without a budget."""
    from torch_autotune.invariants import batch_problems
    from torch_autotune.knobs import train_settings

    machine = _machine(1.05)
    benched = api.bench(
        _speed(machine), _simulated_token_workload(), measure=_arms_on(machine), seconds=0.01
    )
    evidence = benched.evidence
    assert evidence is not None
    assert evidence.bench is not None
    (baseline,) = [arm for arm in evidence.bench.arms if "baseline" in arm.names]
    older = baseline.model_copy(
        update={
            "memory": {k: v for k, v in baseline.memory.items() if k != "compile_memory_budget"}
        }
    )
    only_the_bench = evidence.model_copy(  # its batch ran in the bench alone
        update={
            "search": (),
            "throughput": (),
            "fed": (),
            "bench": evidence.bench.model_copy(update={"arms": (older,)}),
        }
    )
    settings = train_settings(baseline.config, benched.settings)
    assert batch_problems(settings, only_the_bench) == []


def test_the_batch_a_budget_chose_is_said_to_have_run_compiled() -> None:
    profile = _speed(_machine(1.05))
    decision = profile.decision("batch.batch_size")
    assert decision is not None
    assert "eager" not in decision.reason, decision.reason
    assert profile.evidence is not None
    assert profile.evidence.batch_choice is not None
    assert profile.evidence.batch_choice.compiled


def test_a_torch_without_the_budget_is_not_tried_and_a_profile_with_one_is_refused() -> None:
    from torch_autotune.invariants import settings_problems

    software = H100.software.model_copy(update={"torch_version": "2.3.1+cu121"})
    older = H100.model_copy(update={"software": software})
    machine = _machine(1.05)
    profile = tune_on(machine, _simulated_token_workload(), older, mode="speed", budget_s=300)
    assert profile.settings.compile.enabled
    assert machine.budgets_compiled == set()
    decision = profile.decision(BUDGET)
    assert decision is not None
    assert decision.reason == (
        "default: not measured: this torch has no activation memory budget (torch 2.4 added it)"
    )
    budgeted = profile.settings.model_copy(
        update={"compile": profile.settings.compile.model_copy(update={"memory_budget": 0.5})}
    )
    assert settings_problems(budgeted, older, "2.3.1+cu121") == [
        "settings.compile.memory_budget: torch 2.4 added it, this is 2.3.1+cu121 (remove "
        "memory_budget)"
    ]


def test_where_compile_stays_on_unmeasured_neither_lever_is_measured() -> None:
    machine = _machine(1.05)
    profile = _speed(machine, budget_s=20)  # no time for a compile
    compiled = profile.decision("compile.enabled")
    assert compiled is not None
    assert compiled.value is True
    assert compiled.source is Source.INFERRED  # kept by the rules, not measured
    assert not profile.settings.activation_checkpointing
    checkpointing = profile.decision("activation_checkpointing")
    assert checkpointing is not None
    assert checkpointing.reason == f"off: {COMPILE_UNMEASURED}"
    assert profile.evidence is not None
    assert not any(r.variant == "checkpointed" for r in profile.evidence.throughput)


def test_a_compile_that_fails_under_the_budget_leaves_compile_as_it_was_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The partitioner's memory budget is a prototype in torch: where compiling under it
    raises, the tune goes on with the compiled model that ran, and says why."""
    from torch_autotune.probe.simulated import SimulatedTrials

    step = SimulatedTrials.__call__

    def failing(self: SimulatedTrials, batch_size: int) -> object:
        if self.budget is not None:
            raise RuntimeError("knapsack solver: symbolic size has no hint\nmore lines")
        return step(self, batch_size)

    monkeypatch.setattr(SimulatedTrials, "__call__", failing)
    profile = _speed(_machine(1.05))
    assert profile.settings.compile.enabled
    assert profile.settings.compile.memory_budget is None
    decision = profile.decision(BUDGET)
    assert decision is not None
    assert decision.reason == (
        "default: not kept: compiling under it failed (RuntimeError: knapsack solver: symbolic "
        "size has no hint); the model compiles without it, as the profile keeps it"
    )
    assert profile.evidence is not None
    assert profile.evidence.batch_choice is not None
    assert profile.evidence.batch_choice.variant == "compiled"


def test_the_summary_leaves_out_the_budget_where_nothing_compiles() -> None:
    from torch_autotune.probe.presets import preset

    profile = tune_on(preset("cpu-conv"), "conv", recorded("cpu-laptop-linux"))
    assert not profile.settings.compile.enabled
    out = io.StringIO()
    render_run(profile, Console(file=out, width=400, color_system=None), saved=None)
    text = out.getvalue()
    assert re.search(r"^compile\s+off\s*$", text, re.MULTILINE)
    assert "activation memory budget" not in text  # it reads nothing where nothing compiles
