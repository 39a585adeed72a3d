"""Exports for Lightning, Hugging Face, accelerate and the shell, checked against the real APIs.

Profiles come from recorded snapshots through the rules engine. Where a library is installed
(the ``integrations`` extra), its own constructors and loaders judge the export: CPU profiles
are constructed for real; GPU profiles, which cannot be constructed on a machine without a GPU,
are checked against the parameters and values the library declares.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import subprocess
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner, Result

from torch_autotune.cli import cli
from torch_autotune.evidence import WorkloadDetails
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.integrations import (
    EXPORT_FORMATS,
    accelerate_config,
    hf_notes,
    hf_optim,
    hf_training_arguments,
    lightning_data_kwargs,
    lightning_notes,
    lightning_trainer_kwargs,
    render_accelerate,
    render_env,
    render_hf,
    render_lightning,
)
from torch_autotune.profile import Decision, Mode, Preferences, Profile
from torch_autotune.rules.engine import build_profile
from torch_autotune.settings import Source

from .batchnorm import with_batch_one_raising
from .probe.fake_trials import mlp_machine, tune_on

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"

# (snapshot, mode): bf16 + TF32 + compile; fp16; CPU; 8 GPUs; deterministic; ROCm; MPS.
CASES = {
    "h100": ("h100-80gb-hbm3", Mode.SPEED),
    "t4": ("tesla-t4", Mode.SPEED),
    "cpu": ("cpu-laptop-linux", Mode.SPEED),
    "a100-8x": ("a100-sxm4-80gb-8x", Mode.SPEED),
    "h100-reproducible": ("h100-80gb-hbm3", Mode.REPRODUCIBLE),
    "cpu-reproducible": ("cpu-laptop-linux", Mode.REPRODUCIBLE),
    "mi300x": ("mi300x-rocm", Mode.SPEED),
    "m2-mps": ("apple-m2-pro-mps", Mode.SPEED),
}
CPU_CASES = ["cpu", "cpu-reproducible"]
GPU_CASES = [name for name in CASES if name not in CPU_CASES]


def profile_for(case: str) -> Profile:
    name, mode = CASES[case]
    snapshot = HardwareSnapshot.model_validate_json((SNAPSHOTS / f"{name}.json").read_text())
    return build_profile(snapshot, preferences=Preferences(mode=mode))


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="autotune")


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without CUDA, for libraries that ask torch while constructing (a fake)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


# --- the values, without any library ------------------------------------------------------------


def test_export_formats_are_the_cli_choices() -> None:
    assert list(EXPORT_FORMATS) == ["lightning", "hf", "accelerate", "env"]
    command = cli.commands["export"]
    choice = next(p for p in command.params if p.name == "fmt").type
    assert isinstance(choice, click.Choice)
    assert list(choice.choices) == ["yaml", "json", *EXPORT_FORMATS]


@pytest.mark.child_process
def test_integrations_import_no_training_library() -> None:
    code = (
        "import sys, torch_autotune.integrations; "
        "print([m for m in ('lightning', 'transformers', 'accelerate', 'torch', 'yaml') "
        "if m in sys.modules])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("h100", {"accelerator": "gpu", "devices": 1, "precision": "bf16-mixed"}),
        ("t4", {"accelerator": "gpu", "devices": 1, "precision": "16-mixed"}),
        ("cpu", {"accelerator": "cpu", "devices": 1, "precision": "32-true"}),
        ("a100-8x", {"accelerator": "gpu", "devices": 8, "precision": "bf16-mixed"}),
        ("m2-mps", {"accelerator": "mps", "devices": 1, "precision": "bf16-mixed"}),
        ("h100-reproducible", {"deterministic": True, "benchmark": False}),
    ],
)
def test_lightning_values(case: str, expected: dict[str, Any]) -> None:
    kwargs = lightning_trainer_kwargs(profile_for(case))
    assert {k: kwargs[k] for k in expected} == expected


def test_lightning_comments_carry_what_trainer_cannot_set() -> None:
    text = render_lightning(profile_for("h100"))
    assert "num_workers=8" in text
    assert "torch.compile(model, mode='default')" in text
    assert "fused=True" in text
    assert yaml.safe_load(text) == {"trainer": lightning_trainer_kwargs(profile_for("h100"))}


@functools.cache
def _measured() -> Profile:
    """A profile measured on this CPU's recorded twin (fake steps, real DataLoaders: ms)."""
    name, _mode = CASES["cpu"]
    snapshot = HardwareSnapshot.model_validate_json((SNAPSHOTS / f"{name}.json").read_text())
    return tune_on(mlp_machine(), "mlp", snapshot, budget_s=10, max_batch_size=64)


