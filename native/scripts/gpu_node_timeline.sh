#!/bin/bash
# Issue 31: where a traced node's added time lies, one device call. Runs native/workloads/timeline (built here:
#   nvcc -O2 -arch=sm_90 -o .devcarry/tl/node_timeline native/workloads/timeline/*.cu) under each config, ROUNDS times
# in alternating order, and prints one JSON line per run. Needs native/build (tracer, fatbins, cost variants) carried.
#   [LATE=1] [EXECS=1] [CONFIGS="..."] bash native/scripts/gpu_node_timeline.sh OUTDIR [ROUNDS=2] [N=40] [R=200] [BLOCKS=8]
# LATE=1 loads the other module after the target's module was patched. EXECS (main.cu's usage): 2 a second exec of
# the graph replayed beside it, 3 a second exec destroyed before the timing, 4 a second graph of the same shape.
set -u
O=${1:?usage: gpu_node_timeline.sh OUTDIR [ROUNDS] [N] [R] [BLOCKS]}; ROUNDS=${2:-2}; N=${3:-40}; R=${4:-200}; B=${5:-8}
BIN=${BIN:-.devcarry/tl/node_timeline}; LIB=$PWD/native/build/libkvconv_tracer.so; mkdir -p "$O"
run() {  # name, env...
  local name=$1; shift
  local line; line=$(env "$@" timeout -k 5 60 "$BIN" "$N" "$R" "$B" "${LATE:-0}" "${EXECS:-1}" 2>"$O/$name.err" | tail -1)
  echo "{\"config\": \"$name\", \"result\": ${line:-null}}"
  grep -h "kvconv-tracer" "$O/$name.err" | tail -2 >&2
}
T="CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=/tmp/tl-%p.kvdump KVCONV_KERNELS=kvt_target_append"
CONFIGS=(${CONFIGS:-untraced floor nomatch shipped noop nolookup enterexit})
conf() {
  case $1 in
    untraced) run untraced X=1 ;;
    floor) run floor $T KVCONV_CALLBACKS=none ;;
    nomatch) run nomatch CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=/tmp/tl-%p.kvdump KVCONV_KERNELS=zz_no_such_kernel ;;
    shipped) run shipped $T ;;
    noop) run noop $T KVCONV_PATCH_FILE=$PWD/native/build/cost/noop.fatbin ;;
    nolookup) run nolookup $T KVCONV_PATCH_FILE=$PWD/native/build/cost/nolookup.fatbin ;;
    enterexit) run enterexit $T KVCONV_EVENTS=enter,exit ;;
    nograph) run nograph $T KVCONV_GRAPH_CALLBACKS=0 ;;
  esac
}
for ((r = 0; r < ROUNDS; r++)); do
  if ((r % 2 == 0)); then order=("${CONFIGS[@]}"); else order=(); for ((i=${#CONFIGS[@]}-1; i>=0; i--)); do order+=("${CONFIGS[$i]}"); done; fi
  for c in "${order[@]}"; do conf "$c"; done
done | tee "$O/timeline.jsonl"
