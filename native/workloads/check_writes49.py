"""Check the dumps of native/workloads/store_kvcache49.cu (issue 49): every block of store_kvcache recorded the two
slots it wrote (its token's slot in layer l's K buffer and in its V buffer), and the write canary finds nothing.

    python3 native/workloads/check_writes49.py EXPECT_JSON DUMP [DUMP ...]

EXPECT_JSON: the workload's JSON line (blocks, slot_writes, caches, steps). A dump still live (a killed process not
sealed by record) is checked as it is, then sealed (kvconv.capture.seal) and checked again. Prints one line per
dump; exit 1 on the first failed check.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

from kvconv.format import dump


def _names(d) -> dict[int, str]:
    return {int(c["cache_id"]): c["name"].tobytes().rstrip(b"\0").decode() for c in d.records("cache")}


def _check_records(d, want: dict) -> str:
    sw, ev = d.records("slot_write"), d.records("device_event")
    assert len(d.groups_of("slot_write")), "no slot_write group"
    assert d.drops("slot_write") == 0, f"slot_write drop_count {d.drops('slot_write')}"
    assert len(ev) == want["blocks"], f"{len(ev)} device events, {want['blocks']} blocks launched"
    assert len(sw) == want["slot_writes"], f"{len(sw)} slot_write records, expected {want['slot_writes']}"
    assert len(d.records("cache")) == want["caches"] and len(d.records("write_step")) == want["steps"]
    names = _names(d)
    blocks = {}
    for r in sw:
        key = (int(r["gridid"]), int(r["tag"]), int(r["block_x"]))
        blocks.setdefault(key, []).append(names[int(r["cache_id"])])
    evk = {(int(e["gridid"]), int(e["block_x"])) for e in ev}  # a launch's gridid is unique (replays too)
    got = {(g, b) for g, _, b in blocks}
    assert got == evk, f"blocks with slot writes ({len(got)}) differ from the blocks that ran ({len(evk)})"
    for key, caches in blocks.items():  # one token: its slot in layer l's K and in its V buffer
        layers = {c.split(".")[0] for c in caches}
        assert sorted(c.split(".")[1] for c in caches) == ["k", "v"] and len(layers) == 1, (key, caches)
    assert (sw["stores"] == 32 * 4).all(), "each block's 4 warps store 16 bytes a lane per slot and buffer"
    return f"{len(sw)} slot writes, {len(blocks)} blocks, 2 each (K and V of one layer)"


def _canary(path: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "kvconv", "canary", "--writes", str(path)], capture_output=True,
                       text=True)
    assert r.returncode == 0, f"kvconv canary --writes exit {r.returncode}: {r.stdout[-800:]}{r.stderr[-800:]}"
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""


def check(path: Path, want: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = dump.open(path)
        meta = d.metadata()
        live = any(g.live for g in d.groups)
        st = path.stat()
        print(f"{path.name}: {st.st_size:,} bytes, {st.st_blocks * 512:,} on disk, "
              f"written_at {meta.get('written_at')}, writes {meta.get('writes')}")
        assert (meta.get("writes") or {}).get("asked") is True, "metadata does not say --writes was asked"
        print("  " + _check_records(d, want))
        d.close()
    if live:
        # reservations of the host tables and the write canary's groups are sparse holes (~56 MiB with --writes);
        # the 2 GiB device-event buffer is not in the file
        assert st.st_size < 128 << 20, f"a live dump of {want['blocks']} events is {st.st_size:,} bytes"
        assert st.st_blocks * 512 < 16 << 20, f"a live dump of {want['blocks']} events takes {st.st_blocks * 512:,}"
        from kvconv.capture.seal import seal

        why = seal(str(path))
        assert why == "sealed", f"seal: {why}"
        print(f"  sealed: {path.stat().st_size:,} bytes")
        return check(path, want)
    print("  canary: " + _canary(path))


def main(argv: list[str]) -> int:
    want = json.loads(Path(argv[0]).read_text().strip().splitlines()[-1])
    for p in argv[1:]:
        try:
            check(Path(p), want)
        except AssertionError as e:
            print(f"FAIL {p}: {e}")
            return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
