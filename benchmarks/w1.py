"""W1 benchmark, kept under its old name: ``workloads.py --workload w1``.

    python benchmarks/w1.py [--rounds R] [--threads T] [--repeats K] [--runners ...]

takes every option of `workloads.py` (see there and README.md) and runs W1 only.
"""

import sys

from workloads import main

if __name__ == "__main__":
    main(["--workload", "w1", *sys.argv[1:]])
