"""The example training script runs on this machine as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.system  # recommend() detects the real machine
def test_example_training_script_runs(tmp_path: Path) -> None:
    env = {**os.environ, "TORCH_AUTOTUNE_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "train.py"), "--steps", "4"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "4 steps of batch 32 x 1 on cpu" in done.stdout or "4 steps of batch" in done.stdout
    assert "rules-only profile" in done.stdout


@pytest.mark.system  # recommend() detects the real machine
def test_example_training_script_runs_once_a_batchnorm_profile_is_saved_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script writes drop_last=True for its BatchNorm model; a profile that sets it too
    made DataLoader() get drop_last twice (a TypeError) before its first step."""
    import torch_autotune
    from tests.batchnorm import with_batch_one_raising

    monkeypatch.setenv("TORCH_AUTOTUNE_HOME", str(tmp_path))
    profile = with_batch_one_raising(torch_autotune.recommend(), batch_size=64)
    torch_autotune.save(profile)
    assert torch_autotune.recommend().dataloader_kwargs()["drop_last"] is True
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "train.py"), "--steps", "4"],
        env={**os.environ, "TORCH_AUTOTUNE_HOME": str(tmp_path)},
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "4 steps of batch 64 x 1" in done.stdout
