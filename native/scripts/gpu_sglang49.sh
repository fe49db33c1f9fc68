#!/bin/bash
# Issue 49 on the device: SGLang 0.5.17 as its users run it, beside SGLang's own KV canary. One step per call (or a
# few chained); the call sequence (carry, command, duration, what comes back) is in native/engines/README.md,
# "Device session of issue 49". Every run dir is under D (/tmp/eng49: it outlives a call while the machine is warm).
#   gpu_sglang49.sh stage                  copy the carried part(s) of .work/stage/sglang-0.5.17/ to /tmp/kvstage
#   gpu_sglang49.sh setup                  the CLI's wheels, the tracer (built if not carried), the plugins' entry
#                                          points, the bundle unpacked once all its parts are staged; versions
#   gpu_sglang49.sh script [BACKEND]       the user's plain script (sgl.Engine, generate, shutdown) recorded;
#                                          BACKEND triton (default) or flashinfer (its JIT compiles on first use)
#   gpu_sglang49.sh server INT|TERM        launch_server, 16 HTTP requests 8 at a time, ended by SIGINT / SIGTERM
#   gpu_sglang49.sh plants P..             sglang_plants (clean loc-shift freed-reuse outside-write two-stream)
#                                          with --writes --engine sglang and the location canary
#   gpu_sglang49.sh plants-kvc P..         the same with SGLang's --kv-canary log on: what its log says
#   gpu_sglang49.sh perturb M..            SGLang's perturbation modes (req_to_token real_kv_used
#                                          real_kv_unused_cache real_kv_post_forward), --kv-canary raise, recorded
#                                          by kvconv with its canaries
#   gpu_sglang49.sh cost [ROUNDS]          tokens/s of 32 requests x 128 tokens at batch 8, ROUNDS (5) rounds per
#                                          config: untraced, kvc-log, tracer, canaries, both (one engine each)
#   gpu_sglang49.sh collect DEST TAG       what D gained since the last collect (logs, every dump) in DEST/TAG.tar.xz
#                                          parts of 15 MiB (cat DEST/TAG.tar.xz.part* | tar -xJ)
# What each step prints: "== NAME: exit N in S s", the run's last lines, then for each dump of the run: `kvconv
# validate` (exit, error codes), its size on disk, and `record`'s own exit (a clean run: 0).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
NAME=sglang-0.5.17
D=${D:-/tmp/eng49}
T=${T:-300}
G=native/scripts/gpu_engines.sh
W=native/workloads
export PYTHONUNBUFFERED=1 KVCONV_TRACER_LIB=$ROOT/native/build/libkvconv_tracer.so HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$ROOT:/tmp/kvplug:/tmp/$NAME/site:/tmp/site  # SGLang's pins before the CLI's wheels
export LD_LIBRARY_PATH=/tmp/$NAME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
REC="python3 -m kvconv record -k store_kvcache"
mkdir -p "$D"

stage() { bash $G stage $NAME; }

setup() {
  bash $G setup $NAME || exit 1
  python3 -c "import sglang, transformers, torch, kvconv; print('sglang', sglang.__version__, 'transformers',
    transformers.__version__, 'torch', torch.__version__, torch.cuda.get_device_name())" 2>&1 | tail -n 3
}

timed() {  # timed NAME CMD...: bounded, output in D/NAME.log; exit status, seconds and the last lines
  local name=$1 t0=$SECONDS
  shift
  timeout -k 20 "$T" "$@" > "$D/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - t0)) s"
  grep -v "^kvconv-tracer: wrote\|WARNING\|warn(\|Compiling\|Capturing\|it/s\]" "$D/$name.log" | tail -n 10 |
    cut -c1-400
  return $rc
}

judge() {  # judge NAME: every dump of run NAME: verdict, error and warning codes, bytes on disk (du) and apparent
  local f
  for f in "$D/$1".*kvdump; do
    [ -f "$f" ] || continue
    python3 -m kvconv validate "$f" --json 2> /dev/null | python3 -c "
import json, sys
r = json.load(sys.stdin)['dumps'][0]['result']
inc = r.get('incidents') or r.get('findings') or []
code = lambda sev: sorted({x['code'] for x in inc if x['severity'] == sev})
print('  $(basename "$f"): verdict', r.get('verdict'), 'errors', code('error'), 'warnings', code('warning'))" 2>&1 |
      tail -n 2
    echo "    $(du -k "$f" | cut -f1) KiB on disk, $(stat -c %s "$f") bytes"
  done
  python3 -m kvconv validate "$D/$1".*kvdump 2> /dev/null | grep -E "^error|request|INCOMPLETE|VALID|INVALID" |
    head -n 14 | cut -c1-300
}

