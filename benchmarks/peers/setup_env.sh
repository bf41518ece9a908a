#!/usr/bin/env bash
# Creates the isolated virtual environment for the Flower+Opacus peer benchmark.
#
# Flower's simulation engine pins its own Ray version; it must never touch the project's
# Ray in the main environment, so everything goes into a separate venv outside the repo:
#   ${RAYDPFL_PEERS_VENV:-$HOME/.cache/raydpfl/peers-venv}
# torch is installed first, from the local CPU wheel in /opt/wheels, and pinned for every
# later install so nothing can upgrade it (an unpinned torch pulls GBs of CUDA packages).
# torchvision is not installed (the wheel here is a CUDA build that breaks on CPU torch).
#
# Usage: bash benchmarks/peers/setup_env.sh
set -euo pipefail

VENV="${RAYDPFL_PEERS_VENV:-$HOME/.cache/raydpfl/peers-venv}"
WHEELS="${RAYDPFL_WHEELS:-/opt/wheels}"
TORCH_VERSION="2.13.0+cpu"
# The versions the figures in README.md were measured with; override to try others.
FLWR_VERSION="${FLWR_VERSION:-1.41.0}"
OPACUS_VERSION="${OPACUS_VERSION:-1.6.0}"
PY="${PYTHON:-python}"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
case "$(realpath -m "$VENV")/" in
  "$REPO"/*) echo "refusing to create the venv inside the repository: $VENV" >&2; exit 1 ;;
esac

mkdir -p "$(dirname "$VENV")"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m uv venv "$VENV" --python 3.11
fi
VPY="$VENV/bin/python"

# Keep torch at the local CPU build for every install below.
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"

# 1. torch: the local CPU wheel (the "+cpu" local version exists only in $WHEELS); its
#    small pure-Python deps (filelock, sympy, ...) come from the package index.
"$PY" -m uv pip install --python "$VPY" --find-links "$WHEELS" "torch==$TORCH_VERSION"

# 2. Flower with its simulation extra (brings its own pinned Ray), Opacus, numpy.
"$PY" -m uv pip install --python "$VPY" --find-links "$WHEELS" \
  --constraint "$CONSTRAINTS" "flwr[simulation]==$FLWR_VERSION" "opacus==$OPACUS_VERSION" numpy

# 3. Check: torch is still the CPU build, torchvision absent, everything imports.
"$VPY" - <<'PY'
import importlib.util

import flwr
import opacus
import ray
import torch

assert torch.__version__.startswith("2.13.0"), torch.__version__
assert importlib.util.find_spec("torchvision") is None, "torchvision must not be installed"
print(f"flwr {flwr.__version__}, opacus {opacus.__version__}, torch {torch.__version__}, "
      f"ray {ray.__version__}")
PY
echo "peer venv ready: $VENV"
