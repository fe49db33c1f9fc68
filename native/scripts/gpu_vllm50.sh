#!/bin/bash
# Issue 50 on a lent H100/H200: `vllm serve` traced and ended by a signal, the plants and the published bugs' shapes
# as fixtures, the cost table. One step per device call, back to back while the machine is warm; the call sequence
# (what each carries) is in native/engines/README.md, "Device session of issue 50".
#   gpu_vllm50.sh stage build|vllm     copy the carried native/build (to /tmp/kvbuild) or vLLM parts (to /tmp/kvstage)
#   gpu_vllm50.sh setup                .whl into /tmp/site, the tracer found (or built), kvconv's plugin entry points
#                                      (/tmp/kvplug), the vLLM bundle unpacked once all its parts are staged
#   gpu_vllm50.sh serve-sigint         `vllm serve` under record --writes --engine vllm --capture-range profiler,
#   gpu_vllm50.sh serve-sigterm        KVCONV_VALUE=1; 32 completions at concurrency 8 between /start_profile and
#                                      /stop_profile; ended by SIGINT to the job's process group (a terminal's
#                                      Ctrl-C) / by SIGTERM to record alone (kill PID); sigterm: KVCONV_CANARY=1 too
#   gpu_vllm50.sh plants               one run.py process with the plants stale-block, double-alloc and wrong-value
#   gpu_vllm50.sh bugs                 one run.py process with the shapes of vllm#38719, #43810, #45357, the location
#                                      canary on and -k index_put_kernel_impl beside reshape_and_cache_flash_kernel
#   gpu_vllm50.sh cost                 tokens/s at batch 8 and 32, ROUNDS (5) cycles each, three engine processes:
#                                      traced, untraced with torch.profiler rounds between, canaries; the table
#   gpu_vllm50.sh collect OUT TAG NAME..  the logs of runs NAME in OUT/TAG-logs.tar.xz, their .json/.plants.txt, their
#                                      tracer and probe dumps as OUT/<dump>.zst (the fixtures' names); 8 files at most
# Runs write to /tmp/v50 (outlives a call while the machine stays warm). Every engine process is bounded by
# `timeout` (T seconds, default 420).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
RUN=${V50_RUN:-/tmp/v50}
LIB=$ROOT/native/build/libkvconv_tracer.so
[ -f "$LIB" ] || LIB=/tmp/kvbuild/libkvconv_tracer.so
export KVCONV_TRACER_LIB=$LIB PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
KVPLUG=/tmp/kvplug
CACHE=/tmp/vllm-cache
VLLM_SITE=${VLLM_SITE:-/tmp/vllm/site}  # the unpacked bundle (a stand-in for CPU tests)
export PYTHONPATH=$ROOT:$KVPLUG:/tmp/site:$VLLM_SITE VLLM_CACHE_ROOT=$CACHE
T=${T:-420}
K="-k reshape_and_cache_flash_kernel"
WCAP=4194304  # write-table entries (72 B each: 288 MiB): the plants' warm-up writes and the cost rounds fit
REC="python3 -m kvconv record"
# SRC DST: DST.zst (zstd -19, as fixtures are kept) or, without zstandard (the .whl not carried), DST.xz (kvconv reads
# both); prints the file written
SQUEEZE='import sys
data = open(sys.argv[1], "rb").read()
try:
    import zstandard
    out, data = sys.argv[2] + ".zst", zstandard.ZstdCompressor(level=19, threads=-1).compress(data)
except ImportError:
    import lzma
    out, data = sys.argv[2] + ".xz", lzma.compress(data, preset=9)
open(out, "wb").write(data)
print(out)'
P=native/workloads/vllm_plants

