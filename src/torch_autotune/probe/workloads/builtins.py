"""The built-in workloads and the default for a device.

Each built-in is a real architecture (``models``) trained on seeded synthetic data
(``synthetic``). Importing this module, and building a built-in ``Workload``, does not import
torch: the model is built, and the data drawn, when the probe asks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch_autotune.probe.workloads.losses import _cross_entropy
from torch_autotune.probe.workloads.steps import StructuredStep
from torch_autotune.probe.workloads.synthetic import (
    SyntheticImages,
    SyntheticTokens,
    SyntheticVectors,
    _PooledBatches,
)
from torch_autotune.probe.workloads.workload import Workload

if TYPE_CHECKING:
    from torch.nn import Module
    from torch.optim import Optimizer

__all__ = [
    "ACCELERATOR_WORKLOAD",
    "BUILTIN_WORKLOADS",
    "DEFAULT_WORKLOAD",
    "default_workload",
    "gpt2",
    "gpt2_large",
    "llama_1b",
    "mlp",
    "resnet50",
    "resnet_like",
    "transformer_encoder",
]


def _adamw(model: Module, **kwargs: Any) -> Optimizer:
    """AdamW with lr 1e-3 over ``model``'s parameters; ``kwargs`` (e.g. ``fused=True``,
    ``lr=...``) are passed on."""
    import torch

    return torch.optim.AdamW(model.parameters(), **{"lr": 1e-3, **kwargs})


def _supervised(name: str) -> StructuredStep:
    """The built-ins' step: ``model(inputs)`` and cross-entropy against the targets."""
    return StructuredStep(_cross_entropy, name)


def _build_resnet_like() -> Module:
    from torch_autotune.probe.workloads.models import ResNetLike

    return ResNetLike(num_classes=10)


def _build_transformer_lm() -> Module:
    from torch_autotune.probe.workloads.models import TransformerLM

    return TransformerLM(vocab_size=1000, max_len=128)


def _build_resnet50() -> Module:
    from torch_autotune.probe.workloads.models import BottleneckResNet

    return BottleneckResNet()


def _build_gpt2() -> Module:
    from torch_autotune.probe.workloads.models import GPT

    return GPT()


def _build_gpt2_large() -> Module:
    from torch_autotune.probe.workloads.models import GPT

    return GPT(max_len=1024, d_model=1280, nhead=20, num_layers=36)


def _build_llama_1b() -> Module:
    from torch_autotune.probe.workloads.llama import Llama

    return Llama()


def _build_mlp() -> Module:
    from torch import nn

    return nn.Sequential(
        nn.Linear(512, 1024),
        nn.GELU(),
        nn.Linear(1024, 1024),
        nn.GELU(),
        nn.Linear(1024, 1024),
        nn.GELU(),
        nn.Linear(1024, 10),
    )


def resnet_like() -> Workload:
    """A ResNet-style conv net on 3x64x64 images, 10 classes (about 0.7 M parameters).

    Stem conv (stride 2) to 32 channels, four basic blocks (32, 64, 128, 128 channels; 32x32
    down to 8x8), global average pool, linear head. Batch: ``(N, 3, 64, 64)`` float32 images,
    ``(N,)`` int64 labels; cross-entropy loss.
    """
    data = SyntheticImages(size=64, num_classes=10)
    return Workload(
        name="conv",
        train_step=_supervised("conv"),
        kind="conv",
        make_model=_build_resnet_like,
        builds_on_device=True,
        make_optimizer=_adamw,
        make_batch=data.batch,
        dataset=data,
        sample_shape="image 3x64x64 float32, label int64 in [0, 10)",
    )


def transformer_encoder() -> Workload:
    """A causal Transformer encoder language model: 128 tokens, vocabulary 1000 (about 0.7 M).

    Token and position embeddings (d_model 128), two pre-norm ``nn.TransformerEncoderLayer``
    (4 heads, feed-forward 512, batch_first) under a causal mask, LM head. Batch: ``(N, 128)``
    int64 tokens and the ``(N, 128)`` next tokens; cross-entropy over the vocabulary.
    """
    data = SyntheticTokens(seq_len=128, vocab_size=1000)
    return Workload(
        name="transformer",
        train_step=_supervised("transformer"),
        kind="transformer",
        make_model=_build_transformer_lm,
        builds_on_device=True,
        make_optimizer=_adamw,
        make_batch=data.batch,
        dataset=data,
        sample_shape="128 tokens int64 in [0, 1000), next-token targets",
    )


def mlp() -> Workload:
    """An MLP on 512-d vectors: three hidden Linear+GELU layers of 1024, 10 classes (2.6 M).

    Batch: ``(N, 512)`` float32 vectors, ``(N,)`` int64 labels; cross-entropy loss.
    """
    data = SyntheticVectors(features=512, num_classes=10)
    return Workload(
        name="mlp",
        train_step=_supervised("mlp"),
        kind="mlp",
        make_model=_build_mlp,
        builds_on_device=True,
        make_optimizer=_adamw,
        make_batch=data.batch,
        dataset=data,
        sample_shape="vector 512 float32, label int64 in [0, 10)",
    )


