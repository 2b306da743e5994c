#!/usr/bin/env bash
# One entry point for a session on a lent GPU machine (H100 / H200, 16 cores, no network): issues 15 and 16.
#
#   bash scripts/gpu_session.sh STEP [ARGS] [STEP [ARGS] ...]      # steps run in order, one log
#
# Each step runs under `timeout` in a budget for the whole command (GPU_SESSION_BUDGET=580 s, inside the device's
# 10 minutes); a step that no longer fits is SKIPPED and said so. Steps, with estimates:
#   tests         tests/test_fused.py (CPU, CUDA, Triton for sm_90) and the CUDA pipeline test          ~1.5-3 min
#   tests-all     the whole suite, CUDA where tests take device=auto                                    ~3-6 min
#   kernel        benchmarks/rope_kernel.py, bf16, batch 128, axial and mixed, 224 and 384              ~1-1.5 min
#   tune          benchmarks/tune_rope_kernel.py: Triton BLOCK_T x num_warps, every config checked      ~1.5-2.5 min
#   bench-eager   benchmarks/throughput.py: ViT-S, DeiT-III-S, timm's ports, bf16 batch 128, infer and train,
#                 224 and 384, 15 rounds x 10 steps                                                     ~3-4 min
#   bench-compiled SIZE [infer|train|both]  the same torch.compile'd: infer ~3-4 min (both sizes), train ~5-6 min
#   gpu1          1-epoch train.py on configs/imagenette_gpu.yaml (compile) under torchrun, NCCL check  ~2-3 min
#   dryrun CONFIG [EPOCHS]  2 epochs into output/imagenette_vit_s/dryrun_<arm>, short eval, projection  ~2.5-3 min
#   train CONFIG SEED  into output/imagenette_vit_s/<arm>_s<SEED>, resuming from last.pth, stopping early when
#                 the budget runs low (call again), then evaluated at EVAL_SIZES under every policy     ~5-7.5 min
#   eval CONFIG SEED  only that evaluation (~1 min);   status  wheels, data, runs and their epochs
#
# Every call installs the carried .whl/ into /tmp/site (PYTHONPATH=<repo>:/tmp/site; the machine's torch and triton
# stay), unpacks .data/imagenette-160.tar.gz once into output/data, writes $OUT/env.txt and $OUT/machine.json, tees
# every step into $OUT/session.log and ends with a table of the steps. Python side: scripts/gpu_tools.py. Back in
# $OUT (at most 8 files; beyond that all but session.log, env.txt, machine.json go into files.tar.gz): perf/*.json
# (GPU, versions, command inside: copy to results/performance/) and per run config.yaml, metrics.csv, results.json,
# results.md, run.json. Checkpoints (~260 MB) stay on the machine, kept only while warm (30 s after a call).
#
# Prepare once, here: bash scripts/gpu_prepare.sh. Then device `run` calls, each with carry [".whl", ".data"]
# (~53 MB; [".whl"] alone where no step reads data: tests, kernel, tune, bench-*), timeout_s 600, back to back (a
# fresh machine costs 1-2 min, without output/ and its checkpoints: a train call then starts at epoch 0). Where
# status's budget_left_s is under 620 s, prefix the command with GPU_SESSION_BUDGET=<budget_left_s - 40>: a command
# the device stops kills this script before its summary and the packing of $OUT. One session, one issue.
# Issue 15 (~27 min with the start; estimates, not yet measured):
#   1. bash scripts/gpu_session.sh tests kernel tune                                ~5 min (+1-2 min machine start)
#      fix what fails before going on
#   2. bash scripts/gpu_session.sh gpu1 bench-eager                                 ~5.5-6.5 min
#   3. bash scripts/gpu_session.sh bench-compiled 224 infer bench-compiled 384 infer ~4-5 min
#   4. bash scripts/gpu_session.sh bench-compiled 224 train                         ~5-6 min
#   5. bash scripts/gpu_session.sh bench-compiled 384 train                         ~5.5-6.5 min (or a later session)
#   Apply tune's best config in vit_rope/triton_rope.py only where it beats the default by more than the spread of
#   repeated timings; confirm with `kernel` later.
# Issue 16 (~24 min with the start):
#   1. bash scripts/gpu_session.sh dryrun configs/imagenette_vit_s/mixed.yaml        ~3 min (+1-2 min machine start)
#      a train call has ~7.2 min for training: if the projection is over ~6.5 min, lower epochs in base.yaml first
#   2. bash scripts/gpu_session.sh train configs/imagenette_vit_s/mixed.yaml 0       ~5-7.5 min
#   3. bash scripts/gpu_session.sh train configs/imagenette_vit_s/axial.yaml 0       ~5-7.5 min
#   4. bash scripts/gpu_session.sh train configs/imagenette_vit_s/ape.yaml 0         ~5-7.5 min
#   Repeat a call ending "UNFINISHED" at once (it resumes); follow one whose evaluation was SKIPPED by `eval CONFIG
#   SEED`. Then results/imagenette_vit_s/: configs, runs/<arm>_s0/, eval/<arm>/results.json, machine.json (from
#   run.json), the plot (vit_rope.report.write_reports or vit_rope.study.write_study); sizes over 160 px are upsampled.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
START=$SECONDS
BUDGET=${GPU_SESSION_BUDGET:-580}
OUT=${OUT:-/tmp/gpu_session_out}
export PYTHONUNBUFFERED=1
PY=${GPU_SESSION_PYTHON:-python3}  # the device's python3 holds its torch; override only for local checks
TOOLS=("$PY" scripts/gpu_tools.py)
DATA_TGZ=.data/imagenette-160.tar.gz
DATA_ROOT=output/data
DATA_DIR=$DATA_ROOT/imagenette-160
RUNS=output/imagenette_vit_s
EVAL_SIZES=(80 96 112 128 160 192 224 256)
EVAL_WORKERS=${EVAL_WORKERS:-14}  # 16 cores: 14 decoding processes, the main process feeding the GPU
STEPS=()
FIRST_RC=0

