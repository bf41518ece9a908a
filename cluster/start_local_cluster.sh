#!/usr/bin/env bash
# Starts a two-node Ray cluster on this machine, over loopback: a head node and one
# worker node, each its own raylet with its own CPUs and object store. It is for testing
# multi-node runs (actors on two nodes, objects crossing between two object stores)
# without a second machine. Stop it with cluster/stop_local_cluster.sh (same --dir).
#
#   cluster/start_local_cluster.sh [--port 26379] [--dir /tmp/raydpfl-lc-26379]
#                                  [--head-cpus 1] [--worker-cpus 1] [--object-store-mb 256]
#
# Then run a driver on it (RAY_AUTH_MODE=token: see "Token authentication" below):
#   RAY_AUTH_MODE=token raydpfl run configs/quickstart.yaml \
#     --set runtime.address=127.0.0.1:26379
# or, in a subshell (RAY_ADDRESS makes every Ray driver of a shell join this cluster):
#   (source /tmp/raydpfl-lc-26379/cluster.env && raydpfl run CONFIG --set runtime.address=auto)
#
# Safe to run twice: a cluster that is already up is reported, not started again. It
# leaves other Ray instances on the machine alone: its own ports (PORT, PORT+1, random
# ones for the rest), its own temp dir, and every process it starts lives in one of two
# sessions (setsid) recorded in DIR/cluster.state, which is what the stop script stops --
# never `ray stop`, which would stop every Ray on the host.
#
# Token authentication: `ray start --head` turns it on when RAY_AUTH_MODE=token or when a
# token file exists, but a worker node, and a driver given an address (argument or
# RAY_ADDRESS), only use it with RAY_AUTH_MODE=token. So this script exports
# RAY_AUTH_MODE=token (unless you set RAY_AUTH_MODE yourself) and, if no token exists
# (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token), creates ~/.ray/auth_token
# as `ray.init()` would.
#
# Environment defaults: RAYDPFL_CLUSTER_PORT, RAYDPFL_CLUSTER_DIR, RAYDPFL_HEAD_CPUS,
# RAYDPFL_WORKER_CPUS, RAYDPFL_OBJECT_STORE_MB, RAYDPFL_CLUSTER_TIMEOUT_S (default 90).
set -euo pipefail

die() {
    echo "start_local_cluster: error: $*" >&2
    exit 1
}

PORT="${RAYDPFL_CLUSTER_PORT:-26379}"
DIR=""
HEAD_CPUS="${RAYDPFL_HEAD_CPUS:-1}"
WORKER_CPUS="${RAYDPFL_WORKER_CPUS:-1}"
OBJECT_STORE_MB="${RAYDPFL_OBJECT_STORE_MB:-256}"
TIMEOUT_S="${RAYDPFL_CLUSTER_TIMEOUT_S:-90}"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --port) PORT="${2:?--port needs a value}"; shift 2 ;;
        --dir) DIR="${2:?--dir needs a value}"; shift 2 ;;
        --head-cpus) HEAD_CPUS="${2:?--head-cpus needs a value}"; shift 2 ;;
        --worker-cpus) WORKER_CPUS="${2:?--worker-cpus needs a value}"; shift 2 ;;
        --object-store-mb) OBJECT_STORE_MB="${2:?--object-store-mb needs a value}"; shift 2 ;;
        -h | --help)
            awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
            exit 0
            ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
DIR="${DIR:-${RAYDPFL_CLUSTER_DIR:-/tmp/raydpfl-lc-$PORT}}"

for v in PORT HEAD_CPUS WORKER_CPUS OBJECT_STORE_MB TIMEOUT_S; do
    [[ "${!v}" =~ ^[0-9]+$ ]] || die "$v must be a whole number, got '${!v}'"
