"""A locally started Ray instance listens on the loopback interface only.

Ray 2.60 binds every gRPC server of a node (GCS, raylet, object manager, each worker, the
driver) and the runtime-env agent to the *node's* IP address. For a single-machine run
that address is needlessly reachable from the network: `ray.init` picks the host's
outward address, and it even rewrites ``_node_ip_address="127.0.0.1"`` to that address
(`ray._private.services.resolve_ip_for_localhost`) unless Ray's "cluster mode" is off,
which is how Ray itself runs on macOS and Windows (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``,
read once into ``ray._private.ray_constants.ENABLE_RAY_CLUSTER``). `loopback_only` turns
that mode off while `ray.init` starts the node, so the node's address, and with it every
listener, is 127.0.0.1 (checked with psutil in tests/backends/test_ray_loopback.py).

What it cannot reach: with ``ray[default]`` installed, the dashboard agent's metrics
exporter binds every IPv4 interface whatever the node address (no setting in Ray 2.60);
this project's dependencies do not install it. Ray's token authentication stays on.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

log = logging.getLogger(__name__)

#: The node address of a locally started instance.
LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """While active, Ray resolves this node's address to loopback (cluster mode off).

    Restored afterwards: once the node exists, Ray reads its address from the node, and a
    later `ray.init` that joins a cluster must see Ray's own setting. If a future Ray
    drops the constant, the instance starts as before (on the host's address) with a
    warning rather than failing.
    """
    from ray._private import ray_constants

    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        log.warning(
            "raydpfl: this Ray has no ENABLE_RAY_CLUSTER; "
            "the local instance may listen on the network"
        )
        yield
        return
    previous = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = previous
