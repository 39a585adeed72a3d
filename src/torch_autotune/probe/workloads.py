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

``default_workload(device)`` is what ``autotune`` probes without ``--model``: ``resnet50`` on an
accelerator and ``conv`` on the CPU, where a ResNet-50 step takes seconds. Both are conv nets,
the kind most of the rules speak to (cuDNN autotuner, channels_last, image-style DataLoader),
so ``autotune`` with no arguments shows the most. ``CpuHeavyDataset`` is a synthetic image
dataset whose items cost CPU time, to compare DataLoader worker counts.

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
    max_batch_size  optional cap on the batch sizes tried; default len(dataset), else none

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

import contextlib
import copy
import difflib
import importlib
import inspect
import itertools
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args

from torch_autotune.errors import WorkloadError

if TYPE_CHECKING:
    from torch import Generator, Tensor
    from torch.nn import Module, Parameter
    from torch.optim import Optimizer

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

Kind = Literal["conv", "transformer", "mlp", "other"]
KINDS: tuple[str, ...] = get_args(Kind)
"""The model kinds the rules know (``Preferences.model_kind``)."""

_README = "a factory returns model, optimizer and a dataset or example_batch (see the README)"


class MapDataset(Protocol):
    """A map-style dataset: ``len()`` samples, ``dataset[i]`` for ``0 <= i < len``."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


# --- the workload ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A model, its optimizer and its data, as the probe trains them.

    ``make_model()`` returns a fresh model (on the CPU, in training mode) at every call.
    ``make_optimizer(params, **kwargs)`` builds the optimizer; the probe passes the profile's
    optimizer options (``fused=True``) as keyword arguments where ``optimizer_accepts`` says
    they are taken. ``make_batch(n)`` returns ``(inputs, targets)`` of ``n`` samples on the CPU,
    always at the same (worst-case) shape. ``dataset`` yields single samples for the DataLoader
    measurement. ``sample_shape`` describes one sample for reports. ``max_batch_size`` caps
    the batch sizes tried (``None``: no cap).
    """

    name: str
    kind: Kind
    make_model: Callable[[], Module]
    make_optimizer: Callable[..., Optimizer]
    make_batch: Callable[[int], tuple[Tensor, Tensor]]
    dataset: MapDataset | None = None
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    sample_shape: str = ""
    max_batch_size: int | None = None

    def __post_init__(self) -> None:
        where = f"workload '{self.name}'"
        if self.kind not in KINDS:
            raise WorkloadError(f"{where}: kind {self.kind!r} is not one of {_listed(KINDS)}")
        for field in ("make_model", "make_optimizer", "make_batch", "loss_fn"):
            if not callable(getattr(self, field)):
                raise WorkloadError(f"{where}: {field} is not callable")
        size = self.max_batch_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise WorkloadError(f"{where}: max_batch_size must be a positive int or None")

    def optimizer_accepts(self, **kwargs: object) -> bool:
        """Whether ``make_optimizer(params, **kwargs)`` takes these keyword arguments.

        Judged from the factory's signature; ``True`` where it cannot be read (the call then
        decides). ``lambda params: AdamW(params)`` takes none, so ``fused=True`` is not tried.
        """
        try:
            signature = inspect.signature(self.make_optimizer)
        except (TypeError, ValueError):
            return True
        try:
            signature.bind(object(), **kwargs)
        except TypeError:
            return False
        return True


# --- synthetic data -------------------------------------------------------------------------------


def _generator(seed: int, stream: int) -> Generator:
    """A CPU ``torch.Generator`` for item ``stream`` of the data seeded with ``seed``.

    The CPU generator (mt19937) keeps only the low 32 bits of its seed, so the two are mixed
    into 32 bits: a hashed offset for ``seed`` (Knuth's multiplicative hash) plus ``stream``,
    which keeps the streams of one dataset distinct.
    """
    import torch

    offset = (seed * 0x9E3779B1) % 2**32
    return torch.Generator().manual_seed((offset + stream) % 2**32)


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch size must be a positive int, not {batch_size!r}")


class _SeededDataset:
    """Base of the synthetic datasets: ``length`` items, item ``i`` made from seed ``(seed, i)``.

    Items are made on the fly, so a dataset of any length costs no memory; the object holds
    only ints and pickles, so DataLoader workers work under fork and spawn.
    """

    def __init__(self, length: int = 50_000, *, seed: int = 0) -> None:
        if length < 1:
            raise ValueError(f"length must be at least 1, not {length}")
        self.length = length
        self.seed = seed

    def __len__(self) -> int:
        return self.length

    def _index(self, index: int) -> int:
        """``index`` as a position in ``[0, length)``; negative counts from the end."""
        position = index + self.length if index < 0 else index
        if not 0 <= position < self.length:
            raise IndexError(f"index {index} out of range for {self.length} items")
        return position


class _SyntheticDataset(_SeededDataset, ABC):
    """A synthetic dataset of (inputs, targets) samples that also draws whole batches."""

    _BATCH_STREAM = 2**32 - 1  # the stream of ``batch()``, apart from every item's

    @abstractmethod
    def _draw(self, generator: Generator, count: int) -> tuple[Tensor, Tensor]:
        """``count`` samples stacked on dim 0, drawn from ``generator``."""

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        inputs, targets = self._draw(_generator(self.seed, self._index(index)), 1)
        return inputs[0], targets[0]

    def batch(self, batch_size: int) -> tuple[Tensor, Tensor]:
        """A batch of ``batch_size`` samples drawn at once (CPU tensors, the same every call)."""
        _check_batch_size(batch_size)
        return self._draw(_generator(self.seed, self._BATCH_STREAM), batch_size)


