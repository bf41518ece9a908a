"""A Ray instance that raydpfl starts itself listens on loopback only (`connect(None)`).

The instance runs in a child process (the session's shared Ray instance, if any, is not
touched): it starts Ray through `connect`, brings up an actor (so worker processes with
their own gRPC servers exist), then lists every inet socket of the Ray processes it owns
(itself, the node's processes and their descendants) with psutil.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

CHILD = r"""
import json, os, time
from raydpfl.backends.ray.runner import connect, disconnect
import ray, psutil

connect(None)

@ray.remote(num_cpus=0)
class Probe:
    def pid(self):
        return os.getpid()

probe = Probe.remote()
ray.get(probe.pid.remote())
time.sleep(1.0)  # agents finish binding
node = ray._private.worker._global_node
pids = {os.getpid()}
for infos in node.all_processes.values():
    for info in infos:
        root = psutil.Process(info.process.pid)
        pids |= {root.pid, *(c.pid for c in root.children(recursive=True))}
sockets = []
for conn in psutil.net_connections(kind="inet"):
    if conn.pid in pids and conn.laddr and (conn.status == "LISTEN" or not conn.raddr):
        name = psutil.Process(conn.pid).name()
        sockets.append([name, conn.laddr.ip, conn.laddr.port, conn.status])
print(json.dumps({"node_ip": node.node_ip_address, "sockets": sockets}), flush=True)
disconnect()
"""


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)  # ::ffff:127.0.0.1 on a dual-stack socket
    return (mapped or addr).is_loopback


def test_a_locally_started_instance_listens_on_loopback_only():
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        check=True,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])

    assert report["node_ip"] == "127.0.0.1"
    names = {name for name, *_ in report["sockets"]}
    assert {"gcs_server", "raylet"} <= names  # the check saw Ray's servers
    exposed = [s for s in report["sockets"] if not _loopback(s[1])]
    assert exposed == [], f"listening beyond loopback: {exposed}"
