"""`raydpfl tune` refuses, before Ray Tune starts and in one line (exit 2), what `raydpfl
run` refuses: a bad config, missing data, a plug-in that cannot be imported, a trial the
cluster cannot fit; and its resume never unpickles anything from the sweep directory."""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import pytest
import yaml

from raydpfl.cli.main import main
from raydpfl.config import ConfigError
from raydpfl.tune.spec import parse_sweep
from raydpfl.tune.state import STATE_FILE, TRIAL_KEY, SweepState, plan_trials
from raydpfl.tune.sweep import check_trial_resources, load_sweep_file

BASE = {
    "experiment": {
        "name": "preflight",
        "data": {"dataset": "digits", "num_clients": 6, "partition": {"kind": "iid"}},
        "model": {"name": "logreg"},
        "algorithm": {"name": "dp_fedavg", "rounds": 2, "clients_per_round": 3},
        "privacy": {"epsilon": 50.0, "delta": 1e-3, "noise_multiplier": 1.0, "sampling_rate": 0.2},
    },
    "runtime": {"backend": "local"},
    "tune": {"space": {"algorithm.lr": {"grid": [0.1, 0.5]}}},
}


def _sweep_file(tmp_path: Path, **changes) -> Path:
    raw = json.loads(json.dumps(BASE))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = raw
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _one_line_exit_2(capsys, argv: list[str]) -> str:
    import ray

    # Refused before any Ray work: ray.init is never called (another test of the session
    # may have left Ray running, so "not initialised" would prove nothing).
    calls: list[object] = []
    real_init = ray.init

    def counting_init(*args, **kwargs):
        calls.append(args)
        return real_init(*args, **kwargs)

    ray.init = counting_init
    try:
        code = main(argv)
    finally:
        ray.init = real_init
    # Lines Ray's log monitor forwards from an earlier test's actors ("(RayClientWorker
    # pid=...) ...") may land here when the session shares one Ray instance: not ours.
    lines = capsys.readouterr().err.splitlines(keepends=True)
    err = "".join(x for x in lines if not re.match(r"(\x1b\[\d+m)?\(\w+ pid=\d+", x))
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("raydpfl: error: "), err
    assert not calls, "ray.init was called before the refusal"
    return err


def test_missing_dataset_files_are_refused_before_ray_and_leave_no_directory(tmp_path, capsys):
    empty = tmp_path / "no-data"  # (MNIST: the one system folder searched is Fashion-MNIST's)
    empty.mkdir()
    path = _sweep_file(
        tmp_path, experiment__data__dataset="mnist", experiment__data__root=str(empty)
    )
    out = tmp_path / "out"

    err = _one_line_exit_2(capsys, ["tune", str(path), "--out", str(out)])

    assert "mnist: files not found" in err and "raydpfl data download mnist" in err
    assert not out.exists()


def test_a_swept_value_whose_data_is_missing_is_refused_too(tmp_path, capsys):
    empty = tmp_path / "no-data"
    empty.mkdir()
    path = _sweep_file(
        tmp_path,
        experiment__data__root=str(empty),
        tune__space={"data.dataset": {"choice": ["digits", "mnist"]}},
    )

    err = _one_line_exit_2(capsys, ["tune", str(path), "--out", str(tmp_path / "out")])

    assert "mnist" in err


def test_a_plugin_that_cannot_be_imported_is_one_line(tmp_path, capsys):
    path = _sweep_file(tmp_path)

    err = _one_line_exit_2(
        capsys,
        ["tune", str(path), "--plugin", str(tmp_path / "nope.py"), "--out", str(tmp_path / "o")],
    )

    assert "--plugin" in err and "nope.py" in err


def test_an_unknown_algorithm_in_a_sweep_names_the_plugin_option(tmp_path, capsys):
    path = _sweep_file(tmp_path, experiment__algorithm__name="my_own_algorithm")

    err = _one_line_exit_2(capsys, ["tune", str(path), "--out", str(tmp_path / "o")])

    assert "experiment.algorithm.name" in err and "--plugin FILE" in err


def test_a_trial_needing_more_cpus_than_the_cluster_is_refused_naming_both_numbers():
    raw = json.loads(json.dumps(BASE))
    raw["runtime"] = {"backend": "ray", "workers": 8, "cpus_per_worker": 1.0}
    raw["tune"]["server_cpus"] = 0.5
    sweep = parse_sweep(raw)

    with pytest.raises(ConfigError) as e:
        check_trial_resources(sweep, {"CPU": 2.0})

    assert e.value.field == "runtime.cpus_per_worker"
    assert "one trial needs 8.5 CPUs" in str(e.value) and "the Ray cluster has 2" in str(e.value)
    check_trial_resources(sweep, {"CPU": 8.5})  # fits exactly


def test_a_swept_worker_count_is_checked_at_its_largest_value():
    raw = json.loads(json.dumps(BASE))
    raw["runtime"] = {"backend": "ray", "workers": 1, "cpus_per_worker": 0.5}
    raw["tune"]["space"] = {"runtime.workers": {"grid": [1, 2, 6]}}
    sweep = parse_sweep(raw)

    with pytest.raises(ConfigError, match=r"one trial needs 3.25 CPUs"):
        check_trial_resources(sweep, {"CPU": 2.0})