script() {  # script [triton|flashinfer]
  local be=${1:-triton} n=script
  [ "$be" = triton ] || n=script-$be
  rm -f "$D/$n".*
  timed "$n" $REC --writes --engine sglang --capture-range profiler -o "$D/$n.kvdump" -- \
    python3 $W/sglang_script.py --backend "$be"
  echo "record exit: $?"
  grep -h "kvconv sglang plugin: engine end\|probe dump written\|caches registered" "$D/$n.log" | cut -c1-300
  judge "$n"
}

server() {  # server INT|TERM
  local sig=${1:-INT} n
  n=server-$(echo "$sig" | tr A-Z a-z)
  rm -f "$D/$n".*
  timed "$n" $REC --writes --engine sglang --capture-range profiler -o "$D/$n.kvdump" -- \
    python3 $W/sglang_server.py --signal "$sig"
  echo "record exit: $?"
  grep -h "kvconv sglang plugin: engine end\|probe dump written" "$D/$n.log" | cut -c1-300
  judge "$n"
}

plant_run() {  # plant_run TAG PLANT [run.py args]: one plant run, its dumps judged, its plant line shown
  local tag=$1 plant=$2 name
  shift 2
  name=$tag-$plant
  rm -f "$D/$name".*
  KVCONV_PLANT=$([ "$plant" = clean ] || echo "$plant") KVCONV_CANARY=1 PYTHONPATH=$W/sglang_plants:$PYTHONPATH \
    timed "$name" $REC --writes --engine sglang --capture-range profiler -o "$D/$name.kvdump" -- \
    python3 $W/sglang_plants/run.py --probe-out "$D/$name.probe.kvdump" "$@"
  echo "record exit: $?"
  grep -h "kvconv plant\|kv.canary\|KV canary\|violation" "$D/$name.log" | grep -v "armed in" | head -n 6 |
    cut -c1-300
  judge "$name"
}

plants() {
  local p
  for p in "$@"; do plant_run plant "$p"; done
}

plants-kvc() {
  local p
  for p in "$@"; do plant_run kvc "$p" --kv-canary log; done
}

perturb() {  # SGLang's self-tests: its canary must raise; what kvconv's dumps say of the same run
  local m M
  for m in "$@"; do
    M=$(echo "$m" | tr a-z A-Z)
    (
      export "SGLANG_KV_CANARY_PERTURB_${M}_PROB=${PROB:-1.0}" SGLANG_KV_CANARY_PERTURB_TARGET_GROUP=full \
        SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS=${WARMUP:-8}
      plant_run perturb "$m" --kv-canary raise --kv-canary-real-data partial
    )
  done
}

cost() {  # cost [ROUNDS]: one engine per config, ROUNDS rounds each; the tokens/s of every round
  local r=${1:-5} c
  local args="--requests 32 --tokens 128 --batch 8 --rounds $r --pool 32768 --end kill"
  for c in untraced kvc-log tracer canaries both; do
    local kvc=none cmd=()
    case $c in
      untraced) cmd=() ;;
      kvc-log) kvc=log ;;
      tracer) cmd=($REC --capture-range graph --no-validate -o /tmp/cost-$c.kvdump --) ;;
      canaries | both) cmd=(env KVCONV_CANARY=1 KVCONV_WRITE_CAPACITY=4194304 KVCONV_PROBE_OUTPUT=/tmp/cost-$c.probe.kvdump
        $REC --writes --engine sglang --capture-range profiler --no-validate -o /tmp/cost-$c.kvdump --) ;;
    esac
    [ $c = both ] && kvc=log
    timed "cost-$c" "${cmd[@]}" python3 $W/sglang_seed.py $args --kv-canary $kvc
    grep -h '"tokens_per_s"' "$D/cost-$c.log" | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print('  $c: tokens/s per round', [x['tokens_per_s'] for x in r['rounds']], 'start', r.get('start_s'), 's')"
    rm -f /tmp/cost-$c.*kvdump
  done
}

collect() {  # collect DEST TAG: what D gained since the last collect (logs, probe and tracer dumps) in one tar.xz,
  # split into 15 MiB parts (at most 8 files come back from a call)
  local dest=$1 tag=$2 mark=$D/.collected
  mkdir -p "$dest"
  [ -f "$mark" ] || touch -d @0 "$mark"
  (cd "$D" && find . -maxdepth 1 -type f -newer .collected \( -name '*.log' -o -name '*.kvdump' \) -printf '%P\n' |
    sort > /tmp/collect.list && tar -cf - -T /tmp/collect.list | xz -T0 -6 > "/tmp/$tag.tar.xz")
  touch "$mark"
  split -b 15m -d -a 1 "/tmp/$tag.tar.xz" "$dest/$tag.tar.xz.part"
  rm -f "/tmp/$tag.tar.xz"
  echo "collect $tag: $(wc -l < /tmp/collect.list) files"
  ls -la "$dest"
}

cmd=${1:?usage: gpu_sglang49.sh stage|setup|script|server|plants|plants-kvc|perturb|cost|collect ...}
shift
"$cmd" "$@"
