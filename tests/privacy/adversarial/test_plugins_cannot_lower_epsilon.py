"""The adversarial suite (issue 49): plug-ins that try to report an ε they did not deliver.

Every cheat of `cheats.py` runs through the public API (`raydpfl.run_simulation` with the
quickstart's data, a few rounds) and must end one of three ways:
- refused: `PrivacyContractError` (the CLI's one line, exit 2), naming the algorithm,
  the client and the round where a client half is at fault;
- no effect: the honest run's model and ledger, bit for bit;
- listed: it ran, and what it released outside a mechanism is in the run's
  ``unaccounted_releases``, written by the platform.
The same holds on the client-vectorised path and on Ray (`test_on_ray_*`).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

import raydpfl
from raydpfl.algorithms import DPFedAvg
from raydpfl.algorithms.dp_fedavg_client import DPFedAvgClientLevel
from raydpfl.algorithms.dp_ftrl_client import DPFTRLClientLevel
from raydpfl.privacy.accounting.ledger import PrivacyCost
from raydpfl.privacy.mechanisms.kernel import (
    RAW_RECORDS_NOTE,
    RESULT_WEIGHT_NOTE,
    UNBOUNDED_NOTE,
    MechanismTypeError,
    PrivacyContractError,
    SubsampledGaussian,
    uses,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cheats

from tests.simulation.test_privacy_contract import QUICK

ROOT = Path(__file__).resolve().parents[3]
CLIENT_LEVEL = ROOT / "configs/client_level/dp_fedavg_client_synthetic.yaml"
FTRL = ROOT / "configs/client_level/dp_ftrl_client_synthetic.yaml"


def _record(cls: type[DPFedAvg] = DPFedAvg, sigma: float = 1.0, **kw) -> DPFedAvg:
    args = dict(
        clients_per_round=4,
        local_steps=2,
        lr=0.5,
        clip_norm=1.0,
        noise_multiplier=sigma,
        sampling_rate=0.1,
    )
    return cls(**{**args, **kw})


def _run(algorithm, *overrides: str) -> dict:
    result = raydpfl.run_simulation(
        str(ROOT / "configs/quickstart.yaml"), overrides=[*QUICK, *overrides], algorithm=algorithm
    )
    return result.summary


def _honest(*overrides: str) -> dict:
    return _run(_record(), *overrides)


def _same_run(a: dict, b: dict) -> None:
    assert a["model_sha256"] == b["model_sha256"]
    assert a["ledger_sha256"] == b["ledger_sha256"]
    assert a["epsilon_max"] == b["epsilon_max"]


def _refused(algorithm, match: str, *overrides: str) -> str:
    with pytest.raises(PrivacyContractError, match=match) as e:
        _run(algorithm, *overrides)
    message = str(e.value)
    assert "\n" not in message
    return message


# ---- 1. the mechanism states its own cost --------------------------------------------------
def test_a_mechanism_subclass_is_refused_where_it_is_defined():
    with pytest.raises(MechanismTypeError, match="final types"):

        class CheapGaussian(SubsampledGaussian):
            def cost(self, invocations):
                return PrivacyCost(100.0, self.sampling_rate, invocations)

    with pytest.raises(MechanismTypeError, match="final types"):

        class Spoofed(SubsampledGaussian):  # claims a kernel module's name
            __module__ = "raydpfl.privacy.mechanisms.kernel"

    from raydpfl.privacy.mechanisms.client_level_mechanisms import ClientGaussianSum

    with pytest.raises(MechanismTypeError, match="final types"):

        class CheapSum(ClientGaussianSum):
            def cost(self, invocations):
                return None


def test_a_look_alike_mechanism_is_refused():
    _refused(_record(cheats.LookAlike), "kernel's mechanism types")


def test_a_cost_planted_on_the_instance_is_not_what_is_charged():
    _same_run(_run(_record(cheats.InstanceCost)), _honest())


# ---- 2. declarations ------------------------------------------------------------------------
def test_a_use_declared_zero_times_is_refused():
    _refused(_record(cheats.CountZero), r"declares 0 x subsampled_gaussian.*at least once")


def test_a_task_of_another_kind_without_a_mechanism_cannot_train_the_model():
    message = _refused(_record(cheats.WarmupKind), "declared no mechanism but its result")
    assert "client " in message and "round 1" in message


def test_a_tiny_declared_q_is_what_the_platform_samples_at_and_what_summary_states():
    cheat = _run(_record(cheats.TinyDeclaredQ))
    honest_tiny = _run(_record(sampling_rate=1e-6))
    _same_run(cheat, honest_tiny)  # trained at q = 1e-6: the ε is the one delivered
    assert cheat["privacy"]["sampling_rate"] == 1e-6  # the charge, not the config's 0.1
    assert {e["sampling_rate"] for e in cheat["privacy"]["charged"]} == {1e-6}


# ---- 3. live mechanisms fed anything ---------------------------------------------------------
def test_a_release_takes_only_the_batch_the_mechanism_drew():
    _refused(_record(cheats.FullBatchForged), "the batch this mechanism's last sample")


def test_a_context_with_a_clipping_engine_of_its_own_changes_nothing():
    _same_run(_run(_record(cheats.OwnEngine)), _honest())


def _pe(cls=None, **kw):
    from raydpfl.papers.ali_dpfl.pe_dpfl import PeDpfl

    args = dict(
        clients_per_round=4, rounds_budget=2, local_steps=2, lr=0.5, sampling_rate=0.1,
        update_clip_norm=1.0, noise_multiplier=1.0, epsilon=50.0, delta=1e-5,
    )  # fmt: skip
    return (cls or PeDpfl)(**{**args, **kw})


def test_output_perturbation_of_a_dummy_while_uploading_the_clean_update_is_refused():
    message = _refused(_pe(cheats.PerturbsADummy), "must be what perturb_update returned")
    assert "'pe_dpfl'" in message and "client " in message


def test_an_honest_output_perturbation_reads_records_and_lists_nothing_for_it():
    summary = _run(_pe())
    assert RAW_RECORDS_NOTE not in summary["unaccounted_releases"]  # the update was perturbed


def test_a_full_batch_release_run_at_a_wider_clip_than_declared_is_refused():
    _refused(_record(cheats.WideClipFullBatch), "above the declared")


def test_a_statistic_in_the_aggregation_weight_is_listed():
    summary = _run(_record(cheats.WeightChannel))
    assert RESULT_WEIGHT_NOTE in summary["unaccounted_releases"]
    assert RESULT_WEIGHT_NOTE not in _honest()["unaccounted_releases"]


def test_a_record_count_of_its_own_is_refused():
    _refused(_record(cheats.CountChannel), "the client holds")


def test_raw_records_in_the_update_are_listed():
    summary = _run(_record(cheats.MeanInTheUpdate))
    assert RAW_RECORDS_NOTE in summary["unaccounted_releases"]
    assert RAW_RECORDS_NOTE not in _honest()["unaccounted_releases"]


def test_the_public_api_has_no_unbound_noise_and_no_pool():
    from raydpfl.algorithms.base import ClientData
    from raydpfl.privacy.mechanisms.kernel import LiveSubsampledGaussian

    assert not hasattr(LiveSubsampledGaussian, "noisy_sum")
    assert not hasattr(LiveSubsampledGaussian, "count_vectorised_steps")
    import torch

    data = ClientData(0, torch.zeros(5, 2), torch.zeros(5), torch.arange(2))
    assert not any(hasattr(data, a) for a in ("x", "y", "indices"))


# ---- 4. a receipt without the release -------------------------------------------------------
def test_a_session_of_its_own_has_no_records_to_release():
    _refused(_record(cheats.OwnSessionOnly), "not bound to a client's records")


def test_a_context_without_a_session_still_trains_through_the_workers():
    _same_run(_run(_record(cheats.NoSessionContext)), _honest())


def test_a_direct_context_cannot_take_over_the_workers_records():
    _refused(_record(cheats.RebindsTheRecords), "bound to the worker's privacy session")


def test_the_contexts_stream_cannot_replay_the_noise():
    """Replaying `ctx.generator` predicts nothing: subtracting its "noise" moves the model
    away from the noise-free run, it does not land on it."""
    noise_free = _run(_record(sigma=0.0))
    cheat = _run(_record(cheats.NoiseCanceller))
    assert cheat["model_sha256"] != noise_free["model_sha256"]
    assert cheat["ledger_sha256"] == _honest()["ledger_sha256"]


# ---- 5. a weight rule that opts out of its check ------------------------------------------
def test_an_opt_out_on_the_weight_rule_is_ignored():
    message = _refused(_record(cheats.UnboundedRule), "LooseRule.*above the clip norm")
    assert message.startswith("algorithm ") and "client " in message


def test_the_run_level_opt_out_cannot_be_set_from_the_client_half():
    _refused(_record(cheats.LateRunLevelOptOut), "above the clip norm")


def test_a_run_level_opt_out_set_at_build_time_is_listed_as_not_private():
    summary = _run(_record(cheats.DeclaredRunLevelOptOut))
    assert UNBOUNDED_NOTE in summary["unaccounted_releases"]


# ---- 6. client level ------------------------------------------------------------------------
def _client_level(config: Path = CLIENT_LEVEL, *runtime: str, **options):
    overrides = [
        "runtime.backend=local",
        f"experiment.algorithm.rounds={2 if config == CLIENT_LEVEL else 3}",
        "experiment.data.num_clients=40",
        "experiment.algorithm.clients_per_round=10",
        *runtime,
        *(f"experiment.algorithm.options.{k}={v}" for k, v in options.items()),
    ]
    return raydpfl.to_config(str(config), overrides=overrides)


def _run_client_level(
    cls: type[DPFedAvgClientLevel], *runtime: str, config: Path = CLIENT_LEVEL, **options
) -> dict:
    from raydpfl.experiment.build import build_experiment, run_experiment

    exp = build_experiment(_client_level(config, *runtime, **options))
    cheat = cls.__new__(cls)
    cheat.__dict__.update(exp.algorithm.__dict__)
    return run_experiment(dataclasses.replace(exp, algorithm=cheat), None)


def _client_level_refused(cls, match: str, *runtime: str, **kw) -> str:
    with pytest.raises(PrivacyContractError, match=match) as e:
        _run_client_level(cls, *runtime, **kw)
    message = str(e.value)
    assert "\n" not in message and "round " in message
    return message


ADAPTIVE = {"adaptive_clipping": "true"}


def test_an_unclipped_client_upload_is_refused_on_the_worker():
    with pytest.raises(PrivacyContractError, match=r"norm .* > S = ") as e:
        _run_client_level(cheats.UnclippedUpload)
    assert "client " in str(e.value) and "round 1" in str(e.value)


def test_a_share_added_to_something_else_is_refused():
    with pytest.raises(PrivacyContractError, match="must be what the client's GaussianShare"):
        _run_client_level(
            cheats.ShareOnADummy,
            noise="distributed",
            sampling="fixed",
            client_sampling_rate="null",
        )


def test_server_noise_on_anything_but_the_rounds_sum_is_refused():
    # the old server half (it saw the clean sum) is refused before it runs
    _client_level_refused(cheats.NoiseOnADummy, "overrides aggregate_sum")


def test_a_client_level_upload_weighted_by_its_records_is_refused_on_the_worker():
    message = _client_level_refused(cheats.WeightedByData, "has weight 1")
    assert "client " in message


def test_a_scaled_clip_bit_is_refused_on_the_worker():
    message = _client_level_refused(cheats.LouderClipBit, "is the bit", **ADAPTIVE)
    assert "client " in message


def test_a_server_half_stepping_with_the_clean_sum_is_refused():
    """The server half the platform trusted: it released the real sum (the receipt
    closed) and stepped with the clean one. It never gets the clean sum now."""
    message = _client_level_refused(cheats.CleanSumStep, r"overrides aggregate_sum")
    assert message.startswith("round 1 (client-level, server half): algorithm ")


def test_a_server_half_reading_the_exact_clip_count_is_refused():
    _client_level_refused(cheats.ExactClipCount, "overrides aggregate_sum", **ADAPTIVE)


def test_a_release_of_its_own_to_learn_the_noise_is_refused():
    _client_level_refused(cheats.NoiseFromAnEmptyRound, "already made by the platform")


def test_a_dp_ftrl_server_half_keeping_the_clean_prefix_is_refused():
    _client_level_refused(cheats.FtrlCleanPrefix, "overrides aggregate_sum", config=FTRL)


def test_a_dp_ftrl_server_half_reading_every_clipped_upload_is_refused():
    _client_level_refused(cheats.FtrlMedianOfUpdates, "overrides aggregate,", config=FTRL)


def test_a_server_half_gets_only_the_release_and_the_honest_run_is_unchanged():
    """What the built-in server halves receive: a `ReleasedSum` and nothing un-noised; the
    run lists the cohort sizes and client metrics that still reach rounds.parquet."""
    from raydpfl.privacy.mechanisms.client_level_mechanisms import ReleasedSum

    seen = []

    class Spy(DPFedAvgClientLevel):
        def aggregate_release(self, global_params, tasks, released):
            seen.append(released)
            return super().aggregate_release(global_params, tasks, released)

    honest = _run_client_level(DPFedAvgClientLevel, **ADAPTIVE)
    _same_run(_run_client_level(Spy, **ADAPTIVE), honest)
    assert [type(r) for r in seen] == [ReleasedSum, ReleasedSum]
    fields = {f.name for f in dataclasses.fields(ReleasedSum)}
    assert fields == {"noisy_sum", "clients", "mechanism", "noisy_clip_count"}
    assert all(isinstance(r.noisy_clip_count, float) for r in seen)
    listed = honest["unaccounted_releases"]
    assert "cohort_sizes (clients_trained per round in rounds.parquet)" in listed
    assert any(s.startswith("client_metric update_within_clip ") for s in listed)


def test_a_dp_ftrl_server_half_holds_no_tree_state_and_cannot_draw_a_node():
    """During `aggregate_release` the round's session is closed: it holds no tree (the clean
    running sum is the server's) and refuses a node draw; the honest model is unchanged."""
    from raydpfl.privacy.mechanisms.kernel import PrivacyContractError as Refused

    seen = []

    class Spy(DPFTRLClientLevel):
        def aggregate_release(self, global_params, tasks, released):
            session = self.round_session
            with pytest.raises(Refused, match="already made by the platform"):
                session.get().node_noise(global_params)
            seen.append((session.tree, released.mechanism.round_in_tree))
            return super().aggregate_release(global_params, tasks, released)

    _same_run(
        _run_client_level(Spy, config=FTRL), _run_client_level(DPFTRLClientLevel, config=FTRL)
    )
    assert seen == [(None, 1), (None, 2), (None, 3)]