stage() {
  if [ "$1" = build ]; then
    [ -f native/build/libkvconv_tracer.so ] && rm -rf /tmp/kvbuild && cp -r native/build /tmp/kvbuild
    ls -la /tmp/kvbuild | head -20
    return
  fi
  mkdir -p "/tmp/kvstage/$1"
  cp ".work/stage/$1/"*.part* ".work/stage/$1/SHA256SUMS" "/tmp/kvstage/$1/" && ls -la "/tmp/kvstage/$1"
}

plugin_entry_points() {  # what `pip install` of the checkout declares (pyproject.toml), without building it
  local d=$KVPLUG/kvconv_engine_plugins-0.0.dist-info
  mkdir -p "$d"
  printf 'Metadata-Version: 2.1\nName: kvconv-engine-plugins\nVersion: 0.0\n' > "$d/METADATA"
  printf '[vllm.general_plugins]\nkvconv = kvconv.capture.engines.vllm:register\n\n' > "$d/entry_points.txt"
  printf '[sglang.srt.plugins]\nkvconv = kvconv.capture.engines.sglang:register\n' >> "$d/entry_points.txt"  # as gpu_engines.sh
}

setup() {
  if [ ! -f /tmp/site/.done ] && ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && touch /tmp/site/.done
  fi
  if [ ! -f "$LIB" ]; then
    make -C native -j16 ARCHS=90 tracer > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
    LIB=$ROOT/native/build/libkvconv_tracer.so
  fi
  plugin_entry_points
  [ -f /tmp/vllm/.complete ] || bash native/engines/unpack.sh /tmp/kvstage/vllm/vllm /tmp/vllm || exit 1
  python3 -c "import vllm, kvconv, jsonschema; print('setup: vllm', vllm.__version__, 'tracer $LIB')"
}

timed() {  # timed NAME CMD...: bounded run, its output in RUN/NAME.log; exit status, seconds, the last lines
  local name=$1 t0=$SECONDS
  shift
  timeout -k 30 "$T" "$@" > "$RUN/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - t0)) s"
  grep -v "^kvconv-tracer: wrote\|WARNING\|warn(\|Compiling num tokens\|Capturing\|it/s\]" "$RUN/$name.log" |
    tail -n 6 | cut -c1-400
  return $rc
}

judge() {  # judge NAME: validate every dump of run NAME (the tracer's and the probe's), the plants' own words
  local f
  for f in "$RUN/$1"*.kvdump; do
    [ -f "$f" ] || continue
    echo "-- validate $(basename "$f")"
    python3 -m kvconv validate "$f" 2>&1 | grep -v "^warning" | tail -n 12 | cut -c1-600
    echo "   exit ${PIPESTATUS[0]}"
  done
  grep -h "kvconv plant \|kvconv vllm plugin: \|shutdown\] \|Asynchronous scheduling\|async_scheduling=" \
    "$RUN/$1.log" 2> /dev/null | grep -v "armed in" | sort -u | head -n 20 | cut -c1-400
  grep -h "^kvconv plant .*: step\|^kvconv plant .*: block\|^kvconv plant .*: layer\|^kvconv plant .*: the dummy" \
    "$RUN/$1.log" > "$RUN/$1.plants.txt" 2> /dev/null  # what each plant did: the fixture tests read it
  grep -h '^{"signal"' "$RUN/$1.log" > "$RUN/$1.json" 2> /dev/null  # the serve driver's line
  find "$RUN" -maxdepth 1 -name "$1.*" -empty -delete
}

serve() {  # serve NAME INT|TERM
  mkdir -p "$RUN" && rm -f "$RUN/$1"*
  KVCONV_VALUE=1 KVCONV_WRITE_CAPACITY=$WCAP KVCONV_PROBE_OUTPUT=$RUN/$1.probe.kvdump \
    timed "$1" python3 native/workloads/vllm_serve.py --signal "$2" \
    --requests 32 --tokens 32 --concurrency 8 -- $REC $K --writes --engine vllm --capture-range profiler \
    -o "$RUN/$1.kvdump" --
  judge "$1"
  python3 -m kvconv info "$RUN/$1.kvdump" 2>&1 | grep -i -A2 "capture\|verdict" | head -n 10 | cut -c1-300
}