def measured_on(workers: int = 0, **details: Any) -> Profile:
    """That profile as if measured on a Lightning workload with ``details``, at ``workers``."""
    profile = _measured()
    assert profile.evidence is not None
    found = WorkloadDetails(source="objects", batch="16 float32", framework="lightning", **details)
    loader = profile.settings.dataloader.model_copy(
        update={"num_workers": workers, "persistent_workers": workers > 0}
    )
    settings = profile.settings.model_copy(update={"dataloader": loader})
    return profile.model_copy(
        update={
            "evidence": profile.evidence.model_copy(update={"details": found}),
            "settings": settings,
        }
    )


def test_lightning_data_section_sets_the_datamodules_own_arguments() -> None:
    profile = measured_on(workers=2, loader_arguments=("batch_size", "num_workers"))
    text = render_lightning(profile)
    config = yaml.safe_load(text)
    batch = profile.settings.batch.batch_size
    assert config["data"] == {"batch_size": batch, "num_workers": 2}
    assert config["trainer"] == lightning_trainer_kwargs(profile)
    assert "class_path (--config yours.yaml --config THIS.yaml)" in text
    loader_note = next(n for n in lightning_notes(profile) if n.startswith("DataLoader("))
    assert "batch_size" not in loader_note
    assert "persistent_workers=True" in loader_note
    assert "the DataModule's __init__ takes no argument for them" in loader_note


def test_lightning_data_section_turns_persistent_workers_off_without_workers() -> None:
    """torch refuses persistent workers without any: a DataModule defaulting to them would
    fail at the profile's 0 workers unless the export says so."""
    taken = ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
    data = lightning_data_kwargs(measured_on(workers=0, loader_arguments=taken))
    assert data["num_workers"] == 0
    assert data["persistent_workers"] is False
    assert "prefetch_factor" not in data
    assert not any(
        n.startswith("DataLoader(") for n in lightning_notes(measured_on(0, loader_arguments=taken))
    )


WITHOUT_DATA: dict[str, tuple[Callable[[], Profile], str]] = {
    "rules only": (lambda: profile_for("cpu"), "a data: section needs a profile measured on your"),
    "a built-in": (_measured, "a data: section needs a profile measured on your"),
    "lightning": (measured_on, "measured without a DataModule whose __init__ takes them"),
}


@pytest.mark.parametrize("case", WITHOUT_DATA)
def test_without_a_datamodule_that_takes_them_the_loader_stays_a_note_that_says_why(
    case: str,
) -> None:
    make, why = WITHOUT_DATA[case]
    profile = make()
    assert lightning_data_kwargs(profile) == {}
    text = render_lightning(profile)
    assert "data" not in yaml.safe_load(text)
    assert why in text


def test_the_compile_note_is_the_compile_the_probe_measured() -> None:
    note = next(n for n in lightning_notes(profile_for("h100")) if "torch.compile" in n)
    assert "before trainer.fit(model)" in note
    assert "compiles training_step" in note


