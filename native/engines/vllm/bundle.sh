#!/usr/bin/env bash
# Builds the vLLM 0.26.0 bundle for the offline H200 image (Python 3.12, torch 2.11.0+cu130, no pip index).
#
#   bash native/engines/vllm/bundle.sh            # -> .work/stage/vllm/vllm.part00 ... + SHA256SUMS
#   bash native/engines/vllm/bundle.sh --relock   # re-resolve the dependency wheels into wheels.lock first
#
# The bundle is one tar.xz (Python's tarfile reads it, so the device needs no zstd), split into parts of $KVCONV_PART_MB MiB (28: the repository travels beside each, ~33 MiB with the engine fixtures)
# because a device call carries at most 64 MiB, the repository's own files included. Inside:
#   site/vllm, site/vllm-0.26.0.dist-info   the wheel unpacked, minus what a dense model on Hopper never loads
#   wheels/*.whl                            the dependencies the image lacks (wheels.lock), stored uncompressed
#   MANIFEST                                what went in, with sizes
# native/engines/unpack.sh turns the parts back into a folder for PYTHONPATH. Downloads are kept in
# .work/stage/vllm/cache, so a second run fetches nothing and writes the same parts (fixed tar order and times).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
STAGE=${KVCONV_VLLM_STAGE:-$ROOT/.work/stage/vllm}
CACHE=$STAGE/cache
VLLM=0.26.0
# The wheel PyPI serves for vllm==0.26.0 (cp38-abi3, manylinux_2_28): pinned so a re-upload cannot slip in.
VLLM_WHEEL=vllm-$VLLM-cp38-abi3-manylinux_2_28_x86_64.whl
VLLM_SHA256=adb1e4c9b46d0dfdb094121ae5aad670a42412dd813ed4e5db069ed6a15006de
LOCK=$HERE/wheels.lock
IMAGE_PACKAGES=$HERE/image-packages.txt
# Resolution as of this date, so --relock gives the same versions later.
EXCLUDE_NEWER=2026-12-04T00:00:00Z
# The image's glibc takes manylinux_2_34 wheels (SGLang's ran there). pip matches tags exactly: name each one.
GLIBC=2_34
PLATFORMS=(manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64
           manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64)
# Not needed for a dense Qwen3 with FLASH_ATTN on Hopper (engines notes: removed with no import error).
# deep_gemm's extensions for other Pythons are never loaded by a 3.12 interpreter.
STRIP=(vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/_moe_C_stable_libtorch.abi3.so vllm/vllm-rs
       vllm/third_party/fmha_sm100
       vllm/third_party/deep_gemm/_C.cpython-310-x86_64-linux-gnu.so
       vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so
       vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so
       vllm/third_party/deep_gemm/_C.cpython-314-x86_64-linux-gnu.so)
# Dependencies the run does not import (kernels for other GPUs, compilers, video); engines notes list them.
DROP='^(vllm|nvidia-cutlass-dsl.*|tokenspeed-triton|tokenspeed-mla|nvidia-nvvm|nvidia-cuda-nvcc|nvidia-cuda-crt'
DROP+='|nvidia-cuda-nvdisasm|nvidia-cuda-cccl|tilelang|z3-solver|pynvvideocodec|torchcodec|cuda-tile'
DROP+='|humming-kernels|quack-kernels|kernels)$'

die() { echo "bundle.sh: $*" >&2; exit 1; }
quiet() { grep -v "^WARNING: Location 'file:///opt/" >&2 || true; }  # this machine's pip config lists absent local indexes

tools() {  # uv in a throwaway venv: it resolves for another Python and platform than this machine's
    [[ -x $CACHE/uvenv/bin/uv ]] && return
    python3 -m venv "$CACHE/uvenv" && "$CACHE/uvenv/bin/pip" install -q uv
}

