#!/bin/bash
# The live dump file's happy-path cost against an older tracer, interleaved rounds on one machine, plus a death check
# of this build (what docs/results/tracer-cost-2026-11-30/tracer_live_cost.h200.{json,log} hold; lease 1 ran ROUNDS="1 2" WHICH="old new",
# lease 2 ROUNDS="3 4" WHICH="old new newF" DEATH=0).
#   bash native/scripts/gpu_live_cost.sh OUTDIR OLD_LIB
# old = OLD_LIB, new = native/build, newF = native/build with KVCONV_FLUSH_MS=1000 (no copies during a replay:
# isolates the flusher's share). Death check (DEATH=1): die.py os-exit, sigkill, abort, sigsegv as in gpu_death.sh.
set -u
OUTDIR=${1:?usage: gpu_live_cost.sh OUTDIR OLD_LIB}; OLD_LIB=${2:?usage: gpu_live_cost.sh OUTDIR OLD_LIB}
ROUNDS=${ROUNDS:-1 2}; WHICH=${WHICH:-old new}; DEATH=${DEATH:-1}
ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"; mkdir -p "$OUTDIR"; OUTDIR=$(cd "$OUTDIR" && pwd)
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$ROOT}
LIB=$ROOT/native/build/libkvconv_tracer.so
exec > >(tee "$OUTDIR/cost.log") 2>&1
nvidia-smi -L; uname -r
if [ "$DEATH" = 1 ]; then
  W=$OUTDIR/death; mkdir -p "$W"
  for case in os-exit sigkill abort sigsegv; do
    echo "== death $case $(date +%T)"; out=$W/h200-death-$case.kvdump
    CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=$out KVCONV_DEVICE_CAPACITY=4096 KVCONV_HOST_CAPACITY=1024 \
      timeout -k 5 60 python3 native/workloads/die.py $case --layers 4 --replays 3 > "$W/$case.stdout" 2> "$W/$case.stderr"
    echo "exit $?"
    grep -h '"workload"' "$W/$case.stdout" | python3 -c 'import json,sys; print("launched", json.loads(sys.stdin.read())["expected"])'
    python3 -m kvconv validate "$out" > "$W/$case.validate.txt" 2>&1; echo "validate rc=$?"; tail -3 "$W/$case.validate.txt"
    python3 native/workloads/check_dump.py "$out" --expect-graph 12 --expect-eager 4 > "$W/$case.check.json" 2>&1
    echo "check rc=$?"; cut -c1-500 "$W/$case.check.json"
  done
  tar -czSf "$OUTDIR/death.tgz" -C "$W" . && rm -rf "$W"
fi
for round in $ROUNDS; do
  for which in $WHICH; do
    lib=$LIB; [ "$which" = old ] && lib=$OLD_LIB
    fl=1; [ "$which" = newF ] && fl=1000
    echo "== round $round $which $(date +%T)"
    KVCONV_FLUSH_MS=$fl timeout -k 5 170 python3 bench/gpu_overhead.py --works light qwen14b --configs untraced traced \
      --iters 300 --lib "$lib" --out "$OUTDIR/r$round-$which.json" 2>&1 | tail -12
  done
done
echo "== done $(date +%T)"
