"""Privacy by construction, end to end: a plug-in cannot report an ε it did not deliver.

Each refused plug-in below ran to the end on the old task contract (free
`noise_multiplier`/`privacy_cost` fields) and reported a wrong ε; now the run stops with
`PrivacyContractError` naming the client and round, and the CLI exits 2 in one line.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

import raydpfl
from raydpfl.algorithms import DPFedAvg
from raydpfl.algorithms import dp_fedavg as dp_fedavg_module
from raydpfl.algorithms.base import ClientTask, privacy_session
from raydpfl.algorithms.local_dp_sgd import dp_sgd_local_update
from raydpfl.privacy.mechanisms.kernel import PrivacyContractError, SubsampledGaussian, uses
from raydpfl.privacy.per_sample.dpsgd import dp_sgd_step_
from tests.algorithms.test_local_dp_sgd import _reference_steps

ROOT = Path(__file__).resolve().parents[2]
QUICK = [
    "runtime.backend=local",
    "experiment.algorithm.rounds=2",
    "experiment.data.num_clients=10",
    "experiment.algorithm.clients_per_round=4",
    "experiment.algorithm.local_steps=2",
]


def _dp_fedavg(cls: type[DPFedAvg] = DPFedAvg, sigma: float = 1.0) -> DPFedAvg:
    return cls(
        clients_per_round=4,
        local_steps=2,
        lr=0.5,
        clip_norm=1.0,
        noise_multiplier=sigma,
        sampling_rate=0.1,
    )


def _run(algorithm: DPFedAvg) -> raydpfl.SimulationResult:
    return raydpfl.run_simulation(
        str(ROOT / "configs/quickstart.yaml"), overrides=QUICK, algorithm=algorithm
    )


class NoCost(DPFedAvg):
    """Plans its train tasks without any mechanism, then trains with DP-SGD anyway."""

    name = "no_cost"

    def plan(self, round_idx, cohort, train_sizes):
        return [
            dataclasses.replace(t, mechanisms=())
            for t in super().plan(round_idx, cohort, train_sizes)
        ]


class TwiceCharged(DPFedAvg):
    """Declares τ DP-SGD steps and runs 2τ."""

    name = "twice"

    def local_update(self, ctx, params, data, task):
        dp_sgd_local_update(ctx, params, data, task)
        return dp_sgd_local_update(ctx, params, data, task)


class UndeclaredSigma(DPFedAvg):
    """Declares σ = 10 and asks the session for σ = 0.01."""

    name = "undeclared_sigma"

    def local_update(self, ctx, params, data, task):
        weak = SubsampledGaussian(0.01, self.clip_norm, self.sampling_rate)
        privacy_session(ctx, task).get(weak)
        raise AssertionError("unreachable: the session refuses an undeclared mechanism")


class SwappedTask(DPFedAvg):
    """Hands the shared DP-SGD loop a copy of its task that declares σ = 0.01: the loop
    draws through the worker's session, which holds what was charged (σ = 10)."""

    name = "swapped_task"

    def local_update(self, ctx, params, data, task):
        weak = SubsampledGaussian(0.01, self.clip_norm, self.sampling_rate)
        forged = dataclasses.replace(task, mechanisms=(uses(weak, task.local_steps),))
        return dp_sgd_local_update(ctx, params, data, forged)


class OwnSession(DPFedAvg):
    """Replaces the worker's session on its context with one of its own, declaring σ = 0.01."""

    name = "own_session"

    def local_update(self, ctx, params, data, task):
        from raydpfl.privacy.mechanisms.kernel import PrivacySession

        weak = SubsampledGaussian(0.01, self.clip_norm, self.sampling_rate)
        ctx.privacy = PrivacySession((uses(weak, task.local_steps),), ctx.generator, ctx.device)
        return dp_sgd_local_update(ctx, params, data, task)


