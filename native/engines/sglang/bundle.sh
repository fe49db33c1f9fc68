#!/usr/bin/env bash
# Builds the SGLang 0.5.12 bundle for the offline H200 image (Python 3.12, torch 2.11.0+cu130, transformers 5.17):
# .work/stage/sglang/sglang.partNN (KVCONV_PART_MB, 28 MiB, each: one per device call) and SHA256SUMS beside them.
#
#   bash native/engines/sglang/bundle.sh        # needs PyPI, apt-get download and python3 here
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
STAGE=${STAGE:-$ROOT/.work/stage/sglang}
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
tools/bin/pip "${PIPDL[@]}" -d top sglang==0.5.12 sglang-kernel==0.4.2.post2 flashinfer_python==0.6.11.post1

# 2. Its dependencies for Python 3.12 on manylinux_2_34, the torch family resolved away (the image's is used).
printf '%s; sys_platform == "never"\n' torch torchvision torchaudio triton > overrides.txt
echo 'sglang==0.5.12' > req.in
tools/bin/uv pip compile -q req.in --python-version 3.12 --python-platform x86_64-manylinux_2_34 \
  --overrides overrides.txt --no-header --no-annotate -o compiled.txt
$PY - "$HERE" > deps.txt <<'EOF'
import re, sys
here = sys.argv[1]
norm = lambda n: re.sub(r"[-_.]+", "-", n.strip().lower())
names = lambda f: {norm(l.split("#")[0]) for l in open(f"{here}/{f}") if l.split("#")[0].strip()}
skip = names("image-packages.txt") | names("drop.txt") | {"sglang", "sglang-kernel", "flashinfer-python"}
for row in open("compiled.txt"):
    if "==" in row and norm(row.split("==")[0]) not in skip:
        print(row.strip())
EOF
rm -rf deps && mkdir deps
tools/bin/pip "${PIPDL[@]}" -d deps -r deps.txt

# 3. Every wheel stored uncompressed; sglang-kernel without what a dense model on Hopper never loads.
for w in top/sglang-*.whl top/flashinfer_python-*.whl deps/*.whl; do
  $PY "$HERE/repack.py" "$w" "wheels/$(basename "$w")" 2>/dev/null
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
tar -C bundle -cf - . | xz -T0 -9 > sglang.tar.xz
rm -f "$STAGE"/sglang.part* "$STAGE/SHA256SUMS"
split -b "${KVCONV_PART_MB:-28}m" -d -a 2 sglang.tar.xz "$STAGE/sglang.part"
(cd "$STAGE" && sha256sum sglang.part* > SHA256SUMS && cat SHA256SUMS && ls -l sglang.part*)
echo "wheels: $(ls bundle/wheels | wc -l), tar.xz: $(stat -c %s sglang.tar.xz) bytes"
