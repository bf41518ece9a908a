"""Callbacks: what they are told, in which order, and what the trackers write."""

from __future__ import annotations

import math
import struct
import sys
import types
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import raydpfl
from raydpfl.callbacks import Callback, MLflowCallback, numeric_metrics
from raydpfl.config.schema import ConfigError
from raydpfl.experiment.build import build_experiment, preflight, run_experiment
from tests.conftest import small_config


class Recorder(Callback):
    def __init__(self):
        self.events = []

    def on_run_start(self, info):
        self.events.append(("start", info))

    def on_round_end(self, row):
        self.events.append(("round", dict(row)))

    def on_run_end(self, summary):
        self.events.append(("end", dict(summary)))

    def close(self):
        self.events.append(("close", None))


def _rows(run_dir: Path) -> list[dict]:
    return pq.read_table(run_dir / "rounds.parquet").to_pylist()


def _same(a, b) -> bool:
    return (isinstance(a, float) and math.isnan(a) and math.isnan(b)) or a == b


def test_a_callback_sees_the_start_every_row_in_order_and_the_summary(tmp_path):
    config = small_config(experiment__algorithm={"rounds": 3, "eval_every": 2})
    recorder = Recorder()
    result = raydpfl.run_simulation(config, run_dir=tmp_path / "run", callbacks=[recorder])

    kinds = [kind for kind, _ in recorder.events]
    assert kinds == ["start", "round", "round", "round", "end", "close"]
    info = recorder.events[0][1]
    assert info.run_dir == tmp_path / "run" and not info.resumed
    assert info.epsilon_unit == "record"
    assert info.config["experiment.privacy.epsilon"] == 50.0
    rows = [payload for kind, payload in recorder.events if kind == "round"]
    written = _rows(tmp_path / "run")
    assert [r["round"] for r in rows] == [1, 2, 3]
    for seen, stored in zip(rows, written, strict=True):
        assert all(_same(v, stored[k]) for k, v in seen.items())
    assert recorder.events[-2][1]["model_sha256"] == result.summary["model_sha256"]


def test_callbacks_never_change_the_results(tmp_path):
    plain = raydpfl.run_simulation(small_config(experiment__algorithm={"rounds": 2}))
    watched = raydpfl.run_simulation(
        small_config(experiment__algorithm={"rounds": 2}, runtime={"callbacks": "tensorboard"}),
        run_dir=tmp_path / "run",
        callbacks=[Recorder()],
    )
    assert watched.summary["model_sha256"] == plain.summary["model_sha256"]


def test_non_evaluated_rounds_leave_the_accuracy_out_rather_than_logging_nan():
    row = {"round": 2, "test_accuracy": float("nan"), "epsilon_max": 1.5, "note": "x", "ok": True}
    assert numeric_metrics(row) == {"epsilon_max": 1.5}


def _tfrecords(path: Path):
    """The records of a TFRecord file: u64 length, u32 crc, data, u32 crc."""
    data = path.read_bytes()
    at = 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        yield data[at + 12 : at + 12 + length]
        at += 12 + length + 4


def _scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboardX.proto import event_pb2

    out: dict[str, dict[int, float]] = {}
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        for record in _tfrecords(path):
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    out.setdefault(value.tag, {})[event.step] = value.simple_value
    return out


def test_tensorboard_writes_every_numeric_column_per_round(tmp_path):
    config = small_config(
        experiment__algorithm={"rounds": 3, "eval_every": 2}, runtime={"callbacks": "tensorboard"}
    )
    raydpfl.run_simulation(config, run_dir=tmp_path / "run")

    scalars = _scalars(tmp_path / "run" / "tensorboard")
    rows = _rows(tmp_path / "run")
    assert set(scalars["epsilon_max"]) == {1, 2, 3}
    for row in rows:
        assert scalars["epsilon_max"][row["round"]] == pytest.approx(row["epsilon_max"], rel=1e-6)
    # evaluated at rounds 2 and 3 only: round 1's NaN is not logged
    assert set(scalars["test_accuracy"]) == {2, 3}
    assert scalars["test_accuracy"][3] == pytest.approx(rows[2]["test_accuracy"], rel=1e-6)


