#!/bin/bash
# Issue 42 item 3 on one H200 machine, one device call: the tracer's cost on the 1,040-node shape (engine-1040, with
# and without a 5120 x 15360 matmul a layer), taken apart config by config, and which functions of the patched module
# run (the question a private module copy would answer).
#   [PARTS="tracer value"] bash native/scripts/gpu_cost42.sh OUTDIR [ROUNDS] [ITERS]
# PARTS: tracer (the tracer's cost, ~7 min), value (bench/value_digest_cost.py's shipped paths, item 4).
# Carry .devcarry/k42 (bash native/scripts/gpu_cost42.sh --stage builds it here: the tracer, its fatbins, the
# sanitizer runtime, the cost variants noop.fatbin and nolookup.fatbin, and prev.fatbin = the patch before this change
# when PREV_PATCH names one). Writes OUTDIR/log.txt, OUTDIR/cost.json (rewritten after each round), OUTDIR/patched.txt.
set -u
K=.devcarry/k42
if [ "${1:-}" = --stage ]; then  # here, before the call: what the call carries (~22 MiB)
  rm -rf $K && mkdir -p $K/build && B=native/build
  cp $B/kvconv_patch.fatbin $B/kvconv_clocksync.fatbin $B/kvconv_calib_cupti $B/lib{sanitizer,Tree,Interceptor}*.so $K/build/
  strip --strip-unneeded -o $K/build/libkvconv_tracer.so $B/libkvconv_tracer.so
  cp $B/cost/noop.fatbin $B/cost/nolookup.fatbin $K/
  [ -n "${PREV_PATCH:-}" ] && cp "$PREV_PATCH" $K/prev.fatbin
  du -sh $K; exit 0
fi
O=${1:?usage: gpu_cost42.sh OUTDIR [ROUNDS] [ITERS]}; ROUNDS=${2:-2}; ITERS=${3:-200}
mkdir -p "$O"
LIB=$PWD/$K/build/libkvconv_tracer.so
main() {
  echo "== $(date +%T) machine"; nvidia-smi -L; nvidia-smi --query-gpu=uuid,serial,driver_version,clocks.max.sm --format=csv,noheader
  uptime; nproc; python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())'
  md5sum $K/build/*.fatbin $K/*.fatbin $LIB
  export PYTHONUNBUFFERED=1
  case " ${PARTS:-tracer value} " in *" tracer "*) tracer;; esac
  case " ${PARTS:-tracer value} " in *" value "*) value;; esac
  echo "== $(date +%T) done"; uptime
}
tracer() {
  echo "== $(date +%T) which functions of the patched module are loaded and launched (KVCONV_VERBOSE=2)"
  CUDA_INJECTION64_PATH=$LIB KVCONV_KERNELS=index_copy_kernel_impl KVCONV_OUTPUT=/tmp/v2-%p.kvdump KVCONV_VERBOSE=2 \
    timeout -k 5 120 python3 bench/gpu_tracer_cost.py --inner --works engine-1040 --iters 5 --warmup 1 --modes idle \
    > /tmp/v2.out 2> /tmp/v2.err; echo "rc=$?"
  grep -E "patched module|target kernel slot|lazily loaded" /tmp/v2.err | sed -E 's/0x[0-9a-f]+/0x../g' | sort | uniq -c \
    | sort -rn | cut -c1-400 > "$O"/patched.txt; head -30 "$O"/patched.txt; grep -c . /tmp/v2.err
  echo "== $(date +%T) bench: $ROUNDS rounds, $ITERS replays"
  V=(--variant "cb-launch=KVCONV_KERNELS=kvconv_no_such_kernel,KVCONV_GRAPH_CALLBACKS=0"
     --variant "empty=KVCONV_PATCH_FILE=$PWD/$K/noop.fatbin" --variant "nolookup=KVCONV_PATCH_FILE=$PWD/$K/nolookup.fatbin"
     --variant "nocb=KVCONV_GRAPH_CALLBACKS=0")
  [ -f $K/prev.fatbin ] && V+=(--variant "prev=KVCONV_PATCH_FILE=$PWD/$K/prev.fatbin")
  timeout -k 5 "${BT:-520}" python3 bench/gpu_tracer_cost.py --works engine-1040 engine-1040-mm --rounds "$ROUNDS" \
    --iters "$ITERS" --configs untraced floor after-nopatch after profiler "${V[@]}" --lib "$LIB" --timeout 90 \
    --out "$O"/cost.json ${BW:-}
  echo "== $(date +%T) bench exit $?"
}
value() {
  echo "== $(date +%T) value probe (item 4): the shipped paths"
  timeout -k 5 "${VT:-200}" python3 bench/value_digest_cost.py --variants "${VV:-pooled,apart,pooled-after,pooled-launch}" \
    --json "$O"/value.json > /tmp/value.out 2>&1; echo "value exit $?"; tail -c 2500 /tmp/value.out
}
main 2>&1 | tee "$O"/log.txt
