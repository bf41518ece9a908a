"""Multi-node runs for real, on two Ray nodes of this machine (loopback), and the
cluster configs of cluster/ (parsed and checked, never run).

The cluster is started by cluster/start_local_cluster.sh on free ports with its own temp
dir, so it never meets another Ray instance on the machine, and stopped by
cluster/stop_local_cluster.sh whatever happens. The driver runs in a subprocess: this
process may already hold a local Ray session (tests/backends/conftest.py), and a driver
can only belong to one cluster.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from raydpfl.experiment.build import build_experiment, run_experiment
from tests.conftest import small_config

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "cluster"

# Runs the experiment on the cluster through the package's own path (run_experiment ->
# run_on_ray -> connect(address)), and records where the worker actors were placed by
# wrapping start_server (the server actor's public `placements()`).
_DRIVER = """
import json, sys

import ray

from raydpfl.backends.ray import runner
from raydpfl.experiment.build import build_experiment, run_experiment
from tests.conftest import small_config

placements, driver_node, nodes = [], [], []
start_server = runner.start_server


def recording_start_server(*args, **kwargs):
    host, dataset_ref = start_server(*args, **kwargs)
    placements.extend(ray.get(host.placements.remote()))
    driver_node.append(ray.get_runtime_context().get_node_id())
    nodes.extend(
        {"id": n["NodeID"], "head": "raydpfl_loopback_head" in n["Resources"]}
        for n in ray.nodes()
        if n["Alive"]
    )
    return host, dataset_ref


