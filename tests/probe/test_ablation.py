"""The bench's running half: interleaved rounds through the ``measure`` seam, failed arms, the
confirmation run, and the real training loop on the CPU."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
import torch

from tests.rules.helpers import snapshot
from tests.test_bench import measured
from torch_autotune import api
from torch_autotune.api import bench
from torch_autotune.bench import ArmFailed, TrainConfig, plan_arms, tuned_config
from torch_autotune.errors import ProbeError, raised_by_user_code
from torch_autotune.knobs import train_settings
from torch_autotune.probe.loop import TrainingLoop
from torch_autotune.probe.workloads import Workload, resolve_workload
from torch_autotune.profile import Profile, Source
from torch_autotune.rules.engine import build_profile


class SpeedModel:
    """A fake machine: each setting the arm shares with the profile multiplies its speed, and
    every call is logged. ``fail`` names configs that run out of memory."""

    def __init__(
        self,
        tuned: TrainConfig,
        factors: dict[str, float],
        fail: tuple[TrainConfig, ...] = (),
    ) -> None:
        self.tuned = tuned
        self.factors = factors
        self.fail = fail
        self.calls: list[TrainConfig] = []

    def __call__(self, config: TrainConfig, seconds: float) -> float:
        self.calls.append(config)
        if config in self.fail:
            raise ArmFailed(f"out of memory (cuda) at {config.describe()}")
        rate = 1000.0
        for field, factor in self.factors.items():
            if getattr(config, field) == getattr(self.tuned, field):
                rate *= factor
        return rate


@pytest.fixture
def a100() -> Profile:
    return measured("a100-sxm4-80gb-8x")


def test_every_round_runs_every_arm_once_in_a_rotated_order(a100: Profile) -> None:
    model = SpeedModel(tuned_config(a100), {"precision": 2.0})
    plan = plan_arms(TrainConfig(), tuned_config(a100))
    result = bench(a100, "conv", rounds=3, seconds=0.1, measure=model)
    n = len(plan.configs)
    assert len(model.calls) == 3 * n
    rounds = [model.calls[i * n : (i + 1) * n] for i in range(3)]
    assert all(set(r) == set(plan.configs) for r in rounds)
    assert [r[0] for r in rounds] == list(plan.configs[:3])  # each round starts one later
    bench_evidence = result.evidence.bench  # type: ignore[union-attr]
    assert bench_evidence is not None
    assert [a.config for a in bench_evidence.arms] == list(plan.configs)
    assert all(len(a.samples_per_s) == 3 for a in bench_evidence.arms)


def test_a_slower_setting_is_dropped_and_the_rest_confirmed_against_the_baseline(
    a100: Profile,
) -> None:
    tuned = tuned_config(a100)
    model = SpeedModel(
        tuned,
        {"precision": 2.0, "batch_size": 1.4, "channels_last": 0.8, "fused_optimizer": 0.9},
    )
    result = bench(a100, "conv", rounds=5, seconds=0.1, measure=model)
    evidence = result.evidence.bench  # type: ignore[union-attr]
    assert evidence is not None
    dropped = sorted(s.setting for s in evidence.settings if s.outcome == "dropped")
    assert dropped == ["channels_last", "fused_optimizer"]
    assert result.settings.memory_format == "contiguous_format"
    assert result.settings.optimizer.fused is False
    # two settings dropped: the profile without both had not run, so it ran against the
    # baseline in rounds of its own, and it is faster than the baseline
    final = [a for a in evidence.arms if a.names == ("final",)]
    assert len(final) == 1
    assert final[0].config == tuned.model_copy(
        update={"channels_last": False, "fused_optimizer": False}
    )
    assert evidence.final is not None
    assert evidence.final.verdict == "faster"
    assert evidence.final.speedup == pytest.approx(2.0 * 1.4)
    assert not evidence.reverted
    decision = result.decision("optimizer.fused")
    assert decision is not None
    assert decision.source is Source.MEASURED
    assert "0.90x" in decision.reason


def test_where_every_setting_is_dropped_the_baseline_is_not_measured_against_itself(
    a100: Profile,
) -> None:
    """Every setting measured slower: what is left is the baseline's own config. The bench
    printed 'Without them: 1.00x the baseline (range 1.00-1.00: within noise)', the baseline's
    arm divided by itself; it now says what is left, and runs no arm for it."""
    from rich.console import Console

    from torch_autotune.plot import build_figure, render_charts
    from torch_autotune.plot.data import effect_rows
    from torch_autotune.render import bench_summary

    tuned = tuned_config(a100)
    plan = plan_arms(TrainConfig(), tuned)
    fields = ["precision", "batch_size", "compile_mode", "channels_last", "tf32"]
    fields += ["cudnn_benchmark", "fused_optimizer", "num_workers", "pin_memory", "cpu_threads"]
    model = SpeedModel(tuned, dict.fromkeys(fields, 0.9))
    result = bench(a100, "conv", rounds=3, seconds=0.1, measure=model)
    evidence = result.evidence.bench  # type: ignore[union-attr]
    assert evidence is not None
    assert {s.outcome for s in evidence.settings} == {"dropped"}
    assert len(model.calls) == 3 * len(plan.configs)  # no arm ran for what is left
    assert evidence.final is None
    assert evidence.final_is_baseline
    assert not evidence.reverted  # each drop is its own measurement (M1), not M2's revert
    decision = result.decision("batch.batch_size")
    assert decision is not None
    assert decision.rule == "M1"
    summary = bench_summary(evidence)
    assert "1.00x the baseline" not in summary
    assert "trains as the baseline does in every setting the bench ablated" in summary
    (after,) = [r for r in effect_rows(evidence) if r.arm == "after drops"]
    assert after.effect is None
    assert after.note == "the baseline itself"
    out = io.StringIO()
    render_charts(result, Console(file=out, width=120, color_system=None))
    (line,) = [line for line in out.getvalue().splitlines() if "after drops" in line]
    assert line.endswith("│ the baseline itself")
    bench_axes = next(ax for ax in build_figure(result).axes if ax.get_label() == "bench")
    (note,) = [t for t in bench_axes.texts if t.get_gid() == "whole profile: after drops"]
    assert note.get_text().strip() == after.note
    assert "whole profile: after drops" not in {p.get_gid() for p in bench_axes.patches}


def test_an_arm_that_runs_out_of_memory_costs_only_its_own_numbers(a100: Profile) -> None:
    tuned = tuned_config(a100)
    plan = plan_arms(TrainConfig(), tuned)
    batch = next(k for k in plan.knobs if k.name == "batch_size")
    on_alone = plan.on_alone(batch)  # the big batch in fp32 does not fit
    model = SpeedModel(tuned, {"precision": 2.0}, fail=(on_alone,))
    result = bench(a100, "conv", rounds=3, seconds=0.1, measure=model)
    evidence = result.evidence.bench  # type: ignore[union-attr]
    assert evidence is not None
    arm = next(a for a in evidence.arms if a.config == on_alone)
    assert arm.samples_per_s == (None, None, None)
    assert arm.error is not None
    assert "out of memory" in arm.error
    effect = next(s for s in evidence.settings if s.setting == "batch_size")
    assert effect.on_alone is None
    assert effect.off_alone is not None  # the rest still measured
    assert evidence.tuned is not None
    assert evidence.tuned.verdict == "faster"


class _Unruly(SpeedModel):
    """A fake machine whose measurements change what real training changes: the RNG, torch's
    thread count and the cuDNN autotuner."""

    def __call__(self, config: TrainConfig, seconds: float) -> float:
        torch.rand(1)
        torch.set_num_threads(torch.get_num_threads() + 1)
        torch.backends.cudnn.benchmark = True
        return super().__call__(config, seconds)


def test_a_bench_measures_every_arm_records_the_verdict_and_restores_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    threads = torch.get_num_threads()
    profile = measured("cpu-laptop-linux", workload="mlp", model_kind="mlp", batch=48)
    model = _Unruly(tuned_config(profile), {"batch_size": 1.3})
    rng = torch.random.get_rng_state()
    result = bench(profile, rounds=3, seconds=0.1, measure=model)
    assert model.calls  # the arms ran, and disturbed
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert torch.get_num_threads() == threads
    assert torch.backends.cudnn.benchmark is False
    evidence = result.evidence.bench  # type: ignore[union-attr]
    assert evidence is not None
    assert evidence.workload == "mlp"
    assert evidence.device == "cpu"
    assert all(v is not None and v > 0 for a in evidence.arms for v in a.samples_per_s)
    assert [s.setting for s in evidence.settings][:1] == ["batch_size"]  # 48, not 32
    assert evidence.tuned is not None
    assert evidence.tuned.rounds == 3
    assert evidence.tuned.verdict == "faster"


def test_every_arm_trains_under_the_profiles_memory_limit(
    a100: Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile tuned with --memory-limit is benched held to it, as it was probed: an arm
    that would not fit the smaller GPU fails here as it would there."""
    from contextlib import contextmanager

    from torch_autotune.probe import memory

    held: list[tuple[str, int | None]] = []

    @contextmanager
    def capped(device: str, cap: int | None) -> Iterator[None]:
        held.append((device, cap))
        yield
        held.pop()

    limit = 24 * 2**30
    preferences = a100.provenance.preferences.model_copy(update={"memory_limit_bytes": limit})
    provenance = a100.provenance.model_copy(update={"preferences": preferences})
    profile = a100.model_copy(update={"provenance": provenance})
    monkeypatch.setattr(memory, "memory_capped", capped)
    during: list[list[tuple[str, int | None]]] = []

    def measure(_config: TrainConfig, _seconds: float) -> float:
        during.append(list(held))
        return 1000.0

    bench(profile, "conv", rounds=1, seconds=0.1, measure=measure)
    assert during
    assert all(h == [("cuda", limit)] for h in during)
    assert not held  # the whole device given back after


