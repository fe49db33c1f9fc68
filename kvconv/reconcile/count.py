"""Count stage: per launch the device events matched to it, the distinct in-grid blocks among them, those outside
the grid or repeated, the earliest entry; the missing / extra findings; what no launch accounts for.

    >>> c = count_blocks(ev, table, match, ordered, drops, names, notes, options)   # doctest: +SKIP
    >>> c.missing.sum(), c.unattributed
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._notes import Notes, hexs, ranges
from .events import Drops, Events
from .exact import Match
from .launches import GRAPH_NODE, LaunchTable, kind_name, launch_name


@dataclass(frozen=True)
class Counts:
    recorded: np.ndarray  # per row: events matched
    distinct: np.ndarray  # per row: distinct in-grid blocks among them
    outside: np.ndarray
    dupblk: np.ndarray
    first_ns: np.ndarray  # earliest matched entry (0 if none)
    missing: np.ndarray  # per row (0 inside ambiguous runs: counted per run)
    unattributed: int  # events counted neither in a launch nor in an ambiguous run


def _per_launch(ev: Events, t: LaunchTable, match: Match):
    """Per launch: events matched, distinct in-grid blocks, events outside the grid, repeated blocks, earliest entry.
    Repeats are found on one key per block, the launch's first block slot plus the linear blockIdx (a sort of the
    keys, none when they already increase); ``dupe`` (per matched event: a repeat) is only built when some exist."""
    nH = t.n
    m = np.flatnonzero(match.host >= 0)
    h = match.host[m]
    gx, gy, gz = t.gx[h], t.gy[h], t.gz[h]
    x, y, z = ev.x[m].astype(np.uint64), ev.y[m].astype(np.uint64), ev.z[m].astype(np.uint64)
    inside = (x < gx) & (y < gy) & (z < gz)
    with np.errstate(over="ignore"):
        lin = x + gx * (y + gy * z)
    recorded = np.bincount(h, minlength=nH).astype(np.int64)
    hin = h[inside]
    n_inside = np.bincount(hin, minlength=nH).astype(np.int64)
    distinct = _distinct_blocks(t, hin, lin[inside], n_inside)
    dupe = None
    if distinct is None or int((n_inside - distinct).sum()):
        dupe = np.zeros(len(h), bool)  # the rare path: which events are the repeats, in sequence order
        dupe[inside] = _repeats(hin, lin[inside])
        distinct = np.bincount(h[inside & ~dupe], minlength=nH).astype(np.int64)
    tmin = np.full(nH, np.iinfo(np.uint64).max, np.uint64)
    np.minimum.at(tmin, h, ev.t[m])
    return (m, h, inside, dupe, recorded, distinct, np.bincount(h[~inside], minlength=nH).astype(np.int64),
            n_inside - distinct, np.where(recorded > 0, tmin, 0).astype(np.uint64))


def _distinct_blocks(t: LaunchTable, h: np.ndarray, lin: np.ndarray, n_inside: np.ndarray) -> np.ndarray | None:
    """Distinct in-grid blocks per launch (None when the grids are too large for one key space: damage)."""
    grid = np.where(t.grid > 0, t.grid, 0)
    if float(grid.sum(dtype=np.float64)) >= 2.0**62:
        return None
    base = np.concatenate([[0], np.cumsum(grid)[:-1]]).astype(np.int64)
    key = base[h] + lin.astype(np.int64)
    if len(key) < 2 or bool(np.all(key[1:] > key[:-1])):
        return n_inside.copy()
    key.sort()
    first = np.r_[True, key[1:] != key[:-1]]
    if first.all():
        return n_inside.copy()
    owner = np.searchsorted(base, key[first], side="right") - 1
    return np.bincount(owner, minlength=t.n).astype(np.int64)


def _repeats(h: np.ndarray, lin: np.ndarray) -> np.ndarray:
    """Per event: an earlier event (sequence order) had the same launch and blockIdx."""
    key_o = np.lexsort((np.arange(len(h)), lin, h))
    hs, ls = h[key_o], lin[key_o]
    dupe = np.zeros(len(h), bool)
    dupe[key_o] = np.r_[False, (hs[1:] == hs[:-1]) & (ls[1:] == ls[:-1])]
    return dupe


def _firsts(h: np.ndarray, sel: np.ndarray) -> dict:
    out: dict = {}
    for i in np.flatnonzero(sel):
        out.setdefault(int(h[i]), i)
    return out


def count_blocks(ev: Events, t: LaunchTable, match: Match, o, drops: Drops, names: dict, notes: Notes,
                 strict_coverage: bool) -> Counts:
    """``o``: the ordered join's extras (:class:`kvconv.reconcile.ordered.Ordered`) or None."""
    m, h, inside, dupe, recorded, distinct, outside, dupblk, first_ns = _per_launch(ev, t, match)
    exp = np.where(t.dup | t.upload, 0, t.grid)
    in_region = o.in_region if o is not None else np.zeros(t.n, bool)
    missing = np.where(~in_region & ~t.dup, np.maximum(exp - distinct, 0), 0)
    late = o.coverage_late if o is not None else 0
    late_until = -1
    if late:  # launches whose blocks lie (in part) before the first covered block, in host order
        late_until = int(np.searchsorted(np.cumsum(t.grid[o.order]), late, side="left"))
    dev_note = f" ({drops.loss()})" if drops.device else ""
    for hh in t.in_order(missing > 0):
        rec, ex = int(distinct[hh]), int(exp[hh])
        why, sev, code = dev_note, "error", "missing-blocks"
        if late and 0 <= o.order_pos[hh] <= late_until:
            why = (" - ran before coverage began: 0 device drops, so the deficit can only be launches that ran "
                   "before patching (coverage starts late, it never stops early)")
            sev, code = ("error" if strict_coverage else "warning"), "coverage-late"
        notes.add(sev, code, f"{launch_name(t, names, hh)}: {rec:,} of {ex:,} blocks recorded, {ex - rec:,} "
                  f"missing{why}", kind=kind_name(t, hh), index=int(t.index[hh]))
    _extra_findings(ev, t, m, h, inside, dupe, recorded, outside, dupblk, exp, o, names, notes)
    regions = o.regions if o is not None else []
    _region_findings(t, regions, ev, drops, names, notes)
    in_runs = sum(r["unattributed_events"] for r in regions)
    return Counts(recorded=recorded, distinct=distinct, outside=outside, dupblk=dupblk, first_ns=first_ns,
                  missing=missing, unattributed=int((match.host < 0).sum()) - in_runs)


