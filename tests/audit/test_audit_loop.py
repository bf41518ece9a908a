"""Record-level audits of the algorithms that run the shared DP-SGD loop (ALI-DPFL, FedFDP,
the RC-DPFL family, ...): null-record gradient canaries, each step's noisy sum as the
white-box view (`raydpfl.audit.canaries.LoopAudit`). Tiny synthetic runs; the negative
control (noise drawn at 0.1 of its std, the ledger still charging σ) must be caught."""

import copy

import numpy as np
import pytest
import torch
from test_audit_runs import RECORD

import raydpfl.privacy.per_sample.dpsgd as dpsgd
from raydpfl.audit import audit
from raydpfl.audit import canaries as cn
from raydpfl.audit.run import auditable, loop_auditable
from raydpfl.cli.main import main
from raydpfl.config.schema import ConfigError
from raydpfl.privacy.accounting.accountants import compute_epsilon


def _config(name: str) -> dict:
    cfg = copy.deepcopy(RECORD)
    cfg["experiment"]["algorithm"]["name"] = name
    if name == "ali_dpfl":  # R_c = 4 = R_s: τ = 1 every round (no τ* search)
        cfg["experiment"]["privacy"]["epsilon"] = 0.71
    return cfg


def _rc(name: str) -> dict:
    cfg = _config(name)
    cfg["experiment"]["data"]["num_clients"] = 4
    cfg["experiment"]["data"]["synthetic"] = {"min_samples": 60, "max_samples": 100}
    algo = cfg["experiment"]["algorithm"]
    algo.update(rounds=2, eval_every=2, clients_per_round=4)
    algo.pop("local_steps")
    algo["rc_dpfl"] = {"num_clusters": 2, "batch_size": 20, "local_epochs": 1}
    privacy = cfg["experiment"]["privacy"]
    privacy.update(noise_multiplier=1.0)  # given, not calibrated (calibration is slow)
    privacy.pop("sampling_rate")
    return cfg


@pytest.mark.parametrize("name", ["ali_dpfl", "fedfdp", "adap_dp_fl", "dp_scaffold"])
def test_honest_loop_algorithms_stay_below_their_claim(name):
    result = audit(_config(name), canaries=200, k_plus=40, k_minus=0)

    assert (result.unit, result.mode, result.summary["algorithm"]) == ("record", "white-box", name)
    assert 0.0 <= result.epsilon_lower_bound <= result.epsilon_audited <= result.epsilon_claimed


@pytest.mark.parametrize("name", ["rc_dpfl", "rc_dp_fedavg"])
def test_the_rc_dpfl_family_is_audited_per_step_gmm_stage_included(name):
    result = audit(_rc(name), canaries=40, k_plus=8, k_minus=0)

    assert 0.0 <= result.epsilon_lower_bound <= result.epsilon_claimed
    assert result.epsilon_audited == pytest.approx(result.epsilon_claimed, rel=1e-6)


def test_fedfdp_white_box_is_compared_with_the_dp_sgd_steps_alone():
    # The loss upload is a second charged mechanism outside the white-box view: the
    # audited releases' ε (the DP-SGD steps) is below the run's ε, and the honest bound
    # stays under the smaller one. Black-box sees the final model: everything counts.
    white = audit(_config("fedfdp"), canaries=200, k_plus=40, k_minus=0)
    black = audit(_config("fedfdp"), canaries=200, k_plus=40, k_minus=0, mode="black-box")
    # every client trains every round: 4 rounds of τ = 5 steps at σ = 3, q = 0.2
    steps_alone = compute_epsilon([(3.0, 0.2, 20)], 1e-5, "rdp")

    assert white.epsilon_audited < white.epsilon_claimed
    assert white.epsilon_audited == pytest.approx(steps_alone, rel=1e-6)
    assert black.epsilon_audited == black.epsilon_claimed
    assert "audited DP-SGD releases alone" in white.line()


def test_weak_noise_in_a_loop_algorithm_is_caught(monkeypatch):
    real = dpsgd.gaussian_like
    monkeypatch.setattr(dpsgd, "gaussian_like", lambda t, std, g: real(t, 0.1 * std, g))

    result = audit(_config("fedfdp"), canaries=200, k_plus=40, k_minus=0)

    assert result.correct >= 39
    assert result.epsilon_lower_bound > result.epsilon_audited