def test_a_rules_only_profile_is_refused_with_the_fix() -> None:
    with pytest.raises(ProbeError, match="run 'autotune' first"):
        bench(build_profile(snapshot("rtx-4090")), "conv", measure=lambda _c, _s: 1.0)


@pytest.mark.parametrize(("budget_s", "expected"), [(37.0, 37.0), (None, None)])
def test_without_a_profile_the_bench_tunes_first_in_the_budget_given(
    a100: Profile, monkeypatch: pytest.MonkeyPatch, budget_s: float | None, expected: float | None
) -> None:
    # None: tune() chooses its default (120 s, or 180 s where it measures torch.compile)
    asked: list[tuple[object, float | None]] = []

    def fake_tune(workload: Workload, *, budget_s: float | None, **_options: object) -> Profile:
        asked.append((workload.name, budget_s))  # the workload is resolved once, by the bench
        return a100

    monkeypatch.setattr(api, "tune", fake_tune)
    model = SpeedModel(tuned_config(a100), {"precision": 2.0})
    result = bench(None, "conv", rounds=1, seconds=0.1, budget_s=budget_s, measure=model)
    assert asked == [("conv", expected)]
    assert result.evidence is not None
    assert result.evidence.bench is not None


# --- the real loop on the CPU --------------------------------------------------------------------