usage() { sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "$*" >&2; exit 2; }
elapsed() { echo $((SECONDS - START)); }
remaining() { echo $((BUDGET - (SECONDS - START))); }
log() { echo "[gpu_session +$(elapsed)s] $*" | tee -a "$LOG"; }
tools_logged() { "${TOOLS[@]}" "$@" 2>&1 | tee -a "$LOG"; }
fail() { STEPS+=("$1 0"); [ "$FIRST_RC" -ne 0 ] || FIRST_RC=${2:-1}; return "${2:-1}"; }  # fail "NAME WHY" [RC]

# run_step NAME LIMIT_S [RESERVE_S] -- COMMAND...: run COMMAND under timeout (LIMIT_S, less if the budget minus
# RESERVE_S is shorter), output tee'd into the log; records NAME, rc and seconds; returns the rc (124: timed out).
run_step() {
    local name=$1 limit=$2 reserve=0
    shift 2
    if [ "$1" != "--" ]; then reserve=$1; shift; fi
    shift
    local left=$(($(remaining) - reserve))
    if [ "$left" -lt "$limit" ]; then limit=$left; fi
    if [ "$limit" -lt 20 ]; then
        log "SKIPPED $name: $(remaining)s of the command's budget left; run it in the next call"
        fail "$name SKIPPED" 3
        return 3
    fi
    log "step $name (limit ${limit}s): $*"
    local begin=$SECONDS
    # tee through a process substitution, not a pipe: a straggling child (a compile worker) that keeps the output
    # open cannot hold the step past its limit
    timeout -k 20 "$limit" "$@" > >(tee -a "$LOG") 2>&1
    local rc=$?
    sleep 0.2  # let tee catch up before the next line
    local took=$((SECONDS - begin))
    log "step $name: rc $rc in ${took}s$([ "$rc" -eq 124 ] && echo ' (timed out)')"
    STEPS+=("$name $rc $took")
    [ "$FIRST_RC" -ne 0 ] || FIRST_RC=$rc
    return "$rc"
}

# shellcheck disable=SC2329  # the EXIT trap
finish() {  # $OUT: the log gzipped past 15 MiB, and past 8 files all but the log and machine files in a tarball
    if [ "$(stat -c %s "$LOG" 2>/dev/null || echo 0)" -gt $((15 * 1024 * 1024)) ]; then gzip -f "$LOG"; fi
    "${TOOLS[@]}" pack "$OUT"
    printf '\n| step | rc | seconds |\n|---|---|---|\n'
    local entry
    for entry in "${STEPS[@]}"; do
        # shellcheck disable=SC2086  # "name rc seconds": split on purpose
        set -- $entry
        echo "| $1 | $2 | $3 |"
    done
    echo "total $(elapsed)s of a ${BUDGET}s budget; files in \$OUT: $(cd "$OUT" && find . -type f | sed 's|^\./||' \
        | tr '\n' ' ')"
}

