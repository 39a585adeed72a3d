"""``--memory-limit`` (``tune(memory_limit_gib=...)``): the probe tunes as on a smaller GPU, the
limit recorded in the profile and said in the summary; on the CPU it caps the host RAM the
search may fill. On the simulated H100 with GPT-2's recorded memory curve, and from the CLI."""

from __future__ import annotations

import io
import re

import pytest
from click.testing import CliRunner
from rich.console import Console

from tests.probe.fake_trials import recorded, tune_on
from torch_autotune import compose
from torch_autotune.cli import cli
from torch_autotune.errors import EXIT_USAGE
from torch_autotune.probe.presets import preset
from torch_autotune.probe.simulated import SimulatedMachine
from torch_autotune.probe.workloads import resolve_workload
from torch_autotune.render.results import render_run

H100 = recorded("h100-80gb-hbm3")
LAPTOP = recorded("cpu-laptop-linux")
GIB = 1 << 30


def _gpt2(machine: SimulatedMachine, **options: object):  # type: ignore[no-untyped-def]
    import dataclasses

    workload = dataclasses.replace(resolve_workload("gpt2"), dataset=None)
    return tune_on(machine, workload, H100, mode="balanced", budget_s=120, **options)


def test_a_smaller_gpu_takes_a_smaller_batch_and_the_profile_says_so() -> None:
    whole = _gpt2(preset("h100-gpt2", load_s=None))
    machine = preset("h100-gpt2", load_s=None)
    capped = _gpt2(machine, memory_limit_gib=24)
    assert whole.evidence is not None
    assert capped.evidence is not None
    assert capped.provenance.preferences.memory_limit_bytes == 24 * GIB
    assert capped.evidence.memory_limit_bytes is not None
    assert capped.evidence.memory_limit_bytes <= 24 * GIB
    largest = capped.evidence.max_batch_size
    assert largest < whole.evidence.max_batch_size
    # exact, as on a real 24 GiB device: the largest fits the cap, one more does not
    assert machine.peak(largest) <= 24 * GIB < machine.peak(largest + 1)
    out = io.StringIO()
    render_run(capped, Console(file=out, width=300, color_system=None), saved=None)
    assert re.search(r"^memory limit\s{2,}24 GiB of the GPU, as asked\s*$", out.getvalue(), re.M)


def test_on_the_cpu_the_limit_caps_the_host_ram_the_search_may_fill() -> None:
    machine = SimulatedMachine(
        limit=100_000, memory_bytes=None, fixed_bytes=200 << 20, per_sample_bytes=4 << 20, leaves=1
    )
    workload = "mlp"
    profile = tune_on(machine, workload, LAPTOP, budget_s=60, memory_limit_gib=0.5)
    evidence = profile.evidence
    assert evidence is not None
    refused = [t for t in evidence.search if t.step == "ram-guard (not run)"]
    assert refused  # sizes predicted past 0.5 GiB were not run
    assert evidence.max_batch_size * (4 << 20) + (200 << 20) <= 0.5 * GIB


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_tune_refuses_a_memory_limit_no_device_has(bad: float) -> None:
    with pytest.raises(ValueError, match="memory_limit_gib"):
        compose.check_tune_arguments(None, None, None, None, memory_limit_gib=bad)


@pytest.mark.parametrize("bad", ["0", "nan", "-3", "lots"])
def test_the_cli_refuses_a_memory_limit_no_device_has(bad: str) -> None:
    done = CliRunner().invoke(cli, ["--memory-limit", bad, "--no-save"], prog_name="autotune")
    assert done.exit_code == EXIT_USAGE
    assert "--memory-limit" in done.output
