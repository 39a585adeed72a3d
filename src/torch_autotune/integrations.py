"""A profile in the formats of the tools people train with: Lightning, Hugging Face, accelerate.

Pure functions from a ``Profile`` to keyword arguments (dicts) and to the text of a file
(``render_*``). Nothing here imports Lightning, transformers or accelerate: the output is
checked against their real APIs in the tests, and a user needs only the library they use.
PyYAML (a dependency) is imported when a YAML renderer runs.

Each tool covers part of a profile; what it has no setting for is said in the rendered
file's comments (beside the file for JSON), never silently dropped:

- ``lightning``: a ``trainer:`` section for ``LightningCLI`` (``--config FILE``), also usable
  as ``Trainer(**yaml.safe_load(text)["trainer"])``, and a ``data:`` section with the batch
  size and the DataLoader settings when the profile was measured on a ``LightningDataModule``
  whose ``__init__`` takes them (``lightning_data_kwargs``). ``torch.compile``, channels_last,
  the fused optimizer and the DataLoader settings no DataModule argument takes belong in the
  LightningModule or DataModule; the comments give their values.
- ``hf``: JSON keyword arguments for ``transformers.TrainingArguments`` (add ``output_dir``).
  JSON has no comments, and TrainingArguments refuses unknown keys: ``hf_notes`` lists what
  it has no argument for, and ``autotune export`` prints that list on stderr.
- ``accelerate``: an accelerate config file (``accelerate launch --config_file FILE``).
- ``env``: POSIX shell ``export`` lines for the profile's environment variables, to source
  before Python starts (CUDA reads them once, at its first use).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch_autotune.settings import Source

if TYPE_CHECKING:
    from torch_autotune.profile import Profile

__all__ = [
    "EXPORT_FORMATS",
    "accelerate_config",
    "hf_notes",
    "hf_optim",
    "hf_training_arguments",
    "lightning_data_kwargs",
    "lightning_notes",
    "lightning_trainer_kwargs",
    "process_count",
    "render_accelerate",
    "render_env",
    "render_hf",
    "render_lightning",
]


def process_count(profile: Profile) -> int:
    """Training processes on this node, as the profile's topology says (one per target GPU,
    one on the CPU and on MPS, or the DDP ranks asked for)."""
    return profile.topology.processes_per_node


def _header(profile: Profile, tool: str) -> list[str]:
    snapshot = profile.provenance.snapshot
    machine = ", ".join(a.name for a in snapshot.accelerators) or snapshot.host.cpu_model or "CPU"
    return [
        f"# {tool}, from torch-autotune's {profile.mode.value} profile "
        f"(fingerprint {profile.provenance.fingerprint}).",
        f"# Machine: {machine}; device {profile.settings.device}.",
    ]


def _yaml(data: Mapping[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False)


# --- Lightning ----------------------------------------------------------------------------------

_LIGHTNING_ACCELERATOR = {"cuda": "gpu", "mps": "mps", "cpu": "cpu"}
_LIGHTNING_PRECISION = {"bfloat16": "bf16-mixed", "float16": "16-mixed", "float32": "32-true"}


def lightning_trainer_kwargs(profile: Profile) -> dict[str, Any]:
    """Keyword arguments for ``lightning.pytorch.Trainer``.

    ``precision`` is the mixed form (``bf16-mixed``/``16-mixed``, weights stay float32, a
    GradScaler comes with 16-mixed), as the profile's autocast is; ``32-true`` without AMP.
    """
    s = profile.settings
    return {
        "accelerator": _LIGHTNING_ACCELERATOR[s.device],
        "devices": process_count(profile),
        "precision": _LIGHTNING_PRECISION[s.precision.dtype] if s.precision.autocast else "32-true",
        "deterministic": s.backends.deterministic_algorithms,
        "benchmark": s.backends.cudnn_benchmark,
        "accumulate_grad_batches": s.batch.grad_accum_steps,
    }


def lightning_data_kwargs(profile: Profile) -> dict[str, Any]:
    """The ``data:`` section of a LightningCLI config: the profile's batch size and DataLoader
    settings, as the arguments of the ``LightningDataModule`` the profile was measured on.

    Only the arguments its ``__init__`` takes (``WorkloadDetails.loader_arguments`` in the
    evidence); empty for a profile not measured on a DataModule. ``persistent_workers: false``
    where the profile has no workers, since torch refuses persistent workers without any.
    The plain form (``data: {batch_size: 512}``) is the one ``LightningCLI(Model, DataModule)``
    takes, and subclass mode takes it after a config that names ``data``'s ``class_path``.
    """
    details = profile.evidence.details if profile.evidence is not None else None
    taken = details.loader_arguments if details is not None else ()
    kwargs = _loader_kwargs(profile)
    if profile.settings.dataloader.num_workers == 0:
        kwargs["persistent_workers"] = False
    return {key: kwargs[key] for key in taken if key in kwargs}


def lightning_notes(profile: Profile) -> list[str]:
    """What Trainer has no argument for, as lines for the LightningModule/DataModule."""
    s = profile.settings
    data = lightning_data_kwargs(profile)
    rest = {k: v for k, v in _loader_kwargs(profile).items() if k not in data}
    notes = []
    if rest:
        loader = ", ".join(f"{k}={v!r}" for k, v in rest.items())
        notes.append(
            f"DataLoader(dataset, {loader}) in the DataModule's *_dataloader() methods"
            f" ({_not_in_data(profile, data)})"
        )
    if s.compile.enabled:
        mode = s.compile.mode or "default"
        notes.append(
            f"model = torch.compile(model, mode={mode!r}) before trainer.fit(model) (Lightning"
            " then compiles training_step, as the probe did); under LightningCLI, compile the"
            " network in configure_model()"
        )
    if s.memory_format == "channels_last":
        notes.append("model.to(memory_format=torch.channels_last) in configure_model()")
    if s.optimizer.fused:
        notes.append("torch.optim.AdamW(..., fused=True) in configure_optimizers()")
    if s.matmul.tf32:
        notes.append("TF32: call profile.apply() (or torch.set_float32_matmul_precision('high'))")
    if s.seed is not None:
        notes.append(f"lightning.seed_everything({s.seed}, workers=True) before building the model")
    if s.environment:
        notes.append("environment variables: source 'autotune export --format env' first")
    return notes


def _not_in_data(profile: Profile, data: Mapping[str, Any]) -> str:
    """Why these DataLoader settings are not in the config's ``data:`` section."""
    details = profile.evidence.details if profile.evidence is not None else None
    if details is None or details.framework != "lightning":
        return "a data: section needs a profile measured on your LightningDataModule"
    if not data:
        return "the profile was measured without a DataModule whose __init__ takes them"
    return "the DataModule's __init__ takes no argument for them"


