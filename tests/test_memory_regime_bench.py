"""``benchmarks/memory_regime.py`` on the CPU: its batch search and its verdict on recorded
numbers, how its arms reach activation checkpointing, and a smoke run of the whole script on the
small ``transformer`` built-in (the limits recorded, not applied), one arm in a child process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from torch_autotune.errors import DoesNotFitError
from torch_autotune.hardware import HardwareSnapshot

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "memory_regime.py"
SMOKE = [
    "--device", "cpu", "--workloads", "transformer", "--limits", "2", "--seconds", "0.02",
    "--max-batch", "2", "--quick", "--eager-only",
]  # fmt: skip


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """One CPU thread here and in the children: a smoke run's steps are tiny, and on a busy
    machine a second thread waits for a core more than it computes."""
    import torch

    threads = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("memory_regime", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_largest_batch_doubles_then_bisects(bench: ModuleType) -> None:
    largest, trials = bench.largest_batch(lambda size: size <= 13, 1024)
    assert largest == 13
    assert [size for size, _ in trials] == [1, 2, 4, 8, 16, 12, 14, 13]
    assert bench.largest_batch(lambda size: size <= 100, 12) == (
        12,
        [[1, True], [2, True], [4, True], [8, True], [12, True]],
    )
    assert bench.largest_batch(lambda _size: False, 64) == (0, [[1, False]])


def _arm(label: str, checkpointing: bool, *rates: float, over_cap: bool = False) -> dict[str, Any]:
    rows = [{"batch": 8, "samples_per_s": rate, "over_cap": over_cap} for rate in rates]
    return {"label": label, "checkpointing": checkpointing, "measurements": rows}


def test_summary_takes_the_fastest_arm_under_the_cap(bench: ModuleType) -> None:
    result = {
        "does_not_fit": None,
        "tuned": _arm("tuned", True, 114.0),
        "arms": [
            _arm("off", False, 100.0, 90.0),
            _arm("on", True, 120.0, 60.0),
            _arm("over", False, 500.0, over_cap=True),  # the cap not honoured: left out
        ],
    }
    summary = bench.summarize(result)
    assert summary["oracle"] == {"arm": "on", "batch": 8, "samples_per_s": 120.0}
    assert summary["best_without_checkpointing"]["arm"] == "off"
    assert summary["tuned_over_oracle"] == pytest.approx(0.95)
    assert summary["tuned_over_no_checkpointing"] == pytest.approx(1.14)
    assert summary["targets_held"]
    slower = {**result, "tuned": _arm("tuned", True, 99.0)}  # 0.825 of the oracle
    assert not bench.summarize(slower)["targets_held"]


def test_k2s_size_is_measured_only_where_memory_stopped_the_search(bench: ModuleType) -> None:
    assert bench._kept(6, [[1, True], [2, True], [4, True], [8, False], [6, True], [7, False]]) == 5
    assert bench._kept(2, [[1, True], [2, True], [4, False], [3, False]]) == 1
    assert bench._kept(1024, [[512, True], [1024, True]]) is None  # the cap: no margin
    assert bench._kept(0, [[1, False]]) is None  # nothing fits: nothing to measure


def test_the_margins_oracle_is_reported_beside_the_targets_oracle(bench: ModuleType) -> None:
    # GPT-2 large under 16 GiB on the H200: checkpointed 6 at 38.7 samples/s (0.6% of the limit
    # free), 2 without at 35.8; K2's sizes 5 and 1
    def arm(label: str, on: bool, *rows: tuple[int, float, bool]) -> dict[str, Any]:
        measured = [
            {"batch": b, "samples_per_s": r, "over_cap": False, "headroom": k} for b, r, k in rows
        ]
        return {"label": label, "checkpointing": on, "measurements": measured}

    on = arm("on", True, (6, 38.7, False), (5, 32.3, True), (3, 18.8, True))
    off = arm("off", False, (2, 35.8, False), (1, 14.0, True))
    tuned = arm("tuned", True, (5, 32.0, True))
    summary = bench.summarize({"does_not_fit": None, "tuned": tuned, "arms": [on, off]})
    assert summary["oracle"]["batch"] == 6  # the targets: every row, as the issue sets them
    assert summary["tuned_over_oracle"] == pytest.approx(32.0 / 38.7)
    assert summary["tuned_over_no_checkpointing"] == pytest.approx(32.0 / 35.8)
    assert not summary["targets_held"]
    assert summary["headroom_oracle"] == {"arm": "on", "batch": 5, "samples_per_s": 32.3}
    assert summary["headroom_best_without_checkpointing"]["batch"] == 1
    assert summary["tuned_over_headroom_oracle"] == pytest.approx(32.0 / 32.3)
    assert summary["tuned_over_headroom_no_checkpointing"] == pytest.approx(32.0 / 14.0)


def test_summary_where_the_tuner_finds_no_fit(bench: ModuleType) -> None:
    nothing = {"does_not_fit": "plan", "tuned": None, "arms": [_arm("off", False)]}
    assert bench.summarize(nothing)["targets_held"]  # nothing fits in the grid either
    missed = {**nothing, "arms": [_arm("on", True, 10.0)]}
    assert not bench.summarize(missed)["targets_held"]  # the grid found a fit the tuner did not


def test_the_full_grid_compiles_under_each_memory_budget(
    bench: ModuleType, detected_as: Callable[[str], HardwareSnapshot]
) -> None:
    """Without --quick: checkpointing x (eager, compiled, compiled under each budget) x the
    allocator; each budget arm holds the profile's own setting, under compile."""
    detected_as("cpu-laptop-linux")
    args = bench._parse([*SMOKE[:-2], "--memory-budgets", "0.8", "0.3"])
    specs = bench.grid(bench._template("transformer", 2.0, None, args), args)
    assert len(specs) == 2 * 4 * 2
    budgeted = [s for s in specs if s.memory_budget is not None]
    assert sorted({s.memory_budget for s in budgeted}) == [0.3, 0.8]
    for spec in budgeted:
        assert spec.config["compile_mode"] == "default"
        assert spec.config["settings"]["compile.memory_budget"] == spec.memory_budget
    assert bench._parse(SMOKE[:-2]).memory_budgets == [0.8, 0.5]


