"""The README's training loop runs as it is written, with a measured profile: the DataLoader
gets the tuned batch, and the optimizer steps once every ``grad_accum_steps`` batches (issue
18, point 8: the loop used to hard-code batch 64 and no accumulation)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

import torch_autotune
from tests.batchnorm import with_batch_one_raising
from tests.probe.fake_trials import cpu_machine, tune_on
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe.workloads import resolve_workload
from torch_autotune.rules.engine import build_profile

README = Path(__file__).parent.parent / "README.md"


def readme_loop() -> str:
    """The Python block under '## In a training script'."""
    section = README.read_text().split("## In a training script", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, "the README has no training loop"
    return found.group(1)


def run_loop(dataset: Any, seen: list[int]) -> int:
    """Execute the README's loop on ``dataset`` with a small MLP; the batch sizes its model
    saw go to ``seen``; returns how many optimizer steps it took."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model.register_forward_pre_hook(lambda _m, args: seen.append(int(args[0].shape[0])))
    steps: list[int] = []
    hook = register_optimizer_step_post_hook(lambda *_args: steps.append(1))
    try:
        namespace = {
            "dataset": dataset,
            "model": model,
            "loss_fn": torch.nn.functional.cross_entropy,
        }
        exec(compile(readme_loop(), "README.md", "exec"), namespace)
    finally:
        hook.remove()
    return len(steps)


@pytest.mark.parametrize("target", [None, 96])
def test_the_readme_loop_trains_at_the_tuned_batch_with_its_accumulation(
    target: int | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    laptop = detected_as("cpu-laptop-linux")
    monkeypatch.setenv("TORCH_AUTOTUNE_HOME", str(tmp_path))
    machine = cpu_machine(fixed_s=0.05, per_sample_s=0.002, first_s=0.3, autotune_s=0.0)
    workload = resolve_workload("mlp")
    profile = tune_on(
        machine, workload, laptop, budget_s=60, max_batch_size=16, target_global_batch=target
    )
    torch_autotune.save(profile)
    batch, accumulate = profile.batch_size, profile.grad_accum_steps
    assert batch is not None
    assert accumulate == (1 if target is None else -(-target // batch))
    samples = batch * accumulate * 3
    dataset = torch.utils.data.TensorDataset(
        torch.randn(samples, 8), torch.randint(0, 3, (samples,))
    )
    seen: list[int] = []
    steps = run_loop(dataset, seen)
    assert set(seen) == {batch}  # every batch at the tuned size
    assert steps == 3  # one optimizer step every `accumulate` batches


def test_the_readme_loop_never_feeds_a_batchnorm_model_a_last_batch_of_1(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    """A profile whose batch 1 raised sets drop_last=True through the README's own line: 9
    samples at batch 4 give the model two batches of 4, never the last sample alone."""
    laptop = detected_as("cpu-laptop-linux")
    monkeypatch.setenv("TORCH_AUTOTUNE_HOME", str(tmp_path))
    torch_autotune.save(with_batch_one_raising(build_profile(laptop), batch_size=4))
    dataset = torch.utils.data.TensorDataset(torch.randn(9, 8), torch.randint(0, 3, (9,)))
    seen: list[int] = []
    run_loop(dataset, seen)
    assert seen == [4, 4]
