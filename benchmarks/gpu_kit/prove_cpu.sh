#!/usr/bin/env bash
# Proves the kit on a CPU machine: installs .gpukit/wheels offline into a fresh folder
# (pip install --no-index --no-deps --target, as the GPU machine does) and runs the
# quickstart from it on a local Ray and on the local backend, which must end with the same
# model. PYTHON must be an interpreter without Ray/Opacus/dp-accounting (a stand-in for the
# GPU image: Python 3.12 with torch, numpy, scipy, ...; benchmarks/gpu_kit/README.md).
#
#   PYTHON=/path/to/python3.12 bash benchmarks/gpu_kit/prove_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
"$PY" - <<'PYEOF'
import importlib.util, sys
have = [m for m in ("ray", "opacus", "dp_accounting", "tensorboardX") if importlib.util.find_spec(m)]
sys.exit(f"{have} already importable by {sys.executable}: not a fresh interpreter" if have else 0)
PYEOF
tmp=$(mktemp -d /tmp/gpukit-prove.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
t0=$(date +%s)
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
  --target "$tmp/site" .gpukit/wheels/*.whl
echo "installed .gpukit/wheels into $tmp/site in $(( $(date +%s) - t0 )) s ($(du -sh "$tmp/site" | cut -f1))"
export PYTHONPATH="$PWD:$tmp/site" RAY_TMPDIR="$tmp"
"$PY" - "$tmp/site" <<'PYEOF'
import sys, ray, opacus, dp_accounting, tensorboardX, torch
site = sys.argv[1]
for m in (ray, opacus, dp_accounting, tensorboardX):
    assert m.__file__.startswith(site), f"{m.__name__} from {m.__file__}, not the kit"
    print(f"{m.__name__} {getattr(m, '__version__', '?')} from the kit")
print(f"Python {sys.version.split()[0]}, torch {torch.__version__}")
PYEOF
for backend in ray local; do
  t=$(date +%s)
  "$PY" -m raydpfl run configs/quickstart.yaml --set runtime.backend=$backend --out "$tmp/$backend" \
    --no-progress 2>&1 | grep -v "Token authentication is enabled" | tail -2
  echo "quickstart on the $backend backend: $(( $(date +%s) - t )) s"
done
"$PY" - "$tmp" <<'PYEOF'
import json, sys
ray, local = (json.load(open(f"{sys.argv[1]}/{b}/summary.json")) for b in ("ray", "local"))
assert ray["backend"] == "ray" and ray["rounds_completed"] == 30, ray
same = ray["model_sha256"] == local["model_sha256"]
print(f"final model, Ray vs local: {'the same' if same else 'DIFFERENT'} ({ray['model_sha256'][:16]})")
sys.exit(0 if same else 1)
PYEOF