def render_lightning(profile: Profile) -> str:
    """A LightningCLI config (``trainer:``, and ``data:`` where the DataModule takes the
    DataLoader settings), the rest of the profile as comments."""
    lines = _header(profile, "Lightning Trainer arguments")
    lines += [
        "# Use: python train.py fit --config THIS.yaml (LightningCLI),",
        '# or Trainer(**yaml.safe_load(open("THIS.yaml"))["trainer"]).',
    ]
    config: dict[str, Any] = {"trainer": lightning_trainer_kwargs(profile)}
    data = lightning_data_kwargs(profile)
    if data:
        config["data"] = data
        lines += [
            "# data: your DataModule's own arguments, as LightningCLI(Model, DataModule) takes",
            "# them; in subclass mode, give this file after the config that names data's",
            "# class_path (--config yours.yaml --config THIS.yaml). Without LightningCLI:",
            '# YourDataModule(**yaml.safe_load(open("THIS.yaml"))["data"]).',
        ]
    notes = lightning_notes(profile)
    if notes:
        lines.append(
            "# Trainer has no argument for these; set them in your LightningModule/DataModule:"
        )
        lines += [f"#   {note}" for note in notes]
    return "\n".join(lines) + "\n" + _yaml(config)


def _loader_kwargs(profile: Profile) -> dict[str, Any]:
    """DataLoader keyword arguments as plain values (the worker seeding is left to the script)."""
    dl = profile.settings.dataloader
    kwargs: dict[str, Any] = {}
    if profile.settings.batch.batch_size is not None:
        kwargs["batch_size"] = profile.settings.batch.batch_size
    kwargs.update(num_workers=dl.num_workers, pin_memory=dl.pin_memory)
    if dl.num_workers > 0:
        kwargs["persistent_workers"] = dl.persistent_workers
        if dl.prefetch_factor is not None:
            kwargs["prefetch_factor"] = dl.prefetch_factor
    return kwargs


