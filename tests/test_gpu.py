"""GPU tier: fast (NVML) and deep (torch) detection agree on a real GPU, the probe measures it
with the real allocator (OOM at the limit, torch.compile) within its budget, and the bench
trains its arms on it. Each asserts what holds on any NVIDIA GPU.

Skipped where no NVIDIA driver is loaded; run it wherever a GPU is available.
"""

from __future__ import annotations

import pytest

from torch_autotune import detect

pytestmark = pytest.mark.gpu


def test_nvml_and_torch_agree_on_every_gpu() -> None:
    fast = detect()
    deep = detect(deep=True)
    assert fast.accelerators, "a GPU machine shows at least one accelerator"
    assert len(fast.accelerators) == len(deep.accelerators)
    import torch

    for index, accelerator in enumerate(fast.accelerators):
        props = torch.cuda.get_device_properties(index)
        assert accelerator.name == props.name
        assert accelerator.compute_capability == (props.major, props.minor)
        assert accelerator.sm_count == props.multi_processor_count
        assert accelerator.memory_total_bytes is not None
        # NVML's total includes memory the driver reserves; torch's does not.
        assert abs(accelerator.memory_total_bytes - props.total_memory) < 0.03 * props.total_memory
    assert fast.software.torch_cuda_arch_list is not None
    real_arch_list = deep.software.torch_cuda_arch_list or ()
    assert set(fast.software.torch_cuda_arch_list) <= set(real_arch_list) | {"sm_37"}


def test_the_probe_measures_the_gpu_with_allocator_readings() -> None:
    from torch_autotune.api import tune

    profile = tune("conv", mode="balanced", budget_s=60)
    evidence = profile.evidence
    assert evidence is not None
    assert profile.settings.device == "cuda"
    readings = [t.peak_memory_bytes for t in evidence.search if t.fits]
    assert all(r is not None and r > 0 for r in readings)  # the CUDA allocator's peak
    ran = {t.batch_size for t in evidence.search if t.fits}
    assert evidence.batch_size in ran
    if profile.settings.precision.autocast and profile.settings.precision.dtype == "float16":
        assert evidence.batch_size % 8 == 0 or evidence.batch_size < 8  # catalog K4


def _memory_hungry() -> object:
    """A tiny conv net on 512x512 images: about 60 MiB of activations per sample, so the
    memory limit of any GPU lies at a modest batch that trains in milliseconds."""
    import functools

    import torch
    from torch import nn

    from torch_autotune.probe.workloads import as_workload

    def model() -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(64, 8, 3, padding=1),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 10),
        )

    batch = (torch.randn(2, 3, 512, 512), torch.randint(0, 10, (2,)))
    spec = {
        "model": model,
        "optimizer": functools.partial(torch.optim.AdamW, lr=1e-3),
        "example_batch": batch,
        "kind": "conv",
    }
    return as_workload(spec, name="memory-hungry")


