"""The job's pure parts: what the ranks measured combined into one outcome, DDP's options
(DP1-DP3), the ranks a node can run, the launcher's command line, who says what, the store's
job profiles by world size and ``recommend()`` under torchrun, the summary's ranks row."""

from __future__ import annotations

import dataclasses
import io
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from tests.rules.helpers import context_with, run, snapshot
from tests.test_bench import measured
from tests.test_integrations import no_cuda  # noqa: F401  # a fixture: libraries ask torch
from torch_autotune.api import recommend
from torch_autotune.cli import cli
from torch_autotune.cli.launch import LAUNCHED, quiet_rank, without_launch_options
from torch_autotune.detect import RecordedMachine
from torch_autotune.errors import (
    EXIT_USAGE,
    EXIT_WORKLOAD,
    LaunchError,
    RankFailedError,
    WorkloadError,
    WorldSizeWarning,
    user_code_failed,
)
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.integrations import (
    hf_notes,
    hf_training_arguments,
    lightning_notes,
    lightning_trainer_kwargs,
    render_accelerate,
    render_lightning,
)
from torch_autotune.launch import Ranks
from torch_autotune.probe.combine import combine_fed, combine_loads, combine_points, combine_trials
from torch_autotune.probe.fed import FedTrial
from torch_autotune.probe.loader import LoaderTrial
from torch_autotune.probe.search import TrialOutcome
from torch_autotune.probe.trials import PointOutcome
from torch_autotune.profile import Preferences, Profile, RanksRecord
from torch_autotune.render.results import render_run
from torch_autotune.rules.context import Finding, Measurements
from torch_autotune.rules.distributed import ddp
from torch_autotune.rules.engine import build_profile
from torch_autotune.store import ProfileStore
from torch_autotune.together import check_ranks

RANK_0 = Ranks(rank=0, local_rank=0, world_size=2, local_world_size=2, node_rank=0)
RANK_1 = Ranks(rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0)
TORCHRUN_2 = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}


# --- combining what the ranks measured ----------------------------------------------------------

trial_outcomes = st.builds(
    TrialOutcome,
    fits=st.booleans(),
    peak_memory_bytes=st.integers(1, 1 << 40),
    seconds=st.floats(0.001, 100.0),
    warmup_s=st.floats(0.0, 10.0),
    step_s=st.floats(0.001, 10.0),
)


@st.composite
def cpu_trials(draw: st.DrawFn) -> TrialOutcome:
    """A rank's trial on the CPU: what it held as it began, and its peak above that; one that
    failed with no peak ran out of memory, one with a peak took more than --memory-limit."""
    held = draw(st.integers(0, 1 << 34))
    peak = held + draw(st.integers(0, 1 << 34))
    fits = draw(st.booleans())
    if fits:
        return TrialOutcome(True, peak, 1.0, step_s=0.1, held_bytes=held)
    return TrialOutcome(False, draw(st.sampled_from([None, peak])))


@given(st.lists(trial_outcomes, min_size=1, max_size=8))
def test_a_trial_fits_only_where_it_fit_on_every_rank(found: list[TrialOutcome]) -> None:
    combined = combine_trials(found)
    assert combined.fits == all(t.fits for t in found)
    if combined.fits:  # DDP steps at its slowest rank's pace, and the fullest GPU decides
        assert combined.step_s == max(t.step_s for t in found if t.step_s is not None)
        assert combined.peak_memory_bytes == max(t.peak_memory_bytes or 0 for t in found)


@given(st.lists(cpu_trials(), min_size=1, max_size=8))
def test_the_cap_reads_the_rank_that_grew_most_and_a_rank_over_it_is_over_it(
    found: list[TrialOutcome],
) -> None:
    """A rank over the cap made the job's trial read 'ran out of memory', and the job's
    trials that fit said nothing of what the ranks held, so the cap was read against whole
    processes: the search of a job stopped below the sizes one process reached."""
    combined = combine_trials(found)
    failed = [t for t in found if not t.fits]
    if failed:
        over_cap = all(t.peak_memory_bytes is not None for t in failed)
        assert (combined.peak_memory_bytes is not None) == over_cap
        return
    peak, held = combined.peak_memory_bytes, combined.held_bytes
    assert peak is not None
    assert held is not None
    assert peak == max(t.peak_memory_bytes or 0 for t in found)
    assert peak - held == max((t.peak_memory_bytes or 0) - (t.held_bytes or 0) for t in found)