runner.start_server = recording_start_server
summary = run_experiment(build_experiment(small_config(runtime=json.loads(sys.argv[1]))), None)
print("RESULT " + json.dumps({
    "placements": placements,
    "driver_node": driver_node[0],
    "nodes": nodes,
    "model_sha256": summary["model_sha256"],
    "ledger_sha256": summary["ledger_sha256"],
}))
"""


@dataclass(frozen=True)
class LoopbackCluster:
    address: str
    env: dict[str, str]  # what a driver needs: RAY_ADDRESS, RAY_AUTH_MODE, PYTHONPATH


def _free_port_pair() -> int:
    """A port p with p and p+1 free on loopback, below the ephemeral range."""
    for _ in range(200):
        port = random.randrange(20000, 32000)
        try:
            for p in (port, port + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair found")


def _env_file(path: Path) -> dict[str, str]:
    """`export KEY=VALUE` lines of the cluster.env the start script writes."""
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        out[key.strip()] = value.strip()
    return out


@pytest.fixture
def loopback_cluster():
    if shutil.which("ray") is None or shutil.which("setsid") is None:
        pytest.skip("needs the `ray` CLI and setsid")
    port = _free_port_pair()
    # Short: Ray's unix socket paths live under this directory.
    state_dir = Path(tempfile.mkdtemp(prefix="rdl-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # raydpfl may not be installed: the nodes' workers import it from the checkout.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    args = ["--port", str(port), "--dir", str(state_dir)]
    try:
        started = subprocess.run(
            [str(CLUSTER / "start_local_cluster.sh"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
        )
        if started.returncode != 0:
            pytest.fail(f"the loopback cluster did not start:\n{started.stdout}\n{started.stderr}")
        cluster_env = _env_file(state_dir / "cluster.env")
        yield LoopbackCluster(cluster_env["RAY_ADDRESS"], {**env, **cluster_env})
    finally:
        stopped = subprocess.run(
            [str(CLUSTER / "stop_local_cluster.sh"), "--dir", str(state_dir)],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        shutil.rmtree(state_dir, ignore_errors=True)
        assert stopped.returncode == 0, f"stop failed:\n{stopped.stdout}\n{stopped.stderr}"


@pytest.mark.ray
def test_a_run_on_two_nodes_uses_both_and_equals_the_local_backend(loopback_cluster):
    # One CPU per node and two 1-CPU workers: one worker must land on each node. The
    # server actor reserves no CPU and is pinned to the driver's node (the head).
    runtime = {
        "backend": "ray",
        "address": loopback_cluster.address,
        "workers": 2,
        "cpus_per_worker": 1,
        "aggregation_groups": 4,
        "progress": False,
    }
    driver = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps(runtime)],
        cwd=REPO,
        env=loopback_cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert driver.returncode == 0, driver.stderr[-3000:]
    remote = json.loads(
        next(x for x in driver.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT ") :]
    )
    local = run_experiment(
        build_experiment(small_config(runtime={**runtime, "backend": "local", "address": None})),
        None,
    )

    nodes = {n["id"]: n["head"] for n in remote["nodes"]}
    assert len(nodes) == 2 and sorted(nodes.values()) == [False, True]
    worker_nodes = [p["node_id"] for p in remote["placements"]]
    assert sorted(worker_nodes) == sorted(nodes), "one worker on each node"
    assert nodes[remote["driver_node"]] is True, "the driver (and server actor) on the head"
    assert remote["model_sha256"] == local["model_sha256"]
    assert remote["ledger_sha256"] == local["ledger_sha256"]


# ---- cluster configs (no Ray cluster needed) ------------------------------------------


def _load(name: str) -> dict:
    with open(CLUSTER / name) as f:
        return yaml.safe_load(f)


def test_the_cluster_launcher_config_is_valid_for_rays_launcher():
    ray = pytest.importorskip("ray")
    jsonschema = pytest.importorskip("jsonschema")
    config = _load("cluster-launcher.yaml")

    # The schema `ray up` validates against, shipped with Ray.
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)
    types = config["available_node_types"]
    assert config["provider"]["type"] == "aws"
    assert config["head_node_type"] in types
    head = types[config["head_node_type"]]
    gpu_types = [t for t in types.values() if t["resources"].get("GPU", 0) >= 1]
    assert gpu_types and all(t is not head for t in gpu_types)
    assert any("raydpfl" in c for c in config["setup_commands"])
    assert any("ray start --head" in c for c in config["head_start_ray_commands"])
    assert any("$RAY_HEAD_IP" in c for c in config["worker_start_ray_commands"])
    assert all(
        "RAY_AUTH_MODE=token" in c
        for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"]
        if "ray start" in c
    )


def _check_raycluster_spec(spec: dict) -> None:
    assert spec["rayVersion"].startswith("2.")
    assert spec["authOptions"]["mode"] == "token"
    head = spec["headGroupSpec"]
    assert all(isinstance(v, str) for v in head["rayStartParams"].values())
    assert head["template"]["spec"]["containers"][0]["image"]
    (gpu,) = spec["workerGroupSpecs"]
    assert gpu["groupName"] and gpu["minReplicas"] <= gpu["replicas"] <= gpu["maxReplicas"]
    container = gpu["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert container["image"] == head["template"]["spec"]["containers"][0]["image"]


def test_the_kuberay_raycluster_has_a_head_and_a_gpu_worker_group():
    manifest = _load("kuberay-raycluster.yaml")

    assert manifest["apiVersion"] == "ray.io/v1"
    assert manifest["kind"] == "RayCluster"
    assert manifest["metadata"]["name"]
    _check_raycluster_spec(manifest["spec"])


def test_the_kuberay_rayjob_runs_raydpfl_on_the_cluster_it_creates():
    manifest = _load("kuberay-rayjob.yaml")

    assert manifest["apiVersion"] == "ray.io/v1"
    assert manifest["kind"] == "RayJob"
    spec = manifest["spec"]
    assert "raydpfl run " in spec["entrypoint"]
    assert "--set runtime.address=auto" in spec["entrypoint"]
    assert spec["shutdownAfterJobFinishes"] is True
    _check_raycluster_spec(spec["rayClusterSpec"])


def test_the_configs_the_cluster_files_name_exist():
    for name in ("kuberay-raycluster.yaml", "kuberay-rayjob.yaml", "cluster-launcher.yaml"):
        text = (CLUSTER / name).read_text()
        for word in text.split():
            if word.startswith(("configs/", "/home/ray/raydpfl/configs/", "~/raydpfl/configs/")):
                assert (REPO / "configs" / word.split("configs/", 1)[1]).is_file(), word
