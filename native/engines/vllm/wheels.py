"""Helpers of bundle.sh: filter a resolution into wheels.lock, and re-zip the locked wheels uncompressed.

    python3 wheels.py filter resolved.txt image-packages.txt 'DROP-REGEX' > wheels.lock
    python3 wheels.py restore wheels.lock cache/wheels/ tree/wheels/

`filter` keeps each `name==version` of a `uv pip compile --generate-hashes` output (hashes kept, one line each)
that the device image does not already have and that DROP-REGEX (matched against the normalized name) does not
name. `restore` copies each locked wheel with its entries stored instead of deflated: the bundle's xz then
compresses the files themselves, which deflate had already made incompressible. A wheel stays valid: RECORD holds
hashes of the contents, not of the zip's bytes.
"""

import re
import sys
import zipfile
from pathlib import Path


def normalize(name):
    """PEP 503 name, the form pip and the image list compare."""
    return re.sub(r"[-_.]+", "-", name).lower()


def entries(resolved):
    """(name, line) per requirement of a pip-compile file, backslash continuations joined."""
    text = Path(resolved).read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = " ".join(line.split())
        if "==" in line and not line.startswith("#"):
            yield normalize(line.split("==")[0]), line


def filter_lock(resolved, image_list, drop):
    """Print the lock: entries neither on the image nor matched by drop."""
    lines = Path(image_list).read_text().splitlines()
    image = {normalize(s.strip()) for s in lines if s.strip() and not s.startswith("#")}
    for name, line in entries(resolved):
        if name not in image and not re.match(drop, name):
            print(line)


def wheel_key(path):
    """(normalized name, version) from a wheel's file name."""
    name, version = Path(path).name.split("-")[:2]
    return normalize(name), version


def restore(lock, src, dst):
    """Every locked wheel from src, re-zipped stored into dst; fails naming a locked wheel missing from src."""
    wanted = {(n, line.split("==")[1].split()[0]) for n, line in entries(lock)}
    have = {wheel_key(w): w for w in Path(src).glob("*.whl")}
    missing = sorted(f"{n}=={v}" for n, v in wanted - have.keys())
    if missing:
        sys.exit(f"wheels.py: {src}: no wheel for {', '.join(missing)}")
    Path(dst).mkdir(parents=True, exist_ok=True)
    for key in sorted(wanted):
        with zipfile.ZipFile(have[key]) as zin, zipfile.ZipFile(Path(dst) / have[key].name, "w") as zout:
            for info in zin.infolist():
                data = zin.read(info)  # before the type changes: read() decompresses by it
                info.compress_type = zipfile.ZIP_STORED
                zout.writestr(info, data)


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"filter": filter_lock, "restore": restore}[cmd](*args)