class SyntheticImages(_SyntheticDataset):
    """Images ``3 x size x size`` float32 (standard normal) with a class label int64."""

    def __init__(
        self, length: int = 50_000, *, size: int = 64, num_classes: int = 10, seed: int = 0
    ) -> None:
        super().__init__(length, seed=seed)
        self.size = size
        self.num_classes = num_classes

    def _draw(self, generator: Generator, count: int) -> tuple[Tensor, Tensor]:
        import torch

        images = torch.randn(count, 3, self.size, self.size, generator=generator)
        labels = torch.randint(0, self.num_classes, (count,), generator=generator)
        return images, labels


class SyntheticTokens(_SyntheticDataset):
    """Token sequences for next-token prediction: inputs and targets ``seq_len`` int64 each.

    The targets are the inputs shifted left by one token.
    """

    def __init__(
        self, length: int = 50_000, *, seq_len: int = 128, vocab_size: int = 1000, seed: int = 0
    ) -> None:
        super().__init__(length, seed=seed)
        self.seq_len = seq_len
        self.vocab_size = vocab_size

    def _draw(self, generator: Generator, count: int) -> tuple[Tensor, Tensor]:
        import torch

        tokens = torch.randint(0, self.vocab_size, (count, self.seq_len + 1), generator=generator)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class SyntheticVectors(_SyntheticDataset):
    """Vectors of ``features`` float32 (standard normal) with a class label int64."""

    def __init__(
        self, length: int = 50_000, *, features: int = 512, num_classes: int = 10, seed: int = 0
    ) -> None:
        super().__init__(length, seed=seed)
        self.features = features
        self.num_classes = num_classes

    def _draw(self, generator: Generator, count: int) -> tuple[Tensor, Tensor]:
        import torch

        vectors = torch.randn(count, self.features, generator=generator)
        labels = torch.randint(0, self.num_classes, (count,), generator=generator)
        return vectors, labels


class CpuHeavyDataset(_SeededDataset):
    """Images that cost CPU time per item, like decoding and augmenting a JPEG.

    Item ``i`` is ``(image, label)``: a ``3 x image_size x image_size`` float32 image and an
    int64 label in ``[0, num_classes)``. It is made from its own seeded generator (the same
    item for the same index, in any process) in pure torch: a noise image of ``source_size``
    squared, ``passes`` rounds of an FFT low-pass and a 3x3 depthwise convolution (the
    "decode"), then a random crop, bilinear resize, horizontal flip, brightness/contrast
    jitter and normalisation. On one thread of a 2-core x86 cloud VM (a DataLoader worker runs
    one thread) an item costs about 1.5 ms plus 0.9 ms per pass: 5 ms at the default 4 passes,
    10 ms at 10.
    """

    def __init__(
        self,
        length: int = 10_000,
        *,
        image_size: int = 64,
        source_size: int = 96,
        passes: int = 4,
        num_classes: int = 10,
        seed: int = 0,
    ) -> None:
        super().__init__(length, seed=seed)
        if source_size < image_size:
            raise ValueError(f"source_size {source_size} is smaller than image_size {image_size}")
        self.image_size = image_size
        self.source_size = source_size
        self.passes = passes
        self.num_classes = num_classes

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        import torch

        generator = _generator(self.seed, self._index(index))
        image = torch.rand(3, self.source_size, self.source_size, generator=generator)
        for _ in range(self.passes):
            image = _smooth(image)
        image = _augment(image, self.image_size, generator)
        label = torch.randint(0, self.num_classes, (), generator=generator)
        return image, label


def _smooth(image: Tensor) -> Tensor:
    """One "decode" round on a ``3 x H x W`` image: FFT low-pass, then a 3x3 sharpen."""
    import torch
    import torch.nn.functional as F

    height, width = image.shape[-2:]
    spectrum = torch.fft.rfft2(image)
    rows = torch.fft.fftfreq(height).abs().unsqueeze(1)
    cols = torch.fft.rfftfreq(width).unsqueeze(0)
    spectrum = spectrum * ((rows**2 + cols**2) < 0.35**2)
    image = torch.fft.irfft2(spectrum, s=(height, width))
    kernel = torch.tensor([[0.0, -0.25, 0.0], [-0.25, 2.0, -0.25], [0.0, -0.25, 0.0]])
    kernel = kernel.expand(3, 1, 3, 3)
    return F.conv2d(image.unsqueeze(0), kernel, padding=1, groups=3)[0].clamp(0.0, 1.0)


def _augment(image: Tensor, size: int, generator: Generator) -> Tensor:
    """Random crop, resize to ``size`` squared, flip, jitter and normalise a ``3 x H x W``."""
    import torch
    import torch.nn.functional as F

    height, width = image.shape[-2:]
    crop = int(torch.randint(size, min(height, width) + 1, (), generator=generator))
    top = int(torch.randint(0, height - crop + 1, (), generator=generator))
    left = int(torch.randint(0, width - crop + 1, (), generator=generator))
    patch = image[:, top : top + crop, left : left + crop].unsqueeze(0)
    patch = F.interpolate(patch, size=(size, size), mode="bilinear", align_corners=False)[0]
    if bool(torch.rand((), generator=generator) < 0.5):
        patch = patch.flip(-1)
    brightness, contrast = (0.8 + 0.4 * torch.rand(2, generator=generator)).tolist()
    mean = patch.mean()
    patch = ((patch - mean) * contrast + mean * brightness).clamp(0.0, 1.0)
    channel_mean = patch.mean(dim=(1, 2), keepdim=True)
    channel_std = patch.std(dim=(1, 2), keepdim=True).clamp_min(1e-6)
    return (patch - channel_mean) / channel_std