def _point(rate: float, *, steady: bool = True, fits: bool = True) -> PointOutcome:
    return PointOutcome(
        64,
        fits,
        samples_per_s=rate if fits else None,
        relative_spread=0.02,
        steady=steady,
        warmup_s=0.5,
        step_s=64 / rate,
        blocks=3,
        peak_memory_bytes=1000,
        seconds=2.0,
    )


def test_the_groups_rate_is_every_ranks_samples_together() -> None:
    combined = combine_points([_point(1000.0), _point(900.0)])
    assert combined.samples_per_s == 1900.0
    assert combined.step_s == pytest.approx(64 / 900.0)  # the slowest rank's step
    assert combined.steady


def test_a_point_is_steady_only_where_every_ranks_was() -> None:
    assert not combine_points([_point(1000.0), _point(900.0, steady=False)]).steady


def test_a_point_one_rank_could_not_train_did_not_fit() -> None:
    combined = combine_points([_point(1000.0), _point(1.0, fits=False)])
    assert not combined.fits
    assert combined.samples_per_s is None


def test_the_dataloader_feeds_the_group_as_fast_as_its_slowest_rank() -> None:
    loads = [LoaderTrial(2, 5000.0, 20, 640, 1.0), LoaderTrial(2, 3000.0, 12, 384, 1.0)]
    assert combine_loads(loads).samples_per_s == 6000.0
    failed = LoaderTrial(2, None, 0, 0, 0.5, error="a worker died")
    assert combine_loads([loads[0], failed]).error == "a worker died"
    fed = [FedTrial(64, 2, 1, 800.0, 3.0), FedTrial(64, 2, 1, 700.0, 3.2)]
    assert combine_fed(fed) == FedTrial(64, 2, 1, 1400.0, 3.2)


# --- DDP's options (DP1-DP3) --------------------------------------------------------------------


def _ddp(measurements: Measurements | None = None, **preferences: object) -> dict[str, Finding]:
    return run(context_with("a100-sxm4-80gb-8x", measurements, **preferences), ddp)


def test_one_process_keeps_ddps_defaults_and_says_why() -> None:
    found = _ddp(processes_per_node=1)
    assert [f.value for f in found.values()] == [False, False, False, False]
    for finding in found.values():
        assert "one training process" in finding.reason


def test_eight_ranks_take_gradients_as_bucket_views() -> None:
    found = _ddp()
    view = found["ddp.gradient_as_bucket_view"]
    assert view.value is True
    assert view.reason.startswith("on: the 8 ranks (1 node(s) x 8) each hold")
    assert found["ddp.static_graph"].value is False


@pytest.mark.parametrize(
    ("unused", "value", "says"),
    [
        (None, False, "not measured: run autotune under torchrun"),
        (0, False, "every parameter got a gradient in the model's first step"),
        (3, True, "the model's first step left 3 parameter(s) without a gradient"),
    ],
)
def test_unused_parameters_as_the_first_step_found_them(
    unused: int | None, value: bool, says: str
) -> None:
    finding = _ddp(Measurements(unused_parameters=unused))["ddp.find_unused_parameters"]
    assert finding.value is value
    assert says in finding.reason


# --- the ranks a node can run -------------------------------------------------------------------


def test_two_ranks_on_one_gpu_are_refused_in_one_line() -> None:
    one_gpu = build_profile(snapshot("h100-80gb-hbm3"), preferences=Preferences())
    with pytest.raises(LaunchError) as raised:
        check_ranks(2, one_gpu)
    assert str(raised.value) == (
        "2 training processes on this node but 1 GPU(s): NCCL refuses two ranks on one GPU (one"
        " process drives one GPU); start one per GPU: torchrun --nproc-per-node=1 (or autotune"
        " --nproc-per-node 1)"
    )
    assert raised.value.exit_code == EXIT_USAGE


