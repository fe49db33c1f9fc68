"""The ordered join: device events in sequence order laid over host launches in host order, each launch taking as
many consecutive events as its grid has blocks (one stream assumed; multi-stream neighbours form windows).

    >>> o = join_ordered(ev, table, drops, names, notes)     # doctest: +SKIP
    >>> o.match.host[:5], o.regions, o.coverage_late
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvconv.join.events import Drops, Events
from kvconv.join.exact import JOIN_ORDERED, Match
from kvconv.join.launches import GRAPH_NODE, LaunchTable, kernel_short, launch_name
from kvconv.join.notes import Notes


@dataclass(frozen=True)
class Ordered:
    match: Match
    order: np.ndarray  # launch-table rows in host order (duplicates and uploads left out)
    order_pos: np.ndarray  # per row: its place in ``order`` (-1: not in it)
    regions: list  # ambiguous runs and multi-stream windows: dicts with "hosts" (rows) and "first_event"
    in_region: np.ndarray  # per row
    info: dict  # the report's "ordered" section
    coverage_late: int  # blocks missing at the start with 0 drops: launches that ran before coverage began
    surplus_alt: dict  # row -> the previous launch its first (surplus) block may belong to instead
    note: str


def _offsets(ev: Events, t, order, C, E: int, dr: Drops, m: Match) -> tuple:
    """Positions and the range of offsets s (event at position p sits at host block p + s)."""
    drops = dr.device
    T = int(ev.pos[-1]) + 1 if ev.n else 0  # block-enter slots reserved (gaps included)
    gaps = T - ev.n
    p, surplus, alt = ev.pos, np.zeros(ev.n, bool), {}
    if E - T < 0 and drops == 0 and len(order):
        # More events than blocks: find each surplus event as the first that does not fit the launch the forward
        # placement gives it (kernel slot, blockIdx outside the grid, blockIdx repeated); a few rounds. In memory
        # only (the chunked join leaves this case to this path): a damaged dump's rare shape.
        p, surplus, hosts, alt = _locate_surplus(ev, t, order, C, T - E)
        if surplus.any():
            m.host[surplus] = hosts
            m.join[surplus] = JOIN_ORDERED
            keep = ~surplus
            T = int(p[keep][-1]) + 1 if keep.any() else 0
    delta, s_lo, s_hi, info = offsets_of(E, T, ev.n, drops, dr.device_lost)
    info["sequence_gaps"] = gaps
    return p, surplus, alt, delta, s_lo, s_hi, info


def _windows(t: LaunchTable, order: np.ndarray) -> tuple[np.ndarray, int]:
    """Window id per launch in host order: neighbouring launches on different streams (not across replays of one
    graph exec), and every node of a graph replay spanning several streams."""
    nL = len(order)
    if not nL:
        return np.zeros(0, np.int64), 0
    # one host-order column at a time (each is 8 bytes a launch: 2.6 M launches a context at 10 GiB, issue 13)
    st = t.stream[order]
    link = st[1:] != st[:-1]
    n_streams = len(np.unique(st)) if link.any() else 1  # (the join's note: the chunked pass lets t.stream go)
    del st
    kd = t.kind[order] == GRAPH_NODE
    both_g = kd[1:] & kd[:-1]
    del kd
    other_replay = _differs(t.graph_exec, order)
    other_replay |= _differs(t.launch_id, order)
    other_replay &= both_g
    if n_streams > 1:  # (one stream: no replay spans several)
        link = (link & ~other_replay) | (both_g & ~other_replay & _replay_multistream(t, order))
    else:
        link &= ~other_replay
    win = np.zeros(nL, _row_type(nL))
    np.cumsum(~link, out=win[1:])
    return win, n_streams


def _differs(col: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Whether ``col`` differs between neighbours in ``order``."""
    c = col[order]
    return c[1:] != c[:-1]


