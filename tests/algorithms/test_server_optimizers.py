"""Server optimizers (FedAvgM, FedAdagrad, FedAdam, FedYogi; Reddi et al. 2021) for the
record-level algorithms whose server applies one averaged update (fedavg, dp_fedavg,
fedprox, dp_fedprox): each rule against a hand computation, DP-FedAvg's momentum step
against FedAvgM applied by hand to the same noisy mean, the default path unchanged,
resume and Ray equal to an uninterrupted local run, and bad settings refused in one line
naming the field."""

from __future__ import annotations

import math
import typing

import pytest
import torch

from raydpfl.algorithms import DPFedAvg, FedAvg
from raydpfl.algorithms import dp_fedavg_client as client_level
from raydpfl.algorithms.base import Algorithm, WeightedUpdateSum
from raydpfl.algorithms.server_optimizers import (
    SERVER_OPTIMIZERS,
    ServerOptimizer,
    server_step,
)
from raydpfl.config import ConfigError
from raydpfl.config.load import dump_config
from raydpfl.config.schema import ServerOptimizerConfig
from raydpfl.experiment.build import build_experiment, make_local_backend, run_experiment
from raydpfl.simulation.experiment import make_server
from raydpfl.simulation.outputs import RunWriter
from tests.conftest import small_config

LR, BETA1, BETA2, EPS = 0.5, 0.9, 0.99, 1e-3
#: Two rounds' mean updates of a two-entry "model" (entries of both signs, one large).
DELTAS = [[0.3, -2.0], [-0.1, 0.5]]


def _hand(optimizer: str) -> list[list[float]]:
    """θ after each of the DELTAS, from θ₀ = (1, 1), by the paper's formulas in floats."""
    theta, m, v, out = [1.0, 1.0], [0.0, 0.0], [0.0, 0.0], []
    for d in DELTAS:
        for i, g in enumerate(d):
            if optimizer == "sgd":
                theta[i] += LR * g
                continue
            if optimizer == "momentum":
                m[i] = BETA1 * m[i] + g
                theta[i] += LR * m[i]
                continue
            m[i] = BETA1 * m[i] + (1 - BETA1) * g
            if optimizer == "adagrad":
                v[i] = v[i] + g * g
            elif optimizer == "adam":
                v[i] = BETA2 * v[i] + (1 - BETA2) * g * g
            else:  # yogi
                v[i] = v[i] - (1 - BETA2) * g * g * math.copysign(1.0, v[i] - g * g)
            theta[i] += LR * m[i] / (math.sqrt(v[i]) + EPS)
        out.append(list(theta))
    return out


@pytest.mark.parametrize("optimizer", SERVER_OPTIMIZERS)
def test_server_step_matches_the_formulas_by_hand(optimizer):
    theta = {"w": torch.tensor([1.0, 1.0], dtype=torch.float64)}
    state: dict = {}
    for d, want in zip(DELTAS, _hand(optimizer), strict=True):
        mean = {"w": torch.tensor(d, dtype=torch.float64)}
        theta = server_step(
            theta, mean, state, optimizer=optimizer, lr=LR, momentum=BETA1, beta2=BETA2, eps=EPS
        )
        assert theta["w"].tolist() == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert sorted(state) == {"sgd": [], "momentum": ["m"]}.get(optimizer, ["m", "v"])


def test_the_names_are_one_list_shared_with_client_level_dp_fedavg_and_the_config():
    assert client_level.server_step is server_step
    assert client_level.SERVER_OPTIMIZERS == SERVER_OPTIMIZERS
    hint = typing.get_type_hints(ServerOptimizerConfig)["optimizer"]
    assert typing.get_args(hint) == SERVER_OPTIMIZERS


# ---- DP-FedAvg end to end: the step on the round's noisy mean --------------------------------
def _config(algorithm="dp_fedavg", rounds=2, server=None, **runtime):
    section = {
        "name": algorithm,
        "rounds": rounds,
        "local_steps": 2,
        "clients_per_round": 3,
        "eval_every": rounds,
        "evaluate_clients": False,
    }
    if server is not None:
        section["server"] = server
    return small_config(experiment__algorithm=section, runtime=runtime or {})