def test_hf_values_follow_the_profile() -> None:
    h100 = hf_training_arguments(profile_for("h100"))
    assert h100["bf16"] is True
    assert h100["fp16"] is False
    assert h100["tf32"] is True
    assert h100["torch_compile"] is True
    assert h100["torch_compile_mode"] == "default"
    assert h100["optim"] == "adamw_torch_fused"
    assert "per_device_train_batch_size" not in h100  # rules only: no measured batch size
    assert "seed" not in h100
    t4 = hf_training_arguments(profile_for("t4"))
    assert (t4["fp16"], t4["bf16"], t4["tf32"]) == (True, False, None)
    reproducible = hf_training_arguments(profile_for("h100-reproducible"))
    assert reproducible["full_determinism"] is True
    assert reproducible["seed"] == 0
    assert reproducible["torch_compile"] is False
    assert "torch_compile_mode" not in reproducible
    cpu = hf_training_arguments(profile_for("cpu"))
    assert cpu["use_cpu"] is True
    assert "optim" not in cpu  # the CPU keeps torch's kernel unmeasured: transformers' stands
    assert json.loads(render_hf(profile_for("h100"))) == h100


def _with_optimizer(case: str, optimizer: str) -> Profile:
    name, mode = CASES[case]
    snapshot = HardwareSnapshot.model_validate_json((SNAPSHOTS / f"{name}.json").read_text())
    return build_profile(snapshot, preferences=Preferences(mode=mode, optimizer=optimizer))


def _fused_dropped_by_the_bench(profile: Profile) -> Profile:
    """``profile`` as the bench leaves it when the fused kernel measured slower (rule M1)."""
    optimizer = profile.settings.optimizer.model_copy(update={"fused": False})
    settings = profile.settings.model_copy(update={"optimizer": optimizer})
    drop = Decision(
        setting="optimizer.fused",
        value=False,
        rule="M1",
        reason="0.97x (0.96-0.98 over 5 rounds) slower with it",
        source=Source.MEASURED,
    )
    return profile.model_copy(
        update={"settings": settings, "decisions": (*profile.decisions, drop)}
    )


@pytest.mark.parametrize(
    ("case", "optimizer", "expected", "note"),
    [
        ("h100", "adamw", "adamw_torch_fused", None),  # rule I2 fused it
        ("h100", "sgd", None, "measured with SGD"),  # an AdamW optim would replace SGD
        ("h100", "adam", None, "measured with Adam,"),
        ("h100", "other", None, "measured with another optimizer, not AdamW"),
        ("cpu", "adamw", None, "(rule I3)"),  # unmeasured: transformers' default stands
        ("m2-mps", "adamw", None, "(rule I4)"),
    ],
)
def test_hf_optim_is_written_only_where_the_profile_decided_it(
    case: str, optimizer: str, expected: str | None, note: str | None
) -> None:
    profile = _with_optimizer(case, optimizer)
    args = hf_training_arguments(profile)
    assert args.get("optim") == expected
    assert hf_optim(profile) == expected
    said = [n for n in hf_notes(profile) if n.startswith("optim left out")]
    if note is None:
        assert said == []
    else:
        assert len(said) == 1
        assert note in said[0]


def test_hf_optim_is_torch_s_kernel_where_the_bench_measured_the_fused_one_slower() -> None:
    profile = _fused_dropped_by_the_bench(_with_optimizer("h100", "adamw"))
    assert hf_training_arguments(profile)["optim"] == "adamw_torch"
    assert not any(n.startswith("optim left out") for n in hf_notes(profile))
    sgd = _fused_dropped_by_the_bench(_with_optimizer("h100", "sgd"))
    assert "optim" not in hf_training_arguments(sgd)  # measured, but not an AdamW workload


@pytest.mark.usefixtures("no_cuda")
def test_training_arguments_keep_transformers_default_optim_where_none_is_written(
    tmp_path: Path,
) -> None:
    transformers = pytest.importorskip("transformers")
    kwargs = hf_training_arguments(_with_optimizer("cpu", "sgd"))
    assert "optim" not in kwargs
    args = transformers.TrainingArguments(output_dir=str(tmp_path), **kwargs)
    default = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    assert args.optim == default.optim


