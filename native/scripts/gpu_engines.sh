#!/bin/bash
# vLLM and SGLang themselves under kvconv record on an H200 (issues 39, 40, 44), one step per device call; the call
# sequence (what each carries) is in native/engines/README.md, "The next device session".
#   gpu_engines.sh stage NAME            copy the carried parts of bundle NAME (.work/stage/NAME/) to /tmp/kvstage/NAME
#   gpu_engines.sh setup NAME            kvconv's wheels (.whl) into /tmp/site, the tracer (carried native/build, or
#                                        built for sm_90), the plugins' entry points for the checkout (/tmp/kvplug),
#                                        and bundle NAME unpacked once all its parts are staged
#   gpu_engines.sh sglang-session OUT    the SGLang plugin's session on CUDA tensors in SGLang's pool layout, no
#                                        SGLang: location canary, page = slot // 256, clean and one planted write
#   gpu_engines.sh sglang-seed OUT       the second seed's batch-8 run traced (--capture-range graph, the harness's
#                                        drain end: record's exit is issue 44's done-when), then the untraced cost
#                                        process: 2 rounds, 2 more under torch.profiler
#   gpu_engines.sh sglang-cost OUT       2 rounds traced; 2 rounds traced with the canaries (plugin, --writes,
#                                        location canary)
#   gpu_engines.sh sglang-plants OUT P.. the SGLang plugin's clean run and plants P (clean loc-shift freed-reuse
#                                        outside-write two-stream), validate of each dump, kvconv diff clean vs each
#   gpu_engines.sh vllm OUT              the first seed's run with vLLM's default child process, traced; throughput
#   gpu_engines.sh vllm-plants OUT P..   the vLLM plugin (--writes --engine vllm): clean run and plants P
#   gpu_engines.sh vllm-cost OUT         untraced 2 rounds + 2 under torch.profiler; traced 2; canaries 2
#   gpu_engines.sh collect DEST [TAG]    logs and probe dumps of /tmp/eng in DEST/TAG-logs.tar.xz, tracer dumps xz'd
# OUT is /tmp/eng in the README's sequence: it outlives a call while the machine stays warm (a plant run's diff
# against the clean run of an earlier call), and `collect $OUT` ends each call.
# Every engine process is bounded by `timeout` (T seconds, default 300) so that one hung run does not take the call.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
export PYTHONUNBUFFERED=1 KVCONV_TRACER_LIB=$ROOT/native/build/libkvconv_tracer.so HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The checkout's kvconv first (the engine processes import the plugins from it), its entry points (/tmp/kvplug), the
# CLI's missing wheels (/tmp/site: jsonschema & co, for every `python3 -m kvconv`)
KVPLUG=${KVPLUG:-/tmp/kvplug}
KV=$ROOT:$KVPLUG:/tmp/site
export PYTHONPATH=$KV
REC="python3 -m kvconv record"
CACHE=/tmp/vllm-cache
T=${T:-300}
TPUT="--requests 32 --tokens 128 --rounds 2"
WCAP=4194304  # the cost runs' write table (~13k tokens x 80 caches of records; 72 B an entry: 288 MiB)
STPUT="$TPUT --pool 32768"  # SGLang: one pool size for its three cost runs (the canary's clones: 80 x 64 MiB)

stage() {
  mkdir -p "/tmp/kvstage/$1"
  cp ".work/stage/$1/"*.part* ".work/stage/$1/SHA256SUMS" "/tmp/kvstage/$1/" && ls -la "/tmp/kvstage/$1"
}

plugin_entry_points() {  # what `pip install` of the checkout would declare (pyproject.toml), without building it
  local d=$KVPLUG/kvconv_engine_plugins-0.0.dist-info
  mkdir -p "$d"
  printf 'Metadata-Version: 2.1\nName: kvconv-engine-plugins\nVersion: 0.0\n' > "$d/METADATA"
  printf '[vllm.general_plugins]\nkvconv = kvconv.capture.engines.vllm:register\n\n' > "$d/entry_points.txt"
  printf '[sglang.srt.plugins]\nkvconv = kvconv.capture.engines.sglang:register\n' >> "$d/entry_points.txt"
}

