"""Client-level privacy by construction, end to end: the platform makes each round's
release through the round's kernel session, exactly once, and the server half receives
only the release; anything else stops the run.

Every plug-in below ran to the end before client-level noise went through the kernel
(each reported the ε of noise it did not draw, or drew twice); then the server half drew
the noise itself through the round's session; now the platform draws it, the server half
is `aggregate_release`, and an override of `aggregate_sum` (which would see the un-noised
sum) or a release of the server half's own stops the run with `PrivacyContractError`
naming the round, and the CLI exits 2 in one line.
"""

from __future__ import annotations

import pytest
import torch

from raydpfl.algorithms.base import ClientResult, WeightedUpdateSum
from raydpfl.algorithms.dp_fedavg_client import (
    COUNT_NOISE_PURPOSE,
    DPFedAvgClientLevel,
    add_aggregate_noise,
    aggregate_noise_std,
    clip_update,
    distributed_noise_std,
    dp_fedavg_update,
    geometric_clip_update,
    noise_generator,
    noisy_unclipped_fraction,
)
from raydpfl.algorithms.dp_ftrl_client import DPFTRLClientLevel
from raydpfl.algorithms.fedavg import FedAvg
from raydpfl.config.load import dump_config
from raydpfl.experiment.build import build_experiment, run_experiment
from raydpfl.privacy.accounting.client_level import ClientLevelCost
from raydpfl.privacy.mechanisms.client_level_mechanisms import population_charge
from raydpfl.privacy.mechanisms.kernel import PrivacyContractError
from raydpfl.privacy.per_sample.dpsgd import gaussian_like
from tests.conftest import small_config

POISSON = {"sampling": "poisson", "client_sampling_rate": 0.4}
FIXED_DISTRIBUTED = {"sampling": "fixed", "noise": "distributed"}
ADAPTIVE = {**POISSON, "adaptive_clipping": True, "clip_count_stddev": 1.0}


def _config(name="dp_fedavg_client", options=POISSON, rounds=3):
    return small_config(
        experiment__algorithm={"name": name, "options": options, "rounds": rounds},
        experiment__privacy={"epsilon": 30.0, "delta": 1e-3, "noise_multiplier": 0.8},
    )


def _run(cls, name="dp_fedavg_client", options=POISSON, rounds=3):
    """The built-in's run with its algorithm object's class replaced by `cls`."""
    exp = build_experiment(_config(name, options, rounds))
    exp.algorithm.__class__ = cls
    return run_experiment(exp, None)


def _summed(global_params, total):
    if total.total is None:
        return {n: torch.zeros_like(t) for n, t in global_params.items()}
    return {n: total.total[n] for n in global_params}


# ---- plug-ins (the old code paths, or small twists of the built-ins) -------------------------
class OwnNoise(DPFedAvgClientLevel):
    """The old built-in server half: the aggregate noise from its own generator."""

    def aggregate_sum(self, global_params, tasks, total):
        std = aggregate_noise_std(self.noise_multiplier, self.clip_norm)
        gen = noise_generator(self.seed, self._round)
        noisy = add_aggregate_noise(_summed(global_params, total), std, gen)
        return dp_fedavg_update(global_params, noisy, self.expected_cohort)


class Skipped(DPFedAvgClientLevel):
    """No noise at all, ε as charged."""

    def aggregate_sum(self, global_params, tasks, total):
        return dp_fedavg_update(global_params, _summed(global_params, total), self.expected_cohort)


class Twice(DPFedAvgClientLevel):
    """The round's release made twice (the second one kept), charged once."""

    def aggregate_sum(self, global_params, tasks, total):
        super().aggregate_sum(global_params, tasks, total)
        return super().aggregate_sum(global_params, tasks, total)


class OwnCountNoise(DPFedAvgClientLevel):
    """Adaptive clipping with the count's noise drawn as the old code did, outside the
    round's mechanism, in the old server half (the update noise still through it)."""

    def aggregate_sum(self, global_params, tasks, total):
        within = float(total.metric_sums.get("update_within_clip", 0.0))
        gen = noise_generator(self.seed, self._round, False, COUNT_NOISE_PURPOSE)
        draw = gaussian_like(torch.zeros(1, dtype=torch.float64), self.clip_count_stddev, gen)
        fraction = noisy_unclipped_fraction(
            within, total.count, float(draw[0]), self.expected_cohort
        )
        self.current_clip_norm = geometric_clip_update(
            self.current_clip_norm, fraction, self.target_quantile, self.clip_lr
        )
        return OwnNoise.aggregate_sum(self, global_params, tasks, total)


class ReleasesAgain(DPFedAvgClientLevel):
    """The new server half, releasing an empty round through the direct-call path inside
    the server's round (to learn the round's noise)."""

    def aggregate_release(self, global_params, tasks, released):
        self.aggregate_sum(global_params, tasks, WeightedUpdateSum())
        return super().aggregate_release(global_params, tasks, released)


