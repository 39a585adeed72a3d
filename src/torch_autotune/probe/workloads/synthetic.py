"""Synthetic data for the built-in workloads: seeded datasets made on the fly, per index.

``SyntheticImages``, ``SyntheticTokens`` and ``SyntheticVectors`` yield (inputs, targets)
samples and draw whole batches; ``CpuHeavyDataset`` costs CPU time per item, like decoding and
augmenting a JPEG, to compare DataLoader worker counts. Importing this module does not import
torch; torch is imported when data is drawn.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from torch_autotune.probe.workloads.batches import _check_batch_size, _repeat

if TYPE_CHECKING:
    from torch import Generator, Tensor

__all__ = ["CpuHeavyDataset", "SyntheticImages", "SyntheticTokens", "SyntheticVectors"]


def _generator(seed: int, stream: int) -> Generator:
    """A CPU ``torch.Generator`` for item ``stream`` of the data seeded with ``seed``.

    The CPU generator (mt19937) keeps only the low 32 bits of its seed, so the two are mixed
    into 32 bits: a hashed offset for ``seed`` (Knuth's multiplicative hash) plus ``stream``,
    which keeps the streams of one dataset distinct.
    """
    import torch

    offset = (seed * 0x9E3779B1) % 2**32
    return torch.Generator().manual_seed((offset + stream) % 2**32)


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