class Layout:
    """The host side of the ordered join, built once per context: launch-table rows in host order (duplicates and
    uploads left out), their block counts and cumulative counts, and the multi-stream windows."""

    def __init__(self, t: LaunchTable) -> None:
        self.t = t
        # host order; report order within equal host_ns. Row numbers and window ids as i4 below 2^31 rows: the
        # layout is held through the chunked join beside the table (issue 13: 2.6 M launches a context at 10 GiB)
        rows = _row_type(t.n)
        live = t.in_order(~t.dup & ~t.upload)  # in report order: a stable sort by host time keeps it within ties
        self.order = live[np.argsort(t.host_ns[live], kind="stable")].astype(rows)
        del live
        self.C = np.cumsum(t.grid[self.order])  # blocks up to each launch's end (host order)
        self.E = int(self.C[-1]) if len(self.order) else 0
        win, self.n_streams = _windows(t, self.order)
        self.win = win
        self.wstart_of = np.searchsorted(win, win, side="left").astype(rows)
        self.wend_of = (np.searchsorted(win, win, side="right") - 1).astype(rows)

    def blocks(self, lo: int, hi: int) -> tuple:
        """Host blocks of launches ``lo .. hi`` (host order): first block, one past the last."""
        return (int(self.C[lo - 1]) if lo > 0 else 0), int(self.C[hi])


def _row_type(n: int) -> type:
    return np.int32 if n < (1 << 31) else np.int64


class Placer:
    """Lays events over a :class:`Layout` under offsets ``s_lo .. s_hi``, chunk by chunk (events in sequence order,
    positions non-decreasing): the per-chunk match, the misfits per launch and the ambiguous runs and multi-stream
    windows, which may span chunk edges (the open one is carried to the next chunk)."""

    def __init__(self, L: Layout, s_lo: int, s_hi: int) -> None:
        self.L, self.s_lo, self.s_hi = L, s_lo, s_hi
        self.misfit: dict = {}  # row -> [events, first device index, its kernel slot]
        self.runs = {"deficit": _RunAcc("deficit"), "multi-stream": _RunAcc("multi-stream")}

    def place(self, m: Match, p: np.ndarray, slot: np.ndarray, idx: np.ndarray, surplus=None) -> tuple:
        """Fill ``m`` (one chunk's events at positions ``p``; ``surplus``: events already placed apart); returns the
        chunk's host blocks under the lowest and highest offset."""
        L, t = self.L, self.L.t
        a_raw = p + self.s_lo
        in_a = (a_raw >= 0) & (a_raw < L.E)
        if surplus is not None:
            in_a &= ~surplus
        la = _launch_at(L.C, a_raw, L.E)
        if self.s_hi == self.s_lo:  # one placement (no drops): the same launches under both offsets
            b_raw, in_b, lb = a_raw, in_a, la
        else:
            b_raw = p + self.s_hi
            in_b = (b_raw >= 0) & (b_raw < L.E)
            if surplus is not None:
                in_b &= ~surplus
            lb = _launch_at(L.C, b_raw, L.E)
        wa, wb = L.wstart_of[la], L.wend_of[lb]
        exact_node = in_a & in_b & (wa == wb)  # one launch, single-launch window
        win_only = in_a & in_b & ~exact_node & (L.win[la] == L.win[lb])
        amb = ~(exact_node | win_only)
        if surplus is not None:
            amb &= ~surplus
        m.host[exact_node] = L.order[la[exact_node]]
        m.join[exact_node | win_only] = JOIN_ORDERED
        m.fill_from_host(t)
        _attribute_windows(t, m, L.order, L.win, la, wa, wb, win_only)
        self._misfits(m, slot, idx)
        lo = np.where(amb, np.where(in_a, wa, 0), wa)
        hi = np.where(amb, np.where(in_b, wb, len(L.order) - 1), wb)
        self.runs["deficit"].add(amb, lo, hi, idx)
        self.runs["multi-stream"].add(win_only, lo, hi, idx)
        return a_raw, b_raw

    def _misfits(self, m: Match, slot, idx) -> None:
        """The kernel slot must fit; misfits are unmatched (reported per launch once every chunk is placed)."""
        t = self.L.t
        mis = (m.host >= 0) & (slot != t.kernel_slot[np.maximum(m.host, 0)])
        if not mis.any():
            return
        evs = np.flatnonzero(mis)
        uh, first, cnt = np.unique(m.host[mis], return_index=True, return_counts=True)
        for h, f, c in zip(uh.tolist(), first.tolist(), cnt.tolist()):
            v = self.misfit.setdefault(h, [0, int(idx[evs[f]]), int(slot[evs[f]])])
            v[0] += c
        m.clear(mis)

    def misfit_notes(self, names: dict, notes: Notes) -> None:
        misfit_notes(self.L.t, self.misfit, names, notes)

    def regions(self, count) -> list:
        """Ambiguous runs and multi-stream windows: [first launch, last launch] in host order, with their events;
        ``count(blo, bhi)``: the events whose block falls in ``blo .. bhi - 1`` under either offset."""
        L = self.L
        out = []
        found = sorted(f for r in self.runs.values() for f in r.done())
        for r_lo, r_hi, reason, nev, first_ev in found:
            blo, bhi = L.blocks(r_lo, r_hi)
            out.append({"first_launch": r_lo, "last_launch": r_hi, "reason": reason, "expected_blocks": bhi - blo,
                        "device_events": int(count(blo, bhi)), "unattributed_events": nev,
                        "hosts": L.order[r_lo : r_hi + 1], "first_event": first_ev})
        return out


