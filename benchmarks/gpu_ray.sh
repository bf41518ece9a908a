#!/usr/bin/env bash
# The GPU day in one command (issue 38), from the repository root, with .gpukit/ carried:
#
#   bash benchmarks/gpu_ray.sh [benchmarks/gpu_ray.py options]
#   bash benchmarks/gpu_ray.sh --rehearse [options]   # the same on a CPU: fake GPUs, fake nvidia-smi
#
# 1. checks .gpukit/ against its SHA256SUMS (built here by benchmarks/gpu_kit/build.py);
# 2. installs its wheels, offline, into a fresh folder: pip install --no-index --no-deps --target;
# 3. runs benchmarks/gpu_ray.py with that folder and this checkout on PYTHONPATH.
# Results (JSON, Markdown, this log) go to $OUT when set (the device tool's folder), else
# benchmarks/results/. PYTHON picks the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RESULTS=${OUT:-benchmarks/results}
mkdir -p "$RESULTS"
exec > >(tee -a "$RESULTS/gpu-ray.log") 2>&1
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1

extra=()
if [ "${1:-}" = "--rehearse" ]; then
  shift
  extra=(--fake-gpus --device cpu --data standin --sampler smi --smi benchmarks/gpu_kit/fake_nvidia_smi.py)
fi

start=$(date +%s.%N)
elapsed() { echo "$(date +%s.%N) $start" | awk '{printf "%.1f", $1 - $2}'; }
echo "== $(date -u +%FT%TZ) $(uname -n): $("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1)"
command -v nvidia-smi >/dev/null && nvidia-smi -L

[ -f .gpukit/SHA256SUMS ] || { echo "no .gpukit/: build it (python benchmarks/gpu_kit/build.py) and carry it"; exit 3; }
(cd .gpukit && sha256sum -c --quiet SHA256SUMS) || { echo ".gpukit/ does not match its SHA256SUMS"; exit 3; }
echo "== kit checked ($(du -sh .gpukit | cut -f1)) at $(elapsed) s"

SITE=$(mktemp -d /tmp/gpukit-site.XXXXXX)
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .gpukit/wheels/*.whl \
  || { echo "pip could not install .gpukit/wheels"; exit 4; }
# this checkout first: nothing in the kit may shadow it
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import ray, opacus, dp_accounting, raydpfl, torch
print("ray", ray.__version__, "from", ray.__file__.rsplit("/", 2)[0], "| opacus", opacus.__version__,
      "| torch", torch.__version__, "cuda", torch.cuda.is_available())' || exit 4
echo "== kit installed in $SITE at $(elapsed) s"

"$PY" benchmarks/gpu_ray.py --out "$RESULTS" "${extra[@]}" "$@"
rc=$?
echo "== gpu_ray.py exited $rc at $(elapsed) s"
rm -rf "$SITE"
exit $rc