def test_one_rank_per_gpu_and_ranks_on_the_cpu_run() -> None:
    check_ranks(8, build_profile(snapshot("a100-sxm4-80gb-8x"), preferences=Preferences()))
    check_ranks(2, build_profile(snapshot("cpu-laptop-linux"), preferences=Preferences()))


# --- the launcher's command line, and who says what ---------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "kept"),
    [
        (["-m", "mlp", "--nproc-per-node", "2"], ["-m", "mlp"]),
        (["--nproc-per-node=2", "--budget", "30"], ["--budget", "30"]),
        (["--nnodes", "2", "--rdzv-endpoint", "h:1", "--no-save"], ["--no-save"]),
    ],
)
def test_the_ranks_run_the_command_line_less_the_launch_options(
    arguments: list[str], kept: list[str]
) -> None:
    assert without_launch_options(arguments) == kept


def test_several_nodes_get_the_torchrun_line_each_runs() -> None:
    done = CliRunner().invoke(
        cli,
        ["-m", "resnet50", "--nproc-per-node", "8", "--nnodes", "4", "--rdzv-endpoint", "n1:29500"],
    )
    assert done.exit_code == 0, done.output
    line = (
        "torchrun --nnodes=4 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=n1:29500 "
        "--rdzv-id=autotune --max-restarts=0 -m torch_autotune -m resnet50"
    )
    assert done.output.splitlines() == [
        "# run on each of the 4 nodes (the same line), e.g. under SLURM:",
        f"# srun --nodes=4 --ntasks-per-node=1 {line}",
        line,
    ]


def test_nproc_per_node_inside_a_torchrun_rank_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in TORCHRUN_2.items():
        monkeypatch.setenv(name, value)
    done = CliRunner().invoke(cli, ["-m", "mlp", "--nproc-per-node", "2"])
    assert done.exit_code == EXIT_USAGE
    assert "already one of torchrun's ranks" in done.output


@pytest.mark.parametrize("asked", [1, 4])
def test_processes_per_node_other_than_torchruns_is_refused(
    asked: int, monkeypatch: pytest.MonkeyPatch, detected_as: Callable[[str], HardwareSnapshot]
) -> None:
    """2 ranks told they were 1 failed an assertion after the whole probe (exit 1); told they
    were 4, they saved a profile of a job of 4 that recommend() would serve as measured."""
    detected_as("cpu-laptop-linux")  # here and on a GPU machine
    for name, value in TORCHRUN_2.items():
        monkeypatch.setenv(name, value)
    done = CliRunner().invoke(cli, ["-m", "mlp", "--processes-per-node", str(asked)])
    assert done.exit_code == EXIT_USAGE
    assert done.output.splitlines()[-1] == (
        f"autotune: error: --processes-per-node {asked}, but torchrun started 2 on this node:"
        f" the job's ranks measure the job they are; leave it out, or start {asked}"
    )
    assert "Traceback" not in done.output


def test_ctrl_c_to_the_launcher_is_an_interruption_not_a_bug(
    monkeypatch: pytest.MonkeyPatch, detected_as: Callable[[str], HardwareSnapshot]
) -> None:
    """torchrun's agent takes Ctrl-C as its own exception once its ranks are ended: it was
    reported as an internal error (exit 1, torch's traceback) where one process exits 130."""
    detected_as("cpu-laptop-linux")  # here and on a GPU machine
    import signal

    import torch.distributed.run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from torch_autotune.errors import EXIT_INTERRUPTED

    def interrupted(_args: object) -> None:
        raise SignalException("Process 1 got signal: 2", sigval=signal.SIGINT)

    monkeypatch.setattr(torch.distributed.run, "run", interrupted)
    done = CliRunner().invoke(cli, ["-m", "mlp", "--nproc-per-node", "2", "--no-save"])
    assert done.exit_code == EXIT_INTERRUPTED
    assert done.output == "autotune: interrupted\n"