def test_hf_loader_keys_only_with_workers() -> None:
    profile = profile_for("cpu")
    dl = profile.settings.dataloader.model_copy(
        update={"num_workers": 0, "persistent_workers": False}
    )
    settings = profile.settings.model_copy(update={"dataloader": dl})
    args = hf_training_arguments(profile.model_copy(update={"settings": settings}))
    assert args["dataloader_num_workers"] == 0
    assert "dataloader_persistent_workers" not in args
    assert "dataloader_prefetch_factor" not in args


@pytest.mark.parametrize(
    ("case", "distributed", "processes", "precision"),
    [
        ("h100", "NO", 1, "bf16"),
        ("t4", "NO", 1, "fp16"),
        ("cpu", "NO", 1, "no"),
        ("a100-8x", "MULTI_GPU", 8, "bf16"),
    ],
)
def test_accelerate_values(case: str, distributed: str, processes: int, precision: str) -> None:
    config = accelerate_config(profile_for(case))
    assert config["distributed_type"] == distributed
    assert config["num_processes"] == processes
    assert config["mixed_precision"] == precision
    assert config["use_cpu"] is (case == "cpu")
    assert yaml.safe_load(render_accelerate(profile_for(case))) == config


def test_accelerate_dynamo_only_with_compile() -> None:
    assert accelerate_config(profile_for("h100"))["dynamo_config"] == {
        "dynamo_backend": "INDUCTOR",
        "dynamo_mode": "default",
    }
    assert "dynamo_config" not in accelerate_config(profile_for("h100-reproducible"))


# --- shell environment --------------------------------------------------------------------------


def _sourced(path: Path | None) -> dict[str, str]:
    """The environment a clean bash has after sourcing ``path`` (nothing sourced: None)."""
    script = f"source {path}; env -0" if path else "env -0"
    out = subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", "bash", "-c", script],
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if item)


