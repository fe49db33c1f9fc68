"""Rewrites a wheel uncompressed (ZIP_STORED), leaving out members that match --drop, with RECORD to match.

Stored members let the bundle's xz compress across all wheels at once (deflated members do not compress again);
dropped members are the parts of sglang-kernel a dense Qwen3 on Hopper never loads (engines.md).

    python3 repack.py IN.whl OUT.whl --drop 'sgl_kernel/flash_ops.abi3.so' --drop 'sgl_kernel/sm100/*'
"""

import argparse
import fnmatch
import sys
import zipfile


def _keep(name, patterns):
    return not any(fnmatch.fnmatch(name, p) for p in patterns)


def _record(text, patterns):
    """RECORD without the dropped files' rows (pip installs from it)."""
    rows = [r for r in text.splitlines() if r and _keep(r.rsplit(",", 2)[0], patterns)]
    return "\n".join(rows) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--drop", action="append", default=[], help="fnmatch pattern of members to leave out")
    a = ap.parse_args(argv)
    dropped = 0
    with zipfile.ZipFile(a.src) as zin, zipfile.ZipFile(a.dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            if not _keep(info.filename, a.drop):
                dropped += info.file_size
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = _record(data.decode(), a.drop).encode()
            info.compress_type = zipfile.ZIP_STORED
            zout.writestr(info, data)
    print(f"{a.dst}: {dropped:,} bytes left out", file=sys.stderr)


if __name__ == "__main__":
    main()
