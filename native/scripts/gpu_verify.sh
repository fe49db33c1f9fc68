#!/bin/bash
# End-to-end check on a GPU machine, through the user-facing commands: `kvconv record` on both graph shapes (block
# enter, and enter+exit), reconcile, validate, the emitters, and the GPU-marked tests.
#   native/scripts/gpu_verify.sh OUTDIR           (run from the repository root; native/build prebuilt or buildable)
# Python packages the device image lacks travel as wheels in .whl/ (see the device README); they are installed
# into /tmp/site when present.
set -u
OUTDIR=${1:?}; ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"; mkdir -p "$OUTDIR"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$ROOT
else
  export PYTHONPATH=$ROOT
fi
export PYTHONUNBUFFERED=1
K="python3 -m kvconv"
WL=native/workloads/kv_decode.py
{
nvidia-smi -L
make -C native tracer 2>&1 | tail -2
for s in 1 2; do
  echo "== record, streams=$s"
  $K record --no-build -o "$OUTDIR/rec-s$s.kvdump" -- python3 $WL --streams $s; echo "record rc=$?"
  $K reconcile "$OUTDIR/rec-s$s.kvdump"; echo "reconcile rc=$?"
done
echo "== record, streams=2, block enter+exit"
$K record --no-build --events enter,exit -o "$OUTDIR/rec-exit.kvdump" -- python3 $WL --streams 2; echo "record rc=$?"
$K info "$OUTDIR/rec-exit.kvdump"
$K reconcile "$OUTDIR/rec-exit.kvdump" | tail -3
echo "== emitters on both"
$K perfetto "$OUTDIR/rec-s1.kvdump" "$OUTDIR/rec-s2.kvdump" -o "$OUTDIR/both.pftrace"; echo "perfetto rc=$?"
$K chrome "$OUTDIR/rec-exit.kvdump" -o /tmp/exit.json; echo "chrome rc=$?"
echo "== gpu tests"
timeout -k 5 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native.py tests/test_canary_gpu.py 2>&1 | tail -6
echo "== done"
} > "$OUTDIR/verify.log" 2>&1
tail -c 9000 "$OUTDIR/verify.log"