def misfit_notes(t: LaunchTable, misfit: dict, names: dict, notes: Notes) -> None:
    """The misfits of :class:`Placer` (row -> [events, first device index, its kernel slot]), in report order."""
    rows = np.fromiter(misfit, np.int64, len(misfit))
    for h in rows[np.lexsort((rows, t.rank_at(rows)))].tolist():
        c, dev, slot = misfit[h]
        notes.add("error", "ordered-misfit", f"ordered join: {c:,} device events laid on "
                  f"{launch_name(t, names, h)} carry {kernel_short(names, slot)}, not the launch's kernel; "
                  "the single-stream, same-order assumption does not hold here", kind="device_event",
                  index=dev, count=c)


class _RunAcc:
    """Runs of events of one reason (ambiguous or multi-stream) as [lo, hi] launch ranges: lo/hi are non-decreasing
    in position, a new run starts where lo passes the running hi. The open run is carried across chunks."""

    def __init__(self, reason: str) -> None:
        self.reason, self.found, self.open = reason, [], None  # open: (lo, hi, events, first device index)

    def add(self, sel, lo, hi, idx) -> None:
        ev_sel = np.flatnonzero(sel)
        if not len(ev_sel):
            return
        rl, rh, first = lo[ev_sel], hi[ev_sel], idx[ev_sel]
        cnt = np.ones(len(ev_sel), np.int64)
        if self.open is not None:
            o = self.open
            rl, rh, cnt, first = np.r_[o[0], rl], np.r_[o[1], rh], np.r_[o[2], cnt], np.r_[o[3], first]
        run_hi = np.maximum.accumulate(rh)
        brk = np.r_[0, np.flatnonzero(rl[1:] > run_hi[:-1]) + 1]
        nev = np.add.reduceat(cnt, brk)
        ends = np.r_[brk[1:], len(rl)]
        runs = [(int(rl[b0]), int(run_hi[b1 - 1]), int(c), int(first[b0])) for b0, b1, c in zip(brk, ends, nev)]
        self.found.extend((lo_, hi_, self.reason, c, f) for lo_, hi_, c, f in runs[:-1])
        self.open = runs[-1]

    def done(self) -> list:
        if self.open is not None:
            lo_, hi_, c, f = self.open
            self.found.append((lo_, hi_, self.reason, c, f))
            self.open = None
        return self.found


def offsets_of(E: int, T: int, n: int, drops: int, lost: int = 0) -> tuple:
    """``E`` expected blocks, ``T`` block-enter slots reserved (gaps included), ``n`` events, ``drops`` (``lost`` of
    them to a cut, --salvage): the range of offsets s (the event at position p sits at host block p + s) and the
    report's "ordered" section. When the only loss is the cut and the events kept fill slots 0..n-1 without a gap,
    the lost ones are the last ``lost`` slots: s is known (the cut's blocks are the last, not anywhere)."""
    delta = E - T
    if lost and drops == lost and T == n and delta >= lost:
        s_lo = s_hi = delta - lost
    elif delta >= 0:
        s_lo, s_hi = (delta, delta) if drops == 0 else (max(0, delta - drops), delta)
    else:
        s_lo, s_hi = delta, 0
    info = {"expected_blocks": E, "sequence_slots": T, "sequence_gaps": T - n, "offset_lo": s_lo, "offset_hi": s_hi,
            "device_drops": drops}
    if lost and s_lo == s_hi == delta - lost:
        info["lost_at_cut"] = lost
    return delta, s_lo, s_hi, info