# --- Hugging Face -------------------------------------------------------------------------------


def hf_training_arguments(profile: Profile) -> dict[str, Any]:
    """Keyword arguments for ``transformers.TrainingArguments`` (all but ``output_dir``).

    Keys appear only when the profile decides them: ``tf32`` is True or None (None leaves
    torch's defaults), persistent workers and prefetch only with workers, the batch size only
    when the probe measured one, the seed only when the profile fixes one, ``optim`` only where
    the profile decided the optimizer's kernel (``hf_optim``).
    """
    s = profile.settings
    dl = s.dataloader
    args: dict[str, Any] = {
        "bf16": s.precision.autocast and s.precision.dtype == "bfloat16",
        "fp16": s.precision.autocast and s.precision.dtype == "float16",
        "tf32": True if s.matmul.tf32 else None,
        "dataloader_num_workers": dl.num_workers,
        "dataloader_pin_memory": dl.pin_memory,
    }
    if dl.num_workers > 0:
        args["dataloader_persistent_workers"] = dl.persistent_workers
        if dl.prefetch_factor is not None:
            args["dataloader_prefetch_factor"] = dl.prefetch_factor
    if s.batch.batch_size is not None:
        args["per_device_train_batch_size"] = s.batch.batch_size
    args["gradient_accumulation_steps"] = s.batch.grad_accum_steps
    args["torch_compile"] = s.compile.enabled
    if s.compile.enabled:
        args["torch_compile_mode"] = s.compile.mode or "default"
    optim = hf_optim(profile)
    if optim is not None:
        args["optim"] = optim
    args["full_determinism"] = s.backends.deterministic_algorithms
    if s.seed is not None:
        args["seed"] = s.seed
    args["use_cpu"] = s.device == "cpu"
    return args


def hf_optim(profile: Profile) -> str | None:
    """``TrainingArguments.optim`` as the profile decides it, or None to leave it out.

    transformers names the optimizer and its kernel in one value, and its default is
    ``adamw_torch_fused`` from torch 2.8 (``adamw_torch`` before). The profile decides only the
    kernel (``optimizer.fused``), for the optimizer the workload was measured with
    (``provenance.preferences.optimizer``):

    - not AdamW (SGD, Adam, another): None. Every ``optim`` the Trainer knows builds an
      optimizer of its own: writing an AdamW one would train the user's SGD workload with
      AdamW, which is what was never measured;
    - AdamW, fused (rule I2, a GPU with torch 2.0 or newer): ``adamw_torch_fused``. It is
      transformers' own default from torch 2.8; written, so that an older torch or
      transformers trains with the kernel the profile chose too;
    - AdamW, not fused by a measurement (the bench found the fused kernel slower and dropped
      it, rules M1 and M2): ``adamw_torch``;
    - AdamW, not fused by a rule that keeps torch's default kernel without measuring (the CPU
      and MPS, where the fused kernels are beta; torch before 2.0): None. Such a rule is no
      evidence against the fused kernel transformers chose as its default, and writing
      ``adamw_torch`` would override that choice unmeasured; ``hf_notes`` says so.
    """
    if profile.provenance.preferences.optimizer != "adamw":
        return None
    if profile.settings.optimizer.fused:
        return "adamw_torch_fused"
    decision = profile.decision("optimizer.fused")
    if decision is not None and decision.source is Source.MEASURED:
        return "adamw_torch"
    return None


def _optim_note(profile: Profile) -> str | None:
    """Why ``optim`` is left out of the TrainingArguments, None where it is written."""
    if hf_optim(profile) is not None:
        return None
    kind = profile.provenance.preferences.optimizer
    if kind != "adamw":
        named = {"sgd": "SGD", "adam": "Adam"}.get(kind, "another optimizer")
        return (
            f"optim left out: the profile was measured with {named}, not AdamW, and every optim"
            " of the Trainer builds an optimizer of its own: keep the optim of your"
            " TrainingArguments, or give the Trainer your optimizer (Trainer(...,"
            " optimizers=(optimizer, None)))"
        )
    decision = profile.decision("optimizer.fused")
    rule = f" (rule {decision.rule})" if decision is not None else ""
    return (
        f"optim left out: the profile keeps torch's default AdamW kernel here without measuring"
        f"{rule}, which is no reason to override transformers' default (adamw_torch_fused"
        " from torch 2.8); optim='adamw_torch' trains with torch's default"
    )


