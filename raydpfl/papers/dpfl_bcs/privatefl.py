"""PRIVATEFL and PRIVATEFL-BCS: DPFL-BCS's Table I baselines (shared/specs/dpfl-bcs.md §11.7).

PRIVATEFL is Yang, Hui, Yuan, Gong and Cao, "PrivateFL: Accurate, Differentially Private
Federated Learning via Personalized Data Transformation", USENIX Security 2023 ([12] of the
seed). It is NOT in /work/shared/seeds: the seed says only that it "locally implement[s] a
personalized data transformation to mitigate data heterogeneity among clients in DPFL" and
selects clients uniformly. Everything below marked (not from seed) is our reading of the
published description, reduced to DPFL-BCS's client machinery as the spec asks ("all DP
baselines use the same (ε_n, δ_n), T, K, learning rate and clipping B", §11.7).

The model (not from seed). Each client n keeps a personalised input transformation
T_n(x) = γ_n ⊙ x + β_n in front of the shared model w: γ_n has one scale per input channel
(per feature for flat inputs) and β_n one shift per input element, initialised to the
identity (γ = 1, β = 0). This is our recollection of the authors' ``InputNorm`` layer
(per-channel scale, per-pixel shift), not verified against their code (no network here).
Client n's personalised model is w ∘ T_n; the shared model is trained by everyone, T_n by
client n alone, and T_n never leaves the client. (The original also offers a variant on
top of a pre-trained feature extractor; not modelled.)

Local step and privacy (not from seed; our choice, documented). One full-batch step per
participation, exactly DPFL-BCS's (`raydpfl.papers.dpfl_bcs.algorithm`): per-sample gradients of
the JOINT parameter vector θ = (w, γ_n, β_n) are clipped together (L2 to B under the
Gaussian mechanism, L1 to B under Laplace), averaged over the D_n records and scaled by
η_t; noise calibrated to the joint sensitivity 2η_tB/D_n (stage 1 of PRIVATEFL-BCS:
2η_t(B+Θ)/D_n, with the two loss values of the composed model) is added to EVERY coordinate,
the transformation's included. The client uploads only the shared coordinates, −ĝ_w, and
applies its own noisy step T_n ← T_n − ĝ_T locally. Why the transformation is noised too:
it is trained on the client's private records, and the client's personalised model w ∘ T_n
is evaluated (a release: its test loss/accuracy is reported). With the noise, T_n is a
function of the client's noisy releases only, so the personalised model is post-processing
of what the ledger charged and the per-client figures cost nothing more. The alternative
(clip jointly, noise only w, keep T_n clean because "it is never released") would make every
evaluation of w ∘ T_n an unaccounted release; we do not do that. Noising the extra
coordinates changes nothing in the charge: the Gaussian (zCDP) and Laplace costs depend on
the sensitivity and the noise scale, not on the dimension, so every participation is charged
exactly what the same participation of DPSGD/DMLDP (or DPFL-BCS) is charged, from the same
per-client budgets, plans and exhaustion rule. Since the joint vector is clipped to B, the
shared part of the signal is at most as large as DPSGD's (the transformation spends part of
the clipping budget); with ``train_transform=False`` the transformation stays at the identity,
takes no gradient and no noise, and the shared update is exactly DPSGD's (a test pins it).

Selection and aggregation. PRIVATEFL (``bcs_privatefl``): uniform selection with the uniform
plan T_n = K·T/N, 1/|S_t| mean of the shared updates (§11.7). PRIVATEFL-BCS
(``bcs_privatefl_bcs``): DPFL-BCS's two-stage server (Proposition 1 in stage 1, the loss
uploads, the estimates and P1 at T0, systematic PPS with p_n = T_n/(K(T − T0)) after), 1/|S_t|
mean. Both run under either mechanism (``mechanism``), like the other BCS baselines. P1's
noise constant Λ uses d = the shared model's size: only the shared coordinates' noise
reaches the global model. The stage-1 losses are those of the composed model w ∘ T_n.

Where the transformation lives in the simulator. Workers are stateless and train many
clients, so the server half keeps every client's T_n keyed by client id (`transforms`),
sends it with the client's task (`ClientTask.payload`) and stores the client's new T_n from
the result's `local_state` (a field beside the uploaded `update`, which holds the shared
parameters only and is all that is aggregated). This is book-keeping for the client's own
state, not an upload. For evaluation the server's parameter dict also carries each client's
transformation under ``c{n}/input_transform.*`` (unprefixed names are the shared model):
`evaluation_model_keys` names ``c{n}`` for client n, and the simulator scores w ∘ T_n on
client n's own test split (the central test figures are the pooled client test splits, so
these runs need ``data.client_test_fraction > 0``). Training clients read only their own
payload. Checkpoints save every client's T_n in the algorithm's tensor state (keyed
``transform/{n}/{name}``, see `Algorithm.tensor_state`), so runs resume bit for bit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from raydpfl.algorithms.base import ClientContext, ClientData, ClientResult, ClientTask, Params
from raydpfl.algorithms.multi_model import join_models, shared_params
from raydpfl.algorithms.tensor_state import pack_client_tensors, unpack_tensor_state
from raydpfl.models.input_transform import (
    INPUT_TRANSFORM,
    apply_input_transform,
    identity_input_transform,
)
from raydpfl.papers.dpfl_bcs.algorithm import DpflBcs

#: The tensor-state field of the per-client transformations.
TRANSFORM = "transform"


def _cpu_copy(state: Params) -> Params:
    """A detached CPU copy of a client's transformation: where the server half keeps it."""
    return {n: t.detach().to("cpu").clone() for n, t in state.items()}