setup() {
    mkdir -p "$OUT"
    LOG=$OUT/session.log
    touch "$LOG"
    if ls .whl/*.whl >/dev/null 2>&1; then
        local want
        want=$(find .whl -maxdepth 1 -name '*.whl' | sort | md5sum | cut -d' ' -f1)
        if [ "$(cat /tmp/vit_rope_wheels.stamp 2>/dev/null)" != "$want" ]; then
            log "installing $(find .whl -maxdepth 1 -name '*.whl' | tr '\n' ' ')into /tmp/site"
            "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
                .whl/*.whl 2>&1 | tee -a "$LOG" || { log "error: pip install of .whl/*.whl failed"; exit 1; }
            echo "$want" >/tmp/vit_rope_wheels.stamp
        fi
    else
        log "error: no .whl/*.whl (bash scripts/gpu_prepare.sh makes them; carry [\".whl\", \".data\"])"
        exit 1
    fi
    export PYTHONPATH=$REPO:/tmp/site
    local err  # vit_rope's own ImportError names an old timm and the fix
    if ! err=$("$PY" -c "import vit_rope" 2>&1); then log "error: import vit_rope failed: ${err##*$'\n'}"; exit 1; fi
    "${TOOLS[@]}" env "bash scripts/gpu_session.sh $*" >"$OUT/env.txt" 2>&1
    cat "$OUT/env.txt" >>"$LOG"
    grep -E '^(torch|triton|timm|machine|pillow)' "$OUT/env.txt"
    tools_logged machine "$OUT/machine.json"
}

need_data() {
    if [ -f "$DATA_DIR/.unpacked" ]; then return 0; fi
    if [ ! -f "$DATA_TGZ" ]; then
        log "error: no $DATA_TGZ: run bash scripts/gpu_prepare.sh here and carry [\".whl\", \".data\"]"
        return 1
    fi
    log "unpacking $DATA_TGZ into $DATA_ROOT"
    rm -rf "$DATA_DIR" && mkdir -p "$DATA_ROOT" && tar -xzf "$DATA_TGZ" -C "$DATA_ROOT" && touch "$DATA_DIR/.unpacked" \
        || { log "error: unpacking $DATA_TGZ into $DATA_ROOT failed"; return 1; }
    log "data: $(find "$DATA_DIR/train" -type f | wc -l) train / $(find "$DATA_DIR/val" -type f | wc -l) val images"
}

# bench JSON NAME LIMIT COMMAND...: run a benchmark writing JSON, then add the machine and the command (naming
# results/performance/, where the file goes) to it
bench() {
    local json=$1 name=$2 limit=$3
    shift 3
    mkdir -p "$OUT/perf"
    run_step "$name" "$limit" -- "$@"
    [ -f "$json" ] && tools_logged annotate "$json" "${*/$json/results/performance/$(basename "$json")}"
}

step_setup() { :; }
step_tests() {
    run_step tests 420 -- "$PY" -m pytest -q -rs -p no:cacheprovider --durations=10 tests/test_fused.py \
        tests/test_pipeline.py::test_cuda_batches_match_cpu_batches
}
step_tests_all() { run_step tests-all 540 -- "$PY" -m pytest -q -rs -p no:cacheprovider --durations=15; }

step_kernel() {
    local kind size json
    for kind in axial mixed; do
        for size in 224 384; do
            json=$OUT/perf/rope_kernel_cuda_bf16_${kind}_${size}.json
            bench "$json" "kernel-$kind-$size" 150 "$PY" benchmarks/rope_kernel.py --device cuda --dtype bfloat16 \
                --kind "$kind" --batch-size 128 --img-size "$size" --json "$json"
        done
    done
}

step_tune() {
    local json=$OUT/perf/tune_rope_kernel_cuda_bf16.json
    bench "$json" tune 300 "$PY" benchmarks/tune_rope_kernel.py --device cuda --dtype bfloat16 --json "$json"
}