# --- built-in models ------------------------------------------------------------------------------

_LAZY_CLASSES = (
    "BasicBlock",
    "ResNetLike",
    "TransformerLM",
    "Bottleneck",
    "BottleneckResNet",
    "CausalSelfAttention",
    "DecoderBlock",
    "GPT",
)


def __getattr__(name: str) -> Any:
    """The built-in model classes, defined on first use so that importing this module is free.

    They are module attributes all the same (``workloads.ResNetLike``), so models pickle.
    """
    if name in _LAZY_CLASSES:
        return _model_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _shortcut(in_channels: int, out_channels: int, stride: int) -> Module:
    """A residual block's shortcut: the identity, or a strided 1x1 conv and BN where the shape
    changes."""
    from torch import nn

    if stride == 1 and in_channels == out_channels:
        return nn.Identity()
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels)
    )


@cache
def _model_classes() -> dict[str, type]:
    """Define the built-in ``nn.Module`` classes (this imports torch)."""
    import torch
    from torch import nn

    class BasicBlock(nn.Module):  # type: ignore[misc]
        """ResNet basic block: two 3x3 conv+BN, ReLU, and a (projected) shortcut."""

        def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(out_channels)
            self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(out_channels)
            self.relu = nn.ReLU(inplace=True)
            self.shortcut = _shortcut(in_channels, out_channels, stride)

        def forward(self, x: Tensor) -> Tensor:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + self.shortcut(x))

    class ResNetLike(nn.Module):  # type: ignore[misc]
        """Conv stem (stride 2), basic blocks, global average pool, linear head.

        ``(N, 3, H, W)`` float images -> ``(N, num_classes)`` logits.
        """

        def __init__(self, num_classes: int = 10, widths: Sequence[int] = (32, 64, 128)) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, widths[0], 3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(widths[0]),
                nn.ReLU(inplace=True),
            )
            blocks = [BasicBlock(widths[0], widths[0])]
            for previous, width in itertools.pairwise(widths):
                blocks.append(BasicBlock(previous, width, stride=2))
            blocks.append(BasicBlock(widths[-1], widths[-1]))
            self.blocks = nn.Sequential(*blocks)
            self.head = nn.Linear(widths[-1], num_classes)

        def forward(self, x: Tensor) -> Tensor:
            features = self.blocks(self.stem(x))
            return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(features, 1), 1))

    class TransformerLM(nn.Module):  # type: ignore[misc]
        """Token + learned position embedding, a causal pre-norm ``nn.TransformerEncoder``, LM head.

        ``(N, S)`` int64 tokens, ``S <= max_len`` -> ``(N, S, vocab_size)`` next-token logits.
        """

        def __init__(
            self,
            vocab_size: int = 1000,
            max_len: int = 128,
            d_model: int = 128,
            nhead: int = 4,
            num_layers: int = 2,
        ) -> None:
            super().__init__()
            self.tokens = nn.Embedding(vocab_size, d_model)
            self.positions = nn.Embedding(max_len, d_model)
            layer = nn.TransformerEncoderLayer(
                d_model,
                nhead,
                dim_feedforward=4 * d_model,
                dropout=0.1,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            # enable_nested_tensor only serves padded inference, and warns with norm_first.
            self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab_size)

        def forward(self, tokens: Tensor) -> Tensor:
            length = tokens.shape[1]
            positions = torch.arange(length, device=tokens.device)
            x = self.tokens(tokens) + self.positions(positions)
            mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
            x = self.encoder(x, mask=mask, is_causal=True)
            return self.head(self.norm(x))

    classes: dict[str, type] = {}
    for cls in (BasicBlock, ResNetLike, TransformerLM, *_realistic_model_classes()):
        cls.__qualname__ = cls.__name__
        cls.__module__ = __name__
        classes[cls.__name__] = cls
    return classes