def test_a_vectorised_client_level_group_has_no_effect():
    vectorised = ("runtime.vectorise_clients=on", "runtime.aggregation_groups=1")
    cheat = _run_client_level(cheats.VectorisedUnclipped, *vectorised)
    _same_run(cheat, _run_client_level(DPFedAvgClientLevel, *vectorised))


CLIENT_LEVEL_PLUGIN = """
import raydpfl
from raydpfl.algorithms.dp_fedavg_client import DPFedAvgClientLevel, dp_fedavg_update
from raydpfl.config.client_level import ClientLevelOptions
from raydpfl.experiment.builders.client_level import build
from raydpfl.privacy.mechanisms.client_level_mechanisms import round_session


class CleanStep(DPFedAvgClientLevel):
    def aggregate_sum(self, global_params, tasks, total):
        clean = {{n: total.total[n] for n in global_params}}
        round_session(self, self._round, self.round_mechanisms, self.seed).get().release(clean)
        return dp_fedavg_update(global_params, clean, self.expected_cohort)


@raydpfl.register_algorithm("{name}", options=ClientLevelOptions)
def build_clean_step(context):
    algorithm = build(context)
    algorithm.__class__ = CleanStep
    return algorithm
"""


def test_the_cli_refuses_a_client_level_server_half_plugin_in_one_line(tmp_path):
    import subprocess

    plugin = tmp_path / "elsewhere" / "clean_step_plugin.py"
    plugin.parent.mkdir()
    plugin.write_text(CLIENT_LEVEL_PLUGIN.format(name="clean_step_dpfl"))
    cmd = [sys.executable, "-m", "raydpfl", "run", str(CLIENT_LEVEL), "--plugin", str(plugin)]
    cmd += ["--set", "experiment.algorithm.name=clean_step_dpfl", "--set", "runtime.backend=local"]
    cmd += ["--set", "experiment.algorithm.rounds=2", "--set", "experiment.data.num_clients=40"]
    cmd += ["--set", "experiment.algorithm.clients_per_round=10"]
    cmd += ["--out", str(tmp_path / "run"), "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    lines = [x for x in done.stderr.strip().splitlines() if x]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert "round 1" in lines[0] and "algorithm 'clean_step_dpfl'" in lines[0]
    assert "overrides aggregate_sum" in lines[0]


# ---- 7. raw statistics reach the outputs -----------------------------------------------------
def test_a_raw_metric_is_listed_by_the_platform():
    summary = _run(_record(cheats.RawMeanMetric))
    listed = summary["unaccounted_releases"]
    assert RAW_RECORDS_NOTE in listed
    assert any(s.startswith("client_metric label_mean ") for s in listed)


def test_an_extra_result_field_is_listed_by_the_platform():
    listed = _run(_record(cheats.ExtraField))["unaccounted_releases"]
    assert any(s.startswith("client_result_field sample ") for s in listed)
    assert RAW_RECORDS_NOTE in listed


# ---- the client-vectorised path --------------------------------------------------------------
VECTORISED = ("runtime.vectorise_clients=on", "runtime.aggregation_groups=1")


class OwnGroupSessions(DPFedAvg):
    """On the vectorised path: trains the group from sessions of its own at σ = 0.01."""

    def local_update_group_sum(self, ctxs, params, datas, tasks):
        from raydpfl.privacy.mechanisms.kernel import PrivacySession
        from raydpfl.privacy.per_sample import multi_client

        weak = SubsampledGaussian(0.01, self.clip_norm, self.sampling_rate)
        own = [
            PrivacySession((uses(weak, t.local_steps),), c.generator)
            for c, t in zip(ctxs, tasks, strict=True)
        ]
        multi_client.run_sessions(own, params, local_steps=tasks[0].local_steps, lr=tasks[0].lr)
        raise AssertionError("unreachable")


def test_vectorised_sessions_of_its_own_are_refused():
    _refused(_record(OwnGroupSessions), "worker-bound privacy sessions", *VECTORISED)


def test_vectorised_runs_keep_the_charge_and_list_their_statistics():
    cheat = _run(_record(cheats.TinyDeclaredQ), *VECTORISED)
    assert cheat["privacy"]["sampling_rate"] == 1e-6
    assert any("dp_sgd_step_statistics" in s for s in _honest(*VECTORISED)["unaccounted_releases"])


# ---- 8. one line, exit 2, the registered name -----------------------------------------------
PLUGIN = """
import torch
import raydpfl
from raydpfl.algorithms import DPFedAvg
from raydpfl.algorithms.local_dp_sgd import dp_sgd_local_loop


class Loose:
    unbounded_by_design = True

    def __call__(self, norms):
        return torch.full_like(norms, 100.0)


@raydpfl.register_algorithm("{name}")
class Sneaky(DPFedAvg):
    def local_update(self, ctx, params, data, task):
        start, _ = dp_sgd_local_loop(ctx, params, data, task, weight_rule=Loose())
        n = data.num_examples
        return raydpfl.algorithms.ClientResult(
            task.client_id, {{k: params[k] - start[k] for k in params}}, float(n), n
        )
"""


def test_the_cli_refuses_a_plugin_in_one_line_naming_it(tmp_path):
    import subprocess

    plugin = tmp_path / "elsewhere" / "sneaky_plugin.py"
    plugin.parent.mkdir()
    plugin.write_text(PLUGIN.format(name="sneaky_dpfl"))
    overrides = [a for o in QUICK for a in ("--set", o)]
    cmd = [sys.executable, "-m", "raydpfl", "run", str(ROOT / "configs/quickstart.yaml")]
    cmd += ["--plugin", str(plugin), "--set", "experiment.algorithm.name=sneaky_dpfl"]
    cmd += [*overrides, "--out", str(tmp_path / "run"), "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    lines = [x for x in done.stderr.strip().splitlines() if x]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert (
        "algorithm 'sneaky_dpfl'" in lines[0] and "client " in lines[0] and "round 1" in lines[0]
    )


# ---- on Ray --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_up():
    ray = pytest.importorskip("ray")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(cheats)  # the actors cannot import this folder
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    cloudpickle.unregister_pickle_by_value(cheats)
    if started:
        ray.shutdown()


RAY = ("runtime.backend=ray", "runtime.workers=1", "runtime.cpus_per_worker=1")


@pytest.mark.ray
@pytest.mark.slow
def test_on_ray_cheats_are_refused_or_have_no_effect(ray_up):
    local = _honest()
    _same_run(_run(_record(cheats.OwnEngine), *RAY), local)  # no effect, same bits as local
    message = _refused(_record(cheats.UnboundedRule), "above the clip norm", *RAY)
    assert "client " in message and "round 1" in message
    _refused(_record(cheats.WarmupKind), "declared no mechanism", *RAY)
    listed = _run(_record(cheats.RawMeanMetric), *RAY)["unaccounted_releases"]
    assert RAW_RECORDS_NOTE in listed