def _set_by(text: str, tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "env.sh"
    path.write_text(text)
    before, after = _sourced(None), _sourced(path)
    return {k: v for k, v in after.items() if before.get(k) != v}


@pytest.mark.parametrize("case", ["a100-8x", "h100-reproducible", "mi300x", "cpu"])
def test_env_sets_exactly_the_profile_variables(case: str, tmp_path: Path) -> None:
    profile = profile_for(case)
    text = render_env(profile)
    assert text.startswith("#")
    assert ("before starting Python" in text) == bool(profile.settings.environment)
    assert _set_by(text, tmp_path) == dict(profile.settings.environment)


def test_env_says_what_reads_the_variables_it_exports() -> None:
    """A CPU profile's threads are OpenMP's and MKL's: its header once said 'CUDA reads them'."""

    def exporting(case: str, **environment: str) -> str:
        profile = profile_for(case)
        settings = profile.settings.model_copy(update={"environment": environment})
        return render_env(profile.model_copy(update={"settings": settings}))

    cpu = exporting("cpu", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    assert "MKL and OpenMP read them once, each when it starts in the process." in cpu
    assert "CUDA" not in cpu
    gpu = exporting("h100", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    assert "CUDA's caching allocator reads it once, when it starts in the process." in gpu


def test_env_says_when_there_is_nothing_to_export() -> None:
    text = render_env(profile_for("cpu"))
    assert "nothing to export" in text
    assert "export " not in text


def test_env_quotes_hostile_values(tmp_path: Path) -> None:
    profile = profile_for("h100")
    hostile = "expandable_segments:True $(touch pwned) `id` 'quoted' \"x\"; exit 1"
    settings = profile.settings.model_copy(
        update={"environment": {"PYTORCH_CUDA_ALLOC_CONF": hostile}}
    )
    text = render_env(profile.model_copy(update={"settings": settings}))
    assert _set_by(text, tmp_path) == {"PYTORCH_CUDA_ALLOC_CONF": hostile}
    assert not (tmp_path / "pwned").exists()


# --- Lightning's real API -----------------------------------------------------------------------


@pytest.mark.slow  # imports Lightning and builds a Trainer: seconds
@pytest.mark.usefixtures("no_cuda")
@pytest.mark.parametrize("case", CPU_CASES)
def test_lightning_trainer_constructs_for_cpu(case: str, tmp_path: Path) -> None:
    lightning = pytest.importorskip("lightning.pytorch")
    kwargs = yaml.safe_load(render_lightning(profile_for(case)))["trainer"]
    trainer = lightning.Trainer(
        **kwargs, default_root_dir=tmp_path, logger=False, enable_progress_bar=False
    )
    assert trainer.accumulate_grad_batches == kwargs["accumulate_grad_batches"]
    assert trainer.num_devices == 1
    assert trainer.precision == kwargs["precision"]


@pytest.mark.parametrize("case", GPU_CASES)
def test_lightning_kwargs_fit_trainer_for_gpus(case: str) -> None:
    lightning = pytest.importorskip("lightning.pytorch")
    from lightning.fabric.connector import _PRECISION_INPUT_STR

    kwargs = lightning_trainer_kwargs(profile_for(case))
    parameters = inspect.signature(lightning.Trainer.__init__).parameters
    assert set(kwargs) <= set(parameters)
    assert kwargs["precision"] in typing.get_args(_PRECISION_INPUT_STR)
    # "gpu" is the connector's alias for CUDA/ROCm (MPS on a Mac), beside the registry's names
    registry = lightning.accelerators.AcceleratorRegistry.available_accelerators()
    assert kwargs["accelerator"] in {"gpu", *registry}


# --- transformers' real API ---------------------------------------------------------------------


@pytest.mark.usefixtures("no_cuda")
@pytest.mark.parametrize("case", CPU_CASES)
def test_training_arguments_construct_for_cpu(case: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    kwargs = json.loads(render_hf(profile_for(case)))
    args = transformers.TrainingArguments(output_dir=str(tmp_path), **kwargs)
    assert args.use_cpu is True
    assert args.dataloader_num_workers == kwargs["dataloader_num_workers"]
    assert args.full_determinism is kwargs["full_determinism"]
    assert str(args.device) == "cpu"


@pytest.mark.parametrize("case", GPU_CASES)
def test_training_arguments_fields_for_gpus(case: str) -> None:
    transformers = pytest.importorskip("transformers")
    kwargs = hf_training_arguments(profile_for(case))
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    assert set(kwargs) <= fields
    optimizers = {o.value for o in transformers.training_args.OptimizerNames}
    assert kwargs.get("optim", "adamw_torch") in optimizers


def test_hf_notes_say_what_training_arguments_cannot_hold() -> None:
    reproducible = hf_notes(profile_for("h100-reproducible"))
    assert any(note.startswith("TF32 off") for note in reproducible)
    assert any("environment variables" in note for note in reproducible)
    cpu = hf_notes(profile_for("cpu"))
    assert [note for note in cpu if not note.startswith("optim left out")] == []


def test_hf_never_drops_evaluation_samples_and_says_what_training_needs() -> None:
    """``dataloader_drop_last`` drops the last batch of the Trainer's evaluation too: 256 of 300
    samples were scored. Left out; the note says why, and when training's last batch raises."""
    profile = with_batch_one_raising(profile_for("cpu"), batch_size=512)
    assert "dataloader_drop_last" not in hf_training_arguments(profile)
    (note,) = [note for note in hf_notes(profile) if note.startswith("drop_last")]
    assert "the Trainer would drop the last batch of evaluation too" in note
    assert "batch 1 raised ValueError: Expected more than 1 value per channel" in note
    assert "where len(train_dataset) % 512 leaves 1 sample on one process" in note
    assert not [note for note in hf_notes(profile_for("cpu")) if note.startswith("drop_last")]


def test_every_yaml_export_of_a_batchnorm_profile_says_drop_last() -> None:
    """The accelerate export once said only DataLoader(dataset, batch_size=512): 513 samples
    then failed in BatchNorm. Lightning's line is its own, the others the generated one."""
    profile = with_batch_one_raising(profile_for("cpu"), batch_size=512)
    for render in (render_accelerate, EXPORT_FORMATS["env"]):
        assert "#   drop_last: True, in the training DataLoader only: batch 1 raised" in render(
            profile
        ), render
    lightning = render_lightning(profile)
    assert "drop_last=True) in the DataModule's *_dataloader() methods" in lightning
    assert "drop_last in train_dataloader() alone" in lightning
    assert "drop_last" not in render_accelerate(profile_for("cpu"))


@pytest.mark.usefixtures("no_cuda")
def test_the_hf_notes_cannot_go_in_the_json(tmp_path: Path) -> None:
    """Why the notes stand beside the file: TrainingArguments refuses a key it does not know."""
    transformers = pytest.importorskip("transformers")
    kwargs = json.loads(render_hf(profile_for("cpu")))
    with pytest.raises(TypeError, match="_notes"):
        transformers.TrainingArguments(output_dir=str(tmp_path), _notes=["x"], **kwargs)


def test_export_hf_prints_the_notes_on_stderr_and_only_json_on_stdout(tmp_path: Path) -> None:
    snapshot = str(SNAPSHOTS / "h100-80gb-hbm3.json")
    result = run(
        "export", "--format", "hf", "--mode", "reproducible", "--snapshot", snapshot,
        "--store", str(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == hf_training_arguments(profile_for("h100-reproducible"))
    notes = hf_notes(profile_for("h100-reproducible"))
    assert "TrainingArguments has no argument for these" in result.stderr
    assert "or the line says why it is left out" in result.stderr
    assert all(note in result.stderr for note in notes)


# --- accelerate's real API ----------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_accelerate_config_loads(case: str, tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.utils import DistributedType
    from accelerate.utils.constants import TORCH_DYNAMO_MODES

    profile = profile_for(case)
    path = tmp_path / "accelerate.yaml"
    path.write_text(render_accelerate(profile))
    config = load_config_from_file(str(path))
    assert isinstance(config, ClusterConfig)
    expected = accelerate_config(profile)
    assert config.distributed_type is DistributedType(expected["distributed_type"])
    assert config.num_processes == expected["num_processes"]
    assert config.mixed_precision == expected["mixed_precision"]
    assert config.use_cpu is expected["use_cpu"]
    if profile.settings.compile.enabled:
        assert config.dynamo_config["dynamo_mode"] in TORCH_DYNAMO_MODES
    else:
        assert config.dynamo_config == {}


# --- the command --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(EXPORT_FORMATS))
def test_export_command_writes_each_format(fmt: str, tmp_path: Path) -> None:
    out = tmp_path / f"out.{fmt}"
    snapshot = str(SNAPSHOTS / "h100-80gb-hbm3.json")
    result = run(
        "export", "--format", fmt, "--snapshot", snapshot, "--store", str(tmp_path),
        "-o", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert out.read_text() == EXPORT_FORMATS[fmt](profile_for("h100"))


def test_export_command_env_on_stdout(tmp_path: Path) -> None:
    snapshot = str(SNAPSHOTS / "a100-sxm4-80gb-8x.json")
    result = run("export", "--format", "env", "--snapshot", snapshot, "--store", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "export OMP_NUM_THREADS=32" in result.stdout


def test_export_command_refuses_unknown_format(tmp_path: Path) -> None:
    snapshot = str(SNAPSHOTS / "h100-80gb-hbm3.json")
    result = run("export", "--format", "deepspeed", "--snapshot", snapshot)
    assert result.exit_code == 2