def _realistic_model_classes() -> tuple[type, ...]:
    """Define ResNet-50 and GPT-2-small as ``nn.Module`` classes (``_model_classes`` registers
    them). Both follow the published architectures, in plain torch (no torchvision)."""
    import math

    import torch
    import torch.nn.functional as F
    from torch import nn

    class Bottleneck(nn.Module):  # type: ignore[misc]
        """ResNet bottleneck block: 1x1 reduce, 3x3 (with the stride, as in ResNet v1.5), 1x1
        expand to 4x ``width``, BN after each, ReLU, and a projected shortcut where the shape
        changes."""

        expansion = 4

        def __init__(self, in_channels: int, width: int, stride: int = 1) -> None:
            super().__init__()
            out_channels = width * self.expansion
            self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(out_channels)
            self.relu = nn.ReLU(inplace=True)
            self.shortcut = _shortcut(in_channels, out_channels, stride)

        def forward(self, x: Tensor) -> Tensor:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + self.shortcut(x))

    class BottleneckResNet(nn.Module):  # type: ignore[misc]
        """A ResNet of bottleneck blocks; the defaults are ResNet-50 (25.6 M parameters).

        7x7 stride-2 stem conv to ``widths[0]`` channels, BN, ReLU, 3x3 stride-2 max pool;
        one stage per entry of ``blocks`` (3, 4, 6, 3 blocks of widths 64, 128, 256, 512 with
        outputs of 4x that, 256 to 2048 channels), every stage after the first starting with
        stride 2; global average pool, linear head. ``(N, 3, H, W)`` float images ->
        ``(N, num_classes)`` logits; at 224x224 the last stage is 7x7.
        """

        def __init__(
            self,
            blocks: Sequence[int] = (3, 4, 6, 3),
            num_classes: int = 1000,
            widths: Sequence[int] = (64, 128, 256, 512),
        ) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, widths[0], 7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(widths[0]),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, stride=2, padding=1),
            )
            layers: list[nn.Module] = []
            channels = widths[0]
            for stage, (count, width) in enumerate(zip(blocks, widths, strict=True)):
                for index in range(count):
                    stride = 2 if stage > 0 and index == 0 else 1
                    layers.append(Bottleneck(channels, width, stride))
                    channels = width * Bottleneck.expansion
            self.blocks = nn.Sequential(*layers)
            self.head = nn.Linear(channels, num_classes)

        def forward(self, x: Tensor) -> Tensor:
            features = self.blocks(self.stem(x))
            return self.head(torch.flatten(F.adaptive_avg_pool2d(features, 1), 1))

    class CausalSelfAttention(nn.Module):  # type: ignore[misc]
        """Multi-head causal self-attention: one fused QKV projection, then
        ``F.scaled_dot_product_attention(is_causal=True)`` (flash or memory-efficient kernels
        where the device has them), then the output projection."""

        def __init__(self, d_model: int, nhead: int) -> None:
            super().__init__()
            if d_model % nhead:
                raise ValueError(f"d_model {d_model} is not a multiple of nhead {nhead}")
            self.nhead = nhead
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)

        def forward(self, x: Tensor) -> Tensor:
            batch, length, d_model = x.shape
            query, key, value = (
                t.view(batch, length, self.nhead, d_model // self.nhead).transpose(1, 2)
                for t in self.qkv(x).split(d_model, dim=2)
            )
            out = F.scaled_dot_product_attention(query, key, value, is_causal=True)
            return self.proj(out.transpose(1, 2).reshape(batch, length, d_model))

    class DecoderBlock(nn.Module):  # type: ignore[misc]
        """A pre-LN GPT-2 block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))`` with a 4x MLP and
        GELU (tanh approximation, as GPT-2)."""

        def __init__(self, d_model: int, nhead: int) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(d_model)
            self.attention = CausalSelfAttention(d_model, nhead)
            self.norm2 = nn.LayerNorm(d_model)
            self.fc = nn.Linear(d_model, 4 * d_model)
            self.proj = nn.Linear(4 * d_model, d_model)

        def forward(self, x: Tensor) -> Tensor:
            x = x + self.attention(self.norm1(x))
            return x + self.proj(F.gelu(self.fc(self.norm2(x)), approximate="tanh"))

    class GPT(nn.Module):  # type: ignore[misc]
        """A GPT-2-style decoder LM; the defaults are GPT-2 small at 512 tokens (124 M
        parameters).

        Token and learned position embeddings, ``num_layers`` pre-LN ``DecoderBlock``, a final
        LayerNorm, and an LM head tied to the token embedding (no bias). No dropout. GPT-2's
        initialisation: normal(0, 0.02) weights, zero biases, and the residual projections
        scaled by 1/sqrt(2 * num_layers). ``(N, S)`` int64 tokens, ``S <= max_len`` ->
        ``(N, S, vocab_size)`` next-token logits.
        """

        def __init__(
            self,
            vocab_size: int = 50257,
            max_len: int = 512,
            d_model: int = 768,
            nhead: int = 12,
            num_layers: int = 12,
        ) -> None:
            super().__init__()
            self.tokens = nn.Embedding(vocab_size, d_model)
            self.positions = nn.Embedding(max_len, d_model)
            self.blocks = nn.ModuleList(DecoderBlock(d_model, nhead) for _ in range(num_layers))
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab_size, bias=False)
            self.head.weight = self.tokens.weight  # tied: initialised once, as the embedding
            for module in self.modules():
                if isinstance(module, nn.Linear | nn.Embedding) and module is not self.head:
                    nn.init.normal_(module.weight, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            for block in self.blocks:
                for projection in (block.attention.proj, block.proj):
                    nn.init.normal_(projection.weight, std=0.02 / math.sqrt(2 * num_layers))

        def forward(self, tokens: Tensor) -> Tensor:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.tokens(tokens) + self.positions(positions)
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return Bottleneck, BottleneckResNet, CausalSelfAttention, DecoderBlock, GPT


def _adamw(params: Iterable[Parameter], **kwargs: Any) -> Optimizer:
    """AdamW with lr 1e-3; ``kwargs`` (e.g. ``fused=True``, ``lr=...``) are passed on."""
    import torch

    return torch.optim.AdamW(params, **{"lr": 1e-3, **kwargs})


def _build_resnet_like() -> Module:
    return _model_classes()["ResNetLike"](num_classes=10)


def _build_transformer_lm() -> Module:
    return _model_classes()["TransformerLM"](vocab_size=1000, max_len=128)


def _build_resnet50() -> Module:
    return _model_classes()["BottleneckResNet"]()


def _build_gpt2() -> Module:
    return _model_classes()["GPT"]()


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
        kind="conv",
        make_model=_build_resnet_like,
        make_optimizer=_adamw,
        make_batch=data.batch,
        dataset=data,
        loss_fn=_cross_entropy,
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
        kind="transformer",
        make_model=_build_transformer_lm,
        make_optimizer=_adamw,
        make_batch=data.batch,
        dataset=data,
        loss_fn=_cross_entropy,
        sample_shape="128 tokens int64 in [0, 1000), next-token targets",
    )