serve-sigint() { serve serve-sigint INT; }
# the location canary too (a clean baseline for it: 40 copies of 200 MiB, 8 GiB, beside the engine's ~41 GB)
serve-sigterm() { KVCONV_CANARY=1 serve serve-sigterm TERM; }

plant_run() {  # plant_run NAME PLANTS [extra record args]: run.py with the plants, all canaries
  local name=$1 plants=$2
  shift 2
  mkdir -p "$RUN" && rm -f "$RUN/$name"*
  PYTHONPATH=$P:$PYTHONPATH KVCONV_PLANT=$plants KVCONV_VALUE=1 KVCONV_WRITE_CAPACITY=$WCAP timed "$name" \
    $REC $K "$@" --writes --engine vllm -o "$RUN/$name.kvdump" -- \
    python3 $P/run.py --probe-out "$RUN/$name.probe.kvdump"
  judge "$name"
}

plants() { plant_run plants stale-block,double-alloc,wrong-value; }

bugs() {
  KVCONV_CANARY=1 plant_run bugs dummy-slot-zero,pad-index-write,stale-write -k index_put_kernel_impl
}

cost() {  # three engine processes, in this order: traced, untraced with torch.profiler interleaved, canaries
  mkdir -p "$RUN" && rm -f "$RUN"/cost-*
  local wl="native/workloads/vllm_cost.py --compile-cache $CACHE --rounds ${ROUNDS:-5}"
  timed cost-traced $REC $K --no-validate -o /tmp/cost-traced.kvdump --force -- python3 $wl --config traced
  timed cost-untraced python3 $wl --config untraced --torch-profile /tmp/vllm-prof
  KVCONV_VALUE=1 KVCONV_WRITE_CAPACITY=$WCAP KVCONV_PROBE_OUTPUT=/tmp/cost-canaries.probe.kvdump timed cost-canaries \
    $REC $K --writes --engine vllm --no-validate -o /tmp/cost-canaries.kvdump --force -- \
    python3 $wl --config canaries
  python3 native/workloads/vllm_cost.py --table "$RUN"/cost-*.log | tee "$RUN/cost-table.md"
}

collect() {  # collect OUT TAG NAME..: runs NAME's logs (OUT/TAG-logs.tar.xz), their .plants.txt / .json, and their
  # dumps as OUT/<dump>.zst: 8 files a call, so keep to two runs (a .txt or .json, a tracer dump, a probe dump each)
  local dest=$1 tag=$2 f name
  shift 2
  mkdir -p "$dest"
  (cd "$RUN" && tar -cJf "$dest/$tag-logs.tar.xz" --ignore-failed-read $(for name in "$@"; do echo "./$name"*.log; done) \
    ./*.md 2> /dev/null)
  cp "$RUN"/*.md "$dest/" 2> /dev/null  # the cost table
  for name in "$@"; do
    cp "$RUN/$name".plants.txt "$RUN/$name".json "$dest/" 2> /dev/null
    for f in $(ls -S "$RUN/$name"*.kvdump 2> /dev/null | tac); do
      [ "$(ls "$dest" | wc -l)" -ge 8 ] && { echo "collect: $(basename "$f") left in $RUN (8 files a call)"; continue; }
      local z
      z=$(python3 -c "$SQUEEZE" "$f" "$dest/$(basename "$f")")
      if [ "$(stat -c %s "$z")" -gt $((15 << 20)) ]; then
        rm "$z"
        echo "collect: $(basename "$f") left in $RUN (over 15 MiB compressed)"
      fi
    done
  done
  ls -la "$dest"
}

cmd=${1:?usage: gpu_vllm50.sh stage|setup|serve-sigint|serve-sigterm|plants|bugs|cost|collect ...}
shift
"$cmd" "$@"