def test_the_grid_trains_checkpointed_arms_checkpointed(
    bench: ModuleType, detected_as: Callable[[str], HardwareSnapshot]
) -> None:
    """Each arm of the grid, as the training loop reads it: checkpointing from the arm's
    ``TrainConfig.settings`` (a bench knob), and the model prepared with its repeated blocks
    wrapped, or none of them."""
    from torch_autotune.bench import TrainConfig
    from torch_autotune.probe.loop import TrainingLoop
    from torch_autotune.probe.workloads import resolve_workload
    from torch_autotune.settings import Settings
    from torch_autotune.wrapping import is_checkpointed

    detected_as("cpu-laptop-linux")
    args = bench._parse(SMOKE)
    specs = bench.grid(bench._template("transformer", 2.0, None, args), args)
    assert [spec.checkpointing for spec in specs] == [False, True]
    for spec in specs:
        base = Settings.model_validate(spec.base)
        loop = TrainingLoop(resolve_workload("transformer"), "cpu", settings=base)
        settings = loop.settings(TrainConfig.model_validate(spec.config))
        assert settings.activation_checkpointing is spec.checkpointing
        model = loop._model(settings)
        wrapped = [m for m in model.modules() if is_checkpointed(m)]
        assert bool(wrapped) is spec.checkpointing


def test_usage_errors_exit_2(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        bench.main(["--profile", "gpt2-large=p.yaml"])
    assert exited.value.code == 2
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    assert bench.main(["--workloads", "transformer"]) == 2
    assert "CUDA GPU" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_smoke_run_on_the_cpu(
    bench: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    """tune() under the limit, the grid with checkpointing off and on, the second allocator's
    arms each in a child process (on the CPU its variable is harmless), JSON and Markdown."""
    detected_as("cpu-laptop-linux")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setitem(bench.PARENT_ENV, "PYTORCH_CUDA_ALLOC_CONF", None)  # torch's default
    allocators = ["--allocators", "default", "expandable_segments:True"]
    code = bench.main([*SMOKE, "--budget", "6", *allocators, "--out", str(tmp_path)])
    assert code in (0, 1)  # the targets mean nothing on a loaded CPU
    document = json.loads((tmp_path / "memory_regime_cpu.json").read_text())
    assert "transformer under 2 GiB" in (tmp_path / "memory_regime_cpu.md").read_text()
    assert document["versions"]["device"] == "cpu"
    (result,) = document["results"]
    assert result["limit_gib"] == 2.0
    assert not result["cap_applied"]
    arms = result["arms"]
    assert {arm["checkpointing"] for arm in arms} == {False, True}
    for arm in arms:
        assert arm["error"] is None, arm
        assert 1 <= arm["largest_batch"] <= 2
        assert arm["measurements"]
        assert all(row["samples_per_s"] > 0 for row in arm["measurements"])
    children = [arm for arm in arms if arm["process"] == "child"]
    assert children
    assert all(arm["pid"] != os.getpid() for arm in children)
    assert {arm["env_seen"]["PYTORCH_CUDA_ALLOC_CONF"] for arm in children} == {
        "expandable_segments:True"
    }
    rows = [row for arm in arms for row in arm["measurements"]]
    fastest = max(row["samples_per_s"] for row in rows)
    tuned_rate = result["tuned"]["measurements"][0]["samples_per_s"]
    assert result["oracle"]["samples_per_s"] == fastest
    assert result["tuned_over_oracle"] == pytest.approx(tuned_rate / fastest)
    for arm in arms:  # the margin only where memory stopped the arm's search (its own test)
        limit = bench._kept(arm["largest_batch"], arm["trials"])
        for row in arm["measurements"]:
            assert row["headroom"] == (limit is None or row["batch"] <= limit)
    tuned_batch = result["tuned"]["measurements"][0]["batch"]  # why the tuner chose it, kept
    assert result["reasons"]["batch.batch_size"].startswith(f"{tuned_batch}: ")
    assert result["reasons"]["activation_checkpointing"].startswith(("on: ", "off: "))
    markdown = (tmp_path / "memory_regime_cpu.md").read_text()
    assert f"- `batch.batch_size`: {result['reasons']['batch.batch_size']}" in markdown


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_a_workload_that_does_not_fit(
    bench: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    """The tuner's plan is the result; the grid still runs, at the rules' settings."""
    detected_as("cpu-laptop-linux")

    def does_not_fit(*_args: object, **_kwargs: object) -> None:
        raise DoesNotFitError("not even batch 1 trained: shard it", batch_size=1)

    monkeypatch.setattr(bench, "tune", does_not_fit)
    code = bench.main([*SMOKE, "--max-batch", "1", "--out", str(tmp_path)])
    (result,) = json.loads((tmp_path / "memory_regime_cpu.json").read_text())["results"]
    assert result["does_not_fit"].startswith("not even batch 1 trained: shard it")
    assert result["tuned"] is None
    assert result["reasons"] == {}
    assert all(arm["largest_batch"] == 1 for arm in result["arms"])  # no cap on the CPU
    assert code == 1  # the grid fitted where the tuner said nothing would