def finish(L: Layout, P: Placer, count, match, delta: int, info: dict, alt: dict, drops: Drops) -> Ordered:
    """The join's result once every event is placed (``count``: see :meth:`Placer.regions`)."""
    t, order = L.t, L.order
    regions = P.regions(count)
    in_region = np.zeros(t.n, bool)
    for r in regions:
        in_region[r["hosts"]] = True
    late = P.s_lo if (delta > 0 and drops.device == info.get("lost_at_cut", 0)) else 0
    info["late_start_blocks"] = late
    order_pos = np.full(t.n, -1, _row_type(t.n))
    order_pos[order] = np.arange(len(order))
    return Ordered(match=match, order=order, order_pos=order_pos, regions=regions, in_region=in_region, info=info,
                   coverage_late=late, surplus_alt=alt,
                   note=_note(L.n_streams, late, drops, delta, info.get("lost_at_cut", 0)).replace(
                       "{n}", f"{info['sequence_slots'] - 1:,}"))


def join_ordered(ev: Events, t: LaunchTable, drops: Drops, names: dict, notes: Notes) -> Ordered:
    """Lay events (sequence order, in memory) over host launches (host order), each launch taking its grid's block
    count; :mod:`kvconv.check.reconcile.window` does the same chunk by chunk."""
    m = Match.empty(ev.n)
    L = Layout(t)
    p, surplus, alt, delta, s_lo, s_hi, info = _offsets(ev, t, L.order, L.C, L.E, drops, m)
    P = Placer(L, s_lo, s_hi)
    a_raw, b_raw = P.place(m, p, ev.slot, ev.idx, surplus if surplus.any() else None)
    P.misfit_notes(names, notes)
    return finish(L, P, lambda blo, bhi: ((b_raw >= blo) & (a_raw < bhi)).sum(), m, delta, info, alt, drops)


def _launch_at(C: np.ndarray, block: np.ndarray, E: int) -> np.ndarray:
    """The launch (place in host order) holding each host block ``block`` (clipped to 0 .. E-1), ``C``: the launches'
    cumulative block counts. Events come in sequence order, so ``block`` normally never decreases: then each
    launch's first event is looked up (launches are far fewer than events) instead of each event's launch."""
    nL = len(C)
    v = np.clip(block, 0, max(E - 1, 0))
    if len(v) > 1 and not bool(np.all(v[1:] >= v[:-1])):
        return np.minimum(np.searchsorted(C, v, side="right"), nL - 1)
    if not len(v):
        return np.zeros(0, np.int64)
    # only the launches the chunk's blocks span (i0 .. i1): a chunk's work, not the context's launches every chunk
    # (that made the chunked join quadratic: 10 GiB, 2.6 M launches a context)
    i0, i1 = (int(i) for i in np.searchsorted(C, v[[0, -1]], side="right"))
    first = np.searchsorted(v, C[i0:i1], side="left")  # events before each launch's end
    la = np.repeat(np.arange(i0, i1 + 1, dtype=np.int64), np.diff(first, prepend=0, append=len(v)))
    return np.minimum(la, nL - 1, out=la)


def _attribute_windows(t, m: Match, order, win, la, wa, wb, win_only) -> None:
    """Events of a multi-stream window: the kind and replay of the window when uniform."""
    if not win_only.any():
        return
    h0, h1 = order[wa[win_only]], order[wb[win_only]]
    same = ((t.kind[h0] == t.kind[h1]) & (t.replay_at(h0) == t.replay_at(h1)) & (t.graph_exec[h0] == t.graph_exec[h1]))
    sel = np.flatnonzero(win_only)
    m.kind[sel[same]] = t.kind[h0[same]]
    m.replay[sel[same]] = t.replay_at(h0[same])
    m.exec[sel[same]] = t.graph_exec[h0[same]]
    m.window[sel] = win[la[win_only]]


