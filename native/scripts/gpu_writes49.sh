#!/bin/bash
# Issue 49 on the GPU: SGLang's store_kvcache<2048l, 4, true, long> (native/workloads/store_kvcache49.cu: the kernel
# of SGLang's jit_kernel kvcache.cuh, PDL launches, an eager prefill and a replayed decode graph, 16 MHA caches of page
# size 1 registered with the tracer) under `kvconv record --writes`, ended cleanly and by SIGKILL; then the same
# killed run with the bare injection, to see the live file as the process left it (its size) before sealing it.
# native/workloads/check_writes49.py asserts every block recorded its two slots and the write canary is clean.
#   native/scripts/gpu_writes49.sh OUTDIR     OUTDIR gets build.log, run.log, {clean,kill,live}.kvdump.xz
set -u
OUTDIR=${1:?}; ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"; mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site KVCONV_TRACER_LIB=$ROOT/native/build/libkvconv_tracer.so
LIB=$KVCONV_TRACER_LIB; W=/tmp/w49; rm -rf $W; mkdir -p $W
if ls .whl/*.whl > /dev/null 2>&1; then pip install -q --target /tmp/site .whl/*.whl > $W/pip.log 2>&1; fi
make -C native -j16 ARCHS=90 tracer > "$OUTDIR/build.log" 2>&1 || { tail -40 "$OUTDIR/build.log"; exit 1; }
nvcc -O2 -std=c++17 -arch=sm_90 -o $W/skv49 native/workloads/store_kvcache49.cu -ldl || exit 1
$W/skv49 clean > $W/expect.json || exit 1   # untraced: what it launches
echo "== expect $(cat $W/expect.json)"
for mode in clean kill; do
  timeout -k 5 120 python3 -m kvconv record --writes -k store_kvcache -o $W/$mode.kvdump -- $W/skv49 $mode \
    > $W/record-$mode.log 2>&1
  echo "== record $mode: exit $?"; grep -E "slot-write|warning|error|sealed|INVALID|valid" $W/record-$mode.log | head -8
  (echo "==== record $mode"; cat $W/record-$mode.log) >> "$OUTDIR/run.log"
done
KVCONV_WRITES=1 KVCONV_KERNELS=store_kvcache KVCONV_OUTPUT=$W/live.kvdump CUDA_INJECTION64_PATH=$LIB \
  timeout -k 5 120 $W/skv49 kill > $W/bare-kill.log 2>&1
echo "== bare kill: exit $? (137: SIGKILL)"
(echo "==== bare kill"; cat $W/bare-kill.log) >> "$OUTDIR/run.log"
ls -ls $W/*.kvdump
python3 native/workloads/check_writes49.py $W/expect.json $W/clean.kvdump $W/kill.kvdump $W/live.kvdump
echo "== check exit $?"
for f in clean kill live; do xz -T4 -c $W/$f.kvdump > "$OUTDIR/$f.kvdump.xz"; done
echo "== done"