step_bench() {  # step_bench eager | compiled SIZE infer|train|both
    local mode=$1 sizes=(224 384) name=eager modes=(infer train)
    if [ "$mode" = compiled ]; then
        sizes=("$2")
        name="compiled_$2"
        if [ "$3" != both ]; then modes=("$3"); name="${name}_$3"; fi
    fi
    local json=$OUT/perf/throughput_cuda_bf16_vit_s_${name}.json
    bench "$json" "bench-$name" 560 "$PY" benchmarks/throughput.py --device cuda --amp --compile "$mode" \
        --img-sizes "${sizes[@]}" --modes "${modes[@]}" --batch-size 128 --rounds 15 --steps 10 --json "$json"
}
step_bench_eager() { step_bench eager; }

step_gpu1() {
    need_data || { fail "gpu1 data-missing"; return 1; }
    local torchrun=("$PY" -m torch.distributed.run --standalone --nproc_per_node=1)
    run_step nccl 60 -- "${torchrun[@]}" scripts/gpu_tools.py nccl
    local out=output/imagenette_gpu_1ep
    rm -rf "$out"
    local cmd=("${torchrun[@]}" train.py -c configs/imagenette_gpu.yaml --data-dir "$DATA_DIR" --output "$out"
        --epochs 1 compile=true)
    local begin=$SECONDS
    run_step gpu1 420 -- "${cmd[@]}"
    local took=$((SECONDS - begin))
    mkdir -p "$OUT/imagenette_gpu_1ep"
    cp "$out/config.yaml" "$out/metrics.csv" "$OUT/imagenette_gpu_1ep/" 2>/dev/null
    tools_logged run-json "$OUT/imagenette_gpu_1ep/run.json" "command=torchrun ${cmd[*]:3}" "wall_s=$took"
}

copy_run() {  # copy_run RUN_DIR NAME: the small files of a run into $OUT/NAME
    mkdir -p "$OUT/$2"
    local file
    for file in config.yaml metrics.csv eval/results.json eval/results.md; do
        [ -f "$1/$file" ] && cp "$1/$file" "$OUT/$2/"
    done
}

step_dryrun() {  # step_dryrun CONFIG EPOCHS
    local config=$1 epochs=$2 arm
    need_data || { fail "dryrun data-missing"; return 1; }
    arm=$(basename "$config" .yaml)
    local out=$RUNS/dryrun_$arm
    rm -rf "$out"
    run_step dryrun-train 420 -- "$PY" train.py -c "$config" --output "$out" --epochs "$epochs" seed=0 || return 1
    tools_logged projection "$out/metrics.csv" "$config"
    run_step dryrun-eval 180 -- "$PY" -m vit_rope.evaluate --checkpoint "$out/last.pth" --data-dir "$DATA_DIR" \
        --img-sizes 112 256 --policy extrapolate ntk --limit 500 --batch-size 256 --workers "$EVAL_WORKERS" \
        --output "$out/eval"
    copy_run "$out" "dryrun_$arm"
    tools_logged projection "$out/metrics.csv" "$config"
}

