"""Secure-noise mode: DP noise and Poisson sampling from the operating system's CSPRNG.

Research mode draws every random number from a PyTorch PRNG seeded from the run seed:
reproducible, but whoever knows the seed (it is in config.yaml) knows the noise, and a
PRNG's floating-point Gaussians leak through the gaps between representable outputs
(Mironov 2012 for Laplace; Jin et al. 2022, arXiv:2112.05307, for Gaussians). A model
that is released for real should be trained with ``privacy.secure_noise: true``, the
counterpart of Opacus' ``secure_mode``:

- uniform bits come from ``os.urandom`` (the kernel's CSPRNG), 53 bits per uniform;
- Gaussians are made from them by Box-Muller in float64;
- each noise value is the sum of `DRAWS` = 4 such Gaussians scaled back to the target std
  (z = (z₁ + z₂ + z₃ + z₄)/2), Holohan & Braghin's mitigation of the floating-point
  attack (arXiv:2107.10138) that Opacus' ``_generate_noise`` applies in secure mode: the
  attacker must now invert a sum of 2n draws, 2^(53·(2n−1)) work for n = 2;
- Laplace noise (DPFL-BCS's Laplace mechanism) is b·(E₁ − E₂) with E = −ln(1 − u) from
  secure uniforms, in float64 (exact in distribution; not a snapping mechanism, so a
  floating-point attack on the float32 result is made hard by the 53-bit source, not
  ruled out);
- the Poisson sample of each DP-SGD step compares such secure uniforms with q, so the
  batch (whose secrecy the amplification by subsampling relies on) is not predictable
  from the seed either.

A client's stream is then a `SecureGenerator`: a `torch.Generator` (so every other draw
an algorithm makes from it still works) whose own state is seeded from `secrets`, and
that `raydpfl.privacy.per_sample.dpsgd`'s noise and sampling functions recognise and bypass. Draws
are not reproducible, by design. The cost is measured in the README (Privacy → secure
noise).
"""

from __future__ import annotations

import math
import os
import secrets
import warnings

import torch

#: Gaussians summed per noise value (Opacus' secure mode: 2n with n = 2).
DRAWS = 4

#: Noise values drawn per `os.urandom` call: bounds the float64 temporaries (32 random
#: bytes and ~6 float64 intermediates per value: ~20 MiB per chunk).
CHUNK = 1 << 18

_MASK_53 = (1 << 53) - 1
_ULP_53 = 2.0**-53


class SecureGenerator(torch.Generator):
    """A client's stream in secure-noise mode (see the module docstring).

    Still a `torch.Generator` on `device`, seeded from `secrets` instead of the run seed;
    `raydpfl.privacy.per_sample.dpsgd` draws DP noise and Poisson samples for it from `os.urandom`.
    """

    def __init__(self, device: str | torch.device = "cpu") -> None:
        # torch.Generator.__new__ takes the device; there is no base __init__ to call.
        self.manual_seed(secrets.randbits(63))


def is_secure(generator: torch.Generator) -> bool:
    """Whether DP noise and sampling for this stream must come from `os.urandom`."""
    return isinstance(generator, SecureGenerator)


def uniform(n: int) -> torch.Tensor:
    """`n` independent uniforms on [0, 1) with 53 bits from `os.urandom` (float64, CPU)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n == 0:
        return torch.zeros(0, dtype=torch.float64)
    with warnings.catch_warnings():
        # A read-only view of the bytes, no copy (a third of the cost): it is only read.
        warnings.filterwarnings("ignore", message=".*not writable.*")
        words = torch.frombuffer(os.urandom(8 * n), dtype=torch.int64)
    return (words & _MASK_53).to(torch.float64).mul_(_ULP_53)


def _box_muller(n: int) -> torch.Tensor:
    """`n` (even) independent N(0, 1) draws in float64: Box-Muller on secure uniforms,
    r = sqrt(−2 ln(1 − u₁)) (1 − u₁ ∈ (0, 1], so the log is finite), θ = 2π u₂."""
    u = uniform(n)
    half = n // 2
    radius = u[:half].neg().log1p_().mul_(-2.0).sqrt_()
    angle = u[half:].mul_(2.0 * math.pi)
    return torch.cat([radius * torch.cos(angle), radius.mul_(torch.sin(angle))])


def standard_normal(n: int) -> torch.Tensor:
    """`n` N(0, 1) noise values (float64, CPU), each the sum of `DRAWS` secure Gaussians
    divided by sqrt(DRAWS)."""
    parts = []
    for start in range(0, n, CHUNK):
        m = min(CHUNK, n - start)
        draws = _box_muller(DRAWS * m).view(DRAWS, m)
        parts.append(draws.sum(0).div_(math.sqrt(DRAWS)))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def gaussian(
    shape: torch.Size | tuple[int, ...],
    std: float,
    dtype: torch.dtype,
    device: torch.device | str,
) -> torch.Tensor:
    """N(0, std²) per entry of a tensor of `shape`, scaled in float64 and then cast to
    `dtype` on `device` (drawn on the CPU: `os.urandom` is a host source)."""
    if std < 0:
        raise ValueError(f"noise std must be >= 0, got {std}")
    z = standard_normal(math.prod(shape)).mul_(std)
    return z.to(dtype=dtype).reshape(shape).to(device)


def laplace(
    shape: torch.Size | tuple[int, ...],
    scale: float,
    dtype: torch.dtype,
    device: torch.device | str,
) -> torch.Tensor:
    """Laplace(0, scale) per entry of a tensor of `shape`, as scale·(E₁ − E₂) with
    E = −ln(1 − u) ~ Exp(1) from secure uniforms (float64; cast to `dtype` on `device`)."""
    if scale < 0:
        raise ValueError(f"noise scale must be >= 0, got {scale}")
    n = math.prod(shape)
    u = uniform(2 * n)
    e = u.neg_().log1p_().neg_()  # 1 − u ∈ (0, 1]: finite
    z = (e[:n] - e[n:]).mul_(scale)
    return z.to(dtype=dtype).reshape(shape).to(device)