def _rounds(config, rounds):
    """(θ before, noisy mean Δ̄, θ after) of each round, seen at the server's aggregation."""
    exp = build_experiment(config)
    server = make_server(exp)
    seen = []
    real = exp.algorithm.aggregate_sum

    def spy(params, tasks, total):
        new = real(params, tasks, total)
        seen.append(({n: t.clone() for n, t in params.items()}, total.mean(), new))
        return new

    exp.algorithm.aggregate_sum = spy  # the server calls the instance's attribute
    with make_local_backend(exp) as backend:
        for r in range(rounds):
            assert server.run_round(backend, r)
    return seen


def test_dp_fedavg_momentum_is_fedavgm_applied_by_hand_to_the_same_noisy_mean():
    lr, beta = 0.7, 0.5
    sgd = _rounds(_config(rounds=1), 1)
    mom = _rounds(_config(server={"optimizer": "momentum", "lr": lr, "momentum": beta}), 2)
    (theta0, mean0, sgd_new), (m_theta0, m_mean0, m_new) = sgd[0], mom[0]
    for n in theta0:  # the same cohort, DP-SGD noise and so the same released mean ...
        assert torch.equal(m_theta0[n], theta0[n]) and torch.equal(m_mean0[n], mean0[n])
        # ... stepped by FedAvgM: m = β·0 + Δ̄ = Δ̄, θ + η_s m, not θ + Δ̄.
        assert torch.equal(m_new[n], theta0[n] + lr * mean0[n])
        assert not torch.equal(m_new[n], sgd_new[n])
    (theta1, mean1, new1) = mom[1]  # round 2: the momentum carries round 1's mean
    for n in theta1:
        assert torch.equal(theta1[n], m_new[n])
        m = mean0[n] * beta + mean1[n]
        assert torch.equal(new1[n], theta1[n] + lr * m)


@pytest.mark.parametrize("algorithm", ["fedavg", "dp_fedavg", "fedprox"])
def test_the_default_takes_todays_step_and_keeps_no_state(algorithm):
    exp = build_experiment(_config(algorithm))
    algo = exp.algorithm
    assert algo.server_opt is None and algo.tensor_state() == {}
    g = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(3, 2, generator=g), "b": torch.randn(2, generator=g)}
    total = WeightedUpdateSum()
    for k in range(3):
        total.add({n: torch.randn(t.shape, generator=g) for n, t in params.items()}, 10.0 + k)
    ours = algo.aggregate_sum(params, [], total)
    base = Algorithm.aggregate_sum(algo, params, [], total)
    assert all(torch.equal(ours[n], base[n]) for n in params)
    # sgd at 1.0 spelled out is the default, bit for bit; sgd at 0.5 is θ + ½Δ̄.
    explicit = run_experiment(build_experiment(_config(algorithm, server={"lr": 1.0})), None)
    default = run_experiment(build_experiment(_config(algorithm)), None)
    assert explicit["model_sha256"] == default["model_sha256"]
    half = ServerOptimizer("sgd", 0.5).step(params, total.mean())
    assert all(torch.equal(half[n], params[n] + 0.5 * total.mean()[n]) for n in params)


def test_fedavg_takes_the_server_optimizer_too():
    plain = run_experiment(build_experiment(_config("fedavg")), None)
    adam = run_experiment(
        build_experiment(_config("fedavg", server={"optimizer": "adam", "lr": 0.05})), None
    )
    assert adam["model_sha256"] != plain["model_sha256"]
    assert math.isfinite(adam["final_test_accuracy"])


# ---- checkpoints and Ray -------------------------------------------------------------------
ADAM = {"optimizer": "adam", "lr": 0.05}
YOGI = {"optimizer": "yogi", "lr": 0.05, "momentum": 0.8}
MOMENTUM = {"optimizer": "momentum", "lr": 0.5}


