#!/usr/bin/env bash
# Turns a bundle's parts back into an importable folder, on the offline device machine.
#
#   bash native/engines/unpack.sh /tmp/kvstage/vllm /tmp/vllm
#   export PYTHONPATH=/tmp/vllm/site        # the last line it prints, ready to eval
#   [ -f /tmp/vllm/.complete ] || bash native/engines/unpack.sh ...   # written last: the unpack finished
#
# PREFIX.part00, PREFIX.part01, ... are one tar.xz cut by `split -d`; SHA256SUMS beside them names every part
# (bundle scripts write it). Each part is checked first, so a part lost or cut short in transfer fails here with
# its name instead of as a corrupt archive later. The tar is read by Python's tarfile (the image may lack zstd
# and xz binaries; python3 is always there). Then DEST/wheels/*.whl are installed into DEST/site with the
# image's pip (no index, no dependency resolution: the bundle carries exactly what the image lacks).
set -euo pipefail

die() { echo "unpack.sh: $*" >&2; exit 1; }
[[ $# -eq 2 ]] || die "usage: unpack.sh PREFIX DEST (PREFIX.part00... and SHA256SUMS beside them)"
PREFIX=$1 DEST=$2
DIR=$(dirname "$PREFIX") BASE=$(basename "$PREFIX")
SUMS=$DIR/SHA256SUMS

verify() {  # every part SHA256SUMS names is present and whole, and no part lies there that it does not name
    [[ -f $SUMS ]] || die "$SUMS: missing (copy it beside the parts)"
    local named have
    named=$(awk '!/^#/ {print $2}' "$SUMS" | grep -E "^$BASE\.part[0-9]+$" | sort) || true
    [[ -n $named ]] || die "$SUMS: names no $BASE.part*"
    for p in $named; do [[ -f $DIR/$p ]] || die "$DIR/$p: missing (SHA256SUMS names it)"; done
    have=$(cd "$DIR" && ls "$BASE".part* | sort)
    [[ $have == "$named" ]] || die "$DIR: parts $(echo $have) differ from SHA256SUMS's $(echo $named)"
    local bad
    bad=$(cd "$DIR" && grep -E " \*?$BASE\.part[0-9]+$" SHA256SUMS | sha256sum -c --quiet - 2>/dev/null) \
        || die "$DIR/$(echo "$bad" | sed -n '1s/: FAILED.*//p'): sha256 differs from SHA256SUMS (cut short in transfer?)"
}

extract() {  # the parts in order, streamed: nothing the size of the whole archive is written
    # DEST is emptied first, so only a folder this script made (MANIFEST in it) or an empty one is accepted
    if [[ -d $DEST && -n $(ls -A "$DEST") && ! -f $DEST/MANIFEST ]]; then
        die "$DEST: not empty and not an earlier unpack (no MANIFEST); give a new folder"
    fi
    rm -rf "$DEST" && mkdir -p "$DEST"
    cat $(printf "$DIR/%s " $(cd "$DIR" && ls "$BASE".part* | sort)) | python3 -c '
import sys, tarfile
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz") as t:
    t.extractall(sys.argv[1], filter="data")' "$DEST" || die "$PREFIX.part*: could not extract"
}

install() {  # the carried wheels beside the already unpacked tree in DEST/site
    mkdir -p "$DEST/site"
    if compgen -G "$DEST/wheels/*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
            --target "$DEST/site" "$DEST"/wheels/*.whl || die "$DEST/wheels: pip install failed"
    fi
}

verify
extract
install
touch "$DEST/.complete"  # a later call on the same machine can test this and skip the unpack
echo "unpack.sh: $(find "$DEST/site" -maxdepth 1 -name '*.dist-info' | wc -l) distributions in $DEST/site" >&2
echo "export PYTHONPATH=$(cd "$DEST" && pwd)/site\${PYTHONPATH:+:\$PYTHONPATH}"
