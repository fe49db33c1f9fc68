#!/bin/bash
# Second GPU pass: correctness of the default (minimal-callback) tracer on both graph shapes, then the overhead
# bench over every config.  native/scripts/gpu_run2.sh OUTDIR
set -u
OUTDIR=${1:?}; ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"; mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT
LIB=$ROOT/native/build/libkvconv_tracer.so; WL=native/workloads/kv_decode.py; CK=native/workloads/check_dump.py
PY="timeout -k 5 150 python3"
{
for s in 1 2; do
  echo "== streams=$s, default tracer"
  CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=$OUTDIR/min-s$s.kvdump $PY $WL --streams $s
  python3 $CK $OUTDIR/min-s$s.kvdump --expect-graph 280 --expect-eager 40 | cut -c1-1500
done
echo "== bench"
timeout -k 5 400 python3 bench/gpu_overhead.py --out $OUTDIR/bench2.json --iters ${BENCH_ITERS:-200}
echo "== done"
} > $OUTDIR/log2.txt 2>&1
tail -c 5000 $OUTDIR/log2.txt
