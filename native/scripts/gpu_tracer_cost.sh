#!/bin/bash
# Issue 15 on the GPU, one device call: fixtures re-recorded with this build's tracer ("after"), then
# bench/gpu_tracer_cost.py: after against an older tracer ("before") in the same lease.
#   bash native/scripts/gpu_tracer_cost.sh OUTDIR "CONFIGS" ROUNDS ITERS "FIXTURES"
#   FIXTURES: any of single twostream twoproc enter-exit ("" for none)
# Needs a carried folder $KVD (default .devcarry/kvh), everything built beforehand (make -C native tracer ARCHS=90:
# g++ and nvcc need no GPU):
#   $KVD/after/         libkvconv_tracer.so, kvconv_patch.fatbin, kvconv_clocksync.fatbin of this build + the
#                       sanitizer runtime libraries (what native/build holds)
#   $KVD/before/build/  libkvconv_tracer.so + its two fatbins built from the older native/ (git archive REV native)
# and .whl carried. Every step is bounded by `timeout`; BT: the bench's bound (s), BW: extra bench arguments.
# Writes OUTDIR/log.txt, OUTDIR/fix.tgz (the dumps), OUTDIR/cost.json (rewritten after each round).
set -u
O=${1:?usage: gpu_tracer_cost.sh OUTDIR CONFIGS ROUNDS ITERS FIXTURES}
CONFIGS=${2:-untraced before after floor profiler after-nopatch}; ROUNDS=${3:-2}; ITERS=${4:-200}
FIX=${5-twostream enter-exit}; D=${KVD:-.devcarry/kvh}
mkdir -p "$O"
T() { timeout -k 5 "$@"; }

fixture() {  # one capture with this build, checked on the spot (280 = 280 = 280 is checked again where committed)
  local WL=native/workloads/kv_decode.py CK="T 60 python3 native/workloads/check_dump.py" F=/tmp/fix
  echo "== $(date +%T) fixture $1"
  case $1 in
    single|twostream)
      local s=1; [ "$1" = twostream ] && s=2
      CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=$F/$1.kvdump T 60 python3 $WL --streams $s > $F/$1.out 2>&1
      echo "rc=$?"; grep kvconv-tracer $F/$1.out | tail -2
      $CK $F/$1.kvdump --expect-graph 280 --expect-eager 40 | cut -c1-1500 ;;
    twoproc)
      CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=$F/procA.kvdump T 60 python3 $WL --streams 1 > $F/A.out 2>&1 & local PA=$!
      CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=$F/procB.kvdump T 60 python3 $WL --streams 2 > $F/B.out 2>&1 & local PB=$!
      wait $PA $PB; echo "rc=$?"
      $CK $F/procA.kvdump $F/procB.kvdump --expect-graph 280 --expect-eager 40 | cut -c1-1500 ;;
    enter-exit)
      T 60 python3 -m kvconv record --no-build --events enter,exit -o $F/enter-exit.kvdump -- \
        python3 $WL --streams 2 > $F/ee.out 2>&1; echo "rc=$?"; tail -4 $F/ee.out ;;
  esac
  local d; for d in $(case $1 in twoproc) echo procA procB;; *) echo $1;; esac); do
    T 60 python3 -m kvconv reconcile $F/$d.kvdump 2>&1 | grep -E "=|drops|matched" | head -6; done
}

main() {
  T 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
  echo "== $(date +%T) machine"; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; uptime
  mkdir -p native/build /tmp/fix; cp $D/after/* native/build/
  local B=$PWD/$D/before/build
  cp native/build/lib{sanitizer,Tree,Interceptor}*.so "$B"/  # the runtime beside the older library too ($ORIGIN)
  LIB=$PWD/native/build/libkvconv_tracer.so; export KVCONV_TRACER_LIB=$LIB
  md5sum native/build/*.fatbin native/build/libkvconv_tracer.so "$B"/*.fatbin "$B"/libkvconv_tracer.so
  for f in $FIX; do fixture "$f"; done
  [ -n "$FIX" ] && tar -czf "$O"/fix.tgz -C /tmp/fix $(cd /tmp/fix && ls *.kvdump) && ls -la /tmp/fix
  echo "== $(date +%T) bench: $CONFIGS, $ROUNDS rounds, $ITERS replays"
  T "${BT:-420}" python3 bench/gpu_tracer_cost.py --rounds "$ROUNDS" --iters "$ITERS" --configs $CONFIGS ${BW:-} \
    --before-lib "$B"/libkvconv_tracer.so --before-patch "$B"/kvconv_patch.fatbin --lib "$LIB" --out "$O"/cost.json
  echo "== $(date +%T) done (bench exit $?)"; uptime
}

main 2>&1 | tee "$O"/log.txt
