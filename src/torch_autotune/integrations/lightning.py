"""A profile as Lightning ``Trainer`` arguments and a ``LightningCLI`` config."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch_autotune.integrations.common import (
    always,
    arguments,
    channels_last_note,
    header,
    line,
    memory_budget_note,
    notes,
    process_count,
    tf32_note,
    to_yaml,
)
from torch_autotune.records import Export
from torch_autotune.settings import RECORD_BY_NAME

if TYPE_CHECKING:
    from torch_autotune.profile import Profile


_LIGHTNING_ACCELERATOR = {"cuda": "gpu", "mps": "mps", "cpu": "cpu"}
_LIGHTNING_PRECISION = {"bfloat16": "bf16-mixed", "float16": "16-mixed", "float32": "32-true"}


def lightning_trainer_kwargs(profile: Profile) -> dict[str, Any]:
    """Keyword arguments for ``lightning.pytorch.Trainer``.

    ``precision`` is the mixed form (``bf16-mixed``/``16-mixed``, weights stay float32, a
    GradScaler comes with 16-mixed), as the profile's autocast is; ``32-true`` without AMP.
    A job's profile (several ranks) adds ``strategy`` (DDP, with the unused parameters its
    first step found) and ``num_nodes``; ``devices`` is the ranks on each node.
    """
    kwargs: dict[str, Any] = {
        "accelerator": _LIGHTNING_ACCELERATOR[profile.settings.device],
        "devices": process_count(profile),
    }
    topology = profile.topology
    if topology.world_size > 1:  # a job: on every node, Lightning's DDP (FSDP2: a note)
        kwargs["num_nodes"] = topology.nodes
        unused = profile.settings.ddp.find_unused_parameters
        if not profile.settings.fsdp.enabled:
            kwargs["strategy"] = "ddp_find_unused_parameters_true" if unused else "ddp"
    return {**kwargs, **arguments(profile, LIGHTNING)}


def _lightning_ddp(profile: Profile) -> str | None:
    """DDP's options a strategy string cannot carry (Lightning passes DDPStrategy's keyword
    arguments on to DistributedDataParallel)."""
    ddp = profile.settings.ddp
    if not (ddp.gradient_as_bucket_view or ddp.static_graph):
        return None
    options = [f"{name}=True" for name, on in ddp.model_dump().items() if on]
    return (
        f"Trainer(strategy=DDPStrategy({', '.join(options)})) in code, for the options the"
        " strategy string cannot carry (lightning.pytorch.strategies.DDPStrategy)"
    )


def _lightning_precision(profile: Profile) -> dict[str, Any]:
    s = profile.settings
    return {
        "precision": _LIGHTNING_PRECISION[s.precision.dtype] if s.precision.autocast else "32-true"
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
    return notes(profile, LIGHTNING)


def _lightning_loader(profile: Profile) -> str | None:
    """The DataLoader settings no ``data:`` argument takes, as one line."""
    data = lightning_data_kwargs(profile)
    rest = {k: v for k, v in _loader_kwargs(profile).items() if k not in data}
    if not rest:
        return None
    loader = ", ".join(f"{k}={v!r}" for k, v in rest.items())
    alone = "; drop_last in train_dataloader() alone" if rest.get("drop_last") else ""
    return (
        f"DataLoader(dataset, {loader}) in the DataModule's *_dataloader() methods"
        f" ({_not_in_data(profile, data)}{alone})"
    )


def _lightning_compile(profile: Profile) -> str | None:
    if not profile.settings.compile.enabled:
        return None
    mode = profile.settings.compile.mode or "default"
    return (
        f"model = torch.compile(model, mode={mode!r}) before trainer.fit(model) (Lightning"
        " then compiles training_step, as the probe did); under LightningCLI, compile the"
        " network in configure_model()"
    )


def _seed(profile: Profile) -> str | None:
    """seed_everything(seed, workers=True) seeds the workers too; without a seed, the workers'
    seeding is said on its own."""
    s = profile.settings
    if s.seed is None:
        return RECORD_BY_NAME["seed_workers"].note(s)
    return f"lightning.seed_everything({s.seed}, workers=True) before building the model"


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
    lines = header(profile, "Lightning Trainer arguments")
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
    return "\n".join(lines) + "\n" + to_yaml(config)


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
    if profile.drops_last:  # batch 1 raised: so would an epoch's last batch of 1
        kwargs["drop_last"] = True
    return kwargs


LIGHTNING: Mapping[str, Export] = {
    "device": Export(itself="accelerator and devices: lightning_trainer_kwargs"),
    "precision": Export(args=_lightning_precision),
    "batch_size": Export(covered_by="num_workers"),
    "compile": Export(note=_lightning_compile),
    "compile_memory_budget": memory_budget_note("Lightning's Trainer"),
    "memory_format": channels_last_note("in configure_model()"),
    "tf32": Export(note=tf32_note(" (or torch.set_float32_matmul_precision('high'))")),
    "cudnn_benchmark": always(lambda s: {"benchmark": s.backends.cudnn_benchmark}),
    "fused_optimizer": line(
        lambda s: (
            "torch.optim.AdamW(..., fused=True) in configure_optimizers()"
            if s.optimizer.fused
            else None
        )
    ),
    "num_workers": Export(note=_lightning_loader),
    "pin_memory": Export(covered_by="num_workers"),
    "persistent_workers": Export(covered_by="num_workers"),
    "drop_last": Export(covered_by="num_workers"),
    "grad_accum_steps": always(lambda s: {"accumulate_grad_batches": s.batch.grad_accum_steps}),
    "seed_workers": Export(covered_by="seed"),
    "determinism": always(lambda s: {"deterministic": s.backends.deterministic_algorithms}),
    "seed": Export(note=_seed),
    "ddp": Export(note=_lightning_ddp),
    "fsdp": line(
        lambda s: (
            "FSDP2: Trainer(strategy=ModelParallelStrategy()) with profile.parallelize(model)"
            " in configure_model(), as measured (Lightning's 'fsdp' strategy is FSDP1, which"
            " was not)"
            if s.fsdp.enabled
            else None
        )
    ),
}
"""What Lightning writes for each setting, by record name (``Export``)."""
