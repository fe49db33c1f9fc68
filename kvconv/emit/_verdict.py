"""What an emitter says on stderr when its output is empty or its input suspect (never silent about either).

- A ``--window`` / ``--replays`` filter that keeps no device event: a warning naming what the dump holds (the
  output is still written: an empty selection is an answer, not an error, as for any filter).
- A dump whose reconciliation FAILS (what ``kvconv reconcile`` would print): a warning naming the error findings.
  The join the emitters ran already tells whether that can be: when kvconv.check.reconcile made the matches its result
  says it; after the exact (gridid) join, a launch whose matched block count differs from its grid's block count
  (the cheap signal: counts from the join's runs, no pass over the events) is handed to kvconv.check.reconcile for the
  verdict, since some such deficits are no failure (coverage that starts late).

    >>> warn_empty(ctxs, aggs, options, warn)        # doctest: +SKIP
    >>> warn_reconcile(ctxs, options, warn)          # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from kvconv.emit._stream import GRAPH_NODE
from kvconv.emit.options import EmitOptions


def warn_empty(ctxs: list, aggs: list, options: EmitOptions, warn) -> None:
    """Warn when the filters keep none of the device events there are."""
    total = sum(c.n_events for c in ctxs)
    if not total or sum(a.kept for a in aggs):
        return
    if options.replays is not None:
        a, b = options.replays
        ids = []
        for c in ctxs:
            with c.held(join=False) as c:
                ids.append(c.host.launch_id[(c.host.kind == GRAPH_NODE) & c.host.shown])
        ids = np.concatenate(ids) if ids else np.zeros(0, np.uint64)
        have = f"graph replays in the input: {int(ids.min())}..{int(ids.max())}" if len(ids) else \
            "the input has no graph replays"
        warn(f"--replays {a}:{b} keeps none of the {total:,} device events ({have}); the output holds no device "
             "events")
        return
    if options.window_ms is not None:
        a, b = options.window_ms
        spans = [int(max(g.records["globaltimer"].max() for g in c.groups if len(g.records)))
                 - int(min(g.records["globaltimer"].min() for g in c.groups if len(g.records)))
                 for c in ctxs if c.n_events]
        warn(f"--window {a:g}:{b:g} keeps none of the {total:,} device events (they span 0..{max(spans) / 1e6:.3f} "
             "ms after each context's first); the output holds no device events")


def warn_reconcile(ctxs: list, options: EmitOptions, warn) -> None:
    """Warn, per dump, when kvconv reconcile FAILS on it (see the module docstring for when it is asked)."""
    if options.join == "exact":
        return
    from kvconv.check import reconcile as rec
    from kvconv.check.verdict import STATES
    from kvconv.wording import counted

    by_dump: dict[int, list] = {}
    for c in ctxs:
        by_dump.setdefault(id(c.dump), []).append(c)
    for cs in by_dump.values():
        rr = cs[0].reconcile_result
        if rr is None:
            if sum(c.n_events for c in cs) > options.reconcile_max_events or not any(_suspect(c) for c in cs):
                continue
            rr = rec.reconcile(cs[0].dump, options=rec.ReconcileOptions())
        if rr.ok:
            continue
        codes = Counter(f.code for f in rr.findings if f.severity == "error")
        n = sum(codes.values())
        what = ", ".join(f"{k} {v:,}" if v > 1 else k for k, v in sorted(codes.items()))
        warn(f"{cs[0].label}: kvconv reconcile {STATES['failed']} ({counted(n, 'error finding')}: {what}); the "
             f"output shows the events as recorded; `kvconv reconcile {cs[0].label}` says what disagrees")


def _suspect(c) -> bool:
    """Whether the exact join left a launch with more or fewer matched block events than its grid has blocks (or
    the join's runs are not all at hand to tell)."""
    h = c.host
    if c.xjoin is None or c._runs is None:
        return bool(c.n_events or h.n)
    if sum(v[0] for v in c._runs.values()) != c.n_events:
        return True  # runs beyond RUNS_CACHE were not kept
    count = np.zeros(h.n, np.int64)
    for n, starts, rhid in c._runs.values():
        m = rhid >= 0
        if m.any():
            np.add.at(count, rhid[m], np.diff(np.append(starts, n))[m])
    live = h.shown
    return bool(np.any(count[live] != h.grid[live]))