def client_key(client: int) -> str:
    """The model key under which the server's parameters hold client `client`'s transform."""
    return f"c{int(client)}"


@dataclass
class PrivateFlResult(ClientResult):
    """A PRIVATEFL client's result: `update` is the upload (shared parameters only);
    `local_state` is the client's new transformation, which stays with the client (the
    simulator parks it in the server half's per-client store because workers keep none)."""

    local_state: Params = field(default_factory=dict)


class PrivateFl(DpflBcs):
    """PRIVATEFL (``selection="uniform"``) and PRIVATEFL-BCS (``selection="bcs"``)."""

    name = "bcs_privatefl"

    def __init__(
        self, *, input_shape: Sequence[int], train_transform: bool = True, **kwargs: Any
    ) -> None:
        if kwargs.get("mechanism") not in ("gaussian", "laplace"):
            raise ValueError("PRIVATEFL needs the gaussian or the laplace mechanism")
        super().__init__(**kwargs)
        self.input_shape = tuple(int(d) for d in input_shape)
        self.train_transform = bool(train_transform)
        self.transforms: dict[int, Params] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["transforms"] = {}  # server-side store: workers get theirs in the payload
        return state

    # ---- server half -----------------------------------------------------------------
    def transform_of(self, client: int) -> Params:
        """Client `client`'s current transformation (the identity until it first trains)."""
        current = self.transforms.get(int(client))
        return current if current is not None else identity_input_transform(self.input_shape)

    def plan(
        self, round_idx: int, cohort: Sequence[int], train_sizes: np.ndarray
    ) -> list[ClientTask]:
        tasks = super().plan(round_idx, cohort, train_sizes)
        return [
            dataclasses.replace(
                t, payload={n: v.clone() for n, v in self.transform_of(t.client_id).items()}
            )
            for t in tasks
        ]

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        for r in results:  # the clients' own new transformations (never aggregated)
            state = getattr(r, "local_state", None)
            if state:
                self.transforms[r.client_id] = _cpu_copy(state)
        new = super().aggregate(shared_params(global_params), tasks, results)
        new.update(self.evaluation_view())
        return new

    def evaluation_view(self) -> Params:
        """Every client's transformation under ``c{n}/input_transform.*`` (for scoring)."""
        clients = range(self.n)
        return join_models(
            [{name: t.clone() for name, t in self.transform_of(c).items()} for c in clients],
            [client_key(c) for c in clients],
        )

    def evaluation_model_keys(self, num_clients: int) -> list[str] | None:
        """Client n is scored with the shared model composed with its own transformation."""
        return [client_key(c) for c in range(num_clients)]

    def unaccounted_releases(self) -> list[str]:
        return [
            *super().unaccounted_releases(),
            "personalised_test_metrics (each client's test loss/accuracy of the shared model "
            "composed with its own transformation, on its held-out test records; the "
            "transformation itself is trained with noise, so it is post-processing of charged "
            "releases)",
        ]

    # ---- checkpoints -----------------------------------------------------------------
    def tensor_state(self) -> dict[str, torch.Tensor]:
        """DPFL-BCS's tensor state plus every trained client's T_n (``transform/{n}/*``);
        clients never trained are at the identity and need no entry."""
        return {**super().tensor_state(), **pack_client_tensors(TRANSFORM, self.transforms)}

    def load_tensor_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restores the transformations (kept on the CPU, as `aggregate` keeps them) and
        hands the other entries to DPFL-BCS."""
        prefix = f"{TRANSFORM}/"
        own = {k: t for k, t in tensors.items() if k.startswith(prefix)}
        super().load_tensor_state({k: t for k, t in tensors.items() if k not in own})
        _, clients = unpack_tensor_state(own, per_client=(TRANSFORM,))
        self.transforms = {
            c: _cpu_copy(state) for c, state in sorted(clients.get(TRANSFORM, {}).items())
        }

    # ---- client half -----------------------------------------------------------------
    def _forward(self, model: torch.nn.Module, params: Params, x: torch.Tensor) -> torch.Tensor:
        x, rest = apply_input_transform(x, params)
        return super()._forward(model, rest, x)

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        transform = (
            {n: t.to(ctx.device) for n, t in task.payload.items()}
            if task.payload
            else identity_input_transform(self.input_shape, ctx.device)
        )
        # Shared parameters first, so the noise draws on them come in DPSGD's order.
        trainable = {**params, **transform} if self.train_transform else dict(params)
        const = {} if self.train_transform else transform
        noisy, metrics = self._noisy_step(ctx, trainable, const, task, data)
        update: Params = {}
        new_transform = {n: t.detach().clone() for n, t in transform.items()}
        for name, g in noisy.items():
            if name.startswith(f"{INPUT_TRANSFORM}."):
                new_transform[name] = transform[name].detach() - g  # stays on the client
            else:
                update[name] = -g  # the upload
        return PrivateFlResult(
            client_id=task.client_id,
            update=update,
            weight=1.0,
            num_examples=data.num_examples,
            metrics=metrics,
            local_state=new_transform,
        )
