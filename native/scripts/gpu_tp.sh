#!/bin/bash
# Tensor-parallel-shaped traced run (issue 8): torchrun, one rank per GPU, each rank traced into its own dump by
# `kvconv record` (the injection variables are inherited by torchrun's children), then reconcile per rank and one
# Perfetto trace of all ranks.
#   bash native/scripts/gpu_tp.sh OUTDIR [NPROC] [tp_decode args...]   (native/build prebuilt or buildable)
# HANG_S (default 180) bounds the traced run: a run that does not exit by then is reported as "HANG" and fails.
# Writes OUTDIR/tp.log (all of it), OUTDIR/record.log (the traced run), OUTDIR/rank<R>.kvdump (renamed from the tracer's tp-<pid>.kvdump via each rank's JSON
# summary), OUTDIR/rank<R>.reconcile.txt and OUTDIR/tp.pftrace. Exit status: 0 only if every step passed.
set -u
OUTDIR=${1:?usage: gpu_tp.sh OUTDIR [NPROC] [tp_decode args...]}; NPROC=${2:-2}; shift 2 2>/dev/null || shift $#
WL_ARGS="$*"; HANG_S=${HANG_S:-180}; hung=0
ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"; mkdir -p "$OUTDIR"; OUTDIR=$(cd "$OUTDIR" && pwd)
# NVLink multicast stays off (device README / KINDS.md): never remove these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$ROOT
else
  export PYTHONPATH=$ROOT
fi
K="python3 -m kvconv"
LOG=$OUTDIR/tp.log
fail=0
exec > >(tee "$LOG") 2>&1   # everything below goes to the screen and to tp.log
nvidia-smi -L
echo "== env: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS NPROC=$NPROC"
[ -f native/build/libkvconv_tracer.so ] || make -C native tracer 2>&1 | tail -2
rm -f "$OUTDIR"/tp-*.kvdump "$OUTDIR"/rank*.kvdump
echo "== record: torchrun --nproc_per_node $NPROC tp_decode.py (hang limit ${HANG_S}s)"
timeout -k 10 "$HANG_S" $K record --no-build -o "$OUTDIR/tp-%p.kvdump" -- \
  python3 -m torch.distributed.run --standalone --nproc_per_node "$NPROC" native/workloads/tp_decode.py $WL_ARGS \
  2>&1 | tee "$OUTDIR/record.log"
rc=${PIPESTATUS[0]}; echo "record rc=$rc"
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  # A hang is its own failure: the workload did not end within HANG_S, and the dumps (if any) were written by
  # the tracer's SIGTERM handler, not at process exit.
  echo "HANG: the traced run did not exit within ${HANG_S}s (timeout rc=$rc)"; fail=1; hung=1
elif [ "$rc" -ne 0 ]; then
  fail=1
fi
grep -q '\[sigterm\]' "$OUTDIR/record.log" && { echo "a dump was written by the SIGTERM handler, not at exit"; fail=1; }
echo "== dumps: $(cd "$OUTDIR" && ls tp-*.kvdump 2>/dev/null | tr '\n' ' ')"
ranks=()
while read -r r p; do
  if [ -f "$OUTDIR/tp-$p.kvdump" ]; then
    mv "$OUTDIR/tp-$p.kvdump" "$OUTDIR/rank$r.kvdump"; ranks+=("$OUTDIR/rank$r.kvdump"); echo "rank $r: pid $p -> rank$r.kvdump"
  else
    echo "rank $r: pid $p wrote no dump"; fail=1
  fi
done < <(grep -o '{.*"workload": "tp_decode".*}' "$OUTDIR/record.log" | python3 -c '
import json, sys
for l in sys.stdin:
    d = json.loads(l)
    print(d["rank"], d["pid"])' | sort -n)
[ ${#ranks[@]} -eq "$NPROC" ] || { echo "expected $NPROC rank dumps, have ${#ranks[@]}"; fail=1; }
for f in "$OUTDIR"/tp-*.kvdump; do [ -f "$f" ] && echo "not a rank's dump (launcher?): $f"; done
for f in "${ranks[@]}"; do
  echo "== reconcile $(basename "$f")"
  $K reconcile "$f" > "${f%.kvdump}.reconcile.txt"; rc=$?
  cat "${f%.kvdump}.reconcile.txt"; echo "reconcile rc=$rc"; [ $rc -eq 0 ] || fail=1
done
if [ ${#ranks[@]} -gt 0 ]; then
  echo "== perfetto ${#ranks[@]} rank dump(s)"
  $K perfetto "${ranks[@]}" -o "$OUTDIR/tp.pftrace"; rc=$?; echo "perfetto rc=$rc"; [ $rc -eq 0 ] || fail=1
fi
echo "== done fail=$fail hung=$hung"
exit $fail
