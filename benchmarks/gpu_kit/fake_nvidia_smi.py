#!/usr/bin/env python3
"""A stand-in for ``nvidia-smi --query-gpu=utilization.gpu,memory.used
--format=csv,noheader,nounits --loop-ms=N`` on a machine without a GPU (the CPU rehearsal of
benchmarks/gpu_ray.py): every N ms it prints "<busy %>, <MiB>" where busy is the share of
the machine's CPU time that was not idle since the last line (/proc/stat) and MiB the
memory in use (/proc/meminfo). Not a GPU figure: it only exercises the sampling path."""

import sys
import time


def cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values), idle


def used_mib() -> float:
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0])
    return (info["MemTotal"] - info.get("MemAvailable", info["MemFree"])) / 1024


def main(argv: list[str]) -> int:
    ms = 1000
    for arg in argv:
        if arg.startswith("--loop-ms="):
            ms = int(arg.split("=", 1)[1])
        elif arg in ("-L", "--list-gpus"):
            print("GPU 0: Fake GPU (CPU rehearsal)")
            return 0
    total, idle = cpu_times()
    while True:
        time.sleep(ms / 1000)
        t, i = cpu_times()
        busy = 100.0 * (1 - (i - idle) / max(t - total, 1))
        total, idle = t, i
        print(f"{busy:.0f}, {used_mib():.0f}", flush=True)


if __name__ == "__main__":
    try:
        raise SystemExit(main(sys.argv[1:]))
    except (KeyboardInterrupt, BrokenPipeError):
        raise SystemExit(0) from None