def test_who_says_what(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LAUNCHED, raising=False)
    killed = RankFailedError("a rank stopped without a word")
    said = RankFailedError("rank 1 failed: ...", said=True)
    assert not quiet_rank(None)  # one process: everything
    assert quiet_rank(RANK_1)  # a rank other than 0 reports nothing
    assert not quiet_rank(RANK_0)
    assert quiet_rank(RANK_1, LaunchError("two ranks on one GPU"))  # rank 0 says it
    assert not quiet_rank(RANK_0, LaunchError("two ranks on one GPU"))
    assert not quiet_rank(RANK_0, killed)  # no one else can say it
    assert quiet_rank(RANK_0, said)  # rank 1 said it itself
    monkeypatch.setenv(LAUNCHED, "1")
    assert quiet_rank(RANK_0, killed)  # the launcher says it


def test_a_rank_other_than_0_says_its_own_factory_failing_with_its_rank(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    """A factory that raised on rank 1 alone: rank 1 said nothing (rank 0 says what every rank
    meets alike), rank 0 never met it and torchrun ended it, so the job exited 5 in silence."""
    try:
        raise RuntimeError("no shard for rank 1")
    except RuntimeError as theirs:
        built = user_code_failed("'pkg:f' raised RuntimeError: no shard for rank 1", theirs)
        built.__cause__ = theirs
    assert not quiet_rank(RANK_1, built)
    assert quiet_rank(RANK_1, WorkloadError("'pkg:f' is not a module:function"))  # alike: rank 0
    (tmp_path / "onrank.py").write_text(
        "import os\n"
        "def make_workload():\n"
        "    if os.environ.get('RANK') == '1':\n"
        "        raise RuntimeError('no shard for rank 1')\n"
        "    return 'mlp'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    detected_as("cpu-laptop-linux")  # trains on the CPU, also on a machine with a GPU
    for name, value in {**TORCHRUN_2, "RANK": "1", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(cli, ["-m", "onrank:make_workload", "--budget", "10"])
    assert result.exit_code == EXIT_WORKLOAD, result.output
    assert "RuntimeError: no shard for rank 1" in result.stderr  # their traceback
    assert result.stderr.splitlines()[-1] == (
        "autotune: error: rank 1: 'onrank:make_workload' raised RuntimeError: no shard for rank "
        "1; fix the factory"
    )


# --- the store and recommend() under torchrun ---------------------------------------------------


def _job_profile(world: int) -> Profile:
    """A measured profile of ``world`` ranks (1: one process) on the laptop's fingerprint."""
    return measured(snapshot("cpu-laptop-linux"), workload="mlp") if world == 1 else _ranks(world)


def _ranks(world: int) -> Profile:
    """A profile of a job of ``world`` ranks, measured as the laptop's single process was."""
    machine = snapshot("cpu-laptop-linux")
    alone = measured(machine, workload="mlp")
    preferences = alone.provenance.preferences.model_copy(update={"processes_per_node": world})
    assert alone.evidence is not None
    return build_profile(
        machine,
        Measurements(batch_size=alone.evidence.batch_size, num_workers=0),
        preferences,
        evidence=alone.evidence,
    )


def test_a_jobs_profile_is_stored_beside_the_single_process_one(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path)
    alone, job = _job_profile(1), _job_profile(2)
    fingerprint = alone.provenance.fingerprint
    assert store.save(alone) == tmp_path / "profiles" / fingerprint / "mlp.json"
    assert store.save(job) == tmp_path / "profiles" / fingerprint / "world-2" / "mlp.json"
    assert (tmp_path / "profiles" / fingerprint / "world-2.json").exists()
    assert store.load(fingerprint, "mlp") == alone  # the job did not replace it
    assert store.load(fingerprint, "mlp", world=2) == job
    assert store.load(fingerprint, world=2) == job
    assert store.load(fingerprint, "mlp", world=4) is None


def test_show_outside_the_job_says_where_the_jobs_profile_is(tmp_path: Path) -> None:
    """After `autotune --nproc-per-node 2 -m mlp`, `autotune show -m mlp` said 'no profile
    measured on mlp (measured here: mlp)': the job's machine file counted as one process's,
    and nothing said where the job's profile was."""
    from tests.conftest import SNAPSHOT_DIR

    job = _job_profile(2)
    saved = ProfileStore(tmp_path).save(job)
    laptop = str(SNAPSHOT_DIR / "cpu-laptop-linux.json")
    done = CliRunner().invoke(
        cli, ["show", "-m", "mlp", "--snapshot", laptop, "--store", str(tmp_path)]
    )
    assert done.exit_code == 0
    note = next(line for line in done.output.splitlines() if "no profile measured" in line)
    assert "measured here" not in note
    assert f"one for a job of 2 ranks is stored ({saved})" in note
    given = CliRunner().invoke(cli, ["export", "--profile", str(saved), "--format", "lightning"])
    assert given.exit_code == 0, given.output
    assert "devices: 2" in given.output


def test_recommend_under_torchrun_returns_the_jobs_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ProfileStore(tmp_path).save(_job_profile(1))
    ProfileStore(tmp_path).save(_job_profile(2))
    for name, value in TORCHRUN_2.items():
        monkeypatch.setenv(name, value)
    machine = RecordedMachine(snapshot("cpu-laptop-linux"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        profile = recommend(workload="mlp", store=tmp_path, machine=machine)
    assert profile.topology.world_size == 2


def test_recommend_under_torchrun_warns_where_only_one_processs_profile_is_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone = _job_profile(1)
    ProfileStore(tmp_path).save(alone)
    for name, value in TORCHRUN_2.items():
        monkeypatch.setenv(name, value)
    machine = RecordedMachine(snapshot("cpu-laptop-linux"))
    with pytest.warns(WorldSizeWarning, match="no profile for a job of 2 ranks is stored"):
        profile = recommend(workload="mlp", store=tmp_path, machine=machine)
    assert profile == alone


def test_recommend_under_torchrun_with_nothing_stored_gives_the_jobs_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in TORCHRUN_2.items():
        monkeypatch.setenv(name, value)
    profile = recommend(store=tmp_path, machine=RecordedMachine(snapshot("cpu-laptop-linux")))
    assert not profile.measured
    assert (profile.topology.world_size, profile.topology.backend) == (2, "gloo")
    assert profile.settings.ddp.gradient_as_bucket_view


# --- the summary's ranks row --------------------------------------------------------------------


def _two_ranks(
    together: float, alone: float, *, devices: tuple[str, ...] = ("cpu", "cpu"), wait_s: float = 1.0
) -> RanksRecord:
    """How 2 ranks on one node probed together: the group's rate and rank 0's alone."""
    return RanksRecord(
        world_size=2,
        nodes=1,
        backend="gloo",
        devices=devices,
        group_samples_per_s=together,
        one_rank_samples_per_s=alone,
        unused_parameters=0,
        wait_s=wait_s,
    )


@pytest.mark.parametrize(("together", "warned"), [(93_861.0, True), (400_000.0, False)])
def test_a_job_slower_than_one_rank_alone_is_warned_of(together: float, warned: bool) -> None:
    """0.13 of 2 x rank 0 alone was said in the ranks row alone, with no word that one
    process trains faster than the job."""
    from torch_autotune.together import _slower_together

    record = _two_ranks(together, 371_565.0)
    said = _slower_together(record)
    assert (said is not None) == warned
    if said is not None:
        assert said == (
            "the 2 ranks together trained 93,861 samples/s, fewer than rank 0 alone at the same"
            " batch (371,565 samples/s): on this machine one process trains faster than this"
            " job (its ranks share the CPU's cores)"
        )


def test_a_slow_jobs_warning_gives_rates_below_one_as_they_are() -> None:
    from torch_autotune.together import _slower_together

    record = _two_ranks(0.42, 0.61, devices=("cuda:0", "cuda:1"))
    said = _slower_together(record)
    assert said is not None
    assert "trained 0.42 samples/s, fewer than rank 0 alone at the same batch (0.61" in said
    assert "share the CPU" not in said


def test_the_summary_says_the_global_batch_and_the_scaling() -> None:
    job = _ranks(2)
    assert job.evidence is not None
    record = _two_ranks(9000.0, 5000.0, wait_s=130.0)
    job = job.model_copy(update={"evidence": job.evidence.model_copy(update={"ranks": record})})
    out = io.StringIO()
    render_run(job, Console(file=out, width=400, color_system=None), saved=None)
    row = next(line for line in out.getvalue().splitlines() if line.startswith("ranks "))
    assert row.split(None, 1)[1] == (
        "2 (1 node x 2, gloo, cpu); batch 256 a rank, 512 a step together, 9,000 samples/s "
        "together, 0.90 of 2 x rank 0 alone (5,000 samples/s); DDP: gradient_as_bucket_view"
    )
    assert record.scaling_efficiency == pytest.approx(0.9)


# --- the job's exports --------------------------------------------------------------------------


def _eight_by_two(*, unused: int = 0) -> Profile:
    """A measured profile of 2 nodes of 8 A100s whose first step left ``unused`` parameters."""
    alone = measured("a100-sxm4-80gb-8x", workload="mlp")
    preferences = alone.provenance.preferences.model_copy(update={"nodes": 2})
    assert alone.evidence is not None
    return build_profile(
        alone.provenance.snapshot,
        Measurements(batch_size=alone.evidence.batch_size, num_workers=4, unused_parameters=unused),
        preferences,
        evidence=alone.evidence,
    )


def test_lightning_gets_the_strategy_the_devices_and_the_nodes() -> None:
    kwargs = lightning_trainer_kwargs(_eight_by_two())
    assert (kwargs["devices"], kwargs["num_nodes"], kwargs["strategy"]) == (8, 2, "ddp")
    unused = lightning_trainer_kwargs(_eight_by_two(unused=2))
    assert unused["strategy"] == "ddp_find_unused_parameters_true"
    note = next(n for n in lightning_notes(_eight_by_two()) if "DDPStrategy" in n)
    assert "DDPStrategy(gradient_as_bucket_view=True)" in note
    assert "strategy" not in lightning_trainer_kwargs(measured("h100-80gb-hbm3"))


@pytest.mark.slow  # imports Lightning and builds a Trainer: seconds
@pytest.mark.usefixtures("no_cuda")
def test_lightnings_trainer_takes_a_jobs_strategy(tmp_path: Path) -> None:
    """Lightning's DDP over gloo on this CPU, 2 devices: built, not launched."""
    lightning = pytest.importorskip("lightning.pytorch")
    job = _ranks(2)
    kwargs = yaml.safe_load(render_lightning(job))["trainer"]
    assert (kwargs["accelerator"], kwargs["devices"], kwargs["strategy"]) == ("cpu", 2, "ddp")
    trainer = lightning.Trainer(**kwargs, default_root_dir=tmp_path, logger=False)
    assert type(trainer.strategy).__name__ == "DDPStrategy"
    assert trainer.num_devices == 2
    assert trainer.num_nodes == 1


def test_accelerate_counts_every_machines_processes(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    job = _eight_by_two()
    path = tmp_path / "accelerate.yaml"
    path.write_text(render_accelerate(job))
    config = load_config_from_file(str(path))
    assert config.distributed_type is DistributedType.MULTI_GPU
    assert (config.num_processes, config.num_machines) == (16, 2)
    assert "DistributedDataParallelKwargs(gradient_as_bucket_view=True)" in path.read_text()
    assert "machine_rank and main_process_ip" in path.read_text()


def test_training_arguments_take_the_jobs_ddp_options() -> None:
    transformers = pytest.importorskip("transformers")
    kwargs = hf_training_arguments(_ranks(2))
    assert kwargs["ddp_backend"] == "gloo"
    assert kwargs["ddp_find_unused_parameters"] is False
    assert kwargs["ddp_static_graph"] is False
    # built under torchrun only (with ddp_backend it sets up the process group): its fields
    fields = {f.name: f for f in dataclasses.fields(transformers.TrainingArguments)}
    assert set(kwargs) <= set(fields)
    backends = fields["ddp_backend"].metadata.get("choices", ["gloo", "nccl"])
    assert {"gloo", "nccl"} <= set(backends)
    assert any("gradient_as_bucket_view" in note for note in hf_notes(_ranks(2)))
    gpu_job = hf_training_arguments(_eight_by_two(unused=1))
    assert (gpu_job["ddp_backend"], gpu_job["ddp_find_unused_parameters"]) == ("nccl", True)
    assert "ddp_backend" not in hf_training_arguments(measured("h100-80gb-hbm3"))


# --- FSDP2 where DDP does not fit (DP4) ---------------------------------------------------------


def test_a_sharded_job_keeps_ddps_defaults_and_says_why() -> None:
    reason = "DDP did not train batch 1 on every rank (...); sharded ... was 32"
    found = _ddp(Measurements(fsdp_reason=reason, unused_parameters=0))
    assert found["fsdp.enabled"].value is True
    assert found["fsdp.enabled"].reason == f"on: {reason}"
    for setting in (
        "ddp.gradient_as_bucket_view",
        "ddp.static_graph",
        "ddp.find_unused_parameters",
    ):
        assert found[setting].value is False
        assert "FSDP2 shards the model in place of DDP (DP4)" in found[setting].reason
    assert _ddp()["fsdp.enabled"].value is False  # DDP fits: FSDP2 is not measured


def test_the_repeated_block_is_what_fsdp2_shards() -> None:
    torch = pytest.importorskip("torch")
    from torch import nn

    from tests.ranks_workloads import TooBigForDdp
    from torch_autotune.wrapping import repeated_blocks

    model = TooBigForDdp()
    blocks = repeated_blocks(model)
    assert [type(b).__name__ for b in blocks] == ["_Block"] * 3  # not their Linear layers
    assert blocks == list(reversed(list(model.blocks)))  # deepest (last) first
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    assert repeated_blocks(mlp) == [mlp[2], mlp[0]]  # the Linear layers repeat; ReLU holds none
    assert repeated_blocks(nn.Linear(3, 3)) == []
    assert torch.is_tensor(next(model.parameters()))


def test_a_model_neither_ddp_nor_fsdp2_trains_says_both() -> None:
    from torch_autotune.errors import DoesNotFitError
    from torch_autotune.together import _ddp_or_fsdp

    tried: list[bool] = []

    def probe(profile: Profile) -> object:
        tried.append(profile.settings.fsdp.enabled)
        message = "the big workload does not train even at batch size 1 on cuda: it runs out"
        raise DoesNotFitError(message, batch_size=1)

    rules_only = build_profile(snapshot("a100-sxm4-80gb-8x"), preferences=Preferences())
    with pytest.raises(DoesNotFitError) as raised:
        _ddp_or_fsdp(probe, rules_only, Ranks(0, 0, 8, 8, 0))  # type: ignore[arg-type]
    assert tried == [False, True]
    assert str(raised.value) == (
        "the big workload does not train even at batch size 1 on cuda in DDP, nor sharded with"
        " FSDP2 over the 8 ranks (batch 1): it runs out of memory; use a smaller model, more"
        " ranks or larger devices"
    )
    assert raised.value.exit_code == 7


def test_the_exports_of_a_sharded_job(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    job = _eight_by_two()
    settings = job.settings.model_copy(
        update={"fsdp": job.settings.fsdp.model_copy(update={"enabled": True})}
    )
    sharded = job.model_copy(update={"settings": settings})
    kwargs = lightning_trainer_kwargs(sharded)
    assert "strategy" not in kwargs  # Lightning's "fsdp" is FSDP1, which was not measured
    assert any("ModelParallelStrategy" in note for note in lightning_notes(sharded))
    path = tmp_path / "accelerate.yaml"
    path.write_text(render_accelerate(sharded))
    config = load_config_from_file(str(path))
    assert config.distributed_type is DistributedType.FSDP
    assert config.fsdp_config["fsdp_version"] == 2
    assert any("FSDP2" in note for note in hf_notes(sharded))