def test_resume_of_a_directory_without_raydpfl_state_is_refused_and_unpickles_nothing(
    tmp_path, capsys
):
    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    sweep_dir = tmp_path / "planted"
    (sweep_dir / "tune" / "sweep").mkdir(parents=True)
    (sweep_dir / "sweep.yaml").write_text(yaml.safe_dump(BASE))
    (sweep_dir / "run.lock").write_text("")
    for name in ("tuner.pkl", "searcher-state-2026.pkl"):
        (sweep_dir / "tune" / "sweep" / name).write_bytes(pickle.dumps(Payload()))

    err = _one_line_exit_2(capsys, ["tune", "--resume", str(sweep_dir)])

    assert STATE_FILE in err and "never loads it" in err
    assert not marker.exists()


def test_random_search_is_planned_up_front_grid_inside_samples_and_seeded():
    raw = json.loads(json.dumps(BASE))
    raw["tune"] = {
        "num_samples": 3,
        "space": {
            "algorithm.lr": {"loguniform": [0.01, 1.0]},
            "privacy.clip_norm": {"grid": [0.5, 1.0]},
            "algorithm.local_steps": {"randint": [1, 2]},
            "algorithm.clients_per_round": {"choice": [2, 3]},
        },
    }
    spec = parse_sweep(raw).spec

    trials = plan_trials(spec, seed=7)

    assert list(trials) == [f"t{i:05d}" for i in range(6)]
    clips = [t["experiment.privacy.clip_norm"] for t in trials.values()]
    assert clips == [0.5, 1.0] * 3  # every grid combination within each sample
    assert all(0.01 <= t["experiment.algorithm.lr"] <= 1.0 for t in trials.values())
    assert {t["experiment.algorithm.local_steps"] for t in trials.values()} <= {1, 2}
    assert plan_trials(spec, seed=7) == trials
    assert plan_trials(spec, seed=8) != trials
    # Both ends of a randint are drawn (20 samples of {1, 2}).
    many = plan_trials(parse_sweep({**raw, "tune": {**raw["tune"], "num_samples": 10}}).spec, 0)
    assert {t["experiment.algorithm.local_steps"] for t in many.values()} == {1, 2}


def test_the_state_file_round_trips_and_matches_recorded_trials_by_parameters(tmp_path):
    state = SweepState(tmp_path / STATE_FILE, ("/abs/my_plugin.py",))
    keys = ("experiment.algorithm.lr",)
    first = state.key_for({"experiment.algorithm.lr": 0.3}, keys)
    second = state.key_for({"experiment.algorithm.lr": 0.3}, keys)  # same values, new trial
    state.set_statuses({first: "TERMINATED", second: "RUNNING"})
    assert state.key_for({TRIAL_KEY: "t00007"}, keys) == "t00007"

    again = SweepState.read(tmp_path)

    assert (first, second) == ("t00000", "t00001")
    assert again.plugins == ("/abs/my_plugin.py",)
    assert again.params == {"t00000": {keys[0]: 0.3}, "t00001": {keys[0]: 0.3}}
    assert again.finished(tmp_path / "trials") == {"t00000"}
    # A resumed adaptive search's suggestions are matched back to the keys in order.
    assert again.key_for({keys[0]: 0.3}, keys) == "t00000"
    assert again.key_for({keys[0]: 0.3}, keys) == "t00001"
    assert again.key_for({keys[0]: 0.9}, keys) == "t00002"


def test_a_broken_state_file_is_one_config_error(tmp_path):
    (tmp_path / STATE_FILE).write_text('{"format": 1, "trials": [{"key": 3}]}')

    with pytest.raises(ConfigError, match=r"^resume: .*sweep_state.json cannot be read"):
        SweepState.read(tmp_path)


def test_plugins_given_to_a_sweep_travel_as_absolute_paths(tmp_path, monkeypatch):
    plugin = tmp_path / "elsewhere" / "my_algos.py"
    plugin.parent.mkdir()
    plugin.write_text("X = 1\n")
    path = _sweep_file(tmp_path)
    monkeypatch.chdir(tmp_path)

    sweep = load_sweep_file(path, plugins=("elsewhere/my_algos.py", "json"))

    assert sweep.plugins == (str(plugin.resolve()), "json")


@pytest.mark.slow  # starts Ray (tens of seconds on 2 cores)
@pytest.mark.ray
def test_a_trial_the_cluster_cannot_fit_exits_2_in_one_line_instead_of_waiting(tmp_path):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    path = _sweep_file(
        tmp_path,
        runtime={
            "backend": "ray",
            "workers": 64,
            "cpus_per_worker": 1.0,
            "aggregation_groups": 64,
        },
    )
    out = tmp_path / "out"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))

    done = subprocess.run(
        [sys.executable, "-m", "raydpfl", "tune", str(path), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=repo,
        timeout=300,
    )

    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1, done.stderr
    assert "runtime.cpus_per_worker: one trial needs 64.25 CPUs" in done.stderr
    assert not out.exists()
