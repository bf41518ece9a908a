"""Resume for algorithms with schedule or tensor state (Adap DP-FL, PE-DPFL, PRIVATEFL,
DPFL-BCS with server momentum, SCAFFOLD, FedDyn): a run "crashed" after a round past its
last checkpoint and resumed ends with the uninterrupted run's rows, model and ledger, bit
for bit. Plus the tensor-state file's round trip and its errors."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch

from raydpfl.algorithms.tensor_state import pack_client_tensors, pack_tensors, unpack_tensor_state
from raydpfl.config import Config, config_from_dict, dump_config
from raydpfl.experiment.build import (
    build_experiment,
    make_local_backend,
    make_server,
    run_experiment,
)
from raydpfl.simulation.outputs import CHECKPOINT_DIR, TENSORS_KEY, RunWriter
from tests.conftest import small_config
from tests.papers.dpfl_bcs.dpfl_bcs_helpers import bcs_config

#: The interrupted run checkpoints every 2 rounds and "crashes" after round 3, so the
#: resume restores round 2's checkpoint and replays round 3 (checked against its charges).
EVERY, CRASH_AFTER = 2, 3


def _with_checkpoints(config: Config) -> Config:
    import dataclasses

    runtime = dataclasses.replace(config.runtime, checkpoint_every=EVERY)
    return dataclasses.replace(config, runtime=runtime)


def _adap_dp_fl() -> Config:
    # patience 1: σ decays (1 → 0.8 after round 2, the checkpoint) within the rounds run.
    return small_config(
        experiment__algorithm={
            "name": "adap_dp_fl",
            "rounds": 5,
            "clients_per_round": 4,
            "adap_dp_fl": {"patience": 1, "noise_decay": 0.8, "min_noise_multiplier": 0.7},
        },
        experiment__privacy={"epsilon": 50.0, "noise_multiplier": 1.0},
    )


def _pe_dpfl() -> Config:
    # z = 1.5 affords K_ε = 5 rounds within ε = 8: the run stops on its own round count.
    return small_config(
        experiment__algorithm={"name": "pe_dpfl", "rounds": 8, "clients_per_round": 4},
        experiment__privacy={"epsilon": 8.0, "noise_multiplier": 1.5},
    )


def _fedfdp(name: str) -> Config:
    return small_config(
        experiment__algorithm={
            "name": name,
            "rounds": 5,
            "local_steps": 2,
            "fedfdp": {"local_mode": "steps"},
        }
    )


def _bcs(name: str, **bcs) -> Config:
    return config_from_dict(
        bcs_config(
            name,
            experiment__data__client_test_fraction=0.2 if "privatefl" in name else 0.0,
            experiment__algorithm__rounds=6,
            experiment__algorithm__eval_every=2,
            experiment__algorithm__dpfl_bcs=bcs,
        )
    )


CASES = {
    "adap_dp_fl": _adap_dp_fl,
    "pe_dpfl": _pe_dpfl,
    "scaffold": lambda: _fedfdp("scaffold"),
    "dp_scaffold": lambda: _fedfdp("dp_scaffold"),
    "feddyn": lambda: _fedfdp("feddyn"),
    "dp_feddyn": lambda: _fedfdp("dp_feddyn"),
    "dpfl_bcs_momentum": lambda: _bcs("dpfl_bcs", server_momentum=0.5),
    "bcs_privatefl": lambda: _bcs("bcs_privatefl"),
    "bcs_privatefl_bcs": lambda: _bcs("bcs_privatefl_bcs", server_momentum=0.5),
}


def _rounds_table(run_dir) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "rounds.parquet").drop(columns=["wall_seconds"])


def _crash_after(config: Config, run_dir, rounds: int) -> None:
    """Runs `rounds` rounds with checkpoints, then drops everything (no close, no
    summary), as a killed process would."""
    exp = build_experiment(config)
    writer = RunWriter(run_dir)
    writer.write_config(dump_config(config))  # as run_experiment does, before the server
    server = make_server(exp, writer)
    server.checkpoint_start()
    with make_local_backend(exp) as backend:
        for r in range(rounds):
            assert server.run_round(backend, r)


@pytest.mark.parametrize("case", sorted(CASES))
def test_interrupted_run_resumes_to_the_uninterrupted_results(case, tmp_path):
    config = _with_checkpoints(CASES[case]())
    assert build_experiment(config).algorithm.resumable
    reference_dir, run_dir = tmp_path / "reference", tmp_path / "run"
    reference_dir.mkdir()
    run_dir.mkdir()
    reference = run_experiment(build_experiment(config), reference_dir)
    assert reference["rounds_completed"] > CRASH_AFTER  # rounds are left after the crash
    if case == "pe_dpfl":
        assert reference["rounds_completed"] == 5 and "privacy budget" in reference["stop_reason"]

    _crash_after(config, run_dir, CRASH_AFTER)
    state, _ = RunWriter(run_dir).read_checkpoint()
    assert state["rounds_completed"] == EVERY
    resumed = run_experiment(build_experiment(config), run_dir, resume=True)

    assert resumed["resumed_from_round"] == EVERY
    assert resumed["model_sha256"] == reference["model_sha256"]
    assert resumed["ledger_sha256"] == reference["ledger_sha256"]
    pd.testing.assert_frame_equal(_rounds_table(run_dir), _rounds_table(reference_dir))
    final = torch.load(run_dir / "model.pt", weights_only=True)
    want = torch.load(reference_dir / "model.pt", weights_only=True)
    assert list(final) == list(want)
    assert all(torch.equal(final[n], want[n]) for n in want)
    ledger = [d / "ledger.json" for d in (run_dir, reference_dir)]
    assert (
        ledger[0].exists()
        == ledger[1].exists()
        == config.experiment.algorithm.name.startswith(("dp_", "adap", "pe_", "dpfl", "bcs"))
    )
    if ledger[1].exists():
        assert json.loads(ledger[0].read_text()) == json.loads(ledger[1].read_text())


def test_tensor_state_is_written_only_for_algorithms_that_have_some(tmp_path):
    for case, has_tensors in [("scaffold", True), ("pe_dpfl", False)]:
        run_dir = tmp_path / case
        run_dir.mkdir()
        _crash_after(_with_checkpoints(CASES[case]()), run_dir, EVERY)
        state, _ = RunWriter(run_dir).read_checkpoint()
        assert (TENSORS_KEY in state) == has_tensors
        files = sorted(p.name for p in (run_dir / CHECKPOINT_DIR).glob("algorithm-*.pt"))
        assert files == ([f"algorithm-{EVERY:07d}.pt"] if has_tensors else [])


# ---- the tensor-state file ------------------------------------------------------------
def _writer(tmp_path) -> RunWriter:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    return RunWriter(run_dir)


def _params() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(6.0).reshape(2, 3), "b": torch.zeros(3)}


def test_tensor_state_round_trips_bit_for_bit_and_replaces_the_previous_file(tmp_path):
    writer = _writer(tmp_path)
    base = torch.randn(4, 5, dtype=torch.float64)
    tensors = {
        "c/w": torch.tensor([math.pi, -0.0, 1e-300], dtype=torch.float32),
        "c_i/3/w": base[1],  # a view: saved (and loaded) as a tensor of its own
        "c_i/10/w": torch.tensor([1, 2], dtype=torch.int64),
    }
    writer.write_checkpoint(2, _params(), {"format": 1}, tensors)
    writer.write_checkpoint(4, _params(), {"format": 1}, tensors)
    ckpt = writer.run_dir / CHECKPOINT_DIR
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "algorithm-0000004.pt",
        "manifest.json",
        "params-0000004.pt",
        "state-0000004.json",
    ]
    state, _ = writer.read_checkpoint()
    loaded = writer.read_checkpoint_tensors(state)
    assert list(loaded) == list(tensors)
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t)
    assert loaded["c_i/3/w"].untyped_storage().nbytes() == 5 * 8  # not base's 4×5
    # A later checkpoint without tensor state names no file and removes the old one.
    writer.write_checkpoint(6, _params(), {"format": 1}, {})
    state, _ = writer.read_checkpoint()
    assert TENSORS_KEY not in state and writer.read_checkpoint_tensors(state) == {}
    assert not list(ckpt.glob("algorithm-*.pt"))


def test_a_checkpoint_without_a_tensor_file_means_empty_tensor_state(tmp_path):
    writer = _writer(tmp_path)
    writer.write_checkpoint(1, _params(), {"format": 1})  # as older checkpoints were written
    state, _ = writer.read_checkpoint()
    assert writer.read_checkpoint_tensors(state) == {}


def test_a_missing_or_tampered_tensor_file_is_a_clear_error(tmp_path):
    writer = _writer(tmp_path)
    writer.write_checkpoint(1, _params(), {"format": 1}, {"c/w": torch.ones(2)})
    state, _ = writer.read_checkpoint()
    path = writer.run_dir / CHECKPOINT_DIR / state[TENSORS_KEY]
    torch.save({"c/w": [1.0, 2.0]}, path)  # not a tensor
    with pytest.raises(ValueError, match=r"entry 'c/w' must map a string to a tensor"):
        writer.read_checkpoint_tensors(state)
    torch.save([torch.ones(2)], path)  # not a dict
    with pytest.raises(ValueError, match="must hold a dict of tensors"):
        writer.read_checkpoint_tensors(state)
    torch.save({"c/w": torch.nn.Linear(2, 2)}, path)  # pickled code: refused by weights_only
    with pytest.raises(Exception, match="Weights only load failed") as raised:
        writer.read_checkpoint_tensors(state)
    assert any(str(path) in note for note in raised.value.__notes__)
    path.unlink()
    with pytest.raises(FileNotFoundError, match=TENSORS_KEY):
        writer.read_checkpoint_tensors(state)


# ---- the algorithm hooks --------------------------------------------------------------
def test_an_algorithm_without_tensor_state_refuses_unexpected_tensors():
    algo = build_experiment(_pe_dpfl()).algorithm
    assert algo.tensor_state() == {}
    algo.load_tensor_state({})  # empty: fine
    with pytest.raises(ValueError, match=r"'pe_dpfl' keeps no tensor state.*'c/w'"):
        algo.load_tensor_state({"c/w": torch.ones(1)})


def test_unexpected_or_inconsistent_tensor_state_names_the_entry():
    scaffold = build_experiment(_fedfdp("scaffold")).algorithm
    with pytest.raises(ValueError, match=r"unexpected tensor state entry 'h/w'"):
        scaffold.load_tensor_state({"h/w": torch.ones(1)})
    with pytest.raises(ValueError, match=r"unexpected tensor state entry 'c_i/x/w'"):
        scaffold.load_tensor_state({"c/w": torch.ones(1), "c_i/x/w": torch.ones(1)})
    with pytest.raises(ValueError, match=r"'c_i' entries but no 'c'"):
        scaffold.load_tensor_state({"c_i/1/w": torch.ones(1)})
    with pytest.raises(ValueError, match=r"c_i/1 has parameters \['v'\]"):
        scaffold.load_tensor_state({"c/w": torch.ones(1), "c_i/1/v": torch.ones(1)})
    no_momentum = build_experiment(_bcs("dpfl_bcs")).algorithm
    with pytest.raises(ValueError, match="server_momentum"):
        no_momentum.load_tensor_state({"velocity/w": torch.ones(1)})
    privatefl = build_experiment(_bcs("bcs_privatefl")).algorithm
    with pytest.raises(ValueError, match=r"unexpected tensor state entry 'transform/w'"):
        privatefl.load_tensor_state({"transform/w": torch.ones(1)})


def test_pack_and_unpack_are_inverse_and_order_clients_by_id():
    c3, c10 = {"a": torch.ones(1)}, {"a": torch.zeros(1)}
    packed = {
        **pack_tensors("s", {"a": torch.full((1,), 2.0)}),
        **pack_client_tensors("p", {10: c10, 3: c3}),
    }
    assert list(packed) == ["s/a", "p/3/a", "p/10/a"]
    shared, clients = unpack_tensor_state(packed, shared=("s",), per_client=("p",))
    assert set(shared) == {"s"} and torch.equal(shared["s"]["a"], torch.full((1,), 2.0))
    assert clients == {"p": {3: c3, 10: c10}}


@pytest.mark.ray
def test_a_run_interrupted_locally_resumes_on_ray_to_the_same_results(tmp_path):
    """The server actor restores the tensor state the same way (only runtime.* changes)."""
    import dataclasses

    ray = pytest.importorskip("ray")
    config = _with_checkpoints(CASES["dp_scaffold"]())
    reference = run_experiment(build_experiment(config), None)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _crash_after(config, run_dir, CRASH_AFTER)
    on_ray = dataclasses.replace(
        config, runtime=dataclasses.replace(config.runtime, backend="ray", workers=1)
    )
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        resumed = run_experiment(build_experiment(on_ray), run_dir, resume=True)
    finally:
        if started:
            ray.shutdown()
    assert resumed["resumed_from_round"] == EVERY
    assert resumed["model_sha256"] == reference["model_sha256"]
    assert resumed["ledger_sha256"] == reference["ledger_sha256"]


def test_checkpointed_rows_keep_infinities_and_older_nulls_read_as_nan():
    from raydpfl.simulation.server import _encode_nonfinite, _restore_nans

    row = {"round": 1, "epsilon_max": math.inf, "low": -math.inf, "test_loss": math.nan}
    back = _restore_nans(json.loads(json.dumps(_encode_nonfinite(row))))
    assert back["round"] == 1 and back["epsilon_max"] == math.inf and back["low"] == -math.inf
    assert math.isnan(back["test_loss"])
    assert math.isnan(_restore_nans({"test_loss": None})["test_loss"])  # older checkpoints
