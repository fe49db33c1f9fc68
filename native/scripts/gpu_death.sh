#!/bin/bash
# Issue 20 on the GPU: every end of a traced process leaves a dump that kvconv validate reads with every event
# launched before the end. One traced run of native/workloads/die.py per case, then validate (--salvage where the
# plain read refuses) and the tracer's own join check; optional happy-path bench against an older library.
#   bash native/scripts/gpu_death.sh OUTDIR [OLD_LIB]
# Writes OUTDIR/death.log, OUTDIR/death.tgz (the dumps + validate/check outputs), OUTDIR/bench-*.json.
set -u
OUTDIR=${1:?usage: gpu_death.sh OUTDIR [OLD_LIB]}; OLD_LIB=${2:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"; mkdir -p "$OUTDIR"; OUTDIR=$(cd "$OUTDIR" && pwd)
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$ROOT}
LIB=$ROOT/native/build/libkvconv_tracer.so
W=$OUTDIR/work; mkdir -p "$W"
WL="native/workloads/die.py"
ARGS="--layers 4 --replays 3"
exec > >(tee "$OUTDIR/death.log") 2>&1
nvidia-smi -L
for case in normal exit-code exception os-exit abort sigsegv sigkill illegal-address; do
  echo "== $case"
  out=$W/h200-death-$case.kvdump
  CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=$out KVCONV_DEVICE_CAPACITY=4096 KVCONV_HOST_CAPACITY=1024 \
    timeout -k 5 120 python3 $WL $case $ARGS > "$W/$case.stdout" 2> "$W/$case.stderr"
  echo "exit $?"
  grep -h '"workload"' "$W/$case.stdout" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print("launched", d["expected"])' 2>/dev/null
  tail -3 "$W/$case.stderr"
  ls -ls "$out" 2>/dev/null || { echo "NO DUMP"; continue; }
  python3 -m kvconv validate "$out" > "$W/$case.validate.txt" 2>&1; echo "validate rc=$?"; tail -4 "$W/$case.validate.txt"
  python3 -m kvconv validate --salvage "$out" > "$W/$case.salvage.txt" 2>&1; echo "validate --salvage rc=$?"
  python3 native/workloads/check_dump.py "$out" --expect-graph 12 --expect-eager 4 > "$W/$case.check.json" 2>&1
  echo "check rc=$?"; cut -c1-600 "$W/$case.check.json"
done
if [ -n "$OLD_LIB" ]; then
  echo "== happy path: light work, untraced / old library / this library"
  python3 bench/gpu_overhead.py --works light --configs untraced traced --iters 150 --lib "$OLD_LIB" --out "$OUTDIR/bench-old.json" 2>&1 | tail -6
  python3 bench/gpu_overhead.py --works light --configs untraced traced --iters 150 --lib "$LIB" --out "$OUTDIR/bench-new.json" 2>&1 | tail -6
fi
tar -czf "$OUTDIR/death.tgz" -C "$W" . && rm -rf "$W"
echo "== done"
