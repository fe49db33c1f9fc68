"""Count stage: per launch the device events matched to it, the distinct in-grid blocks among them, those outside
the grid or repeated, the earliest entry; the missing / extra findings; what no launch accounts for.

    >>> c = count_blocks(table, match, ordered, drops, names, notes, options)   # doctest: +SKIP
    >>> c.missing.sum(), c.unattributed
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvconv.check.reconcile.tally import Tally
from kvconv.join.events import Drops, Events
from kvconv.join.exact import Match
from kvconv.join.launches import GRAPH_NODE, LaunchTable, kind_name, launch_name
from kvconv.join.notes import Notes, hexs, ranges


@dataclass(frozen=True)
class Counts:
    """What the count stage adds to the join's per-launch reductions (``tally``: events recorded per row, distinct
    in-grid blocks, outside the grid, repeated, first and last entry)."""

    tally: Tally
    missing: np.ndarray  # per row (0 inside ambiguous runs: counted per run)
    unattributed: int  # events counted neither in a launch nor in an ambiguous run
    unflushed: int = 0  # missing blocks of a dead producer's last launches (or cut off the file's end): not the GPU


def count_blocks(t: LaunchTable, tally: Tally, o, drops: Drops, names: dict, notes: Notes,
                 strict_coverage: bool) -> Counts:
    """``tally``: the join's per-launch reductions (:mod:`kvconv.check.reconcile.tally`); ``o``: the ordered join's
    extras (:class:`kvconv.check.reconcile.ordered.Ordered`) or None (its regions name their first event by device
    index)."""
    distinct = tally.distinct
    exp = _Expected(t)
    in_region = o.in_region if o is not None else np.zeros(t.n, bool)
    missing = t.grid - distinct  # in place from here: one array per host row, no expected-blocks copy
    np.maximum(missing, 0, out=missing)
    missing[t.dup | t.upload] = 0
    if o is not None:
        missing[in_region] = 0
    late = o.coverage_late if o is not None else 0
    late_until = -1
    if late:  # launches whose blocks lie (in part) before the first covered block, in host order
        late_until = int(np.searchsorted(np.cumsum(t.grid[o.order]), late, side="left"))
    dev_note = f" ({drops.loss()})" if drops.device else ""
    tail = _unflushed(t, distinct, missing, notes)
    early = (o.order_pos >= 0) & (o.order_pos <= late_until) if late else None  # coverage-late rows
    cut = _cut_tail(t, distinct, missing, notes, drops, early) if tail is None else None
    unflushed = 0
    for hh in t.in_order(missing > 0):
        rec, ex = int(distinct[hh]), int(exp[hh])
        why, sev, code = dev_note, "error", "missing-blocks"
        if cut is not None and cut[0][hh]:  # placed, as a dead producer's end is: no counts-differ for them
            why, sev, code = cut[1], "warning", "lost-at-cut"
            unflushed += ex - rec
        elif tail is not None and tail[hh]:
            why = (" - lost at the producer's end: the dump is unfinished (the producer died or was killed) and these "
                   "blocks ran after the last flush of its device events; not a fault of the GPU")
            sev, code = "warning", "unflushed-blocks"
            unflushed += ex - rec
        elif late and 0 <= o.order_pos[hh] <= late_until:
            why = (" - ran before coverage began: 0 device drops, so the deficit can only be launches that ran "
                   "before patching (coverage starts late, it never stops early)")
            sev, code = ("error" if strict_coverage else "warning"), "coverage-late"
        notes.add(sev, code, f"{launch_name(t, names, hh)}: {rec:,} of {ex:,} blocks recorded, {ex - rec:,} "
                  f"missing{why}", kind=kind_name(t, hh), index=int(t.index[hh]))
    _extra_findings(t, tally, exp, o, names, notes)
    regions = o.regions if o is not None else []
    _region_findings(t, regions, drops, names, notes)
    in_runs = sum(r["unattributed_events"] for r in regions)
    return Counts(tally=tally, missing=missing, unattributed=tally.replay_only + tally.unmatched - in_runs,
                  unflushed=unflushed)


def _unflushed(t: LaunchTable, distinct: np.ndarray, missing: np.ndarray, notes: Notes) -> np.ndarray | None:
    """Of a live dump (its producer died: ``unfinished``), the rows whose missing blocks are the producer's end: the
    launches from the last one with a recorded block on, in host time (the flusher copies device events every
    KVCONV_FLUSH_MS; those of the last launches before the death never reached the file). None: not a live dump, no
    launch misses a block, or the device buffer refused events (validate's ``dropped``: the missing blocks are
    unknowable, errors, and the verdict is the same failed one)."""
    from kvconv.check.validate_records import refused_records

    d, ctx = notes.d, notes.ctx
    groups = d.groups_of("device_event", context_id=ctx)
    if not any(g.live for g in groups) or not missing.any():
        return None
    if any(refused_records(g) for g in groups):  # a full buffer refused events: any missing block may be one of them
        return None
    host_ns = t.host_ns
    if host_ns is None:  # a lean table (large streamed report): the host times read back for this rule only
        host_ns = np.concatenate([d.records(k, context_id=ctx)["host_ns"] for k in ("graph_node", "eager_launch")])
    seen = (distinct > 0) & ~(t.dup | t.upload)
    last = int(host_ns[seen].max()) if seen.any() else -1
    return (missing > 0) & (host_ns.astype(np.int64) >= last)


def _cut_tail(t: LaunchTable, distinct: np.ndarray, missing: np.ndarray, notes: Notes, drops: Drops, early):
    """Of a dump read with --salvage whose device events were cut at the end (the only loss: ``lost`` events, the
    ones kept run 0..N-1 in sequence), the rows whose missing blocks are exactly the lost ones, and why: the last
    launches in host time, from the last one with a recorded block on, missing ``lost`` blocks together while no
    other launch misses one (the lost events were the last slots; ``early``: the launches before coverage began,
    which the ordered join places apart). None otherwise: the loss cannot be placed."""
    lost = drops.device_lost
    if not lost or drops.device != lost or not missing.any():
        return None
    seq = notes.d.records("device_event", context_id=notes.ctx)["sequence"]
    n = len(seq)
    if n and not (int(seq[0]) == 0 and int(seq[-1]) == n - 1 and bool(np.all(seq[1:] > seq[:-1]))):
        return None  # a gap or a disorder: the lost events are not known to be the last
    host_ns = t.host_ns
    if host_ns is None:
        host_ns = np.concatenate([notes.d.records(k, context_id=notes.ctx)["host_ns"]
                                  for k in ("graph_node", "eager_launch")])
    seen = (distinct > 0) & ~(t.dup | t.upload)
    last = int(host_ns[seen].max()) if seen.any() else -1
    rows = (missing > 0) & (host_ns.astype(np.int64) >= last)
    others = ~rows if early is None else ~rows & ~early
    if missing[others].any() or int(missing[rows].sum()) > lost:
        return None
    why = (f" - lost at the cut: the file was cut short and the last {lost:,} device events (sequence {n:,}.."
           f"{n + lost - 1:,}) were lost with its end (--salvage); not a fault of the GPU")
    return rows, why


class _Expected:
    """Blocks a row's grid predicts, 0 for duplicates and graph uploads (they are not counted), row by row."""

    def __init__(self, t: LaunchTable) -> None:
        self.t = t

    def __getitem__(self, h) -> int:
        t = self.t
        return 0 if (t.dup[h] or t.upload[h]) else int(t.grid[h])


