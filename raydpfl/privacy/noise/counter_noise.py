"""What the CPU noise samplers with counter-based streams share (``privacy.noise_sampler``
``ziggurat`` and ``boxmuller``).

A client's stream under such a sampler is a `CounterNoiseGenerator`: still a
`torch.Generator`, seeded exactly as the default one (so Poisson sampling and every other
draw an algorithm makes from it are unchanged), whose Gaussian noise
`raydpfl.privacy.per_sample.dpsgd` draws with `fill_normal_`. Each call (one noise tensor) takes
exactly one ``Tensor.random_`` draw from the torch stream (`draw_seed`), an integer in
[0, 2**63), and the sampler's numba kernel fills the tensor in row-major order from
counter-based SplitMix64 words keyed by that draw: the first pass has no serial
dependency, and the torch stream advances by one draw whatever the tensor's size.
The per-sampler stream formats are in `raydpfl.privacy.noise.ziggurat` and
`raydpfl.privacy.noise.boxmuller`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import numpy as np
import torch


class CounterNoiseGenerator(torch.Generator):
    """Base of the CPU noise streams: a `torch.Generator` (seeded by the caller as any
    client stream) whose Gaussians a subclass's `fill` kernel makes."""

    #: The ``privacy.noise_sampler`` value this stream implements.
    sampler = ""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        # torch.Generator.__new__ takes the device; there is no base __init__ to call.
        if torch.device(device).type != "cpu":
            raise ValueError(
                f"privacy.noise_sampler: {self.sampler} runs on the CPU; the device is {device}"
            )
        #: `draw_seed`'s int64 scalar, reused call after call (saves an allocation).
        self.seed_buf = torch.empty((), dtype=torch.int64)

    @staticmethod
    def fill(out: np.ndarray, seed: int, std: float) -> None:
        """Fills the contiguous 1-d float32/float64 array `out` with N(0, std²) from the
        stream keyed by `seed`."""
        raise NotImplementedError

    #: Optional: ``add(out, seed, std)`` adds `fill`'s values to `out` in place, in one
    #: rounding per value (bit for bit ``out + fill``); without it, `add_normal_` fills
    #: a temporary and adds it.
    add: Callable[[np.ndarray, int, float], None] | None = None

    #: Optional: ``add_low_rank(out, seed, std, g, a)`` adds Σ_b g[b]ᵀ a[b] (g: (B, q),
    #: a: (B, p)) into the flat q×p matrix `out`, then `fill`'s values, in one pass
    #: (value by value: (out + Σ_b g_b a_b) + z); without it, `add_normal_` adds the
    #: product with a GEMM first.
    add_low_rank: Callable[[np.ndarray, int, float, np.ndarray, np.ndarray], None] | None = None


@functools.cache  # looked up per noise tensor: resolve the module once, not per call
def kernel_fill(module: str, sampler: str, name: str = "fill") -> Callable[..., None]:
    """The compiled `name` (default ``fill``) of kernel `module`: numba is imported, and
    the kernel compiled (or loaded from its on-disk cache), on first use only."""
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as e:  # pragma: no cover - numba is a dependency
        raise RuntimeError(
            f"privacy.noise_sampler: {sampler} needs numba (pip install numba)"
        ) from e


def is_counter_noise(generator: torch.Generator) -> bool:
    """Whether Gaussian noise for this stream comes from a counter-based CPU sampler."""
    return isinstance(generator, CounterNoiseGenerator)


def draw_seed(generator: torch.Generator) -> int:
    """The call's one draw from the torch stream (the key of its counter-based words):
    ``Tensor.random_`` on an int64 scalar, an integer in [0, 2**63)."""
    if isinstance(generator, CounterNoiseGenerator):
        buf = generator.seed_buf
    else:  # a plain torch.Generator (the floors' replay of the draw)
        buf = torch.empty((), dtype=torch.int64)
    return int(buf.random_(generator=generator))