step_train() {  # step_train CONFIG SEED [eval-only]
    local config=$1 seed=$2 only_eval=${3:-} arm
    need_data || { fail "train data-missing"; return 1; }
    arm=$(basename "$config" .yaml)
    local name=${arm}_s$seed
    local out=$RUNS/$name
    local epochs done_epochs train_s=0 eval_s=0 resumed=no begin policies
    epochs=$("${TOOLS[@]}" cfg-epochs "$config" "seed=$seed")
    done_epochs=$("${TOOLS[@]}" ckpt-epoch "$out/last.pth")
    local cmd=("$PY" train.py -c "$config" --output "$out" "seed=$seed")
    if [ -z "$only_eval" ] && [ "$done_epochs" -lt "$epochs" ]; then
        if [ "$done_epochs" -gt 0 ]; then cmd+=("resume=$out/last.pth"); resumed="from epoch $done_epochs"; fi
        begin=$SECONDS
        run_step "train-$name" 600 130 -- "${cmd[@]}"
        train_s=$((SECONDS - begin))
        done_epochs=$("${TOOLS[@]}" ckpt-epoch "$out/last.pth")
    elif [ "$done_epochs" -eq 0 ]; then
        log "error: $out/last.pth is not on this machine (a fresh machine has lost output/): train first"
        fail "eval-$name no-checkpoint"
        return 1
    else
        log "$name: last.pth holds epoch $done_epochs of $epochs; no training"
    fi
    policies=$("${TOOLS[@]}" policies)
    # shellcheck disable=SC2206  # the policies: split on purpose
    local evaluate=("$PY" -m vit_rope.evaluate --checkpoint "$out/last.pth" --data-dir "$DATA_DIR" --img-sizes
        "${EVAL_SIZES[@]}" --policy $policies --batch-size 256 --workers "$EVAL_WORKERS" --output "$out/eval")
    if [ "$done_epochs" -ge "$epochs" ] || { [ -n "$only_eval" ] && [ "$done_epochs" -gt 0 ]; }; then
        begin=$SECONDS
        run_step "eval-$name" 300 -- "${evaluate[@]}"
        eval_s=$((SECONDS - begin))
    fi
    copy_run "$out" "$name"
    tools_logged run-json "$OUT/$name/run.json" "run=$name" "config=$config" "seed=$seed" "epochs=$epochs" \
        "epochs_done=$done_epochs" "resumed=$resumed" "train_command=python ${cmd[*]:1}" \
        "eval_command=python ${evaluate[*]:1}" "train_s=$train_s" "eval_s=$eval_s"
    if [ "$done_epochs" -lt "$epochs" ]; then
        log "UNFINISHED $name: epoch $done_epochs of $epochs in $out/last.pth; call the same command again now" \
            "(it resumes while the machine is warm)"
        [ "$FIRST_RC" -ne 0 ] || FIRST_RC=4
    fi
}

step_status() {
    local ckpt
    {
        echo "wheels: $(cat /tmp/vit_rope_wheels.stamp 2>/dev/null || echo none)"
        echo "/tmp/site: $(find /tmp/site -mindepth 1 -maxdepth 1 -printf '%f ' 2>/dev/null)"
        echo "data: $([ -f "$DATA_DIR/.unpacked" ] && echo "$DATA_DIR unpacked" || echo "not unpacked")"
        for ckpt in "$RUNS"/*/last.pth output/imagenette_gpu_1ep/last.pth; do
            [ -f "$ckpt" ] && echo "$ckpt: epoch $("${TOOLS[@]}" ckpt-epoch "$ckpt")"
        done
    } 2>&1 | tee -a "$LOG"
}

# dispatch check|run STEP [ARGS] ...: `check` validates the whole command line before anything runs, `run` runs it
dispatch() {
    local mode=$1 step size how config epochs
    shift
    while [ $# -gt 0 ]; do
        step=$1
        shift
        case $step in
            tests | tests-all | kernel | tune | bench-eager | gpu1 | status | setup)
                [ "$mode" = check ] || "step_${step//-/_}" ;;
            bench-compiled)
                [[ ${1:-} =~ ^[0-9]+$ ]] || die "bench-compiled needs a size (224 or 384)"
                size=$1 how=both
                shift
                if [[ ${1:-} =~ ^(infer|train|both)$ ]]; then how=$1; shift; fi
                [ "$mode" = check ] || step_bench compiled "$size" "$how" ;;
            dryrun)
                [ -f "${1:-}" ] || die "dryrun needs a config file, got '${1:-}'"
                config=$1 epochs=2
                shift
                if [[ ${1:-} =~ ^[0-9]+$ ]]; then epochs=$1; shift; fi
                [ "$mode" = check ] || step_dryrun "$config" "$epochs" ;;
            train | eval)
                [ -f "${1:-}" ] || die "$step needs a config file, got '${1:-}'"
                [[ ${2:-} =~ ^[0-9]+$ ]] || die "$step needs a seed after the config"
                [ "$mode" = check ] || step_train "$1" "$2" "$([ "$step" = eval ] && echo eval-only)"
                shift 2 ;;
            *) die "unknown step '$step'; bash scripts/gpu_session.sh help" ;;
        esac
    done
}

if [ $# -eq 0 ] || [ "$1" = help ] || [ "$1" = -h ] || [ "$1" = --help ]; then
    usage
    exit 0
fi
dispatch check "$@"
setup "$@"
trap finish EXIT
dispatch run "$@"
exit "$FIRST_RC"