def _extra_findings(t, tally: Tally, exp, o, names, notes) -> None:
    outside, dupblk, recorded = tally.outside, tally.dupblk, tally.recorded
    if not (outside.any() or dupblk.any()):
        return
    alts = o.surplus_alt if o is not None else {}
    for hh in t.in_order(outside > 0):
        dev, x, y, z = tally.first_out[int(hh)]
        alt = alts.get(int(hh))
        alt = (f"; ordered join: it came right after the last block of {launch_name(t, names, alt)} and may belong "
               "to that launch instead") if alt is not None else ""
        notes.add("error", "extra-blocks", f"{launch_name(t, names, hh)}: {int(recorded[hh]):,} device events for "
                  f"{int(exp[hh]):,} expected blocks; {int(outside[hh]):,} outside the grid, first block "
                  f"({x},{y},{z}){alt}", kind="device_event", index=dev, count=int(outside[hh]))
    for hh in t.in_order(dupblk > 0):
        dev, x, y, z = tally.first_dup[int(hh)]
        notes.add("error", "duplicate-block", f"{launch_name(t, names, hh)}: {int(dupblk[hh]):,} blocks recorded more "
                  f"than once, first ({x},{y},{z})", kind="device_event", index=dev, count=int(dupblk[hh]))


def _region_findings(t, regions, drops, names, notes) -> None:
    ms_groups: dict = {}
    for r in regions:
        hs = r["hosts"]
        if (r["reason"] == "multi-stream" and r["expected_blocks"] == r["device_events"]
                and (t.kind[hs] == GRAPH_NODE).all() and len(np.unique(t.graph_exec[hs])) == 1):
            ms_groups.setdefault(int(t.graph_exec[hs[0]]), []).append(r)
        else:
            _region_finding(t, r, drops, names, notes)
    for ex, rs in ms_groups.items():
        reps = sorted({int(v) for r in rs for v in t.launch_id[r["hosts"]]})
        hs = np.concatenate([r["hosts"] for r in rs])
        nev = sum(r["unattributed_events"] for r in rs)
        notes.add("warning", "ordered-ambiguous", f"ordered join: graph exec {hexs(ex)} replays {ranges(reps)}: the "
                  f"nodes ran on {len(np.unique(t.stream[hs]))} streams and the device order between streams is "
                  f"unknown, so {nev:,} events are attributed to their replay only, not to a node (counts per replay "
                  "agree); use a dump with gridid+tag for the exact join",
                  kind="device_event", index=rs[0]["first_event"], count=nev)