def test_out_canaries_are_records_with_zero_gradient_and_change_no_sum():
    # The engine gives an in canary G·e_j through the weight rule and an out canary 0;
    # both rows count in the batch (|B| and |D_i| do not depend on inclusion).
    x = torch.zeros(5, 3)
    y = torch.tensor([0, 1, 0, 1, 0])
    pool = cn.NullCanaryData.of(cn.ClientData(0, x, y, torch.arange(5)), first_canary_row=3)

    class Inner:
        def clipped_sum(self, params, x, y, rule, *, into=None):
            return into, dpsgd.StepStats.of(int(x.shape[0]), 0, 0.0)

    class Audit:
        audit_norm_factor = 100.0
        audit_included = np.array([True, False])

        def record_step(self, task, probe):
            pass

    task = cn.ClientTask.dp_sgd(
        client_id=0,
        round_idx=0,
        local_steps=1,
        lr=0.1,
        sampling_rate=0.5,
        clip_norm=2.0,
        noise_multiplier=1.0,
    )
    engine = cn.StepCanaryEngine(Inner(), torch.nn.Identity(), pool, Audit(), task)
    bx, by = pool.batch(torch.arange(5))
    noise = {cn.PROBE: torch.zeros(1, 2)}

    total, stats = engine.clipped_sum({}, bx, by, lambda n: dpsgd.clip_weights(n, 2.0), into=noise)

    assert total[cn.PROBE][0].tolist() == pytest.approx([2.0, 0.0], rel=1e-5)
    assert stats.batch_size == 5


def test_loop_audit_needs_the_noisy_sum_from_the_engine():
    # A fused update (noise added after the engine) cannot be audited: refused loudly.
    task = cn.ClientTask.dp_sgd(
        client_id=0,
        round_idx=0,
        local_steps=1,
        lr=0.1,
        sampling_rate=0.5,
        clip_norm=1.0,
        noise_multiplier=1.0,
    )
    pool = cn.NullCanaryData.of(
        cn.ClientData(0, torch.zeros(1, 1), torch.zeros(1), torch.arange(1)), 1
    )
    engine = cn.StepCanaryEngine(None, torch.nn.Identity(), pool, None, task)
    with pytest.raises(RuntimeError, match="noisy sum"):
        engine.clipped_sum({}, torch.zeros(1, 1), torch.zeros(1), lambda n: n, into=None)


@pytest.mark.parametrize("name", ["mr_mtl", "pe_dpfl"])
def test_unsupported_algorithms_are_refused_naming_the_allowed_values(name):
    with pytest.raises(ConfigError) as err:
        audit(_config(name), canaries=10)

    assert err.value.field == "experiment.algorithm.name"
    assert "ali_dpfl" in str(err.value) and "fedfdp" in str(err.value)


def test_the_cli_refuses_an_unsupported_algorithm_with_exit_2(tmp_path, capsys):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_config("dp_fedavg")))

    code = main(["audit", str(path), "--set", "experiment.algorithm.name=pe_dpfl"])

    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("raydpfl: error: experiment.algorithm.name: ")
    assert all(name in err for name in auditable())


def test_every_loop_algorithm_is_record_level():
    assert set(loop_auditable()) <= set(auditable())
    assert {auditable()[n] for n in loop_auditable()} == {"record"}
    # Declared by each algorithm's registration, not a central list.
    assert {"ali_dpfl", "fedfdp", "rc_dpfl", "dp_scaffold"} <= set(loop_auditable())
    assert auditable()["dp_fedavg_client"] == "client"


def test_only_the_probe_depends_on_which_canaries_are_in(tmp_path):
    # Null-record canaries: with all in or all out, FedFDP (loss-aware clipping, noisy
    # loss upload, |D_i|-weighted mean) ends with the same model bit for bit off the probe.
    from raydpfl.audit import run as audit_run
    from raydpfl.config.load import config_from_any
    from raydpfl.experiment.build import build_experiment, run_experiment
    from raydpfl.simulation.outputs import prepare_run_dir

    cfg = config_from_any(_config("fedfdp"), ["runtime.checkpoint_every=null"])
    base = build_experiment(cfg)
    owners = np.arange(20) % base.dataset.num_clients
    finals = []
    for k, included in enumerate((np.ones(20, bool), np.zeros(20, bool))):
        rng = np.random.default_rng(0)
        exp, _ = audit_run._record_level_loop(cfg, base, owners, included, "white-box", rng)
        run_experiment(exp, prepare_run_dir(tmp_path / str(k)))
        finals.append(torch.load(tmp_path / str(k) / "model.pt", weights_only=True))

    assert set(finals[0]) == set(finals[1])
    for name in finals[0]:
        if name != cn.PROBE:
            assert torch.equal(finals[0][name], finals[1][name]), name
    assert not torch.equal(finals[0][cn.PROBE], finals[1][cn.PROBE])


def test_every_builtin_algorithm_is_audited_refused_with_a_reason_or_not_private():
    from raydpfl.audit.run import not_auditable
    from raydpfl.config.schema import shipped_names

    rest = set(shipped_names("algorithm")) - set(auditable()) - set(not_auditable())

    assert rest == {"fedavg", "fedfair", "fedprox", "scaffold", "feddyn", "qffl", "bcs_fedsgd"}
