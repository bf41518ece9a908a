"""SCAFFOLD (Karimireddy et al., ICML 2020) and DP-SCAFFOLD, FedFDP's baselines
(shared/specs/fedfdp.md §8.3, §11 A16): local gradient + c − c_i; option-II control
variates c_i⁺ = c_i − c + (w_t − y_i)/(Kη); server lr η_g. The control variates are
post-processing of the (DP) updates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from raydpfl.algorithms.base import ClientContext, ClientData, ClientResult, ClientTask, Params
from raydpfl.papers.fedfdp.pfl_base import PflBase, ServerAndClientState, run_local_sgd


def scaffold_correction(
    params: Params, start: Params, payload: Mapping[str, torch.Tensor]
) -> Params:
    """c − c_i, sent as ``corr.<name>`` (SCAFFOLD Alg. 1 line 10: y ← y − η(g + c − c_i))."""
    return {n: payload[f"corr.{n}"] for n in params}


def scaffold_control_update(
    c_i: Params, c: Params, delta: Params, steps: int, lr: float
) -> Params:
    """Option II: c_i⁺ = c_i − c + (w_t − y_i)/(Kη) = c_i − c − Δ_i/(Kη) (Alg. 1 line 12)."""
    return {n: c_i[n] - c[n] - delta[n] / (steps * lr) for n in c_i}


class Scaffold(ServerAndClientState, PflBase):
    """SCAFFOLD with option-II control variates and global step η_g (server state)."""

    name = "scaffold"
    state_fields = ("c", "c_i")

    def __init__(self, *, global_lr: float = 1.0, num_clients: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.global_lr = global_lr
        self.num_clients = num_clients
        self.c: Params | None = None
        self.c_i: dict[int, Params] = {}

    def _ensure(self, like: Params) -> None:
        if self.c is None:
            self.c = {n: torch.zeros_like(t) for n, t in like.items()}

    def _ci(self, client: int) -> Params:
        assert self.c is not None
        return self.c_i.get(client) or {n: torch.zeros_like(t) for n, t in self.c.items()}

    def _payload(self, client: int) -> dict[str, torch.Tensor] | None:
        if self.c is None:
            return None
        ci = self._ci(client)
        return {f"corr.{n}": self.c[n] - ci[n] for n in self.c}

    def aggregate(
        self, global_params: Params, tasks: Sequence[ClientTask], results: Sequence[ClientResult]
    ) -> Params:
        if not results:
            return {n: t.clone() for n, t in global_params.items()}
        self._ensure(global_params)
        assert self.c is not None
        total_w = sum(r.weight for r in results)
        new = {n: t.clone() for n, t in global_params.items()}
        dc = {n: torch.zeros_like(t) for n, t in self.c.items()}
        by_id = {t.client_id: t for t in tasks}
        for r in results:
            for n in new:
                new[n].add_(r.update[n], alpha=self.global_lr * r.weight / total_w)
            ci = self._ci(r.client_id)
            task = by_id[r.client_id]
            ci_new = scaffold_control_update(ci, self.c, r.update, task.local_steps, task.lr)
            for n in dc:
                dc[n].add_(ci_new[n] - ci[n])
            self.c_i[r.client_id] = ci_new
        for n in self.c:  # c ← c + (1/N) Σ_{i∈S} Δc_i (Alg. 1 line 17)
            self.c[n].add_(dc[n], alpha=1.0 / self.num_clients)
        return new

    def local_update(
        self, ctx: ClientContext, params: Params, data: ClientData, task: ClientTask
    ) -> ClientResult:
        corr = scaffold_correction if task.payload else None
        return run_local_sgd(self, ctx, params, data, task, corr)


class DPScaffold(Scaffold):
    """SCAFFOLD with DP-SGD local steps; control variates are post-processing."""

    name = "dp_scaffold"
    is_private = True