def _region_finding(t, r: dict, drops: Drops, names, notes: Notes) -> None:
    hs = r["hosts"]
    first, last = int(hs[0]), int(hs[-1])
    d_ = r["expected_blocks"] - r["device_events"]
    what = f"{len(hs):,} launches from {launch_name(t, names, first)} to {launch_name(t, names, last)}"
    if r["reason"] == "multi-stream":
        ex = sorted({hexs(v) for v in t.graph_exec[hs] if v}) or ["-"]
        notes.add("warning", "ordered-ambiguous", f"ordered join: {what} ran on {len(np.unique(t.stream[hs]))} "
                  f"streams; the device order between streams is unknown, so {r['unattributed_events']:,} events are "
                  f"attributed to their replay/window only, not to a node (graph exec {', '.join(ex)}); use a dump "
                  "with gridid+tag for the exact join", kind="device_event", index=r["first_event"],
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
              f"({r['unattributed_events']:,} events unattributed)", kind=kind_name(t, first),
              index=int(t.index[first]))


def check_ordered_against_gridid(ev: Events, t: LaunchTable, match: Match, notes: Notes) -> int:
    """An ordered join forced on events that carry %gridid is checked against the grid id each event names.

    Where they disagree, the device order is not the host order (a multi-stream graph, concurrent kernels): the
    ordered answer for those events is wrong, so it is reported and their launch/node attribution is withdrawn (they
    keep their replay; block counts were taken before, per replay they still agree)."""
    bad = gridid_contradicts(t, match, ev.has_gid, ev.gridid)
    n = int(bad.sum())
    if n:
        gridid_note(notes, n, int(ev.idx[np.flatnonzero(bad)[0]]))
        match.host[bad] = -1
        match.ordinal[bad] = -1
    return n


def gridid_contradicts(t: LaunchTable, match: Match, has_gid: np.ndarray, gridid: np.ndarray) -> np.ndarray:
    """The events (of one chunk or all) whose ordered launch names another grid id than the event carries."""
    m = (match.host >= 0) & has_gid
    bad = np.zeros(len(m), bool)
    bad[m] = t.grid_id[match.host[m]] != gridid[m]
    return bad


def gridid_note(notes: Notes, n: int, first_dev: int) -> None:
    notes.add("warning", "ordered-ambiguous", f"ordered join contradicted by %gridid for {n:,} device events: the "
              "device order is not the host order (a multi-stream graph or concurrent kernels), so these events "
              "keep their replay but not a launch or node; use --join exact", kind="device_event",
              index=first_dev, count=n)