@pytest.mark.parametrize(
    "names,message",
    [
        ("tensorbord", "unknown callback 'tensorbord'; allowed: tensorboard, mlflow, wandb"),
        ("tensorboard,tensorboard", "named twice"),
    ],
)
def test_a_bad_callback_name_is_one_error_naming_the_key_before_any_work(names, message):
    config = small_config(runtime={"callbacks": names})
    with pytest.raises(ConfigError, match="runtime.callbacks") as err:
        preflight(config)
    assert message in str(err.value)
    with pytest.raises(ConfigError, match="runtime.callbacks"):
        raydpfl.run_simulation(config)


def test_a_tracker_that_is_not_installed_says_what_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    with pytest.raises(ConfigError, match="pip install mlflow"):
        preflight(small_config(runtime={"callbacks": "mlflow"}))


class _FakeMlflow:
    """Records what MLflowCallback asks of MLflow's client API (mlflow is not a dependency)."""

    def __init__(self):
        self.calls = []
        client_calls = self.calls

        class Client:
            def __init__(self, tracking_uri=None):
                client_calls.append(("client", tracking_uri))

            def get_experiment_by_name(self, name):
                return None

            def create_experiment(self, name):
                client_calls.append(("experiment", name))
                return "7"

            def create_run(self, experiment_id, run_name=None, tags=None):
                client_calls.append(("run", experiment_id, run_name, dict(tags)))
                return types.SimpleNamespace(info=types.SimpleNamespace(run_id="r1"))

            def log_batch(self, run_id, metrics=(), params=()):
                client_calls.append(("batch", run_id, list(metrics), list(params)))

            def set_tag(self, run_id, key, value):
                client_calls.append(("tag", key, value))

            def set_terminated(self, run_id, status):
                client_calls.append(("terminated", status))

        self.mlflow = types.ModuleType("mlflow")
        tracking = types.ModuleType("mlflow.tracking")
        tracking.MlflowClient = Client
        entities = types.ModuleType("mlflow.entities")
        entities.Param = lambda k, v: ("param", k, v)
        entities.Metric = lambda k, v, ts, step: ("metric", k, v, step)
        self.mlflow.tracking, self.mlflow.entities = tracking, entities
        self.modules = {
            "mlflow": self.mlflow,
            "mlflow.tracking": tracking,
            "mlflow.entities": entities,
        }


def test_mlflow_gets_the_config_in_batches_and_metrics_per_round(tmp_path, monkeypatch):
    fake = _FakeMlflow()
    for name, module in fake.modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    config = small_config(experiment__algorithm={"rounds": 2})
    run_experiment(build_experiment(config), None, callbacks=[MLflowCallback()])

    batches = [c for c in fake.calls if c[0] == "batch"]
    params = [p for b in batches for p in b[3]]
    assert all(len(b[3]) <= MLflowCallback.PARAMS_PER_BATCH for b in batches)
    assert ("param", "experiment.privacy.epsilon", "50.0") in params
    metrics = [m for b in batches for m in b[2]]
    assert {m[3] for m in metrics if m[1] == "epsilon_max"} == {1, 2}
    assert ("experiment", "test") in fake.calls
    assert fake.calls[-1] == ("terminated", "FINISHED")


def test_a_run_that_fails_ends_its_mlflow_run_as_killed(monkeypatch):
    fake = _FakeMlflow()
    for name, module in fake.modules.items():
        monkeypatch.setitem(sys.modules, name, module)

    def boom(row):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(
            build_experiment(small_config()), None, on_round=boom, callbacks=[MLflowCallback()]
        )
    assert fake.calls[-1] == ("terminated", "KILLED")


@pytest.mark.ray
def test_a_ray_run_tells_callbacks_the_same_rows(tmp_path):
    config = small_config(
        experiment__algorithm={"rounds": 2}, runtime={"backend": "ray", "workers": 2}
    )
    recorder = Recorder()
    raydpfl.run_simulation(config, run_dir=tmp_path / "run", callbacks=[recorder])
    rows = [payload for kind, payload in recorder.events if kind == "round"]
    assert [r["round"] for r in rows] == [1, 2]
    for seen, stored in zip(rows, _rows(tmp_path / "run"), strict=True):
        assert all(_same(v, stored[k]) for k, v in seen.items())


def test_a_client_level_run_tells_callbacks_its_unit():
    config = small_config(
        experiment__algorithm={"name": "dp_fedavg_client", "rounds": 1, "clients_per_round": 4},
        experiment__privacy={"epsilon": 50.0, "delta": 1e-3},
    )
    recorder = Recorder()
    raydpfl.run_simulation(config, callbacks=[recorder])
    assert recorder.events[0][1].epsilon_unit == "client"
