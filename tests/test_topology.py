"""One topology: the training processes on this node, the devices and CPUs of each and the
multiple a batch should have, derived once from the snapshot and the preferences, stored in
the profile, and read by the rules, the probe's workers phase, the accumulation and the
exporters instead of their own counts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.probe.fake_trials import cpu_machine, tune_on
from tests.rules.helpers import SNAPSHOT_DIR, context_with, run, snapshot
from tests.test_profile import NOW, PROFILES_DIR, snapshots
from torch_autotune import compose
from torch_autotune.cli import cli
from torch_autotune.errors import EXIT_USAGE, ProfileFileError
from torch_autotune.hardware import HardwareSnapshot, Vendor
from torch_autotune.integrations import (
    accelerate_config,
    lightning_trainer_kwargs,
    process_count,
    render_accelerate,
)
from torch_autotune.probe import workers_phase
from torch_autotune.probe.simulated import SimulatedMachine
from torch_autotune.probe.workloads import Workload, resolve_workload
from torch_autotune.profile import Mode, Preferences, Profile, target_accelerators
from torch_autotune.profile_io import dump_profile, parse_profile
from torch_autotune.rules.context import Measurements
from torch_autotune.rules.dataloader import MAX_GPU_WORKERS
from torch_autotune.rules.engine import build_profile
from torch_autotune.rules.optimizer import batch
from torch_autotune.topology import TENSOR_CORE_MULTIPLE, derive_topology

CPU_TORCH_8X_A100 = "a100-sxm4-80gb-8x with a CPU build of torch"


def _machine(name: str) -> HardwareSnapshot:
    """A recorded snapshot, or the 8x A100 box whose torch is a CPU build."""
    if name != CPU_TORCH_8X_A100:
        return snapshot(name)
    machine = snapshot("a100-sxm4-80gb-8x")
    software = machine.software.model_copy(update={"torch_cuda_version": None})
    return machine.model_copy(update={"software": software})


def _profile(name: str, measurements: Measurements | None = None, **preferences: Any) -> Profile:
    return build_profile(
        _machine(name),
        measurements,
        Preferences(**preferences),
        now=NOW,
        host_id="test",
    )


# --- what each machine gets ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("h100-80gb-hbm3", ("cuda", 1, 1, 26, 8)),
        ("a100-sxm4-80gb-8x", ("cuda", 8, 1, 32, 8)),  # 256 usable CPUs, 8 ranks
        (CPU_TORCH_8X_A100, ("cpu", 1, 0, 256, 1)),  # the GPUs idle: one process, every CPU
        ("tesla-v100-pcie-16gb-2x", ("cuda", 2, 1, 40, 8)),
        ("cpu-container-quota-4", ("cpu", 1, 0, 4, 1)),  # the quota, not the 64 cores
        ("apple-m2-pro-mps", ("mps", 1, 1, 12, 1)),
        ("mi300x-rocm", ("cuda", 1, 1, 24, 1)),  # K4 is for NVIDIA Tensor Cores
        ("gtx-1080-ti", ("cuda", 1, 1, 24, 1)),  # Pascal: no Tensor Cores
        ("tesla-t4", ("cuda", 1, 1, 4, 8)),  # AMP without TF32 is enough
    ],
)
def test_each_machine_gets_its_topology(
    name: str, expected: tuple[str, int, int, int, int]
) -> None:
    """(device, processes per node, devices per process, CPUs per process, batch multiple)."""
    device, processes, devices, cpus, multiple = expected
    topology = _profile(name).topology
    assert topology.device == device
    assert topology.processes_per_node == processes
    assert topology.devices_per_process == devices
    assert topology.cpus_per_process == cpus
    assert topology.batch_multiple == multiple
    assert process_count(_profile(name)) == processes
    assert topology.processes_reason.startswith(f"{processes}: ")
    assert topology.cpus_reason.startswith(f"{cpus}: ")
    assert topology.multiple_reason.startswith(f"{multiple}: ")
    assert "K4" in topology.multiple_reason


def test_k4_needs_tensor_core_math_as_well_as_tensor_cores() -> None:
    """An H100 computing in float32 without TF32 runs no matmul on its Tensor Cores: no
    multiple of 8 is asked of the batch there."""
    h100 = snapshot("h100-80gb-hbm3")
    plain = derive_topology(h100, None, device="cuda", tensor_core_math=False)
    assert plain.batch_multiple == 1
    assert "neither AMP nor TF32" in plain.multiple_reason
    amp = derive_topology(h100, None, device="cuda", tensor_core_math=True)
    assert amp.batch_multiple == TENSOR_CORE_MULTIPLE == 8
    assert "multiples of 8" in amp.multiple_reason


def test_the_processes_asked_for_are_the_topologys() -> None:
    eight = _profile("a100-sxm4-80gb-8x", processes_per_node=4).topology
    assert eight.processes_per_node == 4
    assert eight.cpus_per_process == 64
    assert "4 of the 8 GPUs stay idle" in eight.processes_reason
    cpu = _profile("cpu-laptop-linux", processes_per_node=2).topology
    assert (cpu.processes_per_node, cpu.cpus_per_process) == (2, 4)
    assert "gloo" in cpu.processes_reason
    mps = _profile("apple-m2-pro-mps", processes_per_node=4).topology
    assert mps.processes_per_node == 1  # torch.distributed has no MPS back end
    assert "4 processes were asked for" in mps.processes_reason
    crowded = _profile("cpu-container-quota-4", processes_per_node=8).topology
    assert crowded.cpus_per_process == 1
    assert "oversubscribe" in crowded.cpus_reason


# --- the accumulation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "processes_per_node", "steps", "spread"),
    [
        (CPU_TORCH_8X_A100, None, 64, ""),  # trains on the CPU, in one process: not 8 steps
        ("a100-sxm4-80gb-8x", None, 8, " x 8 processes"),
        ("a100-sxm4-80gb-8x", 2, 32, " x 2 processes"),
        ("cpu-laptop-linux", 4, 16, " x 4 processes"),
    ],
)
def test_accumulation_spreads_the_target_over_the_topologys_processes(
    name: str, processes_per_node: int | None, steps: int, spread: str
) -> None:
    """The accumulation divided by every GPU in the snapshot: an 8x A100 machine with a CPU
    build of torch got 8 steps for a target of 4096 at batch 64 (a global batch of 512)."""
    ctx = context_with(
        _machine(name),
        Measurements(batch_size=64),
        target_global_batch=4096,
        processes_per_node=processes_per_node,
    )
    found = run(ctx, batch)["batch.grad_accum_steps"]
    assert found.value == steps
    assert found.rule == "L1"
    assert f"batch 64 x {steps} steps{spread} = a global batch of 4096" in found.reason


def test_a_target_without_a_measured_batch_says_it_waits_for_one() -> None:
    decision = _profile("h100-80gb-hbm3", target_global_batch=4096).decision(
        "batch.grad_accum_steps"
    )
    assert decision is not None
    assert decision.value == 1
    assert "target global batch 4096" in decision.reason
    assert "no target global batch is given" not in decision.reason


# --- the workers phase ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("processes_per_node", "here", "expected"),
    [
        (None, 10_000, 26),  # one rank: the recorded H100 box's 26 usable CPUs
        (4, 10_000, 6),  # four ranks: 26 // 4 each
        (4, 8, 2),  # this process has 8 CPUs, shared by four ranks the same way
        (4, 2, 1),  # never none
    ],
)
def test_the_workers_phase_measures_the_cpus_of_one_rank(
    monkeypatch: pytest.MonkeyPatch, processes_per_node: int | None, here: int, expected: int
) -> None:
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: here)
    profile = _profile("h100-80gb-hbm3", processes_per_node=processes_per_node)
    assert workers_phase._max_workers(profile) == expected


def test_the_rules_give_each_rank_its_share_of_the_cpus() -> None:
    """F1 on a GPU: one worker fewer than the CPUs of a rank; G3: that many threads a rank."""
    profile = _profile("a100-sxm4-80gb-8x", processes_per_node=4)
    assert profile.settings.dataloader.num_workers == MAX_GPU_WORKERS  # 63 is past F1's cap
    assert profile.settings.cpu_threads == 64
    threads = profile.decision("cpu_threads")
    assert threads is not None
    assert "shared by 4 training processes: 64 CPU(s) each" in threads.reason


# --- the exporters ----------------------------------------------------------------------------


def test_the_exporters_launch_the_topologys_processes() -> None:
    cpu = _profile("cpu-laptop-linux", processes_per_node=2)
    assert lightning_trainer_kwargs(cpu)["devices"] == 2
    assert lightning_trainer_kwargs(cpu)["accelerator"] == "cpu"
    config = accelerate_config(cpu)
    assert (config["distributed_type"], config["num_processes"]) == ("MULTI_CPU", 2)
    gpus = _profile("a100-sxm4-80gb-8x", processes_per_node=2)
    assert lightning_trainer_kwargs(gpus)["devices"] == 2
    config = accelerate_config(gpus)
    assert (config["distributed_type"], config["num_processes"]) == ("MULTI_GPU", 2)
    one = accelerate_config(_profile(CPU_TORCH_8X_A100))
    assert (one["distributed_type"], one["num_processes"]) == ("NO", 1)


def test_accelerate_reads_several_processes_on_the_cpu(tmp_path: Path) -> None:
    """MULTI_CPU is the accelerate config of DDP ranks on the CPU (over gloo)."""
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    path = tmp_path / "accelerate.yaml"
    path.write_text(render_accelerate(_profile("cpu-laptop-linux", processes_per_node=2)))
    config = load_config_from_file(str(path))
    assert config.distributed_type is DistributedType.MULTI_CPU
    assert config.num_processes == 2
    assert config.use_cpu is True


# --- stored in the profile --------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(PROFILES_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_a_profile_written_without_a_topology_gets_the_one_the_engine_stores(path: Path) -> None:
    """Every profile written before the topology was stored still loads, with the topology
    its settings, snapshot and preferences give: the one the engine stores today."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    stored = data.pop("topology")
    older = parse_profile(json.dumps(data), source=path.name)
    assert older.topology.model_dump(mode="json") == stored
    assert dump_profile(older) == path.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("update", "problem"),
    [
        ({"device": "cpu"}, "topology.device: cpu, but settings.device is cuda"),
        ({"devices_per_process": 0}, "topology.devices_per_process: 0 on cuda"),
        ({"cpus_per_process": 27}, "topology.cpus_per_process: 1 process(es) x 27 CPUs"),
    ],
)
def test_a_topology_no_machine_can_run_is_refused(update: dict[str, Any], problem: str) -> None:
    data = json.loads(dump_profile(_profile("h100-80gb-hbm3"), "json"))
    data["topology"].update(update)
    with pytest.raises(ProfileFileError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_profile(json.dumps(data))


def test_several_processes_on_mps_are_refused() -> None:
    data = json.loads(dump_profile(_profile("apple-m2-pro-mps"), "json"))
    data["topology"].update(processes_per_node=2, cpus_per_process=6)
    with pytest.raises(ProfileFileError, match="on MPS, which trains in one process"):
        parse_profile(json.dumps(data))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snapshots(),
    st.one_of(st.none(), st.integers(1, 64)),
    st.sampled_from(list(Mode)),
)
def test_every_snapshot_gets_a_topology_its_cpus_and_k4_agree_with(
    machine: HardwareSnapshot, processes_per_node: int | None, mode: Mode
) -> None:
    machine = HardwareSnapshot.model_validate(machine.model_dump())
    profile = build_profile(
        machine,
        preferences=Preferences(mode=mode, processes_per_node=processes_per_node),
        now=NOW,
        host_id="test",
    )
    topology, s = profile.topology, profile.settings
    usable = machine.host.cpus_usable
    processes = topology.processes_per_node
    assert topology.device == s.device
    assert topology.cpus_per_process >= 1
    assert topology.cpus_per_process * processes <= max(usable, processes)
    if processes <= usable:
        assert topology.cpus_per_process == usable // processes
    if s.device == "mps":
        assert processes == 1
    elif processes_per_node is not None:
        assert processes == processes_per_node
    elif s.device == "cpu":
        assert processes == 1
    else:
        assert processes == len(target_accelerators(s, machine))
    assert (topology.devices_per_process == 0) is (s.device == "cpu")
    targets = target_accelerators(s, machine)
    k4 = (
        s.device == "cuda"
        and bool(targets)
        and all(a.vendor is Vendor.NVIDIA and a.tensor_cores is True for a in targets)
        and (s.precision.autocast or s.matmul.tf32)
    )
    assert topology.batch_multiple == (8 if k4 else 1)
    assert process_count(profile) == processes


