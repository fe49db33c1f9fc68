"""Measure %globaltimer inversions in sequence order in real captures (the evidence for validate's
`timer-backwards` rule, docs/FINDINGS.md).

    python tools/timer_inversions.py fixtures/h200-*/*.kvdump*

Per dump and context: device events; inverted events (a timer below the running maximum of the events sequenced
before it) and the largest inversion; the same within one SM (against that SM's earlier events); the closest two
events of one SM come in time (how much the captures test one SM's order: blocks resident together or not); and how
many inverted events lie within 8 events of their launch's first (clustering at kernel starts).
"""

from __future__ import annotations

import sys

import numpy as np

from kvconv.format import dump


def _measure(ev: np.ndarray) -> dict:
    ev = ev[np.argsort(ev["sequence"], kind="stable")]
    t = ev["globaltimer"].astype(np.int64)
    inv = np.maximum.accumulate(t) - t           # how far each event lies below an earlier-sequenced one
    back = np.flatnonzero(inv > 0)
    sm_max, sm_n, gap = 0, 0, None
    for sm in np.unique(ev["smid"]):
        ts = t[ev["smid"] == sm]
        d = np.maximum.accumulate(ts) - ts
        sm_max, sm_n = max(sm_max, int(d.max(initial=0))), sm_n + int(np.count_nonzero(d))
        if len(ts) > 1:
            g = int(np.abs(np.diff(ts)).min())
            gap = g if gap is None else min(gap, g)
    launch = np.r_[True, (ev["gridid"][1:] != ev["gridid"][:-1]) | (ev["tag"][1:] != ev["tag"][:-1])]
    start = np.maximum.accumulate(np.where(launch, np.arange(len(ev)), 0))
    near = np.count_nonzero(back - start[back] < 8) if len(back) else 0
    return {"events": len(ev), "inverted": len(back), "max_ns": int(inv.max(initial=0)),
            "sm_inverted": sm_n, "sm_max_ns": sm_max, "near_start": int(near), "sm_gap": gap}


def main(paths: list[str]) -> None:
    print("| dump | ctx | events | inverted | max ns | within one SM: inverted / max ns | one SM's closest events ns "
          "| inverted within 8 events of a launch's first |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for p in paths:
        with dump.open(p, options=dump.ReadOptions(salvage=True)) as d:
            for ctx, _dev in d.contexts():
                ev = np.asarray(d.records("device_event", context_id=ctx))
                if not len(ev):
                    continue
                m = _measure(ev)
                print(f"| {p} | {ctx} | {m['events']:,} | {m['inverted']:,} | {m['max_ns']:,} | "
                      f"{m['sm_inverted']:,} / {m['sm_max_ns']:,} | {m['sm_gap'] or 0:,} | {m['near_start']:,} |")


if __name__ == "__main__":
    main(sys.argv[1:])
