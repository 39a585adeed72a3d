"""DistributedDataParallel's options, where several training processes make the job (rules
DP1-DP3); DDP's own defaults, each said, where one process trains.

DP1 ``gradient_as_bucket_view``: DDP keeps its all-reduce buckets, as large as all the
gradients together, beside the gradients themselves (pytorch #39022, #128696; a user measured a
166 MB model take 152 MB more once wrapped, #131653); with the option the gradients are views
into the buckets, "the saved memory size will be equal to the total gradients size" (DDP's
docstring). Hugging Face and Lightning leave it off by default; its one cost is that a
gradient is a view, which ``grad.detach_()`` or reassigning ``.grad`` in the user's loop breaks.
DP2 ``static_graph``: set only where the user's graph is known not to change between
iterations, which no first step can prove; off. DP3 ``find_unused_parameters``: walks the
autograd graph every step ("applications should only set find_unused_parameters to True when
necessary", DDP notes); on only where the probe's first step found parameters that got no
gradient, which DDP without it refuses at its second step. DP4 ``fsdp.enabled``: FSDP2 in
place of DDP only where the ranks measured that DDP does not train the model even at its
smallest batch and FSDP2 does ("Use DDP when your model fits on a single GPU", Hugging Face's
DDP guide; ZeRO-3's sharding costs about 1.5x DDP's communication, Rajbhandari et al. 2020).
"""

from __future__ import annotations

from collections.abc import Iterator

from torch_autotune.rules.context import Context, Finding
from torch_autotune.settings import Source


def ddp(ctx: Context) -> Iterator[Finding]:
    """DP1-DP4: DDP's options for the job's world size, and FSDP2 where DDP did not fit."""
    topology = ctx.topology
    if topology.world_size == 1:
        why = "one training process: nothing is wrapped in DDP, so DDP's default stays"
        yield Finding("ddp.gradient_as_bucket_view", False, "DP1", f"off: {why}")
        yield Finding("ddp.static_graph", False, "DP2", f"off: {why}")
        yield Finding("ddp.find_unused_parameters", False, "DP3", f"off: {why}")
        yield Finding("fsdp.enabled", False, "DP4", "off: one training process, nothing to shard")
        return
    sharded = ctx.measurements.fsdp_reason if ctx.measurements is not None else None
    if sharded is not None:
        why = "FSDP2 shards the model in place of DDP (DP4), so DDP's default stays"
        yield Finding("ddp.gradient_as_bucket_view", False, "DP1", f"off: {why}")
        yield Finding("ddp.static_graph", False, "DP2", f"off: {why}")
        yield Finding("ddp.find_unused_parameters", False, "DP3", f"off: {why}")
        yield Finding("fsdp.enabled", True, "DP4", f"on: {sharded}", Source.MEASURED)
    else:
        yield from _ddp_options(ctx)
        yield Finding(
            "fsdp.enabled",
            False,
            "DP4",
            "off: DDP keeps a whole copy of the model on every rank, which trains where it fits"
            " one GPU (FSDP2 is measured only where it does not: it communicates more)",
        )


def _ddp_options(ctx: Context) -> Iterator[Finding]:
    """DP1-DP3 for a job of several ranks."""
    topology = ctx.topology
    ranks = (
        f"{topology.world_size} ranks ({topology.nodes} node(s) x {topology.processes_per_node})"
    )
    yield Finding(
        "ddp.gradient_as_bucket_view",
        True,
        "DP1",
        f"on: the {ranks} each hold DDP's all-reduce buckets, a second copy of every "
        "gradient; as views into them the gradients take no memory of their own (do not call "
        "grad.detach_() or replace .grad in the training loop)",
    )
    yield Finding(
        "ddp.static_graph",
        False,
        "DP2",
        "off: no first step can prove that the parameters used never change between "
        "iterations; set it yourself where they never do",
    )
    unused = ctx.measurements.unused_parameters if ctx.measurements is not None else None
    if unused is None:
        yield Finding(
            "ddp.find_unused_parameters",
            False,
            "DP3",
            "off: every parameter is assumed to get a gradient each step (not measured: run "
            "autotune under torchrun to check it on the model's first step)",
        )
    elif unused:
        yield Finding(
            "ddp.find_unused_parameters",
            True,
            "DP3",
            f"on: the model's first step left {unused} parameter(s) without a gradient, which "
            "DDP refuses at the next step unless it walks the graph for them",
            Source.MEASURED,
        )
    else:
        yield Finding(
            "ddp.find_unused_parameters",
            False,
            "DP3",
            "off: every parameter got a gradient in the model's first step, so DDP need not "
            "walk the autograd graph each step for unused ones",
            Source.MEASURED,
        )
