"""Low-rank adapters (LoRA) on a frozen base model, for DP fine-tuning.

LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022)
replaces a Linear layer's weight update by a product of two thin matrices:

    y = W₀ x + b₀ + (α/r) · B A x,     A ∈ R^{r×in}, B ∈ R^{out×r}, B = 0 at the start

with W₀, b₀ frozen. Under DP (Yu et al., "Differentially Private Fine-tuning of Language
Models", ICLR 2022) only A and B are trained, clipped and noised: the noise is added to
r·(in + out) values per adapted layer instead of in·out, and a client uploads only them.

`apply_lora` does this to any model, in place: every parameter of the model becomes a
buffer (frozen: not in ``named_parameters``, so the DP-SGD engines, the noise and the
upload never see it), and each targeted nn.Linear becomes a `LoRALinear` whose only
parameters are its adapters ``lora_a`` and ``lora_b``, two plain nn.Linear layers (no
bias), so the book-keeping engine's Linear rule clips them exactly. The platform needs
nothing else: a run's parameters *are* the adapters.

The base comes from a local checkpoint file (`load_base_checkpoint`: a state dict read
with ``torch.load(weights_only=True)``, optionally checked against its SHA-256), never
from a hub at run time; without one the base is built from a fixed seed (``base_seed``),
so every process that builds the model (each Ray worker) holds the same frozen base.
`char_transformer_lora` is the zoo's entry (``experiment.model.name:
char_transformer_lora``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from raydpfl.models.text import CharTransformer

#: The Linear layers of `CharTransformer` adapted by default: attention and MLP (the
#: head, embeddings and norms stay frozen).
CHAR_TRANSFORMER_TARGETS = ("qkv", "proj", "mlp_in", "mlp_out")


class LoRALinear(nn.Module):
    """y = x W₀ᵀ + b₀ + (α/r)·lora_b(lora_a(x)), W₀ and b₀ buffers (frozen).

    ``lora_a`` starts as nn.Linear's default (Kaiming-uniform), ``lora_b`` at zero, so
    the layer starts as the base layer (Hu et al. 2022, §4)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.register_buffer("weight", base.weight.detach().clone())
        bias = None if base.bias is None else base.bias.detach().clone()
        self.register_buffer("bias", bias)
        device, dtype = base.weight.device, base.weight.dtype
        self.lora_a = nn.Linear(self.in_features, rank, bias=False, device=device, dtype=dtype)
        self.lora_b = nn.Linear(rank, self.out_features, bias=False, device=device, dtype=dtype)
        nn.init.zeros_(self.lora_b.weight)
        self.scaling = float(alpha) / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + self.lora_b(self.lora_a(x)) * self.scaling

    @torch.no_grad()
    def merged_weight(self) -> torch.Tensor:
        """W₀ + (α/r)·B A: the adapted layer as one Linear weight (for export)."""
        return self.weight + self.scaling * self.lora_b.weight @ self.lora_a.weight


def freeze_to_buffers(module: nn.Module) -> None:
    """Turns every parameter of `module` and its submodules into a buffer of the same
    name and value (frozen: gone from ``named_parameters``, kept in ``state_dict``)."""
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if p is None:
                continue
            del m._parameters[name]
            m.register_buffer(name, p.detach())


def apply_lora(
    model: nn.Module, rank: int = 8, alpha: float = 16.0, targets: Sequence[str] | None = None
) -> nn.Module:
    """Freezes `model` and adds adapters to its Linear layers, in place; returns it.

    `targets`: the Linear layers to adapt, each named by its full module name or its last
    component (``"qkv"`` adapts every ``blocks.*.qkv``); None adapts every nn.Linear.

    Raises:
        ValueError: a target names no nn.Linear of the model, or no layer is adapted.
    """
    linears = {name: m for name, m in model.named_modules() if type(m) is nn.Linear}
    if targets is None:
        chosen = list(linears)
    else:
        chosen = [n for n in linears if n in targets or n.rsplit(".", 1)[-1] in targets]
        matched = {t for t in targets for n in chosen if n == t or n.rsplit(".", 1)[-1] == t}
        missing = [t for t in targets if t not in matched]
        if missing:
            raise ValueError(
                f"LoRA targets {missing} name no nn.Linear layer; the model's are "
                f"{sorted(linears)}"
            )
    if not chosen:
        raise ValueError("LoRA: the model has no nn.Linear layer to adapt")
    freeze_to_buffers(model)
    for name in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoRALinear(linears[name], rank, alpha))
    return model


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_base_checkpoint(
    model: nn.Module,
    path: str | os.PathLike[str],
    sha256: str | None = None,
    field: str = "experiment.model.options.checkpoint",
) -> nn.Module:
    """Loads a state dict saved with ``torch.save(model.state_dict(), path)`` into the
    base `model` (strict), with ``torch.load(weights_only=True)``: tensors only, nothing
    unpickled. With `sha256` the file must have that digest first.

    Raises:
        ValueError: the file is missing, its digest differs, it is not a state dict of
            tensors, or its keys or shapes do not fit the model (the message names
            `field`).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"{field}: no checkpoint file at {str(path)!r}")
    if sha256 is not None and file_sha256(path) != sha256.lower():
        raise ValueError(f"{field}: {str(path)!r} does not have the SHA-256 {sha256}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses anything but tensors and containers
        raise ValueError(f"{field}: {str(path)!r} is not a tensor state dict ({e})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{field}: {str(path)!r} holds no state dict of tensors")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:3])
        raise ValueError(f"{field}: {str(path)!r} does not fit the base model: {detail}") from None
    return model


def char_transformer_lora(
    input_shape: tuple[int, ...],
    num_classes: int,
    checkpoint: str | None = None,
    checkpoint_sha256: str | None = None,
    rank: int = 8,
    alpha: float = 16.0,
    targets: str | Sequence[str] = CHAR_TRANSFORMER_TARGETS,
    base_seed: int = 0,
    vocab_size: int | None = None,
    width: int = 64,
    heads: int = 4,
    layers: int = 2,
) -> nn.Module:
    """`CharTransformer` (`width`, `heads`, `layers`) loaded from `checkpoint` (a local
    state-dict file of the same architecture; without one, built from `base_seed`),
    frozen, with rank-`rank` adapters on `targets` (`apply_lora`; a comma-separated
    string or a sequence of layer names)."""
    if isinstance(targets, str):
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(base_seed)  # the same base in every process, checkpoint or not
        base = CharTransformer(input_shape, num_classes, vocab_size, width, heads, layers)
    if checkpoint is not None:
        load_base_checkpoint(base, checkpoint, checkpoint_sha256)
    return apply_lora(base, rank, alpha, tuple(targets))


def adapter_values(model: nn.Module) -> int:
    """The number of trained (uploaded) values: the model's parameters."""
    return sum(p.numel() for p in model.parameters())


def frozen_values(model: nn.Module) -> int:
    """The number of frozen base values (buffers)."""
    return sum(b.numel() for b in model.buffers())


__all__ = [
    "CHAR_TRANSFORMER_TARGETS",
    "LoRALinear",
    "adapter_values",
    "apply_lora",
    "char_transformer_lora",
    "file_sha256",
    "freeze_to_buffers",
    "frozen_values",
    "load_base_checkpoint",
]