def _note(n_streams: int, late: int, drops: Drops, delta: int, cut: int = 0) -> str:
    note = "ordered: device events in sequence order laid over host launches in host order; assumes a single stream"
    if n_streams > 1:
        note += (f" (host records name {n_streams} streams: launches on different streams next to each other "
                 "are attributed to their window, not to one launch)")
    if late:
        note += (f"; {late:,} blocks missing with 0 device drops are attributed to the earliest launches (coverage "
                 "starts late, it never stops early)")
    if cut:
        note += (f"; the device events kept run 0..{{n}} in sequence: the {cut:,} lost to truncation are the last "
                 "slots, at the end of the last launches")
    elif drops.device and delta > 0:
        note += f"; {drops.loss()}: the deficit cannot be placed, ambiguous runs are reported"
    return note


def _locate_surplus(ev: Events, t, order, C, surplus: int, rounds: int = 64):
    """Forward placement with surplus events taken out one at a time: the first event that does not fit its
    launch (another kernel, blockIdx outside the grid, blockIdx seen before in that launch) is the surplus one.
    Returns adjusted positions, the mask of surplus events found (all or none), their launches, and alternatives."""
    n, E = ev.n, int(C[-1])
    found = np.zeros(n, bool)
    alt: dict = {}
    host_of = np.full(n, -1, np.int64)
    for _ in range(min(surplus, rounds)):
        p = ev.pos - np.cumsum(found) + found  # an excluded event keeps the slot it was found at
        idx = np.flatnonzero(~found & (p < E))
        la = np.minimum(np.searchsorted(C, p[idx], side="right"), len(order) - 1)
        h = order[la]
        x, y, z = (a[idx].astype(np.uint64) for a in (ev.x, ev.y, ev.z))
        gx, gy, gz = t.gx[h], t.gy[h], t.gz[h]
        mis = (ev.slot[idx] != t.kernel_slot[h]) | (x >= gx) | (y >= gy) | (z >= gz)
        with np.errstate(over="ignore"):  # u8: the table's grid dimensions are u4, their product is not
            lin = x + gx.astype(np.uint64) * (y + gy.astype(np.uint64) * z)
        o = np.lexsort((np.arange(len(idx)), lin, la))
        rep = np.r_[False, (la[o][1:] == la[o][:-1]) & (lin[o][1:] == lin[o][:-1])]
        dup = np.zeros(len(idx), bool)
        dup[o] = rep
        bad = np.flatnonzero(mis | dup)
        if not len(bad):
            break
        j = idx[bad[0]]
        found[j] = True
        host_of[j] = h[bad[0]]
        lj = int(la[bad[0]])
        if lj > 0 and p[j] == C[lj - 1]:  # first block of its launch: might be the previous launch's surplus
            alt[int(h[bad[0]])] = int(order[lj - 1])
    if int(found.sum()) != surplus:
        return ev.pos, np.zeros(n, bool), host_of[:0], {}
    return ev.pos - np.cumsum(found) + found, found, host_of[found], alt


def _replay_multistream(t, order: np.ndarray) -> np.ndarray:
    """For each neighbouring pair in host order that is inside one graph replay: does that replay use >1 stream?"""
    g = t.kind[order] == GRAPH_NODE
    if not g.any():
        return np.zeros(max(len(order) - 1, 0), bool)
    st = t.stream[order]
    key = np.where(g, t.graph_exec[order] * np.uint64(0x9E3779B97F4A7C15) + t.launch_id[order], 0)
    ks, inv = np.unique(key, return_inverse=True)
    inv = inv.reshape(-1)
    pair = np.unique(np.stack([inv.astype(np.uint64), st.astype(np.uint64)], axis=1), axis=0)
    nstreams = np.bincount(pair[:, 0].astype(np.int64), minlength=len(ks))
    mm = ((nstreams > 1) & (ks != 0))[inv]
    return mm[1:] & mm[:-1]