def _checked_seed(
    out: torch.Tensor, generator: CounterNoiseGenerator, verb: str, seed: int | None
) -> int:
    """The checks `fill_normal_` and `add_normal_` share (a float32/float64 CPU tensor),
    then the call's seed: `seed` if the caller drew it, else one draw (`draw_seed`)."""
    name = generator.sampler
    if out.device.type != "cpu":
        raise ValueError(f"the {name} sampler {verb} CPU tensors; got {out.device}")
    if out.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"the {name} sampler {verb} float32/float64 tensors; got {out.dtype}")
    return draw_seed(generator) if seed is None else seed


def fill_normal_(out: torch.Tensor, std: float, generator: CounterNoiseGenerator) -> torch.Tensor:
    """Fills the CPU tensor `out` with N(0, std²) from `generator`'s sampler, keyed by one
    draw of its torch stream, in place (row-major order); returns `out`."""
    seed = _checked_seed(out, generator, "fills", None)
    if out.numel() == 0:
        return out
    if out.is_contiguous():
        generator.fill(out.numpy().reshape(-1), seed, std)
    else:
        flat = torch.empty(out.numel(), dtype=out.dtype)
        generator.fill(flat.numpy(), seed, std)
        out.copy_(flat.view(out.shape))
    return out


def add_normal_(
    out: torch.Tensor,
    std: float,
    generator: CounterNoiseGenerator,
    seed: int | None = None,
    low_rank: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Adds N(0, std²) from `generator`'s sampler to the CPU tensor `out` in place: the
    values `fill_normal_` would draw, keyed by one draw of the torch stream, or by
    `seed` when the caller drew it already (`draw_seed`); returns `out`. With a sampler
    that has an ``add`` kernel no noise tensor is formed.

    `low_rank` = (g, a), g of shape (B, q) and a of (B, p) for a q×p `out`: Σ_b g_bᵀ a_b
    (= gᵀa) is added first, in the same pass as the noise where the sampler has an
    ``add_low_rank`` kernel (a small batch's Linear weight update,
    `raydpfl.privacy.per_sample.dpsgd.dp_sgd_step_`), else by a GEMM before it."""
    seed = _checked_seed(out, generator, "adds to", seed)
    if low_rank is not None:
        g, a = _checked_factors(out, *low_rank)
        kernel = type(generator).add_low_rank
        if kernel is not None and out.is_contiguous() and out.numel() > 0:
            kernel(out.numpy().reshape(-1), seed, std, g.numpy(), a.numpy())
            return out
        out.addmm_(g.t(), a)
    if out.numel() == 0:
        return out
    add = type(generator).add
    if add is not None and out.is_contiguous():
        add(out.numpy().reshape(-1), seed, std)
        return out
    noise = torch.empty(out.numel(), dtype=out.dtype)
    generator.fill(noise.numpy(), seed, std)
    return out.add_(noise.view(out.shape))


def _checked_factors(
    out: torch.Tensor, g: torch.Tensor, a: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`add_normal_`'s low-rank factors, checked against the q×p `out` and made
    contiguous in its dtype."""
    q, p = (out.shape[0], out.shape[1]) if out.dim() == 2 else (-1, -1)
    fits = g.dim() == a.dim() == 2 and g.shape[0] == a.shape[0]
    if not fits or (g.shape[1], a.shape[1]) != (q, p):
        raise ValueError(
            f"add_normal_: low_rank factors of shapes {tuple(g.shape)} and {tuple(a.shape)} "
            f"do not make a (B, q), (B, p) pair for a tensor of shape {tuple(out.shape)}"
        )
    return g.to(out.dtype).contiguous(), a.to(out.dtype).contiguous()


def normal(
    shape: torch.Size | tuple[int, ...],
    std: float,
    generator: CounterNoiseGenerator,
    dtype=torch.float32,
) -> torch.Tensor:
    """A new tensor of N(0, std²) draws (`fill_normal_` on an empty tensor)."""
    return fill_normal_(torch.empty(shape, dtype=dtype), std, generator)