site() {  # the CLI's wheels (.whl) into /tmp/site, once per machine
  if [ ! -f /tmp/site/.done ] && ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && touch /tmp/site/.done
  fi
}

setup() {
  site
  if [ ! -f native/build/libkvconv_tracer.so ]; then
    make -C native -j16 ARCHS=90 tracer > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
  fi
  plugin_entry_points
  [ -f "/tmp/$1/.complete" ] || bash native/engines/unpack.sh "/tmp/kvstage/$1/$1" "/tmp/$1" || exit 1
  echo "setup $1: ok"
}

timed() {  # timed NAME LOGDIR CMD...: run (bounded), keep its output, print exit status, seconds and the last lines
  local name=$1 dir=$2 t0=$SECONDS
  shift 2
  timeout -k 20 "$T" "$@" > "$dir/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - t0)) s"
  grep -v "^kvconv-tracer: wrote\|WARNING\|warn(\|Compiling num tokens\|Capturing" "$dir/$name.log" | tail -n 8 |
    cut -c1-400
}

sglang_env() {
  export PYTHONPATH=$KV:/tmp/sglang/site LD_LIBRARY_PATH=/tmp/sglang/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

sglang-session() {  # the plugin's session and location canary on CUDA without SGLang (page = slot // 256)
  site
  mkdir -p "$1"
  timed sglang-session "$1" python3 native/workloads/sglang_plants/session_check.py "$1"
}

sglang-seed() {
  local out=$1 wl=native/workloads/sglang_seed.py
  mkdir -p "$out"
  sglang_env
  timed sglang-seed "$out" $REC -k store_kvcache --capture-range graph -o "$out/sglang-seed.kvdump" -- python3 $wl
  local sched
  sched=$(ls -S "$out"/sglang-seed.pid*.kvdump 2> /dev/null | head -1)  # the scheduler's: the largest
  if [ -n "$sched" ]; then
    python3 -m kvconv info "$sched" 2>&1 | grep -i -A3 "capture\|written" | head -n 12 | cut -c1-300
    python3 -m kvconv reconcile "$sched" 2>&1 | tail -n 4 | cut -c1-300
  fi
  timed sglang-cost-untraced "$out" python3 $wl $STPUT --torch-profile /tmp/sglang-prof
  du -sh /tmp/sglang-prof 2> /dev/null
}

sglang-cost() {
  local out=$1 wl=native/workloads/sglang_seed.py
  mkdir -p "$out"
  sglang_env
  timed sglang-cost-traced "$out" $REC -k store_kvcache --capture-range graph --no-validate \
    -o /tmp/sglang-tput.kvdump -- python3 $wl $STPUT
  KVCONV_CANARY=1 KVCONV_PROBE_OUTPUT=/tmp/sglang-tput.probe.kvdump KVCONV_WRITE_CAPACITY=$WCAP \
    timed sglang-cost-canaries "$out" \
    $REC -k store_kvcache --writes --engine sglang --capture-range profiler --no-validate \
    -o /tmp/sglang-canary.kvdump -- python3 $wl $STPUT
}

sglang-plants() {
  local out=$1 p=native/workloads/sglang_plants
  shift
  mkdir -p "$out"
  sglang_env
  for plant in "$@"; do
    local name=$plant
    [ "$plant" = clean ] && plant=""
    KVCONV_PLANT=$plant KVCONV_CANARY=1 PYTHONPATH=$p:$PYTHONPATH timed "sglang-plant-$name" "$out" \
      $REC -k store_kvcache --writes --engine sglang --capture-range profiler -o "$out/sglang-plant-$name.kvdump" \
      -- python3 $p/run.py --probe-out "$out/sglang-plant-$name.probe.kvdump"
    python3 -m kvconv validate "$out"/sglang-plant-$name*.kvdump 2>&1 | grep -v "^warning" | tail -n 8 | cut -c1-400
  done
  local ref
  ref=$(ls -S "$out"/sglang-plant-clean.pid*.kvdump 2> /dev/null | head -1)  # the largest: the scheduler's
  for plant in "$@"; do
    [ "$plant" = clean ] || [ -z "$ref" ] && continue
    echo "== kvconv diff clean $plant"
    python3 -m kvconv diff "$ref" "$(ls -S "$out"/sglang-plant-$plant.pid*.kvdump | head -1)" 2>&1 | tail -n 12 |
      cut -c1-400
  done
}

vllm_env() {
  export PYTHONPATH=$KV:/tmp/vllm/site VLLM_CACHE_ROOT=$CACHE
}

vllm() {
  local out=$1 wl=native/workloads/vllm_seed.py
  mkdir -p "$out"
  vllm_env
  timed vllm-seed "$out" $REC -k reshape_and_cache_flash_kernel -o "$out/vllm-seed.kvdump" -- \
    python3 $wl --compile-cache $CACHE
}

vllm-plants() {
  local out=$1 p=native/workloads/vllm_plants
  shift
  mkdir -p "$out"
  vllm_env
  for plant in "$@"; do
    local name=$plant
    [ "$plant" = clean ] && plant=""
    KVCONV_PLANT=$plant KVCONV_VALUE=1 PYTHONPATH=$p:$PYTHONPATH timed "plant-$name" "$out" \
      $REC -k reshape_and_cache_flash_kernel --writes --engine vllm \
      -o "$out/plant-$name.kvdump" -- python3 $p/run.py --probe-out "$out/plant-$name.probe.kvdump"
    python3 -m kvconv validate "$out"/plant-$name*.kvdump 2>&1 | grep -v "^warning" | tail -n 6 | cut -c1-400
  done
}

vllm-cost() {
  local out=$1 wl=native/workloads/vllm_seed.py
  mkdir -p "$out"
  vllm_env
  timed vllm-cost-untraced "$out" python3 $wl --compile-cache $CACHE $TPUT --torch-profile /tmp/vllm-prof
  timed vllm-cost-traced "$out" $REC -k reshape_and_cache_flash_kernel --no-validate -o /tmp/vllm-tput.kvdump -- \
    python3 $wl --compile-cache $CACHE $TPUT
  KVCONV_VALUE=1 KVCONV_PROBE_OUTPUT=/tmp/vllm-tput.probe.kvdump KVCONV_WRITE_CAPACITY=$WCAP \
    timed vllm-cost-canaries "$out" \
    $REC -k reshape_and_cache_flash_kernel --writes --engine vllm --no-validate -o /tmp/vllm-canary.kvdump -- \
    python3 $wl --compile-cache $CACHE $TPUT
}

collect() {  # collect DEST [TAG]: what comes back from a call (8 files of <= 16 MiB): the logs and probe dumps in one
  # tar.xz, then each tracer dump of the run dir xz-compressed while it fits (the rest stays in /tmp/eng)
  local dest=$1 tag=${2:-run} n=1 f
  mkdir -p "$dest"
  (cd /tmp/eng && tar -cJf "$dest/$tag-logs.tar.xz" --ignore-failed-read ./*.log ./*.probe.kvdump 2> /dev/null)
  for f in $(ls -S /tmp/eng/*.kvdump 2> /dev/null | grep -v '\.probe\.kvdump$' | tac); do
    [ $n -ge 8 ] && break
    xz -T0 -6 -c "$f" > "$dest/$(basename "$f").xz"
    if [ "$(stat -c %s "$dest/$(basename "$f").xz")" -gt $((15 << 20)) ]; then
      rm "$dest/$(basename "$f").xz"
      echo "collect: $(basename "$f") left in /tmp/eng (over 15 MiB compressed)"
    else
      n=$((n + 1))
    fi
  done
  ls -la "$dest"
}

cmd=${1:?usage: gpu_engines.sh stage|setup|sglang-session|sglang-seed|sglang-cost|sglang-plants|vllm|vllm-plants|vllm-cost|collect ...}
shift
"$cmd" "$@"
