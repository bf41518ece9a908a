"""A personalised input transformation x ↦ γ ⊙ x + β (PRIVATEFL's; see
`raydpfl.papers.dpfl_bcs.privatefl`).

It is not a module: it is a pair of tensors a client keeps, applied to the input before the
shared model, with γ one scale per input channel (per feature for flat inputs) and β one
shift per input element. `identity_input_transform` builds it (γ = 1, β = 0) and
`apply_input_transform` applies whatever ``input_transform.*`` entries a parameter dict
holds, so training (the algorithm) and evaluation (`raydpfl.simulation.evaluation`) share
one definition without the evaluation depending on a paper's model module.
"""

from __future__ import annotations

import torch

#: Parameter-name prefix of a personalised input transformation (PRIVATEFL).
INPUT_TRANSFORM = "input_transform"
TRANSFORM_SCALE = f"{INPUT_TRANSFORM}.scale"
TRANSFORM_SHIFT = f"{INPUT_TRANSFORM}.shift"


def identity_input_transform(
    input_shape: tuple[int, ...], device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """PRIVATEFL's transformation at its identity: γ = 1 per channel, β = 0 per element."""
    shape = tuple(int(d) for d in input_shape)
    return {
        TRANSFORM_SCALE: torch.ones(shape[0], device=device),
        TRANSFORM_SHIFT: torch.zeros(shape, device=device),
    }


def apply_input_transform(
    x: torch.Tensor, params: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(γ ⊙ x + β, the other entries): applies the ``input_transform.*`` entries of `params`
    to a batch `x` of shape (B, C, ...) and returns the remaining (model) entries. Without
    such entries, `x` and `params` come back unchanged (the same objects)."""
    if TRANSFORM_SCALE not in params:
        return x, params
    scale, shift = params[TRANSFORM_SCALE], params[TRANSFORM_SHIFT]
    view = scale.reshape(scale.shape[0], *([1] * (shift.dim() - 1)))
    rest = {n: t for n, t in params.items() if not n.startswith(f"{INPUT_TRANSFORM}.")}
    return x * view + shift, rest
