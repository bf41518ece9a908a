"""FedDyn (Acar et al., ICLR 2021) and DP-FedDyn, FedFDP's baselines
(shared/specs/fedfdp.md §8.3, §11 A16): local gradient − h_i + α(w − w_t);
h_i ← h_i − α(y_i − w_t); server h ← h − (α/N)Σ_{i∈S}(y_i − w_t), w ← mean y_i − h/α.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from raydpfl.algorithms.base import ClientContext, ClientData, ClientResult, ClientTask, Params
from raydpfl.algorithms.local_dp_sgd import Correction
from raydpfl.papers.fedfdp.pfl_base import PflBase, ServerAndClientState, run_local_sgd


def feddyn_correction(alpha: float) -> Correction:
    """∇ of −⟨h_i, w⟩ + (α/2)‖w − w_t‖²: −h_i + α(w − w_t) (Acar et al. 2021, Alg. 1)."""

    def term(params: Params, start: Params, payload: Mapping[str, torch.Tensor]) -> Params:
        return {
            n: alpha * (params[n] - start[n]) - payload[f"h.{n}"]
            if f"h.{n}" in payload
            else alpha * (params[n] - start[n])
            for n in params
        }

    return term


class FedDyn(ServerAndClientState, PflBase):
    """FedDyn: dynamic regularisation with per-client h_i and server state h."""

    name = "feddyn"
    state_fields = ("h", "h_i")

    def __init__(self, *, alpha: float = 0.01, num_clients: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.alpha = alpha
        self.num_clients = num_clients
        self.h: Params | None = None
        self.h_i: dict[int, Params] = {}

    def _payload(self, client: int) -> dict[str, torch.Tensor] | None:
        hi = self.h_i.get(client)
        return {f"h.{n}": t for n, t in hi.items()} if hi is not None else None

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        if not results:
            return {n: t.clone() for n, t in global_params.items()}
        if self.h is None:
            self.h = {n: torch.zeros_like(t) for n, t in global_params.items()}
        total_w = sum(r.weight for r in results)
        mean_delta = {n: torch.zeros_like(t) for n, t in global_params.items()}
        for r in results:
            hi = self.h_i.get(r.client_id) or {n: torch.zeros_like(t) for n, t in self.h.items()}
            # h_i ← h_i − α(y_i − w_t)
            self.h_i[r.client_id] = {n: hi[n] - self.alpha * r.update[n] for n in hi}
            for n in mean_delta:
                mean_delta[n].add_(r.update[n], alpha=r.weight / total_w)
            # h ← h − (α/N) Σ_{i∈S} (y_i − w_t)
            for n in self.h:
                self.h[n].sub_(r.update[n], alpha=self.alpha / self.num_clients)
        # w ← mean_i y_i − h/α
        return {
            n: global_params[n] + mean_delta[n] - self.h[n] / self.alpha for n in global_params
        }

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        return run_local_sgd(self, ctx, params, data, task, feddyn_correction(self.alpha))


class DPFedDyn(FedDyn):
    """FedDyn with DP-SGD local steps; h_i, h are post-processing of DP updates."""

    name = "dp_feddyn"
    is_private = True