def hf_notes(profile: Profile) -> list[str]:
    """What TrainingArguments has no argument for, as lines for the training script.

    Plain JSON holds no comments, and ``TrainingArguments(**json.load(file))`` refuses any key
    it does not know (a TypeError; ``HfArgumentParser.parse_json_file`` a ValueError), so these
    cannot go in the file: ``autotune export`` prints them on stderr beside it.
    """
    s = profile.settings
    notes = []
    if s.memory_format == "channels_last":
        notes.append("model.to(memory_format=torch.channels_last) before the Trainer gets it")
    if s.backends.cudnn_benchmark:
        notes.append("cuDNN autotuner: call profile.apply() (torch.backends.cudnn.benchmark)")
    if s.matmul.api is not None and not s.matmul.tf32:
        notes.append("TF32 off: call profile.apply() (tf32 is left unset here)")
    if s.cpu_threads is not None:
        notes.append(f"CPU threads: call profile.apply() (torch.set_num_threads({s.cpu_threads}))")
    if s.environment:
        notes.append("environment variables: source 'autotune export --format env' first")
    optim = _optim_note(profile)
    if optim is not None:
        notes.append(optim)
    return notes


def render_hf(profile: Profile) -> str:
    """JSON for ``TrainingArguments(output_dir=..., **json.load(file))``; ``hf_notes`` says
    what it cannot hold."""
    return json.dumps(hf_training_arguments(profile), indent=2) + "\n"


# --- accelerate ---------------------------------------------------------------------------------

_ACCELERATE_PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "no"}


def accelerate_config(profile: Profile) -> dict[str, Any]:
    """An accelerate config file's content (``accelerate config``'s keys, one machine)."""
    s = profile.settings
    processes = process_count(profile)
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": _distributed_type(s.device, processes),
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": _ACCELERATE_PRECISION[s.precision.dtype]
        if s.precision.autocast
        else "no",
        "num_machines": 1,
        "num_processes": processes,
        "rdzv_backend": "static",
        "same_network": True,
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        "use_cpu": s.device == "cpu",
    }
    if s.device == "cuda":
        config["gpu_ids"] = "all"
    if s.compile.enabled:
        config["dynamo_config"] = {
            "dynamo_backend": "INDUCTOR",
            "dynamo_mode": s.compile.mode or "default",
        }
    return dict(sorted(config.items()))


def _distributed_type(device: str, processes: int) -> str:
    """accelerate's ``distributed_type``: several processes are DDP ranks on the GPUs
    (``MULTI_GPU``) or on the CPU over gloo (``MULTI_CPU``); one process is ``NO``."""
    if processes == 1:
        return "NO"
    return "MULTI_CPU" if device == "cpu" else "MULTI_GPU"


def render_accelerate(profile: Profile) -> str:
    """YAML for ``accelerate launch --config_file FILE``."""
    lines = _header(profile, "accelerate config")
    lines += [
        "# Use: accelerate launch --config_file THIS.yaml train.py",
        "# accelerate has no setting for the DataLoader, TF32, cuDNN or the fused optimizer:",
        "# use profile.dataloader_kwargs(), profile.apply() and profile.optimizer_kwargs().",
    ]
    if profile.settings.environment:
        lines.append("# Environment variables: source 'autotune export --format env' first.")
    return "\n".join(lines) + "\n" + _yaml(accelerate_config(profile))


# --- shell environment --------------------------------------------------------------------------


def render_env(profile: Profile) -> str:
    """POSIX shell ``export`` lines for the profile's environment variables, safely quoted."""
    lines = [
        *_header(profile, "Environment variables"),
        "# Source this file before starting Python: CUDA reads them once, at its first use.",
        "#   . ./THIS.sh && python train.py",
    ]
    environment = profile.settings.environment
    if not environment:
        lines.append("# This profile sets no environment variables: nothing to export.")
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(environment.items())]
    return "\n".join(lines) + "\n"


EXPORT_FORMATS: Mapping[str, Callable[[Profile], str]] = {
    "lightning": render_lightning,
    "hf": render_hf,
    "accelerate": render_accelerate,
    "env": render_env,
}
"""``autotune export --format NAME``: the renderer for each integration format."""
