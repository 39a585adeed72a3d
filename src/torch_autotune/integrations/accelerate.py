"""A profile as an accelerate config file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch_autotune.integrations.common import (
    always,
    arguments,
    header,
    line,
    memory_budget_note,
    notes,
    to_yaml,
)
from torch_autotune.records import Export

if TYPE_CHECKING:
    from torch_autotune.profile import Profile


_ACCELERATE_PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "no"}


def accelerate_config(profile: Profile) -> dict[str, Any]:
    """An accelerate config file's content (``accelerate config``'s keys): ``num_processes``
    every machine's processes, ``num_machines`` the job's nodes; on several machines each sets
    its own ``machine_rank`` and the first one's address (``main_process_ip``)."""
    s = profile.settings
    topology = profile.topology
    processes = topology.world_size  # accelerate counts every machine's processes
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": _distributed_type(s.device, processes, sharded=s.fsdp.enabled),
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "machine_rank": 0,
        "main_training_function": "main",
        "num_machines": topology.nodes,
        "num_processes": processes,
        "rdzv_backend": "static",
        "same_network": True,
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        "use_cpu": s.device == "cpu",
    }
    if s.device == "cuda":
        config["gpu_ids"] = "all"
    if s.fsdp.enabled and processes > 1:  # FSDP2, as measured; the blocks: the note says
        config["fsdp_config"] = {"fsdp_version": 2, "fsdp_reshard_after_forward": True}
    config.update(arguments(profile, ACCELERATE))
    return dict(sorted(config.items()))


def _distributed_type(device: str, processes: int, *, sharded: bool = False) -> str:
    """accelerate's ``distributed_type``: several processes are DDP ranks on the GPUs
    (``MULTI_GPU``) or on the CPU over gloo (``MULTI_CPU``), or shard the model (``FSDP``,
    rule DP4); one process is ``NO``."""
    if processes == 1:
        return "NO"
    if sharded:
        return "FSDP"
    return "MULTI_CPU" if device == "cpu" else "MULTI_GPU"


def _accelerate_compile(profile: Profile) -> dict[str, Any]:
    c = profile.settings.compile
    if not c.enabled:
        return {}
    return {"dynamo_config": {"dynamo_backend": "INDUCTOR", "dynamo_mode": c.mode or "default"}}


def render_accelerate(profile: Profile) -> str:
    """YAML for ``accelerate launch --config_file FILE``."""
    lines = header(profile, "accelerate config")
    lines += [
        "# Use: accelerate launch --config_file THIS.yaml train.py",
    ]
    said = notes(profile, ACCELERATE)
    if said:
        lines.append("# accelerate has no setting for these; set them in your training script:")
        lines += [f"#   {note}" for note in said]
    return "\n".join(lines) + "\n" + to_yaml(accelerate_config(profile))


_BATCH = "DataLoader(dataset, batch_size={}) (profile.batch_size)"


def _accelerate_ddp(profile: Profile) -> str | None:
    """DDP's options, which accelerate takes in code only (its config file has no key)."""
    options = [f"{name}=True" for name, on in profile.settings.ddp.model_dump().items() if on]
    if not options:
        return None
    machines = profile.topology.nodes
    where = (
        f"; on each of the {machines} machines set machine_rank and main_process_ip (the first"
        " machine's address) in its copy of this file"
        if machines > 1
        else ""
    )
    return (
        f"Accelerator(kwargs_handlers=[DistributedDataParallelKwargs({', '.join(options)})]){where}"
    )


ACCELERATE: Mapping[str, Export] = {
    "device": Export(itself="use_cpu, gpu_ids and the processes: accelerate_config"),
    "precision": always(
        lambda s: {
            "mixed_precision": _ACCELERATE_PRECISION[s.precision.dtype]
            if s.precision.autocast
            else "no"
        }
    ),
    "batch_size": line(
        lambda s: None if s.batch.batch_size is None else _BATCH.format(s.batch.batch_size)
    ),
    "compile": Export(args=_accelerate_compile),
    "compile_memory_budget": memory_budget_note("accelerate's config"),
    "ddp": Export(note=_accelerate_ddp),
    "grad_accum_steps": line(
        lambda s: (
            None
            if s.batch.grad_accum_steps == 1
            else f"Accelerator(gradient_accumulation_steps={s.batch.grad_accum_steps})"
        )
    ),
}
"""What accelerate writes for each setting, by record name (``Export``)."""
