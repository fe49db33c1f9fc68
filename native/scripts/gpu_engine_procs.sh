#!/bin/bash
# Every process kept and a capture range, on the GPU (issue 44): an engine's process shapes (engine_procs.py around
# kv_decode.py) under `kvconv record`, each case's dumps validated by record itself and summed up by check_dump.py.
#   native/scripts/gpu_engine_procs.sh OUTDIR
# Needs native/build (carried, or make -C native tracer) and the CLI's wheels in .whl/ (jsonschema & co).
set -u
OUTDIR=${1:?usage: gpu_engine_procs.sh OUTDIR}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site KVCONV_TRACER_LIB=$ROOT/native/build/libkvconv_tracer.so
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
WL=native/workloads/engine_procs.py
REC="timeout -k 5 240 python3 -m kvconv record -k reshape_and_cache_flash_kernel"
# warm-up flood: 40 layers x 60 forwards x 512 blocks = 1,228,800 blocks against a 262,144-event buffer
FLOOD="--warmup 60 --prefill 512 --num-blocks 64"

case_() {  # case_ NAME RECORD-ARGS... -- WORKLOAD-ARGS...
  local name=$1; shift
  echo "== $name"
  local t0=$SECONDS
  $REC -o "$OUTDIR/$name.kvdump" "$@" > "$OUTDIR/$name.log" 2>&1
  echo "record exit $? in $((SECONDS - t0)) s"
  grep -v "^kvconv-tracer: wrote" "$OUTDIR/$name.log" | tail -n 12 | cut -c1-400
  for d in "$OUTDIR/$name".*kvdump "$OUTDIR/$name.kvdump"; do
    [ -f "$d" ] && python3 native/workloads/check_dump.py "$d" | cut -c1-600
  done
}

case_ fork-sigterm -- python3 $WL --start fork --end sigterm -- --replays 7
case_ fork-normal -- python3 $WL --start fork --end normal -- --replays 7
case_ spawn-sigkill-flood --device-capacity 262144 -- python3 $WL --start spawn --end sigkill -- $FLOOD --replays 9
case_ spawn-sigkill-graph --device-capacity 262144 --capture-range graph -- \
  python3 $WL --start spawn --end sigkill -- $FLOOD --replays 9
case_ range-profiler --capture-range profiler -- python3 $WL --start spawn --end normal -- $FLOOD --replays 9 --profiler-range
case_ range-launches --capture-range launches:2400 -- python3 $WL --start fork --end normal -- --warmup 60 --replays 9
case_ range-signal --capture-range signal -- python3 $WL --start spawn --end normal -- --warmup 3 --replays 9 --signal-range
case_ default-capacity-flood -- python3 $WL --start spawn --end sigkill -- $FLOOD --replays 9
ls -la "$OUTDIR"