def tiny() -> Workload:
    """The mlp workload with a small dataset: quick real training."""
    return resolve_workload("mlp")


def test_the_training_loop_measures_real_samples_per_second() -> None:
    loop = TrainingLoop(resolve_workload("mlp"), "cpu", warmup_steps=1, min_steps=2)
    rate = loop.measure(TrainConfig(batch_size=16), 0.05)
    assert rate > 0


def test_the_training_loop_loads_through_workers_and_restores_torchs_flags() -> None:
    threads = torch.get_num_threads()
    loop = TrainingLoop(resolve_workload("conv"), "cpu", warmup_steps=1, min_steps=2)
    seen: list[int] = []
    original = loop._train

    def spy(config: TrainConfig, seconds: float) -> float:
        seen.append(torch.get_num_threads())
        return original(config, seconds)

    loop._train = spy  # type: ignore[method-assign]
    rate = loop.measure(TrainConfig(batch_size=8, num_workers=1, cpu_threads=1), 0.05)
    assert rate > 0
    assert seen == [1]  # the config's thread count while it trained
    assert torch.get_num_threads() == threads  # and torch's own afterwards


class Recording(torch.nn.Module):
    """A conv model that records, at every forward, the autocast dtype and the input's layout."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.seen: list[tuple[torch.dtype | None, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        self.seen.append((dtype, x.is_contiguous(memory_format=torch.channels_last)))
        return self.conv(x).float().mean(dim=(2, 3))


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param(TrainConfig(batch_size=4), (None, False), id="baseline"),
        pytest.param(
            TrainConfig(batch_size=4, precision="bfloat16", channels_last=True),
            (torch.bfloat16, True),
            id="bf16-channels-last",
        ),
    ],
)
def test_an_arm_trains_with_its_settings_as_apply_translates_them(
    config: TrainConfig, expected: tuple[torch.dtype | None, bool]
) -> None:
    models: list[Recording] = []

    def make_model() -> Recording:
        models.append(Recording())
        return models[-1]

    mlp = resolve_workload("mlp")
    workload = Workload(
        name="recording",
        kind="conv",
        make_model=make_model,
        make_optimizer=lambda model, **kw: torch.optim.SGD(model.parameters(), lr=0.1, **kw),
        make_batch=lambda n: (torch.randn(n, 3, 8, 8), torch.randint(0, 4, (n,))),
        train_step=mlp.train_step,
    )
    loop = TrainingLoop(workload, "cpu", warmup_steps=1, min_steps=1)
    settings = loop.settings(config)
    assert settings == train_settings(config, settings) == train_settings(config, settings)
    assert (settings.precision.dtype, settings.memory_format == "channels_last") == (
        config.precision,
        config.channels_last,
    )
    assert loop.measure(config, 0.01) > 0
    assert set(models[-1].seen) == {expected}


def test_out_of_memory_in_the_loop_fails_only_that_arm() -> None:
    from tests.probe.test_trials import LIMIT, OomAt

    mlp = resolve_workload("mlp")
    workload = Workload(
        name="oom",
        kind="mlp",
        make_model=lambda: OomAt("forward"),
        make_optimizer=lambda model, **kw: torch.optim.SGD(model.parameters(), lr=0.1, **kw),
        make_batch=lambda n: (torch.randn(n, 16), torch.randint(0, 4, (n,))),
        train_step=mlp.train_step,
    )
    loop = TrainingLoop(workload, "cpu", warmup_steps=1, min_steps=1)
    assert loop.measure(TrainConfig(batch_size=LIMIT), 0.01) > 0
    with pytest.raises(ArmFailed, match="out of memory"):
        loop.measure(TrainConfig(batch_size=LIMIT + 1), 0.01)


def test_a_bug_in_the_users_model_surfaces_as_their_own_error() -> None:
    mlp = resolve_workload("mlp")
    workload = Workload(
        name="broken",
        kind="mlp",
        make_model=lambda: torch.nn.Linear(3, 4),  # the batches have 16 features
        make_optimizer=lambda model, **kw: torch.optim.SGD(model.parameters(), lr=0.1, **kw),
        make_batch=lambda n: (torch.randn(n, 16), torch.randint(0, 4, (n,))),
        train_step=mlp.train_step,
    )
    loop = TrainingLoop(workload, "cpu", warmup_steps=1, min_steps=1)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as caught:
        loop.measure(TrainConfig(batch_size=4), 0.01)
    assert raised_by_user_code(caught.value)


class _BrokenSamples(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise KeyError(f"sample {index} is missing")


def _workload(
    dataset: torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]] | None,
) -> Workload:
    mlp = resolve_workload("mlp")
    return Workload(
        name="mine",
        kind="mlp",
        make_model=lambda: torch.nn.Linear(16, 4),
        make_optimizer=lambda model, **kw: torch.optim.SGD(model.parameters(), lr=0.1, **kw),
        make_batch=lambda n: (torch.randn(n, 16), torch.randint(0, 4, (n,))),
        dataset=dataset,
        train_step=mlp.train_step,
    )


def test_the_users_dataset_failing_in_the_bench_is_theirs() -> None:
    loop = TrainingLoop(_workload(_BrokenSamples()), "cpu", warmup_steps=1, min_steps=1)
    with pytest.raises(KeyError, match="sample 0 is missing") as caught:
        loop.measure(TrainConfig(batch_size=4), 0.01)
    assert raised_by_user_code(caught.value)


@pytest.mark.parametrize("helper", ["batch_to_device", "optimizer_kwargs"])
@pytest.mark.parametrize("dataset", [None, "samples"])
def test_a_bug_in_our_own_step_code_is_ours_in_the_bench(
    dataset: str | None, helper: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch's move to the device and the optimizer's options are torch-autotune's code: a
    failure there is a bug to report (exit 1), not the user's data or optimizer failing (exit
    5)."""
    from torch_autotune.probe import loop as loop_module

    def ours(*_args: object, **_kwargs: object) -> object:
        raise TypeError(f"a bug in {helper}")

    monkeypatch.setattr(loop_module, helper, ours)
    samples = (
        None
        if dataset is None
        else torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    )
    loop = TrainingLoop(_workload(samples), "cpu", warmup_steps=1, min_steps=1)
    with pytest.raises(TypeError, match=f"a bug in {helper}") as caught:
        loop.measure(TrainConfig(batch_size=4), 0.01)
    assert not raised_by_user_code(caught.value)


