#!/bin/bash
# The tracer's GPU run: every fixture case and the overhead bench in one go (one device-tool call).
#   native/scripts/gpu_run.sh OUTDIR [bench]
# Needs native/build (make -C native) and a GPU with PyTorch (+ CuPy, else torch load_inline) installed.
# Writes OUTDIR/{single,twostream,procA,procB}.kvdump, OUTDIR/summary.jsonl, OUTDIR/bench.json, OUTDIR/log.txt.
set -u
OUTDIR=${1:?usage: gpu_run.sh OUTDIR [bench]}
BENCH=${2:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
mkdir -p "$OUTDIR"
LOG=$OUTDIR/log.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT
LIB=$ROOT/native/build/libkvconv_tracer.so
WL=native/workloads/kv_decode.py
CK=native/workloads/check_dump.py
SUM=$OUTDIR/summary.jsonl
PY="timeout -k 5 150 python3"
: > "$SUM"
{
echo "== machine"; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,name --format=csv,noheader
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cupy', cupy.__version__)"
echo "CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-unset (lazy)}"
ls -la native/build

echo "== 1 untraced baseline (sanity)"
$PY $WL --streams 1 --replays 7

echo "== 2 single-stream, traced"
CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=$OUTDIR/single.kvdump KVCONV_VERBOSE=1 $PY $WL --streams 1 --json $OUTDIR/wl-single.json
python3 $CK $OUTDIR/single.kvdump --expect-graph 280 --expect-eager 40 | tee -a "$SUM"

echo "== 3 two-stream, traced"
CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=$OUTDIR/twostream.kvdump $PY $WL --streams 2 --json $OUTDIR/wl-two.json
python3 $CK $OUTDIR/twostream.kvdump --expect-graph 280 --expect-eager 40 | tee -a "$SUM"

echo "== 4 two processes at once on one GPU"
CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=$OUTDIR/procA.kvdump $PY $WL --streams 1 --json $OUTDIR/wl-A.json &
PA=$!
CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=$OUTDIR/procB.kvdump $PY $WL --streams 2 --json $OUTDIR/wl-B.json &
PB=$!
wait $PA; echo "procA exit $?"; wait $PB; echo "procB exit $?"
python3 $CK $OUTDIR/procA.kvdump $OUTDIR/procB.kvdump --expect-graph 280 --expect-eager 40 | tee -a "$SUM"

echo "== 5 SIGTERM while running (dump must still be written)"
CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=/tmp/sigterm.kvdump $PY $WL --streams 1 --sleep-after 60 > /tmp/sig.out 2>&1 &
PS=$!
for i in $(seq 1 120); do grep -q '"workload"' /tmp/sig.out 2>/dev/null && break; sleep 0.5; done
kill -TERM $PS; wait $PS; echo "sigterm exit $?"; cat /tmp/sig.out | tail -3
python3 $CK /tmp/sigterm.kvdump --expect-graph 280 --expect-eager 40 | tee -a "$SUM" | cut -c1-400

echo "== 6 unwritable output path"
CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=/nonexistent/x.kvdump $PY $WL --layers 2 --replays 1 2>&1 | grep -i kvconv

echo "== 7 kvconv record"
timeout -k 5 150 python3 -m kvconv record -o /tmp/rec.kvdump -- $PY $WL --layers 4 --replays 2 ; echo "record exit $?"

for f in wl-single wl-two wl-A wl-B; do cat $OUTDIR/$f.json >> "$SUM"; rm -f $OUTDIR/$f.json; done

if [ -n "$BENCH" ]; then
  echo "== 8 overhead bench"
  timeout -k 5 300 python3 bench/gpu_overhead.py --out $OUTDIR/bench.json --iters ${BENCH_ITERS:-200}
fi
echo "== done"
} > "$LOG" 2>&1
tail -c 6000 "$LOG"
