"""Workloads to probe: the built-in reference models and the user's own, behind one type.

A ``Workload`` holds everything the probe needs to run real training steps on this machine: a
model builder, an optimizer factory, a synthetic batch of any size, a loss, and optionally a
dataset for the DataLoader measurement. Importing this module does not import torch; torch is
imported when a workload is built or loaded.

Built-in workloads (``BUILTIN_WORKLOADS``), each a real architecture trained on seeded
synthetic data made on the fly per index. Three are small enough for a few steps on a laptop
CPU; two have the size of what people train on a GPU, so that the batch the probe finds there
means something (a 0.7 M-parameter net at 64x64 fits tens of thousands of samples on 80 GB):

    conv          ``resnet_like()``: a ResNet-style conv net, 3x64x64 images, 10 classes
    transformer   ``transformer_encoder()``: a causal Transformer encoder LM, 128 tokens of 1000
    mlp           ``mlp()``: Linear+GELU layers on 512-d vectors, 10 classes
    resnet50      ``resnet50()``: ResNet-50 (25.6 M), 3x224x224 images, 1000 classes
    gpt2          ``gpt2()``: a GPT-2-small decoder (124 M), 512 tokens of 50257
    gpt2-large    ``gpt2_large()``: GPT-2 large (774 M), 1024 tokens: where memory is the limit
    llama-1b      ``llama_1b()``: a Llama-class decoder (1.1 B), 2048 tokens of 32000

``default_workload(device)`` is what ``autotune`` probes without ``--model``: ``resnet50`` on an
accelerator and ``conv`` on the CPU, where a ResNet-50 step takes seconds. Both are conv nets,
the kind most of the rules speak to (cuDNN autotuner, channels_last, image-style DataLoader),
so ``autotune`` with no arguments shows the most. ``CpuHeavyDataset`` is a synthetic image
dataset whose items cost CPU time, to compare DataLoader worker counts.

The package, a module for each thing it owns:

    workload      the ``Workload`` type and its checks, ``KINDS``, ``MapDataset``
    synthetic     the seeded synthetic datasets, ``CpuHeavyDataset``
    models        the built-in ``nn.Module`` classes (imports torch, on first use of one)
    llama         the Llama-class decoder of ``llama-1b`` (imports torch)
    builtins      the built-in workloads, ``default_workload``
    resolve       ``resolve_workload``: the workload from any form the user gives
    factory       importing and calling the user's factory (``load_workload``)
    protocol      checking what a factory returns (``as_workload``)
    huggingface   a ``PreTrainedModel``, a ``datasets.Dataset``, a ``Trainer``, as they are
    lightning     a LightningModule and its LightningDataModule, with no glue
    lightning_step  the model the probe trains for a LightningModule: its training_step
    batches       ``make_batch``: a few samples repeated to any batch size
    losses        cross-entropy and MSE
    messages      how errors name values

The factory protocol
--------------------
``autotune --model mypkg.models:make_workload`` (in Python: ``load_workload(...)``) imports
``mypkg.models`` (the current directory is searched first, as with ``python -m``) and calls
``make_workload()`` with no arguments. The factory returns a ``Workload``, or a dict (or any
object with these attributes):

    model           an ``nn.Module`` (deep-copied for every trial) or a function () -> Module
    optimizer       a function (params, **kwargs) -> Optimizer; keyword arguments let the probe
                    try the profile's options (``fused=True``), so prefer ``functools.partial``
                    of an optimizer class or a function that passes ``**kwargs`` on
    dataset         a map-style dataset of (inputs, targets) samples       at least one of the
    example_batch   an (inputs, targets) batch, ideally at the largest     two; example_batch is
                    shape training will see (longest sequence)             used for make_batch
    loss_fn         optional (outputs, targets) -> scalar loss; default: cross-entropy for
                    integer targets (classes on dim 1, or on the last dim), MSE otherwise
    kind            optional "conv" | "transformer" | "mlp" | "other" (the default)
    datamodule      optional: a LightningDataModule, its train_dataloader() the data; with a
                    LightningModule as model, optimizer and loss come from the module itself
                    (its configure_optimizers and training_step)
    max_batch_size  optional cap on the batch sizes tried; default len(dataset), else none
    blocks          optional: the classes of the model's repeated blocks (a module class or a
                    list of them), what activation checkpointing recomputes and FSDP2 shards;
                    default: the outermost kind of module that repeats and holds most weight

``make_batch(n)`` repeats the example batch (or the dataset's first samples, collated) along
dim 0 to ``n`` samples. Anything unusable raises ``WorkloadError`` (exit code 5) with one
message that names the problem; the user's own exception is kept as its ``__cause__``.

Example ``mypkg/models.py``::

    import functools

    import torch
    from torch import nn


    def make_workload():
        return {
            "model": lambda: nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.GELU(),
                                           nn.Linear(128, 10)),
            "optimizer": functools.partial(torch.optim.AdamW, lr=3e-4),
            "example_batch": (torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))),
            "kind": "mlp",
        }
"""

from __future__ import annotations

from typing import Any

from torch_autotune.probe.workloads.builtins import (
    ACCELERATOR_WORKLOAD,
    BUILTIN_WORKLOADS,
    DEFAULT_WORKLOAD,
    default_workload,
    gpt2,
    mlp,
    resnet50,
    resnet_like,
    transformer_encoder,
)
from torch_autotune.probe.workloads.factory import load_workload
from torch_autotune.probe.workloads.protocol import as_workload
from torch_autotune.probe.workloads.resolve import resolve_workload
from torch_autotune.probe.workloads.synthetic import (
    CpuHeavyDataset,
    SyntheticImages,
    SyntheticTokens,
    SyntheticVectors,
)
from torch_autotune.probe.workloads.workload import KINDS, MapDataset, Workload

__all__ = [
    "ACCELERATOR_WORKLOAD",
    "BUILTIN_WORKLOADS",
    "DEFAULT_WORKLOAD",
    "KINDS",
    "CpuHeavyDataset",
    "MapDataset",
    "SyntheticImages",
    "SyntheticTokens",
    "SyntheticVectors",
    "Workload",
    "as_workload",
    "default_workload",
    "gpt2",
    "load_workload",
    "mlp",
    "resnet50",
    "resnet_like",
    "resolve_workload",
    "transformer_encoder",
]

_MODEL_CLASSES = frozenset(
    (
        "BasicBlock",
        "Bottleneck",
        "BottleneckResNet",
        "CausalSelfAttention",
        "DecoderBlock",
        "GPT",
        "ResNetLike",
        "TransformerLM",
    )
)
"""The names of ``models.__all__``, served here without importing torch until one is used."""


def __getattr__(name: str) -> Any:
    """The built-in model classes (``workloads.ResNetLike``), imported on first use so that
    importing this package does not import torch.

    A model pickled before the classes moved to ``models`` names this package, and still loads.
    """
    if name in _MODEL_CLASSES:
        from torch_autotune.probe.workloads import models

        return getattr(models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