done
((PORT >= 1024 && PORT <= 65533)) || die "--port must be in 1024..65533 (PORT+1 is used too)"
((HEAD_CPUS >= 1 && WORKER_CPUS >= 1)) || die "each node needs at least 1 CPU"
((OBJECT_STORE_MB >= 80)) || die "--object-store-mb must be >= 80 (Ray's minimum is 75 MiB)"
[[ "$DIR" == /* ]] || die "--dir must be an absolute path, got '$DIR'"
# Unix socket paths (DIR/session_<date>_<pid>/sockets/...) must stay under 108 bytes.
((${#DIR} <= 48)) || die "--dir '$DIR' is too long for Ray's socket paths (48 chars at most)"
command -v ray >/dev/null || die "the 'ray' command is not on PATH (pip install 'ray[default]')"
command -v setsid >/dev/null || die "'setsid' (util-linux) is needed to track the nodes"

ADDRESS="127.0.0.1:$PORT"
CLIENT_PORT=$((PORT + 1))
STATE="$DIR/cluster.state"

# Live processes of a recorded session id, one pid a line (empty if none is left).
session_pids() {
    ps -eo pid=,sid=,stat= | awk -v s="$1" '$2 == s && $3 !~ /^Z/ { print $1 }'
}

node_alive() {
    [[ -n "$1" && -n "$(session_pids "$1")" ]]
}

# The state file is parsed, never sourced: only numbers and an address are read.
state_value() {
    sed -n "s/^$1=\([0-9.:]*\)\$/\1/p" "$STATE"
}

if [[ -f "$STATE" ]]; then
    if node_alive "$(state_value HEAD_SID)" && node_alive "$(state_value WORKER_SID)"; then
        echo "start_local_cluster: already running at $(state_value ADDRESS) (state in $DIR)"
        cat "$DIR/cluster.env" 2>/dev/null || true
        exit 0
    fi
    echo "start_local_cluster: stale state in $DIR; stopping what is left of it" >&2
    "$(dirname "$0")/stop_local_cluster.sh" --dir "$DIR" >&2
fi

# Refuse ports somebody else holds, with a clear message instead of a failure deep in Ray.
for p in "$PORT" "$CLIENT_PORT"; do
    python3 -c 'import socket, sys; socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' \
        "$p" 2>/dev/null || die "port $p on 127.0.0.1 is in use; pick another --port"
done

# Token authentication (see the header).
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
if [[ "$RAY_AUTH_MODE" == "token" && -z "${RAY_AUTH_TOKEN:-}" ]]; then
    if [[ -n "${RAY_AUTH_TOKEN_PATH:-}" ]]; then
        [[ -s "$RAY_AUTH_TOKEN_PATH" ]] ||
            die "RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH is empty or missing"
    elif [[ ! -s "$HOME/.ray/auth_token" ]]; then
        ray get-auth-token --generate >/dev/null
    fi
fi
export RAY_USAGE_STATS_ENABLED=0

mkdir -p "$DIR"
chmod 700 "$DIR"

# Flags both nodes share: loopback, our temp dir, a small object store, and random ports
# for everything not named here (two raylets on one host cannot both take the fixed
# defaults, e.g. the dashboard agent's 52365).
COMMON=(
    --node-ip-address=127.0.0.1
    --temp-dir="$DIR"
    --object-store-memory=$((OBJECT_STORE_MB * 1024 * 1024))
    --dashboard-agent-listen-port=0
    --min-worker-port=0 --max-worker-port=0
    --disable-usage-stats
    --log-style=record
)
# The Ray Client server (ray://) only exists with ray[client]; it then gets PORT+1, not
# its default 10001 that another Ray on the host may hold.
CLIENT_FLAG=()
if python3 -c 'from ray._private.utils import get_ray_client_dependency_error as e
raise SystemExit(e() is not None)' 2>/dev/null; then
    CLIENT_FLAG=(--ray-client-server-port="$CLIENT_PORT")
fi

HEAD_SID="" WORKER_SID=""
write_state() {
    printf 'HEAD_SID=%s\nWORKER_SID=%s\nADDRESS=%s\n' "$HEAD_SID" "$WORKER_SID" "$ADDRESS" \
        >"$STATE.tmp"
    mv "$STATE.tmp" "$STATE"
}

# Runs `ray start ARGS...` in a new session: the daemons it leaves behind keep that
# session id (the pid of `ray start`), which is how the stop script finds every one of
# them. The id is recorded before `ray start` returns, so a start killed half-way can
# still be stopped.
LAUNCHED_SID=""
launch_node() {
    local log="$1"
    shift
    setsid ray start "$@" >"$log" 2>&1 &
    LAUNCHED_SID=$!
}

wait_node() {
    local sid="$1" log="$2"
    if ! wait "$sid"; then
        echo "start_local_cluster: 'ray start' failed; the end of $log:" >&2
        tail -n 20 "$log" >&2
        return 1
    fi
}

on_failure() {
    trap - ERR INT TERM
    echo "start_local_cluster: start failed; stopping the nodes already started" >&2
    "$(dirname "$0")/stop_local_cluster.sh" --dir "$DIR" --keep-logs >&2 || true
    exit 1
}
trap on_failure ERR INT TERM

launch_node "$DIR/head-start.log" --head --port="$PORT" "${CLIENT_FLAG[@]}" \
    --include-dashboard=false --num-cpus="$HEAD_CPUS" --num-gpus=0 \
    --resources='{"raydpfl_loopback_head": 1}' "${COMMON[@]}"
HEAD_SID=$LAUNCHED_SID
write_state
wait_node "$HEAD_SID" "$DIR/head-start.log"

# One log monitor per host is enough: the head's.
launch_node "$DIR/worker-start.log" --address="$ADDRESS" --num-cpus="$WORKER_CPUS" \
    --num-gpus=0 --resources='{"raydpfl_loopback_worker": 1}' --include-log-monitor=false \
    "${COMMON[@]}"
WORKER_SID=$LAUNCHED_SID
write_state
wait_node "$WORKER_SID" "$DIR/worker-start.log"

# `ray start` may return before the worker node has registered: wait until the GCS lists
# both nodes alive.
python3 - "$ADDRESS" "$TIMEOUT_S" <<'PY'
import sys
import time

import ray

address, timeout = sys.argv[1], float(sys.argv[2])
deadline = time.monotonic() + timeout
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
try:
    while len(alive := [n for n in ray.nodes() if n["Alive"]]) < 2:
        if time.monotonic() > deadline:
            sys.exit(f"only {len(alive)} of 2 nodes came up within {timeout:g} s")
        time.sleep(0.5)
finally:
    ray.shutdown()
PY
trap - ERR INT TERM

cat >"$DIR/cluster.env" <<ENV
export RAY_ADDRESS=$ADDRESS
export RAY_AUTH_MODE=$RAY_AUTH_MODE
ENV

cat <<MSG
start_local_cluster: head + 1 worker node up at $ADDRESS (CPUs: head $HEAD_CPUS, worker $WORKER_CPUS; state in $DIR)
Run on it (a driver given an address needs RAY_AUTH_MODE=$RAY_AUTH_MODE):
  RAY_AUTH_MODE=$RAY_AUTH_MODE raydpfl run CONFIG --set runtime.address=$ADDRESS
or, in a subshell (RAY_ADDRESS makes every Ray driver of a shell join this cluster):
  (source $DIR/cluster.env && raydpfl run CONFIG --set runtime.address=auto)
Stop it with:
  $(dirname "$0")/stop_local_cluster.sh --dir $DIR
MSG