class UndeclaredShares(DPFedAvgClientLevel):
    """Distributed noise with the clients' shares left out of their tasks and drawn from
    the client's stream directly (the old client half)."""

    def plan(self, round_idx, cohort, train_sizes):
        import dataclasses

        return [
            dataclasses.replace(t, mechanisms=())
            for t in super().plan(round_idx, cohort, train_sizes)
        ]

    def local_update(self, ctx, params, data, task):
        trained = FedAvg.local_update(self, ctx, params, data, task)
        update = clip_update(trained.update, self.clip_norm)
        std = distributed_noise_std(self.noise_multiplier, self.clip_norm, self.cohort_size)
        update = {n: t + gaussian_like(t, std, ctx.generator) for n, t in update.items()}
        return ClientResult(task.client_id, update, 1.0, trained.num_examples)


class CheaperCost(DPFedAvgClientLevel):
    """States a round cost of twice the σ it draws with."""

    def round_privacy_cost(self, round_idx):
        c = super().round_privacy_cost(round_idx)
        return ClientLevelCost(2 * c.noise_multiplier, c.sampling, c.population, c.sampling_rate)


class Undeclared(DPFedAvgClientLevel):
    """A client-level algorithm that states its cost but declares no round mechanism."""

    def round_mechanisms(self, round_idx):
        return None

    def round_privacy_cost(self, round_idx):
        return population_charge(DPFedAvgClientLevel.round_mechanisms(self, round_idx))

    def aggregate_sum(self, global_params, tasks, total):
        return OwnNoise.aggregate_sum(self, global_params, tasks, total)


class FtrlSkipsRound2(DPFTRLClientLevel):
    """DP-FTRL whose second round draws a node of its own through a fresh session (the
    direct-call path with the server's session taken off)."""

    def aggregate_release(self, global_params, tasks, released):
        if self._round == 1:
            opened = getattr(self, "round_session", None)
            self.round_session = None  # the algorithm's own session, not the server's
            try:
                self.aggregate_sum(global_params, tasks, WeightedUpdateSum())
            finally:
                self.round_session = opened
        return super().aggregate_release(global_params, tasks, released)


# ---- the refusals ------------------------------------------------------------------------------
def test_the_built_ins_run_with_their_noise_through_the_session():
    for options in (POISSON, FIXED_DISTRIBUTED, ADAPTIVE):
        summary = run_experiment(build_experiment(_config(options=options, rounds=2)), None)
        assert summary["rounds_completed"] == 2
    summary = run_experiment(build_experiment(_config("dp_ftrl_client", {}, rounds=5)), None)
    assert summary["rounds_completed"] == 5


@pytest.mark.parametrize(
    "cls, options, drew",
    [
        (OwnNoise, POISSON, "overrides aggregate_sum"),
        (Skipped, POISSON, "overrides aggregate_sum"),
        (Twice, POISSON, "overrides aggregate_sum"),
        (OwnCountNoise, ADAPTIVE, "overrides aggregate_sum"),
        (ReleasesAgain, POISSON, "already made by the platform"),
    ],
    ids=["own-noise", "skipped", "twice", "own-count-noise", "releases-again"],
)
def test_server_noise_outside_the_platforms_release_is_refused(cls, options, drew):
    with pytest.raises(PrivacyContractError, match=r"^round 1 \(client-level, server half\)") as e:
        _run(cls, options=options)
    assert drew in str(e.value) and "\n" not in str(e.value)


def test_distributed_shares_left_out_of_the_tasks_are_refused():
    # refused on the worker (an upload that is not clipped to S, its noise undeclared) or,
    # failing that, on the server
    with pytest.raises(PrivacyContractError, match=r"distributed sum needs each client|> S = "):
        _run(UndeclaredShares, options=FIXED_DISTRIBUTED)


def test_a_round_cost_stated_beside_the_mechanisms_is_refused():
    with pytest.raises(PrivacyContractError, match="states the round cost"):
        _run(CheaperCost)


def test_a_client_level_algorithm_without_round_mechanisms_is_refused():
    with pytest.raises(PrivacyContractError, match="declares no round mechanisms"):
        _run(Undeclared)


def test_a_dp_ftrl_node_drawn_outside_the_session_is_refused_naming_its_round():
    with pytest.raises(PrivacyContractError, match=r"^round 2 \(client-level") as e:
        _run(FtrlSkipsRound2, name="dp_ftrl_client", options={}, rounds=4)
    assert "a release outside the round's session" in str(e.value)


def test_the_cli_refuses_a_client_level_round_in_one_line_with_exit_2(
    tmp_path, capsys, monkeypatch
):
    from raydpfl.cli.main import main

    original = DPFedAvgClientLevel.aggregate_sum

    def twice(self, global_params, tasks, total):
        original(self, global_params, tasks, total)
        return original(self, global_params, tasks, total)

    monkeypatch.setattr(DPFedAvgClientLevel, "aggregate_sum", twice)
    path = tmp_path / "cl.yaml"
    path.write_text(dump_config(_config()))
    code = main(["run", str(path), "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("raydpfl: error: round 1 (client-level")
