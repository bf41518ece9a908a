"""benchmarks/vectorised_clients.py: its RC-DPFL case is one cluster's group of the
Fashion-MNIST rotation cell, and both paths it times do the same work (the same clients'
updates, up to float rounding, from the same draws)."""

from __future__ import annotations

from pathlib import Path

import torch

from raydpfl.algorithms.base import ClientContext, ClientData
from raydpfl.privacy.per_sample.engines import make_engine
from tests.benchmarks.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    return load_script("vectorised_clients", ROOT / "benchmarks" / "vectorised_clients.py")


def test_rc_case_is_one_cluster_of_the_rotation_cell():
    case = _bench().make_case("rc", torch.device("cpu"), rc_steps=3)
    assert case["model"] == "rc_cnn" and case["num_params"] == 28_938
    assert case["clients"] == 6 and case["mean_records"] == 2857
    assert case["sampling_rate"] == 32 / 2857 and case["local_steps"] == 3
    tasks = case["alg"].plan(0, list(range(6)), None)
    assert case["alg"].supports_group(tasks)  # one q, C, σ, τ: one vectorised group


def test_rc_case_paths_give_the_same_updates():
    bench = _bench()
    device = torch.device("cpu")
    case = bench.make_case("rc", device, rc_steps=2)
    model, alg = case["model_obj"], case["alg"]
    tasks = alg.plan(0, list(range(case["clients"])), None)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    datas = [ClientData(k, case["x"], case["y"], idx) for k, idx in enumerate(case["indices"])]
    engine = make_engine(model, "auto")
    one_at_a_time = []
    for k, (gen, task) in enumerate(zip(bench._generators(6, device), tasks, strict=True)):
        params = {n: t.clone() for n, t in start.items()}
        one_at_a_time.append(
            alg.local_update(ClientContext(model, engine, gen, device), params, datas[k], task)
        )
    ctxs = [ClientContext(model, engine, g, device) for g in bench._generators(6, device)]
    grouped = alg.local_update_group(ctxs, start, datas, tasks)
    for a, b in zip(one_at_a_time, grouped, strict=True):
        assert a.metrics["mean_batch_size"] == b.metrics["mean_batch_size"]
        # float rounding only: 1e-5 against updates of order 1e-3 (noise η·σ·C/(q·N) ≈ 3e-3)
        assert float(a.update["classifier.weight"].abs().max()) > 1e-3
        for name in a.update:
            torch.testing.assert_close(b.update[name], a.update[name], atol=1e-5, rtol=0)
    # clients differ (own data, own draws): a mix-up between them would show
    assert not torch.allclose(
        grouped[0].update["classifier.weight"], grouped[1].update["classifier.weight"]
    )


def test_fixed_shape_case_truncates_at_the_cap():
    bench = _bench()
    device = torch.device("cpu")
    case = bench.make_case("rc", device, rc_steps=2)
    # q·n = 32, sd ≈ 5.6: ⌈32 + 16.8⌉
    assert bench.default_cap(case) == 49
    tasks = bench._fixed(case["alg"].plan(0, list(range(6)), None), case["indices"], 20)
    assert all(t.mechanisms[0].mechanism.max_batch_size == 20 for t in tasks)
    assert all(t.privacy_cost.mechanism == "truncated_subsampled_gaussian" for t in tasks)
    engine = make_engine(case["model_obj"], "auto")
    _, poisson = bench.run_vectorised(case, device, engine, 2**28)
    _, fixed = bench.run_vectorised(case, device, engine, 2**28, cap=20)
    # 6 clients × 2 steps, at most 20 each; the Poisson batches average 32
    assert fixed <= 6 * 2 * 20 < poisson
