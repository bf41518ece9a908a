"""A character model for next-character prediction (LEAF's Shakespeare).

`CharTransformer`: token embedding + learned position embedding, `layers` pre-norm
transformer blocks (causal self-attention and an MLP, built from Linear and LayerNorm so
that every per-sample gradient depends on that sample alone), and a Linear head on the
last position's state, predicting the next character. Inputs are int64 token ids of
shape (B, L) (the `shakespeare` reader's 80-character windows over LEAF's 80-symbol
vocabulary); outputs are (B, vocab) logits.

Registered as ``char_transformer`` by `raydpfl.config.schema` (a "module:attr" target
with its options dataclass, so ``experiment.model.options`` is checked strictly and the
class travels to Ray workers).

`CharLSTM`: token embedding, a `raydpfl.models.recurrent.DPLSTM` (an LSTM built from
Linear cells) and a Linear head on the last hidden state: LEAF's own Shakespeare model
(embedding 8, two LSTM layers of 256) by default.

DP-SGD: every layer of both has a book-keeping rule (Embedding, LayerNorm and Linear
layers, attention included: it is written out from Linear layers), so
``runtime.engine: auto`` takes the book-keeping engine (`raydpfl.privacy.per_sample.engines`). The
position embedding is looked up per sample (ids expanded to (B, L)), not once for the
batch: a lookup shared by all samples would get the batch's summed output gradient,
which no per-sample rule can split. The attention is written out (no fused kernel) so
the vmap engine can batch it too. The LSTM's hidden-to-hidden Linear runs once per time
step; the engine merges its calls into one record (`raydpfl.privacy.per_sample.repeated`),
where nn.LSTM under vmap cost about 30 s per 16 sequences on 2 CPU cores here.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from raydpfl.models.recurrent import DPLSTM


class _Block(nn.Module):
    """Pre-norm block: x + Attn(LN(x)); x + MLP(LN(x)), causal attention over positions."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} must be divisible by heads {heads}")
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp_in = nn.Linear(width, 4 * width)
        self.mlp_out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        d = width // self.heads
        q, k, v = (t.reshape(b, length, self.heads, d).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        attended = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, length, width)
        x = x + self.proj(attended)
        return x + self.mlp_out(torch.relu(self.mlp_in(self.norm2(x))))


class CharTransformer(nn.Module):
    """Next-character model over windows of `input_shape[0]` tokens (see the module
    docstring). Options: `vocab_size` (default: `num_classes`), `width`, `heads`,
    `layers`."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        vocab_size: int | None = None,
        width: int = 64,
        heads: int = 4,
        layers: int = 2,
    ) -> None:
        super().__init__()
        if len(input_shape) != 1:
            raise ValueError(
                f"char_transformer takes token windows of shape (L,), got {tuple(input_shape)}"
            )
        self.length = int(input_shape[0])
        self.vocab_size = int(vocab_size or num_classes)
        self.embed = nn.Embedding(self.vocab_size, width)
        self.position = nn.Embedding(self.length, width)
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.long()
        positions = (
            torch.arange(tokens.shape[-1], device=tokens.device).expand_as(tokens).contiguous()
        )
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, -1]))


class CharLSTM(nn.Module):
    """Next-character model over windows of `input_shape[0]` tokens: Embedding(vocab,
    `embed`) → `DPLSTM`(`embed`, `hidden`, `layers`) → Linear head on the last hidden
    state (see the module docstring). Defaults are LEAF's Shakespeare LSTM's."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        vocab_size: int | None = None,
        embed: int = 8,
        hidden: int = 256,
        layers: int = 2,
    ) -> None:
        super().__init__()
        if len(input_shape) != 1:
            raise ValueError(
                f"char_lstm takes token windows of shape (L,), got {tuple(input_shape)}"
            )
        self.vocab_size = int(vocab_size or num_classes)
        self.embed = nn.Embedding(self.vocab_size, embed)
        self.lstm = DPLSTM(embed, hidden, layers)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        states = self.lstm(self.embed(tokens.long()))
        return self.head(states[:, -1])