def resnet50() -> Workload:
    """ResNet-50 on 3x224x224 images, 1000 classes (25.6 M parameters), as trained on ImageNet.

    ``BottleneckResNet()``: 7x7 stem and max pool, bottleneck blocks [3, 4, 6, 3] of widths 64
    to 512 (256 to 2048 channels out), global average pool, linear head. Batch:
    ``(N, 3, 224, 224)`` float32 images, ``(N,)`` int64 labels; cross-entropy loss. A dataset
    item costs about 0.6 ms of one CPU thread (a seeded 224x224 normal image), so a DataLoader
    worker delivers some 1500 images/s: on a fast GPU the worker count matters, as it does for
    real images.
    """
    data = SyntheticImages(size=224, num_classes=1000)
    return Workload(
        name="resnet50",
        train_step=_supervised("resnet50"),
        kind="conv",
        make_model=_build_resnet50,
        builds_on_device=True,
        make_optimizer=_adamw,
        make_batch=_PooledBatches(data),
        dataset=data,
        sample_shape="image 3x224x224 float32, label int64 in [0, 1000)",
    )


def gpt2() -> Workload:
    """A GPT-2-small decoder LM on 512 tokens of a 50257-token vocabulary (124 M parameters).

    ``GPT()``: 12 pre-LN blocks of d_model 768 with 12 heads, causal attention through
    ``F.scaled_dot_product_attention``, GELU (tanh) MLPs, the LM head tied to the token
    embedding. Batch: ``(N, 512)`` int64 tokens and the ``(N, 512)`` next tokens;
    cross-entropy over the vocabulary. A dataset item (513 random token ids) costs a few
    microseconds, as reading pre-tokenised text does.
    """
    data = SyntheticTokens(seq_len=512, vocab_size=50257)
    return Workload(
        name="gpt2",
        train_step=_supervised("gpt2"),
        kind="transformer",
        make_model=_build_gpt2,
        builds_on_device=True,
        make_optimizer=_adamw,
        make_batch=_PooledBatches(data),
        dataset=data,
        sample_shape="512 tokens int64 in [0, 50257), next-token targets",
    )


def gpt2_large() -> Workload:
    """A GPT-2-large decoder LM on 1,024 tokens (774 M parameters): 36 blocks of d_model 1280
    with 20 heads, the architecture of ``gpt2``. Where memory is the limit: its weights,
    gradients and AdamW state alone take 12.4 GB in float32, before any activation."""
    data = SyntheticTokens(seq_len=1024, vocab_size=50257)
    return Workload(
        name="gpt2-large",
        train_step=_supervised("gpt2-large"),
        kind="transformer",
        make_model=_build_gpt2_large,
        builds_on_device=True,
        make_optimizer=_adamw,
        make_batch=_PooledBatches(data),
        dataset=data,
        sample_shape="1024 tokens int64 in [0, 50257), next-token targets",
    )


def llama_1b() -> Workload:
    """A Llama-class decoder LM of about 1.1 B parameters on 2,048 tokens (``llama.Llama``:
    RMSNorm, rotary embeddings, grouped-query attention, SwiGLU). Its weights, gradients and
    AdamW state take 17.7 GB in float32: on a 24 GB card it trains, if at all, near batch 1."""
    data = SyntheticTokens(seq_len=2048, vocab_size=32000)
    return Workload(
        name="llama-1b",
        train_step=_supervised("llama-1b"),
        kind="transformer",
        make_model=_build_llama_1b,
        builds_on_device=True,
        make_optimizer=_adamw,
        make_batch=_PooledBatches(data),
        dataset=data,
        sample_shape="2048 tokens int64 in [0, 32000), next-token targets",
    )


BUILTIN_WORKLOADS: dict[str, Callable[[], Workload]] = {
    "conv": resnet_like,
    "transformer": transformer_encoder,
    "mlp": mlp,
    "resnet50": resnet50,
    "gpt2": gpt2,
    "gpt2-large": gpt2_large,
    "llama-1b": llama_1b,
}
"""The built-in workloads by name."""

DEFAULT_WORKLOAD = "conv"
"""The workload ``resolve_workload(None)`` gives when no device is named: the CPU's default."""

ACCELERATOR_WORKLOAD = "resnet50"
"""The default workload on an accelerator (``default_workload``)."""


def default_workload(device: str) -> str:
    """The built-in workload ``autotune`` probes on ``device`` when none is asked for.

    ``"resnet50"`` on an accelerator (``"cuda"``, ``"mps"``, also ``"cuda:1"``): a batch found
    for a real ImageNet-sized net tells the user something, where a 0.7 M-parameter net fits
    tens of thousands of samples. ``"conv"`` (``DEFAULT_WORKLOAD``) on the CPU, where one
    ResNet-50 step takes seconds and a probe would fit a handful of trials in its budget.
    """
    return DEFAULT_WORKLOAD if device.partition(":")[0] == "cpu" else ACCELERATOR_WORKLOAD
