"""FedFDP's private loss upload (shared/specs/fedfdp.md §5.3, Eqs. 14–15; §11 A6–A7).

Each client's loss F_k of a model is released by a ``loss`` follow-up task after
aggregation: the loss clipped to [0, C_l], summed over an independent Poisson(q_l) batch,
noise σ_l·C_l: SGM(q_l, σ_l), charged as its own task (the shared
`raydpfl.algorithms.local_dp_sgd.noisy_loss_query`). FedFDP releases the loss of each
client's updated model, DP q-FFL (`raydpfl.papers.fedfdp.qffl`) that of the new global
model, both through `LossUploadFollowups`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from raydpfl.algorithms.base import ClientContext, ClientData, ClientResult, ClientTask, Params
from raydpfl.algorithms.local_dp_sgd import noisy_loss_query
from raydpfl.papers.fedfdp.theory import next_loss_clip_bound
from raydpfl.privacy.mechanisms.kernel import SubsampledGaussian, uses


class LossUpload:
    """FedFDP's private loss upload (Eqs. 14–15, §5.3, §11 A6–A7), server-side state.

    Per client: the adaptive clip bound C_l^i (starts at `clip_init`, then
    max(floor, multiplier·F̃_i), post-processing). A ``loss`` task evaluates a model on an
    independent Poisson(q_l) batch, clips each loss to [0, C_l^i], sums, adds N(0, σ_l²C_l²)
    and divides by q_l·|D_i|: SGM(q_l, σ_l), declared as `cost`.
    """

    def __init__(
        self,
        *,
        noise_multiplier: float,
        sampling_rate: float,
        clip_init: float,
        clip_floor: float,
        clip_multiplier: float,
    ) -> None:
        self.noise_multiplier = noise_multiplier
        self.sampling_rate = sampling_rate
        self.clip_init = clip_init
        self.clip_floor = clip_floor
        self.clip_multiplier = clip_multiplier
        self.clip: dict[int, float] = {}

    def mechanism(self, client_id: int) -> SubsampledGaussian:
        """One release per client per round: SGM(q_l, σ_l) of losses clipped to the
        client's current C_l (charged `PrivacyCost(σ_l, q_l, 1)` whatever C_l is)."""
        return SubsampledGaussian(self.noise_multiplier, self.bound(client_id), self.sampling_rate)

    def bound(self, client_id: int) -> float:
        return self.clip.get(client_id, self.clip_init)

    def task(
        self, client_id: int, round_idx: int, payload: Mapping[str, torch.Tensor] | None
    ) -> ClientTask:
        """The follow-up task releasing client `client_id`'s loss of the payload model
        (``w.<name>`` tensors) or, without payload, of the broadcast model."""
        return ClientTask(
            client_id=client_id,
            round_idx=round_idx,
            local_steps=0,
            lr=0.0,
            mechanisms=(uses(self.mechanism(client_id), 1),),
            kind="loss",
            payload=payload,
        )

    def update(self, results: Sequence[ClientResult]) -> dict[int, float]:
        """Reads the released losses; moves each C_l^i; returns {client: F̃_i}."""
        out = {}
        for r in results:
            noisy = float(r.metrics["noisy_loss"])
            out[r.client_id] = noisy
            self.clip[r.client_id] = next_loss_clip_bound(
                noisy, floor=self.clip_floor, multiplier=self.clip_multiplier
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"clip": {str(k): v for k, v in self.clip.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.clip = {int(k): float(v) for k, v in state.get("clip", {}).items()}


def release_loss(
    ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
) -> ClientResult:
    """Client half of a ``loss`` task: the private mean loss (Alg. 2 L9–L11).

    The model is the payload's ``w.*`` tensors when present, else the broadcast params.
    The batch is a fresh Poisson(q_l) sample from the task's own RNG stream (independent
    of the gradient batch, so the two mechanisms compose additively, §6.4).
    ``raw_loss`` (the unclipped, noiseless batch mean) is a non-private diagnostic for the
    paper's Ψ variant; it is listed in the algorithm's unaccounted releases.
    """
    payload = task.payload or {}
    model_params = (
        {n: payload[f"w.{n}"] for n in params} if payload else {n: p for n, p in params.items()}
    )
    n = data.num_examples
    # the shared noisy loss query, in float64, through the task's declared mechanism
    noisy, losses = noisy_loss_query(ctx, model_params, data, task, with_raw_losses=True)
    assert losses is not None
    raw = float(losses.mean()) if losses.numel() else float("nan")
    return ClientResult(
        client_id=task.client_id,
        update={},
        weight=float(n),
        num_examples=n,
        metrics={"noisy_loss": noisy, "raw_loss": raw, "loss_batch_size": float(losses.numel())},
    )


class LossUploadFollowups:
    """Server-half mixin: after aggregation every client of the round releases a loss
    through the algorithm's `loss_upload` (a ``loss`` follow-up task, charged
    SGM(q_l, σ_l)); the client half answers it with `release_loss`."""

    loss_upload: LossUpload

    def loss_model(self, result: ClientResult) -> dict[str, torch.Tensor] | None:
        """The ``w.<name>`` payload of the model whose loss `result`'s client releases;
        None (the default): the new global model."""
        return None

    def followups_due(
        self, round_idx: int, results: Sequence[ClientResult], new_params: Params
    ) -> bool:
        """Every round: each client of the round releases its loss."""
        return True

    def followup_task(self, round_idx: int, result: ClientResult) -> ClientTask:
        return self.loss_upload.task(result.client_id, round_idx, self.loss_model(result))