@pytest.mark.slow
def test_bench_on_the_cpu_end_to_end() -> None:
    """A real (short) tune and bench: numbers for every arm, and the verdict is recorded."""
    from torch_autotune.api import tune

    laptop = snapshot("cpu-laptop-linux")
    profile = tune("mlp", snapshot=laptop, budget_s=8, max_batch_size=64)
    rng = torch.random.get_rng_state()
    result = bench(profile, rounds=3, seconds=0.1)
    assert torch.equal(torch.random.get_rng_state(), rng)
    evidence = result.evidence.bench  # type: ignore[union-attr]
    assert evidence is not None
    assert evidence.workload == "mlp"
    assert all(v is not None and v > 0 for a in evidence.arms for v in a.samples_per_s)
    if profile.settings.batch.batch_size != 32:
        assert [s.setting for s in evidence.settings][:1] == ["batch_size"]
    assert evidence.tuned is not None
    assert evidence.tuned.rounds == 3


def test_a_checkpointed_arm_trains_a_checkpointed_model_of_its_own() -> None:
    from torch.utils.checkpoint import checkpoint

    calls: list[int] = []

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return checkpoint(*args, **kwargs)  # type: ignore[arg-type]

    loop = TrainingLoop(resolve_workload("transformer"), "cpu", warmup_steps=1, min_steps=2)
    plain = TrainConfig(batch_size=4)
    checkpointed = plain.model_copy(update={"settings": {"activation_checkpointing": True}})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("torch.utils.checkpoint.checkpoint", counting)
        assert loop.measure(plain, 0.05) > 0
        assert calls == []  # the plain arm's model is not checkpointed
        assert loop.measure(checkpointed, 0.05) > 0
        assert calls  # its blocks ran under checkpoint
        calls.clear()
        assert loop.measure(plain, 0.05) > 0
        assert calls == []  # and the plain arm's model is still its own
