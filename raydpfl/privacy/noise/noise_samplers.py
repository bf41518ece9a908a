"""The ``privacy.noise_sampler`` registry: the name of each Gaussian sampler a client's
seeded stream can use, and how such a stream is made."""

from __future__ import annotations

import torch

from raydpfl.privacy.noise.boxmuller import BoxMullerGenerator
from raydpfl.privacy.noise.counter_noise import CounterNoiseGenerator
from raydpfl.privacy.noise.ziggurat import ZigguratGenerator

#: torch: torch's own generator (the default; its bits are every earlier run's);
#: the others: counter-based CPU samplers (`raydpfl.privacy.noise.counter_noise`).
COUNTER_SAMPLERS: dict[str, type[CounterNoiseGenerator]] = {
    "ziggurat": ZigguratGenerator,
    "boxmuller": BoxMullerGenerator,
}
NOISE_SAMPLERS = ("torch", *COUNTER_SAMPLERS)


def seeded_stream(sampler: str, seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A generator seeded with `seed` whose Gaussian noise comes from `sampler`."""
    if sampler == "torch":
        return torch.Generator(device=device).manual_seed(seed)
    try:
        cls = COUNTER_SAMPLERS[sampler]
    except KeyError:
        raise ValueError(
            f"noise_sampler must be one of {', '.join(NOISE_SAMPLERS)}; got {sampler!r}"
        ) from None
    gen = cls(device=device)
    gen.manual_seed(seed)
    return gen