class NoisesElsewhere(DPFedAvg):
    """Samples through the declared mechanism but adds (weaker) noise by itself."""

    name = "noises_elsewhere"

    def local_update(self, ctx, params, data, task):
        dp = privacy_session(ctx, task, data).dp_sgd()
        for _ in range(task.local_steps):
            dp.sample()  # the platform's sample; the raw records come from elsewhere
            x, y = data.records()
            dp_sgd_step_(
                ctx.clipping,
                params,
                x,
                y,
                lr=task.lr,
                clip_norm=dp.clip_norm,
                noise_multiplier=0.01,
                expected_batch_size=dp.sampling_rate * data.num_examples,
                generator=ctx.generator,
            )
        raise AssertionError("unreachable: the second sample is refused")


def test_a_session_of_its_own_has_no_effect():
    """The records carry the worker's session: the shared loop trains through it whatever
    session the context holds, so the run is the honest one, bit for bit."""
    cheat = _run(_dp_fedavg(OwnSession, sigma=10.0)).summary
    honest = _run(_dp_fedavg(sigma=10.0)).summary
    assert cheat["model_sha256"] == honest["model_sha256"]
    assert cheat["epsilon_max"] == honest["epsilon_max"]


def test_sampling_through_the_mechanism_and_noising_elsewhere_is_refused():
    with pytest.raises(PrivacyContractError, match="before the previous one was released"):
        _run(_dp_fedavg(NoisesElsewhere, sigma=10.0))


