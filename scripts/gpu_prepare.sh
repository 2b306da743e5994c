#!/usr/bin/env bash
# Prepare this checkout for a session on a lent GPU machine (issues 15 and 16); run HERE, on the CPU machine, once.
#
#   bash scripts/gpu_prepare.sh            # about 10 s: one ~2.5 MB wheel download and a 48 MiB copy
#
# What it does (idempotent, nothing is committed):
#   1. .whl/: the timm==1.0.31 wheel (the GPU machine has an older timm and no network; its torch, triton,
#      torchvision, pyyaml, safetensors, huggingface_hub, einops, pytest and matplotlib are used as they are), fetched
#      with the `pip download` command of the device README. timm needs nothing the machine lacks (its Requires-Dist:
#      torch, torchvision, pyyaml, huggingface_hub, safetensors), so no other wheel is fetched.
#   2. .data/imagenette-160.tar.gz: a copy of ../shared/data/imagenette-160.tar.gz (48 MiB; ../shared does not travel
#      with the repo, a carried in-repo folder does).
#   3. /.whl/ and /.data/ in .git/info/exclude, so that both stay untracked and travel only when named in `carry`.
#   4. Prints the size that travels: tracked + untracked-not-ignored files + .whl + .data, which must stay under
#      64 MiB (about 53 MB with this repo as it is).
#
# Then a GPU session makes these device `run` calls, each with carry [".whl", ".data"] and timeout_s 600, back to back
# (the machine goes back 30 s after a call); scripts/gpu_session.sh's header says more. Estimates, not measurements;
# one 30-minute session holds one issue:
#   issue 15: bash scripts/gpu_session.sh tests kernel tune                                  ~5 min + 1-2 min start
#             bash scripts/gpu_session.sh gpu1 bench-eager                                   ~5.5-6.5 min
#             bash scripts/gpu_session.sh bench-compiled 224 infer bench-compiled 384 infer  ~4-5 min
#             bash scripts/gpu_session.sh bench-compiled 224 train                           ~5-6 min
#             bash scripts/gpu_session.sh bench-compiled 384 train                           ~5.5-6.5 min
#   issue 16: bash scripts/gpu_session.sh dryrun configs/imagenette_vit_s/mixed.yaml          ~3 min + 1-2 min start
#             bash scripts/gpu_session.sh train configs/imagenette_vit_s/mixed.yaml 0         ~5-7.5 min
#             bash scripts/gpu_session.sh train configs/imagenette_vit_s/axial.yaml 0         ~5-7.5 min
#             bash scripts/gpu_session.sh train configs/imagenette_vit_s/ape.yaml 0           ~5-7.5 min
set -euo pipefail

cd "$(dirname "$0")/.."
TIMM_VERSION=1.0.31
DATA=../shared/data/imagenette-160.tar.gz

if [ -x .venv/bin/python ] && .venv/bin/python -m pip --version >/dev/null 2>&1; then
    PY=.venv/bin/python
else
    PY=python3
fi

# 3. ignore the carried folders (a worktree's .git is a file: ask git where its info/ is)
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
touch "$exclude"
for pattern in /.whl/ /.data/; do
    grep -qxF "$pattern" "$exclude" || echo "$pattern" >>"$exclude"
done

# 1. wheels: one version of each package only (two stop the device's install)
mkdir -p .whl
stale=$(find .whl -maxdepth 1 -name 'timm-*.whl' ! -name "timm-${TIMM_VERSION}-*.whl" -print)
if [ -n "$stale" ]; then
    echo "removing other timm wheels: $stale"
    find .whl -maxdepth 1 -name 'timm-*.whl' ! -name "timm-${TIMM_VERSION}-*.whl" -delete
fi
if ! ls .whl/timm-"${TIMM_VERSION}"-*.whl >/dev/null 2>&1; then
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "timm==${TIMM_VERSION}"
fi
echo "wheels in .whl/:"
ls -l .whl
for wheel in .whl/*.whl; do
    echo "$wheel requires (extras left out):"
    unzip -p "$wheel" '*/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' | sed 's/^/    /' || true
done

# 2. the 160 px Imagenette copy
mkdir -p .data
if [ ! -f .data/imagenette-160.tar.gz ] || ! cmp -s "$DATA" .data/imagenette-160.tar.gz; then
    cp -f "$DATA" .data/imagenette-160.tar.gz && chmod u+w .data/imagenette-160.tar.gz
fi
ls -l .data

# 4. what travels: git-visible files (tracked + untracked-not-ignored) and the carried folders
visible=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
carried=$(du -cb .whl .data | tail -1 | cut -f1)
total=$((visible + carried))
limit=$((64 * 1024 * 1024))
echo "travels: ${visible} B of repo files + ${carried} B carried (.whl .data) = ${total} B of ${limit} B (64 MiB)"
if [ "$total" -ge "$limit" ]; then
    echo "error: over the 64 MiB the device takes; ignore or remove large untracked files" >&2
    exit 1
fi
echo "ready: device run calls with carry [\".whl\", \".data\"] (see scripts/gpu_session.sh)"
