"""A profile as Hugging Face ``TrainingArguments`` (JSON) and the notes beside it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch_autotune.integrations.common import (
    always,
    arguments,
    channels_last_note,
    memory_budget_note,
    notes,
    tf32_note,
    with_workers,
)
from torch_autotune.records import Export, last_batches, small_batch_error
from torch_autotune.settings import Source

if TYPE_CHECKING:
    from torch_autotune.profile import Profile


def hf_training_arguments(profile: Profile) -> dict[str, Any]:
    """Keyword arguments for ``transformers.TrainingArguments`` (all but ``output_dir``).

    Keys appear only when the profile decides them: ``tf32`` is True or None (None leaves
    torch's defaults), persistent workers and prefetch only with workers, the batch size only
    when the probe measured one, the seed only when the profile fixes one, ``optim`` only where
    the profile decided the optimizer's kernel (``hf_optim``), the ``ddp_*`` arguments only in
    a job's profile (several ranks; the batch is per device).
    """
    return {**arguments(profile, HF), "use_cpu": profile.settings.device == "cpu"}


def checkpointing_argument() -> str:
    """The ``TrainingArguments`` field that turns on activation checkpointing for the installed
    transformers: ``activation_checkpointing`` where it has one (transformers 5 renamed it; its
    ``gradient_checkpointing`` warns that v6 removes it), else ``gradient_checkpointing``, also
    where transformers is not installed. Read from the class itself (transformers imported
    here, a second or two, only for a profile that checkpoints)."""
    try:
        from transformers import TrainingArguments
    except ImportError:
        return _OLD_NAME
    fields = getattr(TrainingArguments, "__dataclass_fields__", {})
    return "activation_checkpointing" if "activation_checkpointing" in fields else _OLD_NAME


_OLD_NAME = "gradient_checkpointing"
"""The ``TrainingArguments`` field before transformers 5's ``activation_checkpointing``."""


def _hf_precision(profile: Profile) -> dict[str, Any]:
    p = profile.settings.precision
    return {
        "bf16": p.autocast and p.dtype == "bfloat16",
        "fp16": p.autocast and p.dtype == "float16",
    }


def _hf_loader(profile: Profile) -> dict[str, Any]:
    dl = profile.settings.dataloader
    args: dict[str, Any] = {"dataloader_num_workers": dl.num_workers}
    if dl.num_workers > 0 and dl.prefetch_factor is not None:
        args["dataloader_prefetch_factor"] = dl.prefetch_factor
    return args  # never dataloader_drop_last: see _hf_drop_last


def _hf_compile(profile: Profile) -> dict[str, Any]:
    c = profile.settings.compile
    return (
        {"torch_compile": True, "torch_compile_mode": c.mode or "default"}
        if c.enabled
        else {"torch_compile": False}
    )


def hf_optim(profile: Profile) -> str | None:
    """``TrainingArguments.optim`` as the profile decides it, or None to leave it out.

    transformers names the optimizer and its kernel in one value, and its default is
    ``adamw_torch_fused`` from torch 2.8 (``adamw_torch`` before). The profile decides only the
    kernel (``optimizer.fused``), for the optimizer the workload was measured with
    (``provenance.preferences.optimizer``):

    - not AdamW (SGD, Adam, another): None. Every ``optim`` the Trainer knows builds an
      optimizer of its own: writing an AdamW one would train the user's SGD workload with
      AdamW, which is what was never measured;
    - AdamW, fused (rule I2, a GPU with torch 2.0 or newer; rule I6, a workload whose
      optimizer was built fused, such as a Trainer's optim ``adamw_torch_fused``, which trained
      fused on the CPU too): ``adamw_torch_fused``. It is transformers' own default from torch
      2.8; written, so that an older torch or transformers trains with the kernel the profile
      chose too;
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
    return notes(profile, HF)


def render_hf(profile: Profile) -> str:
    """JSON for ``TrainingArguments(output_dir=..., **json.load(file))``; ``hf_notes`` says
    what it cannot hold."""
    return json.dumps(hf_training_arguments(profile), indent=2) + "\n"


def _hf_ddp(profile: Profile) -> dict[str, Any]:
    """The ``ddp_*`` arguments: the back end of a job's profile (several ranks), the unused
    parameters and the static graph wherever the profile says (the Trainer wraps the model in
    DDP itself under torchrun)."""
    topology, ddp = profile.topology, profile.settings.ddp
    args: dict[str, Any] = {}
    if topology.world_size > 1:
        args["ddp_backend"] = topology.backend
    if topology.world_size > 1 or ddp.find_unused_parameters or ddp.static_graph:
        args["ddp_find_unused_parameters"] = ddp.find_unused_parameters
        args["ddp_static_graph"] = ddp.static_graph
    return args


def _hf_ddp_note(profile: Profile) -> str | None:
    """gradient_as_bucket_view, which TrainingArguments has no argument for."""
    if not profile.settings.ddp.gradient_as_bucket_view:
        return None
    return (
        "gradient_as_bucket_view: TrainingArguments has no argument for it; the Trainer's"
        " accelerate takes it as Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
        "gradient_as_bucket_view=True)]) in a subclass's create_accelerator_and_postprocess()"
    )


def _hf_drop_last(profile: Profile) -> str | None:
    """Why ``dataloader_drop_last`` is not written, and what training's last batch needs.

    The Trainer applies it to its evaluation loaders too, where it would leave samples out of
    the metrics without a word. An epoch's last training batch too small for the model (batch
    1 and BatchNorm) raises instead, loudly, and only for the training sets the line names.
    """
    raised = small_batch_error(profile)
    if raised is None:
        return None
    batch = profile.settings.batch.batch_size
    short = last_batches(profile)
    where = f"len(train_dataset) % {batch} leaves {short} on one process" if batch else "it would"
    return (
        "drop_last: dataloader_drop_last is left out: the Trainer would drop the last batch of"
        f" evaluation too, and its metrics would skip samples. An epoch's last training batch of"
        f" {short} raises ({raised}): where {where}, train on that many samples fewer"
    )


HF: Mapping[str, Export] = {
    "device": Export(itself="use_cpu: hf_training_arguments"),
    "precision": Export(args=_hf_precision),
    "batch_size": always(
        lambda s: (
            {}
            if s.batch.batch_size is None
            else {"per_device_train_batch_size": s.batch.batch_size}
        )
    ),
    "compile": Export(args=_hf_compile),
    "compile_memory_budget": memory_budget_note("the Trainer"),
    "memory_format": channels_last_note("before the Trainer gets it"),
    "tf32": Export(
        args=lambda p: {"tf32": True if p.settings.matmul.tf32 else None},
        note=lambda p: tf32_note("")(p) if not p.settings.matmul.tf32 else None,
    ),
    "fused_optimizer": Export(
        args=lambda p: {} if (optim := hf_optim(p)) is None else {"optim": optim},
        note=_optim_note,
    ),
    "num_workers": Export(args=_hf_loader),
    "pin_memory": always(lambda s: {"dataloader_pin_memory": s.dataloader.pin_memory}),
    "persistent_workers": with_workers(
        lambda s: {"dataloader_persistent_workers": s.dataloader.persistent_workers}
    ),
    "grad_accum_steps": always(lambda s: {"gradient_accumulation_steps": s.batch.grad_accum_steps}),
    "seed_workers": Export(itself="the Trainer seeds its DataLoader's workers"),
    "determinism": always(lambda s: {"full_determinism": s.backends.deterministic_algorithms}),
    "seed": always(lambda s: {} if s.seed is None else {"seed": s.seed}),
    "ddp": Export(args=_hf_ddp, note=_hf_ddp_note),
    "drop_last": Export(note=_hf_drop_last),
    "activation_checkpointing": Export(
        args=lambda p: (
            {
                (name := checkpointing_argument()): True,
                f"{name}_kwargs": {"use_reentrant": False},
            }
            if p.settings.activation_checkpointing and p.settings.blocks is None
            else {}
        ),
        note=lambda p: (
            "activation checkpointing: on, of the blocks the workload named (see blocks): the"
            " Trainer's own would recompute its model's layers instead, so it is not turned on"
            " here (leave it off); call profile.prepare_model(model) before the Trainer takes"
            " the model"
            if p.settings.activation_checkpointing and p.settings.blocks is not None
            else None
        ),
    ),
}
"""What ``TrainingArguments`` writes for each setting, by record name (``Export``)."""