def test_the_probe_finds_the_real_limit_measures_compile_and_keeps_to_its_budget() -> None:
    from torch_autotune.api import tune
    from torch_autotune.probe.guard import NEAR_TIME_GUARD, TIME_GUARD
    from torch_autotune.profile import Source

    profile = tune(_memory_hungry(), mode="speed", budget_s=90)  # type: ignore[arg-type]
    evidence = profile.evidence
    assert evidence is not None
    run = [t for t in evidence.search if t.seconds is not None]
    largest = evidence.max_batch_size
    # the largest batch ran, and a size at most 3% larger ran out of memory
    assert largest in {t.batch_size for t in run if t.fits}
    assert evidence.limited_by == "memory", evidence.limit_reason
    failed = [t.batch_size for t in run if not t.fits]
    assert failed
    assert min(failed) <= largest * 1.03 + 1
    # a size refused for time says the prediction and the time left it was refused on, or,
    # beside a smaller size refused so, that it was
    for trial in evidence.search:
        if trial.step == TIME_GUARD:
            assert trial.predicted_s is not None
            assert trial.left_s is not None
        elif trial.step == NEAR_TIME_GUARD:
            same = [t for t in evidence.search if t.variant == trial.variant]
            refused = [t.batch_size for t in same if t.step == TIME_GUARD]
            assert min(refused) <= 1.25 * max(t.batch_size for t in same if t.fits)
    if evidence.limited_by == "budget":
        assert evidence.elapsed_s >= 0.9 * evidence.budget_s
    # where it ran over, which phase did (an H200 took 96.2 s of 90 once; the evidence's
    # repr alone was cut before its phases)
    phases = [(p.name, p.seconds, p.allowed_s) for p in evidence.phases]
    assert evidence.elapsed_s <= evidence.budget_s * 1.05, (evidence.elapsed_s, phases)
    # compile, where the rules allow it, is decided by measurement with the numbers
    if evidence.compile is not None and evidence.compile.measured:
        decision = profile.decision("compile.enabled")
        assert decision is not None
        assert decision.source is Source.MEASURED
        assert "x (" in decision.reason
        assert evidence.compile.compile_s is not None
    assert profile.settings.batch.batch_size in {t.batch_size for t in evidence.search if t.fits}


def test_the_bench_trains_every_arm_on_the_gpu_or_says_why_not() -> None:
    """A short bench of a measured mlp profile on this GPU (balanced mode: no compile arm;
    8 to 16 arms, 3 rounds of 0.1 s; tens of seconds). Which arm is faster is the GPU's own
    business, so only what holds on any NVIDIA GPU is asserted: every arm trained on the GPU in
    every round or failed with its reason, and every effect has its numbers."""
    import math

    import torch

    from tests.test_bench import measured
    from torch_autotune.api import bench
    from torch_autotune.profile import Mode

    profile = measured(
        detect(), mode=Mode.BALANCED, model_kind="mlp", batch=256, workers=2, workload="mlp"
    )
    assert profile.settings.device == "cuda"
    rng = torch.random.get_rng_state()
    torch.cuda.reset_peak_memory_stats()
    result = bench(profile, rounds=3, seconds=0.1)
    assert torch.cuda.max_memory_allocated() > 0  # the arms trained on the GPU
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert result.evidence is not None
    evidence = result.evidence.bench
    assert evidence is not None
    assert (evidence.workload, evidence.device, evidence.rounds) == ("mlp", "cuda", 3)
    assert evidence.arms[0].names[0] == "baseline"
    assert all(v is not None and v > 0 for v in evidence.arms[0].samples_per_s)
    for arm in evidence.arms:
        assert len(arm.samples_per_s) == 3
        every_round = all(v is not None and v > 0 for v in arm.samples_per_s)
        assert every_round or arm.error, arm.names
    benched = {s.setting for s in evidence.settings}
    assert "batch_size" in benched  # 32 against 256
    assert ("precision" in benched) is profile.settings.precision.autocast  # none on Pascal
    effects = [evidence.tuned, evidence.final] + [
        e for s in evidence.settings for e in (s.on_alone, s.off_alone)
    ]
    failed = any(arm.error for arm in evidence.arms)
    assert evidence.tuned is not None or failed
    for e in effects:
        if e is None:
            continue
        assert math.isfinite(e.speedup)
        assert e.low <= e.speedup <= e.high
        assert 1 <= e.rounds <= 3
    for setting in evidence.settings:
        assert setting.reason
        assert (setting.on_alone is not None and setting.off_alone is not None) or failed
    assert evidence.elapsed_s > 0


