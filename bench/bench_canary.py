"""Time the canary checker on a synthetic dump of canary records against a numpy pass over the same records.

    python bench/bench_canary.py [--records 1048576] [--buffers 4] [--reps 3]
    git show REV:kvconv/check/canary/ > /tmp/old_canary.py && python bench/bench_canary.py --module /tmp/old_canary.py

The dump is written with kvconv.format.dump.new: ``--records`` canary records, ``--buffers`` buffers per step,
8 expected pages per record out of 4,096, the changed set equal to it except that every 1,000th record has one page
changed outside it and every 1,500th one expected page unchanged, and page 0 excluded (the shape of fixtures/canary-*).

The baseline ("a numpy pass over the same records") reads every column the checker reads and every page each record
references once: per list, one gather of the referenced pages and one per-record reduction (``np.maximum.reduceat``).
Timed, in this process: ``canary.check(d)`` (summary and findings; steps are produced lazily) and ``kvconv canary
DUMP`` as the CLI runs it (summary, flagged steps, findings). ``--module`` times another implementation of
``kvconv/check/canary/`` (e.g. the old per-record loop) on the same dump; a slow one can be run on fewer records.
Goal (issue 13): check <= 20x the numpy pass.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvconv.format import dump, layout  # noqa: E402

LISTS = ("expected", "changed", "excluded")
NUM_PAGES, PER = 4096, 8


def _segments(rng, n: int) -> np.ndarray:
    """n sorted, unique runs of PER pages in 1..NUM_PAGES-1: shape [n, PER]."""
    gaps = rng.integers(1, NUM_PAGES // PER - 1, size=(n, PER))
    return np.cumsum(gaps, axis=1)


def make(path: Path, n: int, buffers: int) -> dict:
    """Write the dump; return what was planted (unexpected / missing record counts)."""
    rng = np.random.default_rng(13)
    exp = _segments(rng, n)
    extra = np.arange(n) % 1000 == 999  # one page changed outside the expected set
    drop = np.arange(n) % 1500 == 1499  # one expected page (the last) unchanged
    ecount = np.full(n, PER, np.int64)
    ccount = PER + extra.astype(np.int64) - drop.astype(np.int64)
    per_rec = ecount + ccount + 1
    offs = np.concatenate([[0], np.cumsum(per_rec)])
    pages = np.zeros(int(offs[-1]), dtype=np.uint32)
    # expected at offs, changed after it, excluded (page 0) last
    pos = offs[:-1, None] + np.arange(PER)
    pages[pos] = exp
    cpos = (offs[:-1] + PER)[:, None] + np.arange(PER)
    keep = np.ones((n, PER), bool)
    keep[drop, PER - 1] = False  # the dropped page is the last, so the rest stay in place
    pages[cpos[keep]] = exp[keep]
    last = offs[:-1] + PER + ccount - 1
    pages[last[extra]] = NUM_PAGES - 1  # above every expected page (gaps keep them below), so still sorted
    pages[offs[1:] - 1] = 0
    recs = np.zeros(n, dtype=layout.DTYPES["canary"])
    recs["step"] = np.arange(n) // buffers
    recs["host_ns"] = 10**9 + recs["step"] * 1000
    recs["buffer_id"] = np.arange(n) % buffers
    st = dump.StringTable()
    names = [st.add(f"L{b}.index_k") for b in range(buffers)]
    recs["name_off"] = np.array(names)[recs["buffer_id"], 0]
    recs["name_len"] = np.array(names)[recs["buffer_id"], 1]
    recs["num_pages"], recs["page_size"], recs["compression"] = NUM_PAGES, 64, 4
    recs["flags"] = layout.ENUMS["canary_flags"]["snapshot_clone"]
    recs["expected_first"], recs["expected_count"] = offs[:-1], ecount
    recs["changed_first"], recs["changed_count"] = offs[:-1] + PER, ccount
    recs["excluded_first"], recs["excluded_count"] = offs[1:] - 1, 1
    pg = np.zeros(len(pages), dtype=layout.DTYPES["canary_page"])
    pg["page"] = pages
    with dump.new(path) as w:
        w.write_metadata({"tool": "bench_canary", "tool_version": "0"})
        w.write_strings(st)
        w.write_records("canary", recs)
        w.write_records("canary_pages", pg)
    return {"unexpected": int(extra.sum()), "missing": int(drop.sum()), "pages": len(pages)}


def numpy_pass(d) -> int:
    """The baseline: every column the checker reads, every referenced page gathered once, one reduction per list."""
    recs = d.records("canary")
    pages = d.records("canary_pages")["page"]
    acc = 0
    for c in ("step", "host_ns", "buffer_id", "name_off", "name_len", "num_pages", "page_size", "compression",
              "flags"):
        acc += int(recs[c].astype(np.int64).sum())
    for lst in LISTS:
        first = recs[f"{lst}_first"].astype(np.int64)
        count = recs[f"{lst}_count"].astype(np.int64)
        offs = np.concatenate([[0], np.cumsum(count)])
        idx = np.repeat(first - offs[:-1], count) + np.arange(offs[-1])
        vals = pages[idx]
        nz = count > 0
        acc += int(np.maximum.reduceat(vals, offs[:-1][nz]).sum())
    return acc


def load(path: str | None):
    if path is None:
        from kvconv.check import canary

        return canary
    spec = importlib.util.spec_from_file_location("kvconv._bench_canary_impl", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1 << 20)
    ap.add_argument("--buffers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--module", help="time this file instead of kvconv/check/canary/ (e.g. an older version)")
    a = ap.parse_args()
    from _timing import best, quietness  # beside this script (make() alone is also used by tests)

    mod = load(a.module)
    print(quietness("start"))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "canary.kvdump"
        planted = make(path, a.records, a.buffers)
        size = os.path.getsize(path)
        print(f"dump: {a.records:,} canary records, {planted['pages']:,} pages, {size / 2**20:.1f} MiB; planted "
              f"{planted['unexpected']:,} unexpected, {planted['missing']:,} missing")
        with dump.open(path) as d:
            t_np, w_np, _ = best(a.reps, numpy_pass, d)
            t_ck, w_ck, res = best(a.reps, mod.check, d)
            s = res.summary()
            assert s["steps_with_unexpected"] == planted["unexpected"], s
            assert s["steps_with_missing"] == planted["missing"], s
            assert s["records"] == a.records, s
        print(f"numpy pass        {t_np * 1e3:9.1f} ms (worst {w_np * 1e3:.1f})")
        print(f"canary.check      {t_ck * 1e3:9.1f} ms (worst {w_ck * 1e3:.1f})  {t_ck / t_np:6.1f}x the numpy pass"
              f"  ({a.records / t_ck / 1e6:.2f} M records/s){'  [' + a.module + ']' if a.module else ''}")
        if a.module is None:
            from kvconv.cli import main as cli

            def run_cli():
                with contextlib.redirect_stdout(io.StringIO()) as out:
                    rc = cli(["canary", str(path)])
                return rc, out.getvalue()

            t_cli, w_cli, (rc, text) = best(a.reps, run_cli)
            assert rc == 1 and text.rstrip().endswith("FAILED"), (rc, text[-200:])
            print(f"kvconv canary     {t_cli * 1e3:9.1f} ms (worst {w_cli * 1e3:.1f})  {t_cli / t_np:6.1f}x the numpy "
                  f"pass  (text report, {len(text.splitlines()):,} lines)")
        print("goal: canary.check <= 20x the numpy pass")
        print(quietness("end"))


if __name__ == "__main__":
    main()
