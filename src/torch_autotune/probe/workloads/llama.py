"""A Llama-class decoder in plain torch: the built-in ``llama-1b`` (about 1.1 B parameters),
where memory is the limit on a single GPU.

The architecture of Llama (Touvron et al., "LLaMA", 2023) as Llama 3.2 1B shapes it: pre-norm
blocks with RMSNorm (Zhang and Sennrich 2019), rotary position embeddings (Su et al. 2021) on
the queries and keys, grouped-query attention (Ainslie et al. 2023: 32 query heads share 8
key-value heads) through ``F.scaled_dot_product_attention``, SwiGLU MLPs (Shazeer 2020), no
biases, an untied LM head. The vocabulary is Llama 2's 32,000 tokens rather than Llama 3's
128,256, which keeps the embeddings to 6% of the parameters, as a 1 B model has them.
This module imports torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Llama", "LlamaBlock", "RMSNorm", "rotary_tables"]


class RMSNorm(nn.Module):  # type: ignore[misc]
    """``x / rms(x) * weight``, the root mean square taken in float32 (as Llama does, so that
    bfloat16 activations do not lose the sum)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        scaled = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return scaled.type_as(x) * self.weight


def rotary_tables(head_dim: int, max_len: int, theta: float = 10000.0) -> tuple[Tensor, Tensor]:
    """(cos, sin), each ``(max_len, head_dim)``: the rotation of each position, the two halves
    of a head rotated by the same frequencies (the "rotate half" layout)."""
    frequencies = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), frequencies)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x`` ``(N, heads, S, head_dim)`` rotated by position (cos and sin ``(S, head_dim)``)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class GroupedQueryAttention(nn.Module):  # type: ignore[misc]
    """Causal attention of ``nhead`` query heads over ``kv_heads`` key-value heads, each shared
    by ``nhead / kv_heads`` queries, with rotary embeddings on the queries and keys."""

    def __init__(self, d_model: int, nhead: int, kv_heads: int) -> None:
        super().__init__()
        if d_model % nhead or nhead % kv_heads:
            raise ValueError(f"{d_model=}, {nhead=} and {kv_heads=} do not divide")
        self.nhead, self.kv_heads, self.head_dim = nhead, kv_heads, d_model // nhead
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.kv = nn.Linear(d_model, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        batch, length, d_model = x.shape
        query = self.q(x).view(batch, length, self.nhead, self.head_dim).transpose(1, 2)
        key, value = (
            t.view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
            for t in self.kv(x).chunk(2, dim=-1)
        )
        query, key = _rotate(query, cos, sin), _rotate(key, cos, sin)
        share = self.nhead // self.kv_heads  # each key-value head serves this many queries
        key, value = key.repeat_interleave(share, dim=1), value.repeat_interleave(share, dim=1)
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(batch, length, d_model))


class LlamaBlock(nn.Module):  # type: ignore[misc]
    """``x + attention(norm(x))``, then ``x + down(silu(gate(h)) * up(h))`` with
    ``h = norm(x)``."""

    def __init__(self, d_model: int, nhead: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(d_model)
        self.attention = GroupedQueryAttention(d_model, nhead, kv_heads)
        self.mlp_norm = RMSNorm(d_model)
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):  # type: ignore[misc]
    """A Llama-class decoder LM; the defaults are the built-in ``llama-1b`` (the module
    docstring): 16 blocks of d_model 2048, 32 query and 8 key-value heads, SwiGLU of 8192, a
    32,000-token vocabulary, 2,048 positions. ``(N, S)`` int64 tokens, ``S <= max_len`` ->
    ``(N, S, vocab_size)`` next-token logits. Weights normal(0, 0.02), as Llama's reference
    code initialises them."""

    def __init__(  # noqa: PLR0917  # the model's shape, as the other built-ins take theirs
        self,
        vocab_size: int = 32000,
        max_len: int = 2048,
        d_model: int = 2048,
        nhead: int = 32,
        kv_heads: int = 8,
        num_layers: int = 16,
        hidden: int = 8192,
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(
            LlamaBlock(d_model, nhead, kv_heads, hidden) for _ in range(num_layers)
        )
        self.norm = RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        cos, sin = rotary_tables(d_model // nhead, max_len)
        self.register_buffer("cos", cos, persistent=False)  # moved with the model, not saved
        self.register_buffer("sin", sin, persistent=False)
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens: Tensor) -> Tensor:
        length = tokens.shape[1]
        cos, sin = self.cos[:length], self.sin[:length]
        x = self.tokens(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))
