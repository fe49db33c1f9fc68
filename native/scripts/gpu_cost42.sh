#!/bin/bash
# Issue 42 item 3 on one H200 machine, one device call: the tracer's cost on the 1,040-node shape (engine-1040, with
# and without a 5120 x 15360 matmul a layer), taken apart config by config, and which functions of the patched module
# run (the question a private module copy would answer).
#   [PARTS="tracer value"] bash native/scripts/gpu_cost42.sh OUTDIR [ROUNDS] [ITERS]
# PARTS: tracer (the tracer's cost, ~7 min), value (bench/value_digest_cost.py's shipped paths, item 4).
# Carry .devcarry/k42 (bash native/scripts/gpu_cost42.sh --stage builds it here: the tracer, its fatbins, the
# sanitizer runtime, the cost variants noop.fatbin and nolookup-lean.fatbin, and prev.fatbin / nolookup.fatbin = the
# patch before this change and its lookup-less build, when PREV_PATCH / PREV_NOLOOKUP name them). Writes OUTDIR/log.txt, OUTDIR/cost.json (rewritten after each round), OUTDIR/patched.txt.
set -u
K=.devcarry/k42
if [ "${1:-}" = --stage ]; then  # here, before the call: what the call carries (~22 MiB)
  rm -rf $K && mkdir -p $K/build && B=native/build
  cp $B/kvconv_patch.fatbin $B/kvconv_clocksync.fatbin $B/kvconv_calib_cupti $B/lib{sanitizer,Tree,Interceptor}*.so $K/build/
  strip --strip-unneeded -o $K/build/libkvconv_tracer.so $B/libkvconv_tracer.so
  cp $B/cost/noop.fatbin $K/ && cp $B/cost/nolookup.fatbin $K/nolookup-lean.fatbin
  [ -n "${PREV_PATCH:-}" ] && cp "$PREV_PATCH" $K/prev.fatbin
  [ -n "${PREV_NOLOOKUP:-}" ] && cp "$PREV_NOLOOKUP" $K/nolookup.fatbin
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
  echo "== $(date +%T) the patch's two paths on kv_decode.py (280 graph-node executions, 40 eager launches)"
  mkdir -p /tmp/fix && local r
  for r in none graph; do
    CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=/tmp/fix/single-range-$r.kvdump KVCONV_CAPTURE_RANGE=$r \
      timeout -k 5 90 python3 native/workloads/kv_decode.py --streams 1 > /tmp/fix/$r.out 2>&1; echo "range $r: rc=$?"
    grep kvconv-tracer /tmp/fix/$r.out | tail -2
    timeout 60 python3 native/workloads/check_dump.py /tmp/fix/single-range-$r.kvdump --expect-graph 280 \
      --expect-eager $([ $r = none ] && echo 40 || echo 0) | cut -c1-1500
  done
  tar -czf "$O"/fix.tgz -C /tmp/fix single-range-none.kvdump single-range-graph.kvdump none.out graph.out
  echo "== $(date +%T) which functions of the patched module are loaded and launched (KVCONV_VERBOSE=2)"
  CUDA_INJECTION64_PATH=$LIB KVCONV_KERNELS=index_copy_kernel_impl KVCONV_OUTPUT=/tmp/v2-%p.kvdump KVCONV_VERBOSE=2 \
    timeout -k 5 120 python3 bench/gpu_tracer_cost.py --inner --works engine-1040 --iters 5 --warmup 1 --modes idle \
    > /tmp/v2.out 2> /tmp/v2.err; echo "rc=$?"
  grep -E "patched module|target kernel slot|lazily loaded" /tmp/v2.err | sed -E 's/0x[0-9a-f]+/0x../g' | sort | uniq -c \
    | sort -rn | cut -c1-400 > "$O"/patched.txt; head -30 "$O"/patched.txt; grep -c . /tmp/v2.err
  echo "== $(date +%T) bench: $ROUNDS rounds, $ITERS replays"
  V=(--variant "cb-launch=KVCONV_KERNELS=kvconv_no_such_kernel,KVCONV_GRAPH_CALLBACKS=0"
     --variant "empty=KVCONV_PATCH_FILE=$PWD/$K/noop.fatbin" --variant "nocb=KVCONV_GRAPH_CALLBACKS=0")
  local f; for f in nolookup nolookup-lean prev; do
    [ -f $K/$f.fatbin ] && V+=(--variant "$f=KVCONV_PATCH_FILE=$PWD/$K/$f.fatbin"); done
  timeout -k 5 "${BT:-520}" python3 bench/gpu_tracer_cost.py --works engine-1040 engine-1040-mm --rounds "$ROUNDS" \
    --iters "$ITERS" --configs untraced floor after-nopatch after profiler "${V[@]}" --lib "$LIB" --timeout 90 \
    --host-capacity "${HOSTCAP:-0}" --out "$O"/cost.json ${BW:-}
  echo "== $(date +%T) bench exit $?"
}
value() {
  echo "== $(date +%T) value probe (item 4): the shipped paths"
  timeout -k 5 "${VT:-200}" python3 bench/value_digest_cost.py --variants "${VV:-pooled,apart,pooled-after,pooled-launch}" \
    --json "$O"/value.json > /tmp/value.out 2>&1; echo "value exit $?"; tail -c 2500 /tmp/value.out
}
main 2>&1 | tee "$O"/log.txt