def _extra_findings(ev, t, m, h, inside, dupe, recorded, outside, dupblk, exp, o, names, notes) -> None:
    if not (outside.any() or dupblk.any()):
        return
    x, y, z = ev.x[m], ev.y[m], ev.z[m]
    first_out = _firsts(h, ~inside) if (~inside).any() else {}
    first_dup = _firsts(h, dupe) if dupe is not None and dupe.any() else {}
    alts = o.surplus_alt if o is not None else {}
    for hh in t.in_order(outside > 0):
        i = first_out[int(hh)]
        blk = f"({int(x[i])},{int(y[i])},{int(z[i])})"
        alt = alts.get(int(hh))
        alt = (f"; ordered join: it came right after the last block of {launch_name(t, names, alt)} and may belong "
               "to that launch instead") if alt is not None else ""
        notes.add("error", "extra-blocks", f"{launch_name(t, names, hh)}: {int(recorded[hh]):,} device events for "
                  f"{int(exp[hh]):,} expected blocks; {int(outside[hh]):,} outside the grid, first block {blk}{alt}",
                  kind="device_event", index=int(ev.idx[m[i]]), count=int(outside[hh]))
    for hh in t.in_order(dupblk > 0):
        i = first_dup[int(hh)]
        blk = f"({int(x[i])},{int(y[i])},{int(z[i])})"
        notes.add("error", "duplicate-block", f"{launch_name(t, names, hh)}: {int(dupblk[hh]):,} blocks recorded more "
                  f"than once, first {blk}", kind="device_event", index=int(ev.idx[m[i]]), count=int(dupblk[hh]))