@pytest.mark.parametrize(
    "algorithm,server",
    [("dp_fedavg", ADAM), ("fedavg", YOGI), ("dp_fedprox", MOMENTUM)],
    ids=["dp_fedavg", "fedavg", "dp_fedprox"],
)
def test_an_interrupted_run_resumes_to_the_same_model(tmp_path, algorithm, server):
    config = _config(algorithm, rounds=4, server=server, checkpoint_every=2)
    reference = run_experiment(build_experiment(config), None)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    exp = build_experiment(config)
    writer = RunWriter(run_dir)
    writer.write_config(dump_config(config))
    server_ = make_server(exp, writer)
    server_.checkpoint_start()
    with make_local_backend(exp) as backend:
        for r in range(3):  # checkpoint after round 2 (m and v saved); round 3, then a "crash"
            assert server_.run_round(backend, r)
    want = ["server_m"] if server["optimizer"] == "momentum" else ["server_m", "server_v"]
    assert sorted({k.split("/")[0] for k in exp.algorithm.tensor_state()}) == want
    resumed = run_experiment(build_experiment(config), run_dir, resume=True)
    assert resumed["resumed_from_round"] == 2
    assert resumed["model_sha256"] == reference["model_sha256"]
    assert resumed.get("ledger_sha256") == reference.get("ledger_sha256")


def test_the_optimizer_state_round_trips_and_refuses_foreign_entries():
    opt = ServerOptimizer("adam", 0.1)
    opt.step({"w": torch.zeros(2)}, {"w": torch.tensor([1.0, -1.0])})
    back = ServerOptimizer("adam", 0.1)
    back.load_tensor_state(opt.tensor_state())
    assert all(torch.equal(back.state[f]["w"], opt.state[f]["w"]) for f in ("m", "v"))
    with pytest.raises(ValueError, match="scaffold_c/w"):
        back.load_tensor_state({"scaffold_c/w": torch.zeros(2)})
    with pytest.raises(ValueError, match="keeps no tensor state"):
        DPFedAvg(
            clients_per_round=1,
            local_steps=1,
            lr=0.1,
            clip_norm=1.0,
            noise_multiplier=1.0,
            sampling_rate=0.1,
        ).load_tensor_state(opt.tensor_state())


@pytest.mark.ray
def test_ray_gives_the_local_backends_model_bit_for_bit():
    ray = pytest.importorskip("ray")
    local = run_experiment(build_experiment(_config(server=ADAM)), None)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        on_ray = run_experiment(
            build_experiment(_config(server=ADAM, backend="ray", workers=2, progress=False)),
            None,
        )
    finally:
        if started:
            ray.shutdown()
    assert on_ray["model_sha256"] == local["model_sha256"]
    assert on_ray["ledger_sha256"] == local["ledger_sha256"]


# ---- bad settings: one line naming the field -----------------------------------------------
@pytest.mark.parametrize(
    "algorithm,server,field",
    [
        ("dp_fedavg", {"optimizer": "adamw"}, "experiment.algorithm.server.optimizer"),
        ("dp_fedavg", {"lr": 0.0}, "experiment.algorithm.server.lr"),
        ("fedavg", {"lr": -1.0}, "experiment.algorithm.server.lr"),
        ("dp_fedavg", {"momentum": 1.0}, "experiment.algorithm.server.momentum"),
        ("dp_fedavg", {"beta2": -0.1}, "experiment.algorithm.server.beta2"),
        ("dp_fedavg", {"adam_eps": 0.0}, "experiment.algorithm.server.adam_eps"),
        ("dp_fedavg", {"learning_rate": 0.5}, "experiment.algorithm.server.learning_rate"),
        ("ali_dpfl", {"optimizer": "momentum"}, "experiment.algorithm.server"),
        ("dp_scaffold", {"lr": 0.5}, "experiment.algorithm.server"),
        ("dp_fedavg_client", {"lr": 0.5}, "experiment.algorithm.server"),
    ],
)
def test_bad_server_settings_are_one_error_naming_the_field(algorithm, server, field):
    with pytest.raises(ConfigError) as err:
        _config(algorithm, server=server)
    assert err.value.field == field
    assert "\n" not in str(err.value)
    if field.endswith(".optimizer") or field.endswith(".server"):
        assert "momentum" in str(err.value) or "dp_fedavg" in str(err.value)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"server_optimizer": "nesterov"}, "server_optimizer must be one of sgd, momentum"),
        ({"server_lr": 0.0}, "server_lr must be > 0"),
        ({"server_momentum": 1.0}, r"server_momentum must be in \[0, 1\)"),
        ({"server_adam_eps": -1.0}, "server_adam_eps must be > 0"),
    ],
)
def test_the_algorithms_refuse_bad_settings_too(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedAvg(clients_per_round=1, local_steps=1, lr=0.1, batch_size=4, **kwargs)
