#!/bin/bash
# Issue 15 on the GPU: this build ("after") against an older tracer ("before", HEAD at the start) in one lease:
# both device patches built there (sm_90), fixtures with the new tracer, then bench/gpu_tracer_cost.py.
#   bash native/scripts/gpu_tracer_cost.sh OUTDIR "CONFIGS" ROUNDS ITERS [FIX=1|single|0]
# Needs a carried folder .devcarry/eng: lib/ (libkvconv_tracer.so of this build, libkvconv_tracer_before.so, the
# sanitizer runtime libraries, kvconv_clocksync.fatbin), inc/ (sanitizer headers), before_src/ (the old patch.cu,
# tracer_shared.h, kvconv_records.h); .whl carried too. BT / BW: the bench timeout and extra bench arguments.
set -u
O=${1:?}; CONFIGS=${2:-untraced before after floor}; ROUNDS=${3:-1}; ITERS=${4:-200}; FIX=${5:-1}
D=.devcarry/eng; L=$PWD/$D/lib
mkdir -p $O; exec > >(tee $O/log.txt) 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
echo "== $(date +%T) machine"; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; uptime
git log --oneline -1 2>/dev/null
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
NV="$NVCC --fatbin --compile-as-tools-patch -gencode arch=compute_90,code=sm_90 -I$PWD/$D/inc"
$NV -Inative/include -Inative/src -o $L/kvconv_patch.fatbin native/src/patch.cu & P1=$!
$NV -I$D/before_src -o $L/kvconv_patch_before.fatbin $D/before_src/patch.cu & P2=$!
wait $P1 $P2; ls -la $L/*.fatbin
mkdir -p native/build; cp $L/* native/build/
LIB=$PWD/native/build/libkvconv_tracer.so; WL=native/workloads/kv_decode.py; CK=native/workloads/check_dump.py
F=/tmp/fix; mkdir -p $F
AFTER_OK=1
if [ "$FIX" != 0 ]; then
  echo "== $(date +%T) single"
  CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=$F/single.kvdump KVCONV_VERBOSE=1 timeout -k 5 60 python3 $WL --streams 1 2>&1 | grep -v -i deprecat | grep -v "self.kv(" | tail -12
  rc=${PIPESTATUS[0]}; echo "rc=$rc"; [ $rc = 124 ] && AFTER_OK=0
  python3 $CK $F/single.kvdump --expect-graph 280 --expect-eager 40 | cut -c1-2500
  python3 -m kvconv reconcile $F/single.kvdump 2>&1 | head -30
  if [ $AFTER_OK = 1 ] && [ "$FIX" = 1 ]; then
    echo "== $(date +%T) twostream"
    CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=$F/twostream.kvdump timeout -k 5 60 python3 $WL --streams 2 > $F/ts.out 2>&1; echo "rc=$?"; tail -2 $F/ts.out
    python3 $CK $F/twostream.kvdump --expect-graph 280 --expect-eager 40 | cut -c1-1500
    echo "== $(date +%T) twoproc"
    CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=$F/procA.kvdump timeout -k 5 60 python3 $WL --streams 1 > $F/A.out 2>&1 & PA=$!
    CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=$F/procB.kvdump timeout -k 5 60 python3 $WL --streams 2 > $F/B.out 2>&1 & PB=$!
    wait $PA $PB
    python3 $CK $F/procA.kvdump $F/procB.kvdump --expect-graph 280 --expect-eager 40 | cut -c1-1500
    echo "== $(date +%T) enter-exit"
    timeout -k 5 60 python3 -m kvconv record --no-build --events enter,exit -o $F/enter-exit.kvdump -- python3 $WL --streams 2 2>&1 | tail -4
    python3 -m kvconv reconcile $F/enter-exit.kvdump 2>&1 | head -12
  fi
  tar -czf $O/fix.tgz -C $F . ; ls -la $F
fi
echo "== $(date +%T) bench"
CF=$CONFIGS; [ $AFTER_OK = 0 ] && CF="untraced before floor"
timeout -k 5 ${BT:-480} python3 bench/gpu_tracer_cost.py --rounds $ROUNDS --iters $ITERS --configs $CF ${BW:-} \
  --before-lib $L/libkvconv_tracer_before.so --before-patch $L/kvconv_patch_before.fatbin --lib $LIB --out $O/cost.json
echo "== $(date +%T) done"