def test_a_memory_limit_holds_the_probe_to_a_smaller_gpu() -> None:
    """--memory-limit 4: the search stops where 4 GiB of the real allocator's fraction does,
    and the whole device is the process's again afterwards."""
    import torch

    from torch_autotune.api import tune

    whole = tune("conv", mode="balanced", budget_s=45)
    capped = tune("conv", mode="balanced", budget_s=45, memory_limit_gib=4)
    assert whole.evidence is not None
    assert capped.evidence is not None
    assert capped.provenance.preferences.memory_limit_bytes == 4 << 30
    assert capped.evidence.memory_limit_bytes is not None
    assert capped.evidence.memory_limit_bytes <= 4 << 30
    assert capped.evidence.max_batch_size < whole.evidence.max_batch_size
    fitted = [t.peak_memory_bytes or 0 for t in capped.evidence.search if t.fits]
    assert max(fitted) <= 4 << 30
    total = torch.cuda.get_device_properties(0).total_memory
    held = torch.empty(int(0.5 * total), dtype=torch.uint8, device="cuda")  # past 4 GiB: allowed
    del held


def test_where_the_optimizer_step_is_the_peak_foreach_is_measured_against_fused() -> None:
    """A wide MLP (8 layers of 4096x4096: 134M parameters, 2 GiB with Adam's state) on 32-wide
    vectors under a 3 GiB limit: activations are nothing beside the optimizer's step, so the
    fused step against foreach's is measured at the largest batch and rule I2 says so."""
    import dataclasses

    import torch

    from torch_autotune.api import tune
    from torch_autotune.probe.workloads import resolve_workload
    from torch_autotune.profile import Source

    width = 4096

    def wide() -> torch.nn.Module:
        layers = [torch.nn.Linear(width, width) for _ in range(8)]
        return torch.nn.Sequential(torch.nn.Linear(32, width), *layers, torch.nn.Linear(width, 10))

    mlp = resolve_workload("mlp")
    workload = dataclasses.replace(
        mlp,
        name="wide",
        make_model=wide,
        make_batch=lambda n: (torch.randn(n, 32), torch.randint(0, 10, (n,))),
        typical_batch=None,
        dataset=None,
    )
    profile = tune(workload, mode="balanced", budget_s=60, memory_limit_gib=3)
    assert profile.evidence is not None
    record = profile.evidence.optimizer_memory
    assert profile.evidence.limited_by == "memory", profile.evidence.limit_reason
    assert record is not None, profile.evidence.search
    assert record.fused_peak_bytes is not None
    if record.foreach_fits:
        assert record.foreach_peak_bytes is not None
        assert record.foreach_peak_bytes > record.fused_peak_bytes  # the intermediates
    decision = profile.decision("optimizer.fused")
    assert decision is not None
    assert decision.source is Source.MEASURED


def test_a_memory_budget_lowers_the_compiled_steps_peak_on_the_gpu() -> None:
    """Compile's activation memory budget at 0.5 (``apply.compile_model``) on a GELU MLP in
    bf16 whose activations (8 x 256 MiB saved) outweigh its weights (0.5 GiB with gradients):
    its step peaks lower than the same model compiled without it, which ran first (so the
    budget's compile is a compile of its own), for the same loss."""
    import torch

    from torch_autotune.apply import compile_model
    from torch_autotune.settings import Settings

    def compiled(budget: float | None) -> Settings:
        return Settings.model_validate(
            {
                "device": "cuda",
                "compile": {"enabled": True, "mode": "default", "memory_budget": budget},
            }
        )

    torch.manual_seed(0)
    layers = [
        torch.nn.Sequential(
            torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
        )
        for _ in range(8)
    ]
    model = torch.nn.Sequential(*layers).cuda()
    x = torch.randn(4096, 1024, device="cuda")

    def step(budget: float | None) -> tuple[int, float]:
        run = compile_model(compiled(budget), model)
        for _ in range(2):  # the first compiles
            model.zero_grad(set_to_none=True)
            torch.cuda.reset_peak_memory_stats()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = run(x).float().square().mean()
            loss.backward()
            torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(), loss.item()

    plain_peak, plain_loss = step(None)
    peak, loss = step(0.5)
    assert peak < 0.85 * plain_peak, (peak / 2**30, plain_peak / 2**30)
    assert loss == pytest.approx(plain_loss, rel=1e-2)