def _region_findings(t, regions, ev, drops, names, notes) -> None:
    ms_groups: dict = {}
    for r in regions:
        hs = r["hosts"]
        if (r["reason"] == "multi-stream" and r["expected_blocks"] == r["device_events"]
                and (t.kind[hs] == GRAPH_NODE).all() and len(np.unique(t.graph_exec[hs])) == 1):
            ms_groups.setdefault(int(t.graph_exec[hs[0]]), []).append(r)
        else:
            _region_finding(t, r, ev, drops, names, notes)
    for ex, rs in ms_groups.items():
        reps = sorted({int(v) for r in rs for v in t.launch_id[r["hosts"]]})
        hs = np.concatenate([r["hosts"] for r in rs])
        nev = sum(r["unattributed_events"] for r in rs)
        notes.add("warning", "ordered-ambiguous", f"ordered join: graph exec {hexs(ex)} replays {ranges(reps)}: the "
                  f"nodes ran on {len(np.unique(t.stream[hs]))} streams and the device order between streams is "
                  f"unknown, so {nev:,} events are attributed to their replay only, not to a node (counts per replay "
                  "agree); use a dump with gridid+tag for the exact join",
                  kind="device_event", index=int(ev.idx[rs[0]["first_event"]]), count=nev)


def _region_finding(t, r: dict, ev, drops: Drops, names, notes: Notes) -> None:
    hs = r["hosts"]
    first, last = int(hs[0]), int(hs[-1])
    d_ = r["expected_blocks"] - r["device_events"]
    what = f"{len(hs):,} launches from {launch_name(t, names, first)} to {launch_name(t, names, last)}"
    if r["reason"] == "multi-stream":
        ex = sorted({hexs(v) for v in t.graph_exec[hs] if v}) or ["-"]
        notes.add("warning", "ordered-ambiguous", f"ordered join: {what} ran on {len(np.unique(t.stream[hs]))} "
                  f"streams; the device order between streams is unknown, so {r['unattributed_events']:,} events are "
                  f"attributed to their replay/window only, not to a node (graph exec {', '.join(ex)}); use a dump "
                  "with gridid+tag for the exact join", kind="device_event", index=int(ev.idx[r["first_event"]]),
                  count=r["unattributed_events"])
        if d_:
            notes.add("error", "missing-blocks" if d_ > 0 else "extra-blocks",
                      f"{what}: {r['expected_blocks']:,} expected blocks, {r['device_events']:,} device events "
                      f"({abs(d_):,} {'missing' if d_ > 0 else 'extra'}); which launch cannot be told",
                      kind=kind_name(t, first), index=int(t.index[first]))
        return
    notes.add("error", "missing-blocks" if d_ > 0 else ("extra-blocks" if d_ < 0 else "ordered-ambiguous"),
              f"ordered join: {what}: {r['expected_blocks']:,} expected blocks, {r['device_events']:,} device "
              f"events, {abs(d_):,} {'missing' if d_ >= 0 else 'extra'}; {drops.loss()}, so the ordered join cannot "
              f"tell which of these launches {'lost' if d_ >= 0 else 'gained'} them "
              f"({r['unattributed_events']:,} events unattributed)", kind=kind_name(t, first), index=int(t.index[first]))


def check_ordered_against_gridid(ev: Events, t: LaunchTable, match: Match, notes: Notes) -> int:
    """An ordered join forced on events that carry %gridid is checked against the grid id each event names.

    Where they disagree, the device order is not the host order (a multi-stream graph, concurrent kernels): the
    ordered answer for those events is wrong, so it is reported and their launch/node attribution is withdrawn (they
    keep their replay; block counts were taken before, per replay they still agree)."""
    m = (match.host >= 0) & ev.has_gid
    bad = np.zeros(len(m), bool)
    bad[m] = t.grid_id[match.host[m]] != ev.gridid[m]
    n = int(bad.sum())
    if n:
        first = int(np.flatnonzero(bad)[0])
        notes.add("warning", "ordered-ambiguous", f"ordered join contradicted by %gridid for {n:,} device events: the "
                  "device order is not the host order (a multi-stream graph or concurrent kernels), so these events "
                  "keep their replay but not a launch or node; use --join exact", kind="device_event",
                  index=int(ev.idx[first]), count=n)
        match.host[bad] = -1
        match.ordinal[bad] = -1
    return n
