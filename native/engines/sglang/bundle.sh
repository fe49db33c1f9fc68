#!/usr/bin/env bash
# Builds an SGLang bundle for the offline H200 image (Python 3.12, torch 2.11.0+cu130, transformers 5.17):
# .work/stage/NAME/NAME.partNN (KVCONV_PART_MB, 28 MiB, each: one per device call) and SHA256SUMS beside them, NAME
# `sglang` for 0.5.12 (the fixtures' engine) and `sglang-0.5.17` for 0.5.17 (issue 49: SGLang's own KV canary).
#
#   bash native/engines/sglang/bundle.sh            # 0.5.12; needs PyPI, apt-get download and python3 here
#   bash native/engines/sglang/bundle.sh 0.5.17     # 0.5.17: its pins, and transformers 5.12.1 carried
#
# Per version (the pins of sglang's METADATA): 0.5.12 sglang-kernel 0.4.2.post2, flashinfer-python 0.6.11.post1,
# the image's transformers 5.17 (sitecustomize.py lets SGLang register `qwen3_asr` again). 0.5.17 sglang-kernel
# 0.4.5, flashinfer-python 0.6.15.post1 and transformers==5.12.1, carried with the tokenizers it accepts
# (transformers checks `tokenizers<=0.23.0` at import; the image has 0.23.2): the pinned pair, not the image's; and,
# of drop.txt's, xgrammar (0.5.17's server_args imports function_call/kimik3_detector.py, `from xgrammar import`)
# and soundfile with cffi and pycparser (the HTTP server imports entrypoints/openai/streaming_asr.py: `import
# soundfile`): found by a static scan of the module-level imports of the Engine, launch_server and scheduler paths.
#
# The tarball holds wheels/*.whl (every one rewritten uncompressed by repack.py, so that xz compresses across them),
# lib/libnuma.so.1 (sgl_kernel/sm90/common_ops.abi3.so needs it; the image lacks it) and site/sitecustomize.py
# (AutoConfig.register exist_ok=True for transformers 5.17). ../unpack.sh PREFIX DEST installs the wheels into
# DEST/site beside it; then PYTHONPATH=DEST/site and LD_LIBRARY_PATH=DEST/lib. Carried: sglang; sglang-kernel
# less flash_ops.abi3.so (1.07 GB, its FA3), sm100/, flashmla_ops.abi3.so (MLA) and the cp310 mscclpp files;
# flashinfer-python (not flashinfer-cubin); and what `uv pip compile` resolves for sglang==0.5.12 that the image
# lacks (image-packages.txt), less drop.txt (each line says why).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
VERSION=${1:-0.5.12}
case $VERSION in
  0.5.12) NAME=sglang KERNEL=0.4.2.post2 FLASHINFER=0.6.11.post1 CARRY="" DROPS="drop.txt" KEEP="" ;;
  0.5.17) NAME=sglang-0.5.17 KERNEL=0.4.5 FLASHINFER=0.6.15.post1 CARRY="transformers tokenizers"
          DROPS="drop.txt drop-0.5.17.txt" KEEP="xgrammar soundfile cffi pycparser" ;;
  *) echo "bundle.sh: no recipe for sglang $VERSION (0.5.12, 0.5.17)" >&2; exit 2 ;;
esac
STAGE=${STAGE:-$ROOT/.work/stage/$NAME}
WORK=$STAGE/build
PIPDL=(download -q --no-deps --only-binary :all: --python-version 3.12
       --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform linux_x86_64 --platform any)
mkdir -p "$WORK"
cd "$WORK"

[ -x tools/bin/uv ] || { python3 -m venv tools && tools/bin/pip install -q uv; }
PY=tools/bin/python

# 1. The engine's own wheels.
rm -rf top wheels bundle && mkdir -p top wheels bundle/lib bundle/site
tools/bin/pip "${PIPDL[@]}" -d top sglang==$VERSION sglang-kernel==$KERNEL flashinfer_python==$FLASHINFER

# 2. Its dependencies for Python 3.12 on manylinux_2_34, the torch family resolved away (the image's is used).
printf '%s; sys_platform == "never"\n' torch torchvision torchaudio triton > overrides.txt
echo "sglang==$VERSION" > req.in
tools/bin/uv pip compile -q req.in --python-version 3.12 --python-platform x86_64-manylinux_2_34 \
  --overrides overrides.txt --no-header --no-annotate -o compiled.txt
$PY - "$HERE" "$CARRY" "$KEEP" $DROPS > deps.txt <<'EOF'
import re, sys
here, carry, keep, drops = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4:]
norm = lambda n: re.sub(r"[-_.]+", "-", n.strip().lower())
names = lambda f: {norm(l.split("#")[0]) for l in open(f"{here}/{f}") if l.split("#")[0].strip()}
image = names("image-packages.txt") - {norm(c) for c in carry}  # CARRY: pinned versions the image's would break
dropped = set().union(*(names(d) for d in drops)) - {norm(k) for k in keep}  # KEEP: drop.txt's that it imports
skip = image | dropped | {"sglang", "sglang-kernel", "flashinfer-python"}
for row in open("compiled.txt"):
    if "==" in row and norm(row.split("==")[0]) not in skip:
        print(row.strip())
EOF
rm -rf deps && mkdir deps
tools/bin/pip "${PIPDL[@]}" -d deps -r deps.txt

# 3. Every wheel stored uncompressed; sglang-kernel without what a dense model on Hopper never loads.
for w in top/sglang-*.whl top/flashinfer_python-*.whl deps/*.whl; do  # xgrammar (0.5.17) without its C++ static
  $PY "$HERE/repack.py" "$w" "wheels/$(basename "$w")" --drop 'xgrammar/lib/*' 2>/dev/null  # library (65 MB)
done
w=$(ls top/sglang_kernel-*.whl)
$PY "$HERE/repack.py" "$w" "wheels/$(basename "$w")" --drop 'sgl_kernel/flash_ops.abi3.so' \
  --drop 'sgl_kernel/sm100/*' --drop 'sgl_kernel/flashmla_ops.abi3.so' --drop '_mscclpp.*' \
  --drop 'lib/*' --drop 'lib64/*' --drop 'include/*'

# 4. libnuma.so.1 from Debian's libnuma1, sitecustomize.py, then tar.xz split into KVCONV_PART_MB (28) MiB parts.
rm -rf numa && mkdir numa && (cd numa && apt-get download -q libnuma1 >/dev/null && dpkg-deb -x libnuma1_*.deb x)
cp -L numa/x/usr/lib/x86_64-linux-gnu/libnuma.so.1 bundle/lib/
cp "$HERE/sitecustomize.py" bundle/site/  # unpack.sh installs the wheels beside it
mv wheels bundle/wheels
ls bundle/wheels > bundle/WHEELS.txt
tar -C bundle -cf - . | xz -T0 -9 > "$NAME.tar.xz"
rm -f "$STAGE/$NAME".part* "$STAGE/SHA256SUMS"
split -b "${KVCONV_PART_MB:-28}m" -d -a 2 "$NAME.tar.xz" "$STAGE/$NAME.part"
(cd "$STAGE" && sha256sum "$NAME".part* > SHA256SUMS && cat SHA256SUMS && ls -l "$NAME".part*)
echo "sglang $VERSION: wheels: $(ls bundle/wheels | wc -l), $NAME.tar.xz: $(stat -c %s "$NAME.tar.xz") bytes"