def mlp() -> Workload:
    """An MLP on 512-d vectors: three hidden Linear+GELU layers of 1024, 10 classes (2.6 M).

    Batch: ``(N, 512)`` float32 vectors, ``(N,)`` int64 labels; cross-entropy loss.
    """
    data = SyntheticVectors(features=512, num_classes=10)
    return Workload(
        name="mlp",
        kind="mlp",
        make_model=_build_mlp,
        make_optimizer=_adamw,
        make_batch=data.batch,
        dataset=data,
        loss_fn=_cross_entropy,
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
        kind="conv",
        make_model=_build_resnet50,
        make_optimizer=_adamw,
        make_batch=_PooledBatches(data),
        dataset=data,
        loss_fn=_cross_entropy,
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
        kind="transformer",
        make_model=_build_gpt2,
        make_optimizer=_adamw,
        make_batch=_PooledBatches(data),
        dataset=data,
        loss_fn=_cross_entropy,
        sample_shape="512 tokens int64 in [0, 50257), next-token targets",
    )


BUILTIN_WORKLOADS: dict[str, Callable[[], Workload]] = {
    "conv": resnet_like,
    "transformer": transformer_encoder,
    "mlp": mlp,
    "resnet50": resnet50,
    "gpt2": gpt2,
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


# --- losses ---------------------------------------------------------------------------------------


def _cross_entropy(outputs: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy of logits and integer class targets, classes on dim 1 or on the last dim.

    ``(N, C)``/``(N,)`` and ``(N, C, d...)``/``(N, d...)`` follow torch (classes on dim 1);
    ``(N, S, C)``/``(N, S)`` (a language model's logits) is flattened to ``(N*S, C)``/``(N*S)``.
    """
    import torch.nn.functional as F

    torch_layout = outputs.shape[:1] + outputs.shape[2:] == targets.shape
    if not torch_layout and outputs.shape[:-1] == targets.shape:
        return F.cross_entropy(outputs.flatten(0, -2), targets.flatten())
    return F.cross_entropy(outputs, targets)


def _mse(outputs: Tensor, targets: Tensor) -> Tensor:
    """Mean squared error (for floating-point targets)."""
    import torch.nn.functional as F

    return F.mse_loss(outputs, targets)


def _default_loss(targets: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
    """Cross-entropy for integer targets, MSE for anything else."""
    import torch

    integer = not (targets.dtype.is_floating_point or targets.dtype.is_complex)
    return _cross_entropy if integer and targets.dtype != torch.bool else _mse


# --- the user's factory ---------------------------------------------------------------------------


def resolve_workload(
    choice: str | Workload | None = None, *, device: str | None = None
) -> Workload:
    """The workload to probe: a ``Workload``, a built-in name, or ``"package.module:factory"``.

    ``None`` gives the default built-in for ``device`` (``default_workload``), or
    ``DEFAULT_WORKLOAD`` when no device is named.
    """
    if isinstance(choice, Workload):
        return choice
    if choice is None:
        name = DEFAULT_WORKLOAD if device is None else default_workload(device)
        return BUILTIN_WORKLOADS[name]()
    if choice in BUILTIN_WORKLOADS:
        return BUILTIN_WORKLOADS[choice]()
    if ":" in choice:
        return load_workload(choice)
    raise WorkloadError(
        f"'{choice}' is neither a built-in workload ({_listed(BUILTIN_WORKLOADS)}) nor a"
        f" package.module:factory reference{_perhaps(choice, BUILTIN_WORKLOADS)}"
    )


def load_workload(spec: str) -> Workload:
    """Import ``"package.module:factory"``, call the factory, and check what it returns.

    The current directory is put first on ``sys.path`` (as ``python -m`` does) so that a
    module next to the training script imports. Raises ``WorkloadError`` for every way the
    factory is unusable, the user's own exception chained as ``__cause__``.
    """
    module_name, attribute = _parse_spec(spec)
    module = _import(spec, module_name)
    factory = _attribute(spec, module, module_name, attribute)
    return as_workload(_call_factory(spec, factory), name=spec)


def _parse_spec(spec: str) -> tuple[str, str]:
    """``"package.module:factory"`` -> ``("package.module", "factory")``; dotted both sides."""
    module_name, colon, attribute = spec.partition(":")
    parts = [*module_name.split("."), *attribute.split(".")]
    if colon and all(part.isidentifier() for part in parts):
        return module_name, attribute
    hint = ""
    if "/" in spec or "\\" in spec or spec.partition(":")[0].endswith(".py"):
        hint = " (a module name, not a file path)"
    raise WorkloadError(
        f"'{spec}' is not a factory reference: write package.module:factory{hint},"
        " e.g. mypkg.models:make_workload"
    )


def _ensure_current_directory_on_path() -> None:
    """Put the current directory first on ``sys.path`` unless it is there (as ``python -m``)."""
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.insert(0, here)


def _import(spec: str, module_name: str) -> Any:
    """Import the factory's module; any failure is a ``WorkloadError`` naming its cause."""
    _ensure_current_directory_on_path()
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and _is_self_or_parent(exc.name, module_name):
            fix = "check the name and that it is importable from the current directory"
            if module_name.endswith(".py"):
                fix = f"drop the '.py': {module_name.removesuffix('.py')}:..."
            raise WorkloadError(
                f"'{spec}': module '{module_name}' cannot be imported ({exc}); {fix}"
            ) from exc
        raise WorkloadError(
            f"'{spec}': module '{module_name}' cannot be imported: it needs a module that is"
            f" missing ({exc}); install it in this environment"
        ) from exc
    except SystemExit as exc:
        raise WorkloadError(
            f"'{spec}': importing '{module_name}' exited (SystemExit {exc.code}); a module"
            " with a factory must not parse arguments or train at import: put that under"
            " if __name__ == '__main__':"
        ) from exc
    except Exception as exc:
        raise WorkloadError(
            f"'{spec}': importing '{module_name}' raised {_exception(exc)}; fix the module"
        ) from exc


def _is_self_or_parent(missing: str, module_name: str) -> bool:
    """Whether the module that was not found is ``module_name`` or one of its packages."""
    return module_name == missing or module_name.startswith(missing + ".")


def _attribute(spec: str, module: Any, module_name: str, attribute: str) -> Callable[[], Any]:
    """The factory named by the dotted ``attribute`` of ``module``; it must be callable."""
    found = module
    owner = f"module '{module_name}'"
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError as exc:
            public = [name for name in dir(found) if not name.startswith("_")]
            raise WorkloadError(
                f"'{spec}': {owner} has no attribute '{part}'"
                f"{_perhaps(part, public) or '; check the factory name'}"
            ) from exc
        owner = f"'{part}'"
    if not callable(found):
        raise WorkloadError(
            f"'{spec}': '{attribute}' is {_article(found)}, not a function; point to a function"
            " that takes no arguments and returns the workload"
        )
    return found  # type: ignore[no-any-return]


def _call_factory(spec: str, factory: Callable[[], Any]) -> Any:
    """Call the factory with no arguments; its failures become ``WorkloadError``."""
    try:
        inspect.signature(factory).bind()
    except TypeError as exc:
        raise WorkloadError(
            f"'{spec}' needs arguments ({exc}); a factory is called with none: give them"
            " defaults or wrap it in a function without parameters"
        ) from exc
    except ValueError:
        pass  # no readable signature (a builtin): let the call decide
    try:
        return factory()
    except SystemExit as exc:
        raise WorkloadError(
            f"'{spec}' exited (SystemExit {exc.code}); a factory must return the workload,"
            " not parse arguments or exit"
        ) from exc
    except Exception as exc:
        raise WorkloadError(f"'{spec}' raised {_exception(exc)}; fix the factory") from exc


_FIELDS = ("model", "optimizer", "dataset", "example_batch", "loss_fn", "kind", "max_batch_size")


def as_workload(result: Any, *, name: str) -> Workload:
    """Check a factory's result and make it a ``Workload`` (see the module docstring).

    ``result`` is a ``Workload`` (returned as it is), a mapping, or an object with the
    protocol's attributes. ``name`` names the workload in reports and in error messages.
    """
    from torch import nn

    if isinstance(result, Workload):
        return result
    if isinstance(result, Mapping):
        fields = _mapping_fields(result, name)
    elif not isinstance(result, nn.Module) and any(hasattr(result, f) for f in _FIELDS):
        fields = {f: getattr(result, f) for f in _FIELDS if hasattr(result, f)}
    else:
        raise WorkloadError(
            f"'{name}' returned {_article(result)}; a factory returns a Workload or a dict"
            " with model, optimizer and a dataset or example_batch (see the README)"
        )
    return _user_workload({k: v for k, v in fields.items() if v is not None}, name, result)


def _mapping_fields(result: Mapping[Any, Any], name: str) -> dict[str, Any]:
    """The protocol's fields of a mapping; an unknown key is an error (likely a typo)."""
    for key in result:
        if key not in _FIELDS:
            raise WorkloadError(
                f"'{name}' returned a {type(result).__name__} with the unknown key {key!r}"
                f"{_perhaps(str(key), _FIELDS) or f'; the keys are {_listed(_FIELDS)}'}"
            )
    return dict(result)


def _user_workload(fields: dict[str, Any], name: str, result: object) -> Workload:
    """Build the ``Workload`` from the protocol's fields, checking each."""
    container = type(result).__name__
    for required in ("model", "optimizer"):
        if required not in fields:
            raise WorkloadError(f"'{name}' returned a {container} without '{required}'; {_README}")
    if "dataset" not in fields and "example_batch" not in fields:
        raise WorkloadError(
            f"'{name}' returned a {container} with neither 'dataset' nor 'example_batch'; {_README}"
        )
    dataset = _checked_dataset(fields["dataset"], name) if "dataset" in fields else None
    batches: _RepeatedBatch | _DatasetBatches
    if "example_batch" in fields:
        batches = _RepeatedBatch(*_checked_batch(fields["example_batch"], name))
        if dataset is not None:
            _DatasetBatches(dataset, name)(1)  # its samples are (inputs, targets) pairs
    else:
        batches = _DatasetBatches(fields["dataset"], name)
    inputs, targets = batches(2)  # two samples: a dataset's must also batch together
    return Workload(
        name=name,
        kind=_checked_kind(fields.get("kind", "other"), name),
        make_model=_model_builder(fields["model"], name),
        make_optimizer=_OptimizerBuilder(fields["optimizer"], name),
        make_batch=batches,
        dataset=dataset,
        loss_fn=_checked_callable(fields, "loss_fn", name) or _default_loss(targets),
        sample_shape=f"inputs {_describe_sample(inputs)}, targets {_describe_sample(targets)}",
        max_batch_size=_checked_max_batch_size(fields, dataset, name),
    )


def _checked_kind(kind: Any, name: str) -> Kind:
    if kind not in KINDS:
        raise WorkloadError(
            f"'{name}': kind {kind!r} is not one of {_listed(KINDS)}{_perhaps(str(kind), KINDS)}"
        )
    return kind  # type: ignore[no-any-return]


def _checked_callable(fields: Mapping[str, Any], key: str, name: str) -> Any:
    value = fields.get(key)
    if value is not None and not callable(value):
        raise WorkloadError(f"'{name}': '{key}' is {_article(value)}, not a function")
    return value


def _checked_max_batch_size(
    fields: Mapping[str, Any], dataset: MapDataset | None, name: str
) -> int | None:
    size = fields.get("max_batch_size")
    if size is None:
        return len(dataset) if dataset is not None else None
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise WorkloadError(f"'{name}': 'max_batch_size' must be a positive int, not {size!r}")
    return size


def _checked_dataset(dataset: Any, name: str) -> MapDataset:
    """A map-style dataset with at least one sample."""
    from torch.utils.data import IterableDataset

    if isinstance(dataset, IterableDataset) or not (
        hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
    ):
        raise WorkloadError(
            f"'{name}': 'dataset' is {_article(dataset)}, not a map-style dataset (one with"
            " __len__ and __getitem__); give one, or an example_batch instead"
        )
    try:
        length = len(dataset)
    except Exception as exc:
        raise WorkloadError(f"'{name}': len(dataset) raised {_exception(exc)}") from exc
    if length < 1:
        raise WorkloadError(f"'{name}': the dataset is empty; give one with samples")
    return dataset  # type: ignore[no-any-return]


def _checked_batch(batch: Any, name: str) -> tuple[Tensor, Tensor]:
    """An ``(inputs, targets)`` pair of tensors with the same number of samples (dim 0)."""
    import torch

    if not (isinstance(batch, Sequence) and len(batch) == 2) or not all(
        isinstance(t, torch.Tensor) for t in batch
    ):
        raise WorkloadError(
            f"'{name}': 'example_batch' is {_article(batch)}; give an (inputs, targets) tuple"
            " of two tensors"
        )
    inputs, targets = batch
    if inputs.dim() == 0 or targets.dim() == 0 or inputs.shape[0] != targets.shape[0]:
        raise WorkloadError(
            f"'{name}': 'example_batch' has inputs {tuple(inputs.shape)} and targets"
            f" {tuple(targets.shape)}; both need the same number of samples on dim 0"
        )
    if inputs.shape[0] < 1:
        raise WorkloadError(f"'{name}': 'example_batch' holds no samples")
    return inputs.detach(), targets.detach()


def _repeat(inputs: Tensor, targets: Tensor, batch_size: int) -> tuple[Tensor, Tensor]:
    """``batch_size`` samples taken cyclically from a batch along dim 0 (new tensors)."""
    import torch

    index = torch.arange(batch_size, device=inputs.device) % inputs.shape[0]
    return inputs.index_select(0, index), targets.index_select(0, index.to(targets.device))


class _RepeatedBatch:
    """``make_batch`` from an example batch: its samples repeated to the size asked for."""

    def __init__(self, inputs: Tensor, targets: Tensor) -> None:
        self.inputs = inputs
        self.targets = targets

    def __call__(self, batch_size: int) -> tuple[Tensor, Tensor]:
        _check_batch_size(batch_size)
        return _repeat(self.inputs, self.targets, batch_size)


class _PooledBatches:
    """``make_batch`` of a large built-in: ``DISTINCT`` samples drawn once, repeated to the size.

    Drawing 1536 fresh 224x224 images for every trial would cost seconds of CPU that are no
    part of training; repeated samples cost the model exactly what distinct ones do. The pool
    is drawn on the first call, so building the workload imports no torch.
    """

    DISTINCT = 64

    def __init__(self, data: _SyntheticDataset) -> None:
        self.data = data
        self._pool: tuple[Tensor, Tensor] | None = None

    def __call__(self, batch_size: int) -> tuple[Tensor, Tensor]:
        _check_batch_size(batch_size)
        if self._pool is None:
            self._pool = self.data.batch(self.DISTINCT)
        return _repeat(*self._pool, batch_size)


class _DatasetBatches:
    """``make_batch`` from a dataset: its first samples, collated, repeated to the size asked.

    At most ``DISTINCT`` samples are read (and kept), so a large batch costs no more reads.
    """

    DISTINCT = 64

    def __init__(self, dataset: MapDataset, name: str) -> None:
        self.dataset = dataset
        self.name = name
        self._first: tuple[Tensor, Tensor] | None = None

    def __call__(self, batch_size: int) -> tuple[Tensor, Tensor]:
        _check_batch_size(batch_size)
        wanted = min(batch_size, len(self.dataset), self.DISTINCT)
        if self._first is None or self._first[0].shape[0] < wanted:
            self._first = self._collate(wanted)
        return _repeat(*self._first, batch_size)

    def _collate(self, count: int) -> tuple[Tensor, Tensor]:
        import torch
        from torch.utils.data import default_collate

        samples = [self._sample(index) for index in range(count)]
        try:
            batch = default_collate(samples)
        except Exception as exc:
            raise WorkloadError(
                f"'{self.name}': the dataset's samples cannot be batched ({_exception(exc)});"
                " samples must be (inputs, targets) tensors of one shape, or give example_batch"
                " at the largest shape"
            ) from exc
        if not (isinstance(batch, Sequence) and len(batch) == 2) or not all(
            isinstance(t, torch.Tensor) for t in batch
        ):
            raise WorkloadError(
                f"'{self.name}': dataset[0] is {_article(samples[0])}, not an (inputs,"
                " targets) pair; return one from __getitem__, or give example_batch"
            )
        return batch[0], batch[1]

    def _sample(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except Exception as exc:
            raise WorkloadError(
                f"'{self.name}': dataset[{index}] raised {_exception(exc)}; fix the dataset"
            ) from exc


def _model_builder(model: Any, name: str) -> Callable[[], Module]:
    """``make_model`` from a module (copied each call) or from a function that builds one."""
    from torch import nn

    if isinstance(model, nn.Module):
        return _ModelCopies(model, name)
    if callable(model):
        return _ModelBuilder(model, name)
    raise WorkloadError(
        f"'{name}': 'model' is {_article(model)}; give an nn.Module or a function that builds one"
    )


class _ModelCopies:
    """A fresh deep copy of the user's model at every call; the original is never trained."""

    def __init__(self, template: Module, name: str) -> None:
        self.template = template
        self.name = name

    def __call__(self) -> Module:
        try:
            return copy.deepcopy(self.template)
        except Exception as exc:
            raise WorkloadError(
                f"'{self.name}': the model cannot be copied ({_exception(exc)}); give 'model'"
                " as a function that builds a fresh model"
            ) from exc


class _ModelBuilder:
    """The user's model function, its failures and wrong results made ``WorkloadError``."""

    def __init__(self, build: Callable[[], Any], name: str) -> None:
        self.build = build
        self.name = name

    def __call__(self) -> Module:
        from torch import nn

        try:
            model = self.build()
        except Exception as exc:
            raise WorkloadError(
                f"'{self.name}': building the model raised {_exception(exc)}; fix the model"
                " function"
            ) from exc
        if not isinstance(model, nn.Module):
            raise WorkloadError(
                f"'{self.name}': the model function returned {_article(model)}, not an nn.Module"
            )
        return model


class _OptimizerBuilder:
    """The user's optimizer factory, checked: keyword arguments, failures, result type.

    It carries the factory's signature, so ``Workload.optimizer_accepts`` reads the user's.
    """

    def __init__(self, factory: Any, name: str) -> None:
        import torch

        if isinstance(factory, torch.optim.Optimizer):
            raise WorkloadError(
                f"'{name}': 'optimizer' is {_article(factory)} already built; give a factory"
                " (params -> optimizer), e.g. functools.partial(torch.optim.AdamW, lr=3e-4):"
                " every trial builds a fresh one"
            )
        if not callable(factory):
            raise WorkloadError(
                f"'{name}': 'optimizer' is {_article(factory)}; give a function params ->"
                " optimizer, e.g. functools.partial(torch.optim.AdamW, lr=3e-4)"
            )
        self.factory = factory
        self.name = name
        # Unreadable (a builtin): no __signature__, so Workload.optimizer_accepts assumes yes.
        with contextlib.suppress(TypeError, ValueError):
            self.__signature__ = inspect.signature(factory)

    def __call__(self, params: Iterable[Parameter], /, **kwargs: Any) -> Optimizer:
        import torch

        signature = getattr(self, "__signature__", None)
        if kwargs and signature is not None:
            try:
                signature.bind(params, **kwargs)
            except TypeError as exc:
                raise WorkloadError(
                    f"'{self.name}': the optimizer factory does not take {_listed(kwargs)}"
                    " as keyword arguments; write it as e.g. functools.partial("
                    "torch.optim.AdamW, lr=3e-4) or lambda params, **kw: ...(params, **kw)"
                ) from exc
        try:
            optimizer = self.factory(params, **kwargs)
        except Exception as exc:
            raise WorkloadError(
                f"'{self.name}': the optimizer factory raised {_exception(exc)}"
            ) from exc
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise WorkloadError(
                f"'{self.name}': the optimizer factory returned {_article(optimizer)}, not a"
                " torch.optim.Optimizer"
            )
        return optimizer


# --- message helpers ------------------------------------------------------------------------------


def _describe_sample(batch: Tensor) -> str:
    """One sample of a batch for reports: ``3x64x64 float32``, or ``int64`` for a scalar."""
    dtype = str(batch.dtype).removeprefix("torch.")
    shape = "x".join(str(size) for size in batch.shape[1:])
    return f"{shape} {dtype}" if shape else dtype


def _article(value: object) -> str:
    """``None``, ``an int``, ``a Sequential``: what a value is, for messages."""
    if value is None:
        return "None"
    kind = type(value).__name__
    return f"{'an' if kind[0].lower() in 'aeiou' else 'a'} {kind}"


def _exception(exc: BaseException) -> str:
    """``RuntimeError: boom`` (the type alone when the message is empty)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _listed(names: Iterable[object]) -> str:
    return ", ".join(str(name) for name in names)


def _perhaps(word: str, choices: Iterable[str]) -> str:
    """``"; perhaps you meant 'x'?"`` for the closest choice, or ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; perhaps you meant '{close[0]}'?" if close else ""