# --- how the user sets it ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, 10**9])
def test_tune_refuses_a_process_count_no_machine_has(bad: object) -> None:
    with pytest.raises(ValueError, match="processes_per_node"):
        compose.check_tune_arguments(None, None, None, None, processes_per_node=bad)  # type: ignore[arg-type]


def test_recommend_takes_the_processes_per_node(tmp_path: Path) -> None:
    machine = str(SNAPSHOT_DIR / "a100-sxm4-80gb-8x.json")
    runner = CliRunner()
    args = ["recommend", "--snapshot", machine, "--json", "--store", str(tmp_path)]
    result = runner.invoke(cli, [*args, "--processes-per-node", "2"], prog_name="autotune")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["topology"]["processes_per_node"] == 2
    assert data["provenance"]["preferences"]["processes_per_node"] == 2
    refused = runner.invoke(cli, [*args, "--processes-per-node", "0"], prog_name="autotune")
    assert refused.exit_code == EXIT_USAGE
    assert "--processes-per-node" in refused.output


def test_autotune_offers_the_processes_per_node() -> None:
    result = CliRunner().invoke(cli, ["--help"], prog_name="autotune")
    assert "--processes-per-node" in result.output


# --- a whole run ------------------------------------------------------------------------------


def _simulated() -> Workload:
    """The conv workload without a dataset: no real DataLoader in these runs."""
    return dataclasses.replace(resolve_workload("conv"), dataset=None, name="simulated")