def test_the_task_contract_has_no_free_noise_or_cost_field():
    for field in ("noise_multiplier", "privacy_cost", "clip_norm", "sampling_rate"):
        with pytest.raises(TypeError, match=field):
            ClientTask(client_id=0, round_idx=0, local_steps=1, lr=0.1, **{field: 0.01})
    task = ClientTask(
        client_id=0,
        round_idx=0,
        local_steps=3,
        lr=0.1,
        mechanisms=(uses(SubsampledGaussian(10.0, 1.0, 0.1), 3),),
    )
    assert (task.noise_multiplier, task.clip_norm, task.sampling_rate) == (10.0, 1.0, 0.1)
    assert task.privacy_cost == SubsampledGaussian(10.0, 1.0, 0.1).cost(3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.noise_multiplier = 0.01  # type: ignore[misc]


def test_a_private_train_task_without_a_mechanism_is_refused_before_dispatch():
    with pytest.raises(PrivacyContractError, match=r"round 1: algorithm 'no_cost' is private"):
        _run(_dp_fedavg(NoCost))


def test_dp_sgd_run_twice_but_charged_once_is_refused():
    with pytest.raises(PrivacyContractError, match=r"charged 2 x subsampled_gaussian.*used 4 x"):
        _run(_dp_fedavg(TwiceCharged))


def test_an_undeclared_sigma_is_refused_on_the_worker():
    with pytest.raises(PrivacyContractError, match="did not declare subsampled_gaussian"):
        _run(_dp_fedavg(UndeclaredSigma, sigma=10.0))


def test_a_forged_task_still_trains_at_the_charged_sigma():
    honest = _run(_dp_fedavg(sigma=10.0))
    forged = _run(_dp_fedavg(SwappedTask, sigma=10.0))
    assert forged.model_sha256 == honest.model_sha256
    assert forged.summary["epsilon_max"] == honest.summary["epsilon_max"]


def test_a_built_in_release_that_bypasses_its_mechanism_is_caught(monkeypatch):
    """DP-FedAvg's client half replaced by a copy that draws its batches and noise from
    the dpsgd primitives directly (the old code path): the receipt shows no invocation of
    the charged mechanism, and the run stops."""

    def bypass(ctx, params, data, task, **_):
        start = {n: p.clone() for n, p in params.items()}
        expected = task.sampling_rate * data.num_examples
        _reference_steps(ctx, params, data, task, lambda batch: expected)
        return raydpfl.algorithms.ClientResult(
            client_id=task.client_id,
            update={n: params[n] - start[n] for n in params},
            weight=float(data.num_examples),
            num_examples=data.num_examples,
        )

    monkeypatch.setattr(dp_fedavg_module, "dp_sgd_local_update", bypass)
    with pytest.raises(PrivacyContractError, match="used no mechanism"):
        _run(_dp_fedavg())


def test_the_cli_refuses_in_one_line_with_exit_2(tmp_path, capsys, monkeypatch):
    from raydpfl.cli.main import main

    monkeypatch.setattr(dp_fedavg_module.DPFedAvg, "local_update", TwiceCharged.local_update)
    code = main(
        [
            "run",
            str(ROOT / "configs/quickstart.yaml"),
            "--out",
            str(tmp_path / "run"),
            "--no-progress",
            *[a for o in QUICK for a in ("--set", o)],
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("raydpfl: error: client ")
    assert "charged 2 x subsampled_gaussian" in err[0]


NON_PRIVATE = {"fedavg", "fedprox", "scaffold", "feddyn", "qffl", "fedfair", "bcs_fedsgd"}


def _algorithm_of(case: dict) -> str:
    for o in case["overrides"]:
        if o.startswith("experiment.algorithm.name="):
            return o.split("=", 1)[1]
    return str(raydpfl.to_config(case["config"]).experiment.algorithm.name)


@pytest.mark.slow
def test_every_registered_private_algorithm_releases_exactly_what_it_is_charged():
    """Every built-in private algorithm (with its follow-up tasks) runs 2-5 rounds with the
    server checking each result's receipt against its charge, and really charges its
    clients (a release that bypassed the kernel would fail the check, as above)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from preset_hashes import CASES

    from raydpfl.registry import names

    first_case: dict[str, dict] = {}
    for case in CASES.values():
        first_case.setdefault(_algorithm_of(case), case)
    private = [n for n in names("algorithm") if n not in NON_PRIVATE]
    assert set(private) <= set(first_case), sorted(set(private) - set(first_case))
    for name in private:
        case = first_case[name]
        result = raydpfl.run_simulation(str(ROOT / case["config"]), overrides=case["overrides"])
        assert result.summary["ledger_sha256"] is not None, name
        assert result.summary["epsilon_max"] > 0, name


def test_the_vectorised_group_path_reports_the_sessions_receipts():
    result = raydpfl.run_simulation(
        str(ROOT / "configs/quickstart.yaml"), overrides=[*QUICK, "runtime.vectorise_clients=on"]
    )
    one_by_one = _run(_dp_fedavg())
    assert result.summary["epsilon_max"] == one_by_one.summary["epsilon_max"] > 0
    assert torch.isfinite(torch.cat([p.flatten() for p in result.params.values()])).all()


def test_the_docs_private_plugin_runs_and_is_charged_for_both_mechanisms():
    """The docs' private plug-in (docs/how-to/write-an-algorithm.md: DP-SGD steps + a noisy
    loss query per task), run as written: both mechanisms are charged (ε above plain
    DP-FedAvg's) and the receipts match (the run completes)."""
    page = (ROOT / "docs" / "how-to" / "write-an-algorithm.md").read_text()
    section = page[page.index("## A private plug-in") :]
    code = section[section.index("```python") + len("```python") : section.index("```\n", 10)]
    namespace: dict = {"raydpfl": raydpfl}
    exec(compile(code, "write-an-algorithm.md", "exec"), namespace)
    try:
        cls = namespace["DPFedAvgLossReport"]
        result = _run(_dp_fedavg(cls))
        plain = _run(_dp_fedavg())
        assert result.summary["epsilon_max"] > plain.summary["epsilon_max"]
        assert result.history.to_pandas()["noisy_loss"].notna().all()
    finally:
        raydpfl.registry.unregister("algorithm", "dp_fedavg_loss_report")


def test_clients_parquet_lists_every_clients_epsilon_without_a_client_test_split(tmp_path):
    """Issue 35.11: with client_test_fraction 0 nothing is scored per client, and
    clients.parquet still says each client's ε and size (it was empty)."""
    import pyarrow.parquet as pq

    result = raydpfl.run_simulation(
        str(ROOT / "configs/quickstart.yaml"),
        overrides=[*QUICK, "experiment.data.client_test_fraction=0"],
        run_dir=tmp_path / "run",
    )
    table = pq.read_table(tmp_path / "run" / "clients.parquet").to_pandas()
    assert len(table) == 10 and table["round"].unique().tolist() == [2]
    assert table["epsilon"].max() == pytest.approx(result.summary["epsilon_max"])
    assert (table["num_test_examples"] == 0).all() and table["test_accuracy"].isna().all()
    assert (table["num_examples"] > 0).all()