relock() {  # vllm's requirements for 3.12/manylinux_2_34, wheels only, torch family away, minus the image's and DROP
    tools
    printf '%s; sys_platform == "never"\n' torch torchvision torchaudio triton >"$CACHE/overrides.txt"
    echo "vllm==$VLLM" >"$CACHE/req.in"
    "$CACHE/uvenv/bin/uv" pip compile -q "$CACHE/req.in" --python-version 3.12 \
        --python-platform "x86_64-manylinux_$GLIBC" --only-binary :all: --override "$CACHE/overrides.txt" --exclude-newer "$EXCLUDE_NEWER" \
        --generate-hashes --no-header --no-annotate -o "$CACHE/resolved.txt" 2> >(quiet)
    grep -q "sha256:$VLLM_SHA256" "$CACHE/resolved.txt" || die "PyPI's hashes for vllm==$VLLM lack VLLM_SHA256"
    python3 "$HERE/wheels.py" filter "$CACHE/resolved.txt" "$IMAGE_PACKAGES" "$DROP" >"$LOCK.tmp"
    mv "$LOCK.tmp" "$LOCK"
    echo "wheels.lock: $(grep -c == "$LOCK") wheels"
}

fetch() {  # the vllm wheel and the locked wheels, each checked against its sha256
    local plat=() p
    for p in "${PLATFORMS[@]}"; do plat+=(--platform "$p"); done
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${plat[@]}" -d "$CACHE/dl" "vllm==$VLLM" 2> >(quiet)
    [[ -f $CACHE/dl/$VLLM_WHEEL ]] || die "pip did not fetch $VLLM_WHEEL"
    echo "$VLLM_SHA256  $CACHE/dl/$VLLM_WHEEL" | sha256sum -c --quiet || die "$VLLM_WHEEL: sha256 differs"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${plat[@]}" --require-hashes -d "$CACHE/wheels" -r "$LOCK" 2> >(quiet)
}

unpack_vllm() {  # the wheel's tree with STRIP removed; the dist-info stays (platform detection reads it)
    rm -rf "$CACHE/tree" && mkdir -p "$CACHE/tree/site" "$CACHE/tree/wheels"
    python3 -m zipfile -e "$CACHE/dl/$VLLM_WHEEL" "$CACHE/tree/site"
    local s
    for s in "${STRIP[@]}"; do
        [[ -e $CACHE/tree/site/$s ]] || die "$s is not in $VLLM_WHEEL (strip list out of date)"
        rm -rf "${CACHE:?}/tree/site/$s"
    done
}

restore_wheels() {  # each locked wheel re-zipped with stored entries: xz then compresses their contents
    python3 "$HERE/wheels.py" restore "$LOCK" "$CACHE/wheels" "$CACHE/tree/wheels"
}

pack() {  # one deterministic tar.xz, split into parts; SHA256SUMS names every part
    (cd "$CACHE/tree" && find site wheels -type f -printf '%s %p\n' | sort -k2 >MANIFEST)
    rm -f "$STAGE"/vllm.part* "$STAGE/SHA256SUMS"
    tar -C "$CACHE/tree" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - MANIFEST site wheels \
        | xz -9 -T2 >"$CACHE/vllm.tar.xz"
    split -b "${KVCONV_PART_MB:-28}m" -d -a 2 "$CACHE/vllm.tar.xz" "$STAGE/vllm.part"
    # sizes as comments for whoever plans the device calls; unpack.sh reads only the checksum lines
    (cd "$STAGE" && { stat -c '# %n %s bytes' vllm.part*; echo "# total $(cat vllm.part* | wc -c) bytes"
                      sha256sum vllm.part*; } >SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS && cat SHA256SUMS)
}

main() {
    mkdir -p "$CACHE/dl" "$CACHE/wheels"
    [[ ${1:-} == --relock || ! -f $LOCK ]] && relock
    fetch
    unpack_vllm
    restore_wheels
    pack
}
main "$@"
