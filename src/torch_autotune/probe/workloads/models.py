"""The built-in models, in plain torch (no torchvision): small ones for a CPU, and two at the
size people train on a GPU.

``ResNetLike`` (of ``BasicBlock``) and ``TransformerLM`` are small enough for a few steps on a
laptop CPU; ``BottleneckResNet`` (of ``Bottleneck``) is ResNet-50 and ``GPT`` (of
``DecoderBlock`` and ``CausalSelfAttention``) is GPT-2 small, both following the published
architectures. This module imports torch: ``torch_autotune.probe.workloads`` imports it on
first use of a class (``workloads.ResNetLike``) or when a built-in builds its model.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "GPT",
    "BasicBlock",
    "Bottleneck",
    "BottleneckResNet",
    "CausalSelfAttention",
    "DecoderBlock",
    "ResNetLike",
    "TransformerLM",
]


def _shortcut(in_channels: int, out_channels: int, stride: int) -> nn.Module:
    """A residual block's shortcut: the identity, or a strided 1x1 conv and BN where the shape
    changes."""
    if stride == 1 and in_channels == out_channels:
        return nn.Identity()
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels)
    )


class _PooledClassifier(nn.Module):  # type: ignore[misc]
    """The shape of both ResNets: ``stem``, ``blocks``, global average pool, linear ``head``.

    Subclasses build the three. ``(N, 3, H, W)`` float images -> ``(N, num_classes)`` logits.
    """

    def forward(self, x: Tensor) -> Tensor:
        features = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(features, 1), 1))


class _TokenLM(nn.Module):  # type: ignore[misc]
    """The input of both language models: token and learned position embeddings of ``d_model``.

    Subclasses add their layers after these two, so the initialisation draws the same random
    numbers in the same order as a model that builds the embeddings itself.
    """

    def __init__(self, vocab_size: int, max_len: int, d_model: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(max_len, d_model)

    def embed(self, tokens: Tensor) -> Tensor:
        """``(N, S)`` int64 tokens, ``S <= max_len`` -> ``(N, S, d_model)`` embeddings."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tokens(tokens) + self.positions(positions)


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


class ResNetLike(_PooledClassifier):
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


class TransformerLM(_TokenLM):
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
        super().__init__(vocab_size, max_len, d_model)
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
        x = self.embed(tokens)
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        x = self.encoder(x, mask=mask, is_causal=True)
        return self.head(self.norm(x))


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


class BottleneckResNet(_PooledClassifier):
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


class GPT(_TokenLM):
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
        super().__init__(vocab_size, max_len, d_model)
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
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
