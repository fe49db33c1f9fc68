#!/bin/bash
# The write-address canary on the GPU (issue 16): build, the four planted cases through `kvconv record`, the
# overhead of write recording beside the block-enter-only tracer.   native/scripts/gpu_writes.sh OUTDIR
set -u
OUTDIR=${1:?}; ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"; mkdir -p "$OUTDIR/w"
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site KVCONV_TRACER_LIB=$ROOT/native/build/libkvconv_tracer.so
pip install -q --target /tmp/site .whl/*.whl > "$OUTDIR/w/pip.log" 2>&1
make -C native -j16 ARCHS=90 tracer > "$OUTDIR/w/build.log" 2>&1 || { tail -40 "$OUTDIR/w/build.log"; exit 1; }
LIB=$ROOT/native/build/libkvconv_tracer.so; WL=native/workloads/kv_writes.py
for p in none pad-minus-one stale-pad wrong-page; do
  echo "== plant $p"
  KVCONV_WRITES=1 timeout -k 5 120 python3 -m kvconv record -o "$OUTDIR/w/writes-$p.kvdump" -- \
    python3 $WL --plant "$p" --json "$OUTDIR/w/writes-$p.json" > "$OUTDIR/w/run-$p.log" 2>&1
  echo "record exit $?"; tail -c 1500 "$OUTDIR/w/run-$p.log"
done
echo "== overhead: kv_writes 40 layers x 8 rows, 300 timed replays (untraced, enter only, enter + writes)"
for cfg in untraced enter writes; do
  case $cfg in
    untraced) env -u CUDA_INJECTION64_PATH python3 $WL --layers 40 --rows 8 --requests 8 --bench 300 --json "$OUTDIR/w/bench-$cfg.json" ;;
    enter) CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=/tmp/b-$cfg.kvdump python3 $WL --layers 40 --rows 8 --requests 8 --bench 300 --json "$OUTDIR/w/bench-$cfg.json" ;;
    writes) KVCONV_WRITES=1 CUDA_INJECTION64_PATH=$LIB KVCONV_OUTPUT=/tmp/b-$cfg.kvdump python3 $WL --layers 40 --rows 8 --requests 8 --bench 300 --json "$OUTDIR/w/bench-$cfg.json" ;;
  esac > "$OUTDIR/w/bench-$cfg.log" 2>&1
  echo "$cfg exit $? $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['bench'])" "$OUTDIR/w/bench-$cfg.json" 2>&1)"
  tail -n 3 "$OUTDIR/w/bench-$cfg.log" | cut -c1-400
done
echo "== overhead: bench/gpu_tracer_cost.py --inner (light, engine-small), untraced / enter / enter + writes"
K=reshape_and_cache_flash_kernel,index_copy_kernel_impl
for cfg in untraced enter writes; do
  case $cfg in
    untraced) env -u CUDA_INJECTION64_PATH timeout -k 5 100 python3 bench/gpu_tracer_cost.py --inner --works light engine-small --iters 50 ;;
    enter) CUDA_INJECTION64_PATH=$LIB KVCONV_KERNELS=$K KVCONV_OUTPUT=/tmp/c-$cfg.kvdump timeout -k 5 100 python3 bench/gpu_tracer_cost.py --inner --works light engine-small --iters 50 ;;
    writes) KVCONV_WRITES=1 CUDA_INJECTION64_PATH=$LIB KVCONV_KERNELS=$K KVCONV_OUTPUT=/tmp/c-$cfg.kvdump timeout -k 5 100 python3 bench/gpu_tracer_cost.py --inner --works light engine-small --iters 50 ;;
  esac > "$OUTDIR/w/cost-$cfg.log" 2>&1
  echo "$cfg exit $?"; tail -n 2 "$OUTDIR/w/cost-$cfg.log" | cut -c1-1500
done
python3 -c "import sys,glob; from kvconv.format import dump
for p in sorted(glob.glob(\"/tmp/[bc]-writes*.kvdump\")):
    d = dump.open(p); print(p, {k: len(d.records(k)) for k in (\"slot_write\", \"write_step\", \"device_event\", \"graph_node\")}, \"drops\", d.drops(\"slot_write\"))"
echo "== done"
