#!/usr/bin/env bash
# The one command a session lent a GPU machine sends (docs/gpu.md): on a copy of the checkout with .gpu/ holding the
# timm wheel and the 160 px Imagenette tarball, no network and torch preinstalled, it installs timm beside the
# machine's packages (no index, no dependencies), unpacks the data, runs make gpu-check (or the suites named, e.g.
# "check bench") and leaves one tarball of the results, plus each summary, in $OUT (default /tmp/gpu-out).
#   bash scripts/gpu_session.sh [check] [bench]
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PIP_NO_INDEX=1
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-out}
suites=${*:-check}
site=/tmp/site data=/tmp/imagenette-data results=/tmp/gpu-results
mkdir -p "$OUT" "$site" "$data" "$results"
wheels=(.gpu/timm-*.whl)
if [ -e "${wheels[0]}" ]; then
    python3 -m pip install -q --no-index --no-deps --target "$site" "${wheels[@]}" || echo "timm wheel: install failed"
else
    echo "no .gpu/timm-*.whl: using the machine's own timm"
fi
export PYTHONPATH="$site:$PWD"
if [ ! -d "$data/imagenette-160" ]; then
    tar -xzf .gpu/imagenette-160.tar.gz -C "$data" || echo "no .gpu/imagenette-160.tar.gz: gpu-check names the folder"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
status=0
for suite in $suites; do
    make "gpu-$suite" PYTHON=python3 DATA_DIR="$data/imagenette-160" OUT="$results/gpu-$suite" || status=1
    cp "$results/gpu-$suite/summary.md" "$OUT/summary-$suite.md" 2>/dev/null
done
# checkpoints, caches and compiled kernels stay behind: the JSON files, logs and summaries come back
tar -czf "$OUT/gpu-results.tar.gz" -C "$results" --exclude='*.pth' --exclude='*.pt' --exclude=cache . || status=1
ls -la "$OUT"
exit $status