def test_a_run_for_two_processes_spreads_the_target_over_them() -> None:
    machine = cpu_machine(fixed_s=0.05, per_sample_s=0.002, first_s=0.3, autotune_s=0.0)
    profile = tune_on(
        machine,
        _simulated(),
        snapshot("cpu-laptop-linux"),
        budget_s=60,
        max_batch_size=64,
        target_global_batch=4096,
        processes_per_node=2,
    )
    assert profile.provenance.preferences.processes_per_node == 2
    assert profile.topology.processes_per_node == 2
    assert profile.batch_size == 64
    assert profile.grad_accum_steps == 32
    decision = profile.decision("batch.grad_accum_steps")
    assert decision is not None
    assert "batch 64 x 32 steps x 2 processes = a global batch of 4096" in decision.reason


def test_the_probe_rounds_its_sizes_to_the_topologys_multiple() -> None:
    """K4 on the simulated H100: every size the points measured is a multiple of 8."""
    profile = tune_on(SimulatedMachine(), _simulated(), snapshot("h100-80gb-hbm3"), mode="balanced")
    evidence = profile.evidence
    assert evidence is not None
    assert profile.topology.batch_multiple == 8
    sizes = {point.batch_size for point in evidence.throughput}
    assert sizes
    assert all(size % 8 == 0 for size in sizes), sizes
    assert evidence.batch_size % 8 == 0


@pytest.mark.parametrize("missing", ["settings", "provenance", "both"])
def test_a_profile_without_settings_or_provenance_is_refused_for_them(missing: str) -> None:
    """pydantic derives the missing topology even where a required field is missing: the
    profile is still refused, for that field, as one ProfileFileError."""
    data = json.loads(dump_profile(_profile("h100-80gb-hbm3"), "json"))
    del data["topology"]
    for key in ("settings", "provenance") if missing == "both" else (missing,):
        del data[key]
    with pytest.raises(
        ProfileFileError, match="settings" if missing != "provenance" else "provenance"
    ):
        parse_profile(json.dumps(data))
    with pytest.raises(ProfileFileError):
        parse_profile("{}")
