"""The parts of ``settings.Settings``, one model each: precision, TF32, the cuDNN switches,
compile, the DataLoader, the optimizer, DDP and FSDP2, the batch; and ``StrictModel``, which
every model of the data model is. ``settings`` holds them together (and names them too).

The ground floor of the data model: pydantic and the standard library only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from torch_autotune.bounds import (
    STRICT,
    AccumSteps,
    BatchSize,
    PrefetchFactor,
    WorkerCount,
)


class StrictModel(BaseModel):
    """Frozen, refuses unknown fields (a typo in a hand-edited file is an error) and refuses
    inf and NaN (``bounds.STRICT``)."""

    model_config = STRICT


class Precision(StrictModel):
    """Mixed precision: torch.autocast(device, dtype) and a GradScaler for fp16."""

    autocast: bool = False
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    grad_scaler: bool = False


class MatmulPrecision(StrictModel):
    """TF32 for float32 matmuls and convolutions, in the one API the installed torch wants.

    ``api`` is ``allow_tf32`` (torch.backends.cuda.matmul/cudnn.allow_tf32, torch < 2.9) or
    ``fp32_precision`` (torch.backends.*.fp32_precision, torch >= 2.9); mixing them raises in
    torch (rules catalog B2, S5), so a profile holds exactly one. ``None``: set nothing.
    """

    tf32: bool = False
    api: Literal["allow_tf32", "fp32_precision"] | None = None


class Backends(StrictModel):
    """cuDNN autotuner and determinism switches."""

    cudnn_benchmark: bool = False
    cudnn_deterministic: bool = False
    deterministic_algorithms: bool = False


class Compile(StrictModel):
    """torch.compile."""

    enabled: bool = False
    mode: (
        Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None
    ) = None
    memory_budget: float | None = Field(
        default=None,
        ge=0,
        le=1,
        strict=True,  # a number: YAML's false is not a budget of 0
        description="torch._functorch.config.activation_memory_budget while the model compiles:"
        " the share of the activations the compiled graphs save that they keep (0: recompute"
        " what can be, as checkpointing the whole graph would); None: torch's default, 1.0.",
    )


class DataLoaderSettings(StrictModel):
    """Keyword arguments for torch.utils.data.DataLoader."""

    num_workers: WorkerCount = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: PrefetchFactor | None = Field(
        default=None,
        description="Batches each worker loads ahead; None keeps torch's default (2 with workers).",
    )
    seed_workers: bool = Field(
        default=False, description="Seed every worker from one generator (reproducible)."
    )


class OptimizerSettings(StrictModel):
    """Keyword arguments for the optimizer (Adam/AdamW)."""

    fused: bool = False


class DdpSettings(StrictModel):
    """DistributedDataParallel's options, where several processes train. Each default is
    DDP's own: a profile written before these existed wraps as a script that sets nothing."""

    gradient_as_bucket_view: bool = Field(
        default=False,
        description="Gradients are views into DDP's all-reduce buckets: one copy of the "
        "gradients less on every rank.",
    )
    static_graph: bool = Field(
        default=False,
        description="The parameters used, and the graph, never change between iterations.",
    )
    find_unused_parameters: bool = Field(
        default=False,
        description="Walk the autograd graph every step for parameters that got no gradient: "
        "only where the model has some, as its first step showed.",
    )


class FsdpSettings(StrictModel):
    """FSDP2 (``fully_shard``) in place of DDP, where DDP does not train even the smallest
    batch: each repeated block sharded over the ranks, then the root (``apply.parallelize``)."""

    enabled: bool = False


class BatchSettings(StrictModel):
    """Filled by the probe: a batch size is only ever one that ran on this machine."""

    batch_size: BatchSize | None = None
    grad_accum_steps: AccumSteps = 1
