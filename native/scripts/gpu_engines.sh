#!/bin/bash
# vLLM and SGLang themselves under kvconv record on an H200 (issues 39, 40, 44), one step per device call:
#   gpu_engines.sh stage NAME        copy the carried parts of bundle NAME (.work/stage/NAME/) to /tmp/kvstage/NAME
#   gpu_engines.sh setup NAME        unpack NAME (native/engines/unpack.sh), build the tracer for sm_90, install .whl
#                                    (kvconv's wheel: the vLLM plugin's entry point; the CLI's missing wheels)
#   gpu_engines.sh vllm OUTDIR       the first seed's run with vLLM's default child process, traced; throughput
#   gpu_engines.sh plants OUTDIR P.. the vLLM plugin (--writes --engine vllm): clean run and plants P
#   gpu_engines.sh sglang OUTDIR     the second seed's batch-8 run, traced with --capture-range graph; throughput
# Bundles: native/engines/README.md (the parts are carried one per call into .work/stage/NAME/, back to back).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
export PYTHONUNBUFFERED=1 KVCONV_TRACER_LIB=$ROOT/native/build/libkvconv_tracer.so
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
REC="python3 -m kvconv record"
CACHE=/tmp/vllm-cache

stage() {
  mkdir -p "/tmp/kvstage/$1"
  cp ".work/stage/$1/"*.part* ".work/stage/$1/SHA256SUMS" "/tmp/kvstage/$1/" && ls -la "/tmp/kvstage/$1"
}

setup() {
  if [ ! -f /tmp/site/.done ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && touch /tmp/site/.done
  fi
  if [ ! -f native/build/libkvconv_tracer.so ]; then
    make -C native -j16 ARCHS=90 tracer > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
  fi
  [ -f "/tmp/$1/.complete" ] || bash native/engines/unpack.sh "/tmp/kvstage/$1/$1" "/tmp/$1" || exit 1
  echo "setup $1: ok"
}

timed() {  # timed NAME LOGDIR CMD...: run, keep its output, print exit status, seconds and the last lines
  local name=$1 dir=$2 t0=$SECONDS
  shift 2
  "$@" > "$dir/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - t0)) s"
  grep -v "^kvconv-tracer: wrote\|WARNING\|warn(" "$dir/$name.log" | tail -n 8 | cut -c1-360
}

vllm() {
  local out=$1 wl=native/workloads/vllm_seed.py
  mkdir -p "$out"
  export PYTHONPATH=/tmp/vllm/site:/tmp/site
  timed vllm-seed "$out" $REC -k reshape_and_cache_flash_kernel -o "$out/vllm-seed.kvdump" -- \
    python3 $wl --compile-cache $CACHE
  timed vllm-tput-untraced "$out" python3 $wl --compile-cache $CACHE --requests 32 --tokens 128
  timed vllm-tput-traced "$out" $REC -k reshape_and_cache_flash_kernel --no-validate -o /tmp/vllm-tput.kvdump -- \
    python3 $wl --compile-cache $CACHE --requests 32 --tokens 128
}

plants() {
  local out=$1 p=native/workloads/vllm_plants
  shift
  mkdir -p "$out"
  for plant in "$@"; do
    local name=$plant
    [ "$plant" = clean ] && plant=""
    KVCONV_PLANT=$plant KVCONV_VALUE=1 VLLM_CACHE_ROOT=$CACHE PYTHONPATH=$p:/tmp/vllm/site:/tmp/site \
      timed "plant-$name" "$out" $REC -k reshape_and_cache_flash_kernel --writes --engine vllm \
      -o "$out/plant-$name.kvdump" -- python3 $p/run.py --probe-out "$out/plant-$name.probe.kvdump"
    python3 -m kvconv validate "$out"/plant-$name*.kvdump 2>&1 | grep -v "^warning" | tail -n 6 | cut -c1-400
  done
}

sglang() {
  local out=$1 wl=native/workloads/sglang_seed.py
  mkdir -p "$out"
  export PYTHONPATH=/tmp/sglang/site:/tmp/site LD_LIBRARY_PATH=/tmp/sglang/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  timed sglang-seed "$out" $REC -k store_kvcache --capture-range graph -o "$out/sglang-seed.kvdump" -- python3 $wl
  timed sglang-tput-untraced "$out" python3 $wl --requests 64 --tokens 64
  timed sglang-tput-traced "$out" $REC -k store_kvcache --capture-range graph --no-validate \
    -o /tmp/sglang-tput.kvdump -- python3 $wl --requests 64 --tokens 64
}

cmd=${1:?usage: gpu_engines.sh stage|setup|vllm|plants|sglang ...}
shift
"$cmd" "$@"
