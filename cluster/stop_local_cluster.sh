#!/usr/bin/env bash
# Stops the loopback cluster started by cluster/start_local_cluster.sh, and only it:
# the processes of the two sessions recorded in DIR/cluster.state get SIGTERM (raylets,
# then the GCS, then the rest), and SIGKILL what is left after a grace period. Other Ray
# instances on the machine are left alone (this script never runs `ray stop`, which stops
# every Ray on the host). Then DIR is removed, unless --keep-logs.
#
#   cluster/stop_local_cluster.sh [--port 26379] [--dir /tmp/raydpfl-lc-26379] [--keep-logs]
#
# Safe to run twice, or when nothing is running.
set -euo pipefail

die() {
    echo "stop_local_cluster: error: $*" >&2
    exit 1
}

PORT="${RAYDPFL_CLUSTER_PORT:-26379}"
DIR=""
KEEP_LOGS=0
GRACE_S="${RAYDPFL_CLUSTER_GRACE_S:-10}"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --port) PORT="${2:?--port needs a value}"; shift 2 ;;
        --dir) DIR="${2:?--dir needs a value}"; shift 2 ;;
        --keep-logs) KEEP_LOGS=1; shift ;;
        -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
DIR="${DIR:-${RAYDPFL_CLUSTER_DIR:-/tmp/raydpfl-lc-$PORT}}"
STATE="$DIR/cluster.state"

if [[ ! -f "$STATE" ]]; then
    echo "stop_local_cluster: no cluster state in $DIR; nothing to stop"
    exit 0
fi

[[ "$GRACE_S" =~ ^[0-9]+$ ]] || die "RAYDPFL_CLUSTER_GRACE_S must be a whole number"
# The state file is parsed, not sourced: only numbers and an address are taken from it.
HEAD_SID=$(sed -n 's/^HEAD_SID=\([0-9]*\)$/\1/p' "$STATE")
WORKER_SID=$(sed -n 's/^WORKER_SID=\([0-9]*\)$/\1/p' "$STATE")
ADDRESS=$(sed -n 's/^ADDRESS=\([0-9.:]*\)$/\1/p' "$STATE")

MY_SID=$(ps -o sid= -p $$ | tr -d ' ')

# Live pids of the recorded sessions (zombies, already dead, are left to their parent
# to reap), never our own shell's; with a process name, only the processes of that name.
# A session id that cannot be one the start script made (init's, ours) is ignored.
our_pids() {
    local name="$1" sid
    shift
    for sid in "$@"; do
        [[ "$sid" =~ ^[0-9]+$ ]] && ((sid > 1)) && [[ "$sid" != "$MY_SID" ]] || continue
        ps -eo pid=,sid=,stat=,comm= | awk -v s="$sid" -v me="$$" -v name="$name" \
            '$2 == s && $1 != me && $3 !~ /^Z/ && (name == "" || $4 == name) { print $1 }'
    done
}

# SIGTERM to the named processes of the sessions; waits up to $1 seconds for them to go.
term_and_wait() {
    local grace="$1" name="$2" pids i
    shift 2
    pids=$(our_pids "$name" "$@")
    [[ -z "$pids" ]] && return 0
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for ((i = 0; i < grace * 10; i++)); do
        [[ -z "$(our_pids "$name" "$@")" ]] && return 0
        sleep 0.1
    done
}

# Order matters: a raylet leaves at once while the GCS is up (and takes its workers and
# agents along), but waits ~10 s for a GCS that is gone; the GCS then leaves at once;
# what is left (autoscaler monitor, log monitor, headless dashboard) gets a short grace.
term_and_wait "$GRACE_S" raylet "$WORKER_SID"
term_and_wait "$GRACE_S" raylet "$HEAD_SID"
term_and_wait "$GRACE_S" gcs_server "$HEAD_SID"
term_and_wait 2 "" "$HEAD_SID" "$WORKER_SID"

left=$(our_pids "" "$HEAD_SID" "$WORKER_SID")
if [[ -n "$left" ]]; then
    # The autoscaler monitor typically lingers after its GCS is gone.
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        [[ -z "$(our_pids "" "$HEAD_SID" "$WORKER_SID")" ]] && break
        sleep 0.1
    done
fi
left=$(our_pids "" "$HEAD_SID" "$WORKER_SID")
# shellcheck disable=SC2086
[[ -z "$left" ]] || die "processes still alive after SIGKILL: $(echo $left)"

if ((KEEP_LOGS)); then
    rm -f "$STATE" "$DIR/cluster.env"
    echo "stop_local_cluster: stopped the cluster at ${ADDRESS:-?}; logs kept in $DIR"
else
    rm -rf -- "$DIR"
    echo "stop_local_cluster: stopped the cluster at ${ADDRESS:-?} and removed $DIR"
fi
