"""Format-neutral planning of a context's tracks: which tracks there are, in which order, with which lanes and names,
decided once from the first pass and used by every trace format (Perfetto track uuids, Chrome thread ids).

Track ids are local to the context (a context's tracks never share one with another context's): Perfetto makes its
track uuids of them (``(serial + 1) << 24`` plus the local id), Chrome uses them as thread ids of the context's
process.

    >>> plan = Plan(ctx, first_pass(ctx, options), options)     # doctest: +SKIP
    >>> plan.tracks.sm(3), plan.tracks.exec_nodes(0, 1)         # local ids: SM 3's track, exec 0's second node lane
    >>> plan.node_names[plan.node_name_ix[0]]                   # 'node 0 · reshape_and_cache_flash_kernel'
"""

from __future__ import annotations

import numpy as np

from kvconv.emit._blocks import BlockStream, place_lanes
from kvconv.emit._canary import canary_steps
from kvconv.emit._first_pass import Agg, event_keep
from kvconv.emit._stream import EAGER, GRAPH_NODE, Ctx
from kvconv.emit.options import EmitOptions
from kvconv.format.errors import OutputError
from kvconv.join.launches import short_name
from kvconv.join.runs import rows_by_value

SPAN = 1 << 24  # local track ids of one context: 1 .. SPAN - 1


class TrackIds:
    """The local ids of a context's tracks (fixed ones, then per stream, per SM, per graph exec, then lanes)."""

    ROOT, BLOCKS, RATE, DROPS, HOST_DROPS, CANARY = 1, 2, 3, 4, 5, 6

    def __init__(self, context: int) -> None:
        self.context = context  # for messages: the context's place in the trace, from 1

    def stream(self, i: int) -> int:
        return 0x100 + i

    def sm(self, smid):
        return 0x10000 + smid

    def exec_group(self, j: int) -> int:
        return 0x20000 + 2 * j

    def exec_host(self, j):
        return self.exec_group(j) + 1

    def place_lanes(self, replay_lanes: list[int], node_lanes: list[int]) -> None:
        """Give each graph exec's replay and node lanes their ids, after every exec's group and host track (as many
        lanes as overlapping slices need, none shared with another exec)."""
        n = len(replay_lanes)
        sizes = np.array([x for pair in zip(replay_lanes, node_lanes) for x in pair], np.int64)
        starts = self.exec_group(n) + np.concatenate([[0], np.cumsum(sizes)[:-1]]) if n else np.zeros(0, np.int64)
        self.replay0 = starts[0::2].astype(np.uint64)
        self.node0 = starts[1::2].astype(np.uint64)
        self.next = int(starts[-1] + sizes[-1]) if n else self.exec_group(0)
        self._check()

    def take(self, n: int) -> int:
        """``n`` more ids (after every other): the first."""
        first, self.next = self.next, self.next + n
        self._check()
        return first

    def _check(self) -> None:
        if self.next >= SPAN:
            raise OutputError(f"context {self.context}: too many tracks ({self.next:,})",
                              hint="narrow the trace with --window or --replays", code="too-many-tracks")

    def exec_replays(self, j, lane):
        """The replay lane's id (vectorised over ``j`` and ``lane`` arrays)."""
        return _lane_id(self.replay0, j, lane)

    def exec_nodes(self, j, lane):
        """The node lane's id (vectorised over ``j`` and ``lane`` arrays)."""
        return _lane_id(self.node0, j, lane)


def _lane_id(first: np.ndarray, j, lane):
    if np.isscalar(j):
        return int(first[j]) + int(lane)
    return first[j] + np.asarray(lane).astype(np.uint64)


def lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Greedy lanes so that slices on one lane never overlap (strictly: the next starts after the previous ends)."""
    n = len(start)
    lane = np.zeros(n, np.int64)
    if n <= 1:
        return lane
    if bool(np.all(start[1:] > start[:-1])):  # already in start order (no ties): lexsort's order is the identity
        order, s, e = None, start, end
    else:
        order = np.lexsort((end, start))
        s, e = start[order], end[order]
    if bool(np.all(s[1:] > np.maximum.accumulate(e)[:-1])):
        return lane
    if order is None:
        order = np.arange(n)
    lane[order] = place_lanes(s, e, [], [], 0)[0]
    return lane



def _pairs_by_exec(ex: np.ndarray, v: np.ndarray, n_exec: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (ex, v) pairs in (ex, v) order: each one's first occurrence, and each row's pair, where ``ex``
    takes the values 0 .. n_exec - 1 (graph execs): one np.unique per exec, so that the temporaries are one exec's
    rows at a time (:func:`kvconv.join.runs.rows_by_value`)."""
    inv = np.empty(len(ex), np.int64)
    firsts, base = [], 0
    for _, sel in rows_by_value(ex, np.arange(n_exec)):
        if len(sel):
            f, i = _unique_first(v[sel])
            inv[sel] = base + i
            firsts.append(sel[f])
            base += len(f)
    return (np.concatenate(firsts) if firsts else np.zeros(0, np.int64)), inv


def _unique_first(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(v, return_index=True, return_inverse=True)[1:]``: the first occurrence of each distinct value, in
    value order, and each element's value rank; without a sort where ``v`` is already non-decreasing (replay ids,
    in launch order)."""
    if len(v) and bool(np.all(v[1:] >= v[:-1])):
        new = np.empty(len(v), bool)
        new[0] = True
        np.not_equal(v[1:], v[:-1], out=new[1:])
        return np.flatnonzero(new), np.cumsum(new) - 1
    _, f, i = np.unique(v, return_index=True, return_inverse=True)
    return f, i.reshape(-1)


def _per_exec_lanes(ex_of: np.ndarray, n_exec: int, st: np.ndarray, en: np.ndarray) -> tuple[np.ndarray, dict]:
    """Lanes of slices grouped by graph exec: (lane per slice, exec -> lanes it needs; execs without one left out)."""
    lane = np.zeros(len(ex_of), np.int32)
    count = {}
    for j in range(n_exec):
        sel = np.flatnonzero(ex_of == j)
        if len(sel):
            lane[sel] = lanes(st[sel], en[sel])
            count[j] = int(lane[sel].max()) + 1
    return lane, count


class Plan:
    """Everything of one context decided before any of its events is written, in no format's terms."""

    def __init__(self, c: Ctx, agg: Agg, options: EmitOptions, canary=None) -> None:
        self.c, self.agg, self.opt = c, agg, options
        self.tracks = TrackIds(c.serial + 1)
        h = c.host
        # graph execs and streams of shown host records
        self.shown = shown = h.shown & agg.kept_hosts
        gn = shown & (h.kind == GRAPH_NODE)
        ge = h.graph_exec[gn]
        self.execs = ([int(ge[0])] if int(ge.min()) == int(ge.max()) else np.unique(ge).tolist()) if len(ge) else []
        self.exec_ix = {e: j for j, e in enumerate(self.execs)}
        self.streams = np.unique(h.stream[shown & (h.kind == EAGER)]).tolist()
        self.stream_ix = {s: j for j, s in enumerate(self.streams)}
        rows_dt = np.int32 if h.n < (1 << 31) else np.int64  # row numbers: what the plan keeps per launch
        self._node_slices(np.flatnonzero(gn & (agg.count > 0)).astype(rows_dt))
        self._replay_slices()
        n = len(self.execs)
        self.tracks.place_lanes([self.replay_lanes.get(j, 0) for j in range(n)],
                                [self.node_lanes.get(j, 0) for j in range(n)])
        self.host_rows = np.flatnonzero(shown).astype(rows_dt)
        self.canary = canary if canary is not None else canary_steps(c.dump).get(c.context_id)
        self._block_lanes()

    # the kernel slices are planned when first asked for (Perfetto draws them only where exits are recorded): what
    # they take per launch is not held otherwise; their tracks' ids come after every other's either way
    _KERNEL = frozenset({"kernel_rows", "kernel_start", "kernel_end", "kernel_track", "kernel_lanes", "kernel_tracks",
                         "kernel_names", "kernel_name_ix"})

    def __getattr__(self, name: str):
        if name in Plan._KERNEL and "c" in self.__dict__:
            self._kernel_slices()
            return self.__dict__[name]
        raise AttributeError(name)

    def forget_kernel_rows(self) -> None:
        """Let the kernel slices' per-launch columns go once written (their tracks and names stay)."""
        if "kernel_rows" in self.__dict__:
            self.kernel_rows = self.kernel_start = self.kernel_end = self.kernel_track = self.kernel_name_ix = None

    def _block_lanes(self) -> None:
        """Paired blocks (entry to exit) overlap on an SM (several blocks are resident at once): per SM, as many
        lanes as that takes; lane 0 is the SM's own track, lane k its k-th extra track (``sm_lane_tracks``)."""
        b = self.agg.blocks
        self.sm_extra: dict[int, int] = {}  # smid -> local id of its lane 1 (lanes 1.. are consecutive)
        self.block_stream = BlockStream(self.c, b) if b is not None else None
        self.window = None  # the paired blocks of the chunk being written
        if b is None:
            return
        for s in sorted(b.sm_lanes):
            if b.sm_lanes[s] > 1:
                self.sm_extra[int(s)] = self.tracks.take(b.sm_lanes[s] - 1)

    def paired(self, first: int, recs, dev_index, has):
        """With paired blocks: the pair of each event (-1: none), the exits that end a pair left out (their block's
        slice ends at them); else None and the events as they are."""
        if self.block_stream is None or not len(recs):
            return None, recs, dev_index, has
        di = first + np.arange(len(recs), dtype=np.int64) if dev_index is None else np.asarray(dev_index, np.int64)
        self.window = self.block_stream.window(di)
        pair, is_exit = self.window.in_chunk(di)
        if is_exit.any():
            k = np.flatnonzero(~is_exit)
            recs, di, pair, has = recs[k], di[k], pair[k], (has[k] if has is not None else None)
        return pair, recs, di.astype(np.uint64), has

    def block_track_ids(self, recs, pair) -> np.ndarray:
        """The local track id of each event of a chunk: its SM's (lane 0), or the lane of its block's slice."""
        lane = self.window.of(self.window.lane, pair, 0)
        return self.block_tracks(recs["smid"].astype(np.int64), lane)

    def block_tracks(self, smid: np.ndarray, lane: np.ndarray) -> np.ndarray:
        """The local track id of blocks on SM ``smid``, lane ``lane`` (vectorised)."""
        out = self.tracks.sm(smid.astype(np.int64))
        k = np.flatnonzero(lane > 0)
        if len(k):
            out[k] = np.array([self.sm_extra[int(s)] for s in smid[k].tolist()], np.int64) + lane[k] - 1
        return out

    def sm_lane_tracks(self, smid: int) -> list[int]:
        """The local ids of SM ``smid``'s extra lanes."""
        first = self.sm_extra.get(smid)
        if first is None:
            return []
        return list(range(first, first + self.agg.blocks.sm_lanes[smid] - 1))

    def _kernel_slices(self) -> None:
        """Per timed launch (first block entry to last block exit): a slice on its graph exec's, or its stream's,
        "kernels" track (lanes where kernels overlap), as Nsight Systems' CUDA HW row."""
        h = self.c.host
        self.kernel_rows = np.zeros(0, np.int64)
        self.kernel_names: list[str] = []
        self.kernel_tracks: list[tuple[str, int, int]] = []  # (group: "exec" | "stream", index, first local id)
        rows, self.kernel_start, self.kernel_end = self.launch_spans()
        gn = h.kind[rows] == GRAPH_NODE
        grp = np.where(gn, np.searchsorted(np.array(self.execs, np.uint64), h.graph_exec[rows]),
                       len(self.execs) + np.searchsorted(np.array(self.streams, np.uint64), h.stream[rows]))
        self.kernel_rows, self.kernel_track = rows, np.zeros(len(rows), np.int64)
        self.kernel_lanes: dict[int, int] = {}
        for g in np.unique(grp).tolist():
            sel = np.flatnonzero(grp == g)
            ln = lanes(self.kernel_start[sel], self.kernel_end[sel])
            first = self.tracks.take(int(ln.max()) + 1)
            self.kernel_lanes[g] = int(ln.max()) + 1
            self.kernel_track[sel] = first + ln
            kind, ix = ("exec", g) if g < len(self.execs) else ("stream", g - len(self.execs))
            self.kernel_tracks.append((kind, ix, first))
        slots = np.unique(h.kernel_slot[rows])
        self.kernel_names = [short_name(self.c.kernel_name(s)) for s in slots.tolist()]
        self.kernel_name_ix = np.searchsorted(slots, h.kernel_slot[rows]).astype(np.int32)  # no Python int per row

    def launch_spans(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(rows, start, end)`` (device ns) of the shown launches with matched blocks: the first block entry to
        the last block exit where the dump records exits (kvconv.join.durations), else to the last block
        entry (``exits_recorded`` False: a lower bound of the kernel's duration)."""
        agg, d = self.agg, self.agg.durations
        if d is not None:
            rows = np.flatnonzero(d.timed & self.shown)
            return rows, d.start_ns[rows], d.end_ns[rows]
        rows = np.flatnonzero((agg.count > 0) & self.shown)
        return rows, agg.first_ts[rows].astype(np.int64), agg.last_ts[rows].astype(np.int64)

    @property
    def exits_recorded(self) -> bool:
        return self.agg.durations is not None

    def kernel_track_names(self):
        """``(group, index, local id, name)`` of each kernels track: group "exec" (graph exec ``index``) or
        "stream" (eager stream ``index``)."""
        for kind, ix, first in self.kernel_tracks:
            g = ix if kind == "exec" else len(self.execs) + ix
            base = "kernels" if kind == "exec" else f"kernels · stream {self.streams[ix]:#x}"
            for ln in range(self.kernel_lanes[g]):
                yield kind, ix, first + ln, base + (f" ({ln + 1})" if ln else "")

    def _node_slices(self, rows: np.ndarray) -> None:
        """Node executions (graph-node rows with matched events): their exec, lane and name."""
        agg, h = self.agg, self.c.host
        self.node_rows = rows
        # per node execution: i4 columns (what the plan keeps grows with the host records)
        self.node_exec = np.searchsorted(np.array(self.execs, np.uint64), h.graph_exec[rows]).astype(np.int32)
        self.node_lane, self.node_lanes = _per_exec_lanes(self.node_exec, len(self.execs), agg.first_ts[rows],
                                                          agg.last_ts[rows])
        self.node_names: list[str] = []  # "node <ordinal> · <kernel>", one per distinct (ordinal, kernel slot)
        self.node_name_ix = np.zeros(len(rows), np.int32)
        if len(rows):
            # distinct (ordinal, slot) pairs, in (ordinal, slot) order, as one i8 key (ordinal >= -1 is i4, the slot
            # u4): one sort of one column over every node execution, each execution's pair found in the few
            key = ((h.node_ordinal[rows].astype(np.int64) + 1) << 32) | h.kernel_slot[rows].astype(np.int64)
            u = np.unique(key)
            self.node_name_ix = np.searchsorted(u, key).astype(np.int32)
            del key
            up = np.stack([(u >> 32) - 1, u & 0xFFFFFFFF], 1)
            short = {s: short_name(self.c.kernel_name(s)) for s in np.unique(up[:, 1]).tolist()}
            self.node_names = [f"node {o} · {short[s]}" for o, s in up.tolist()]

    def _replay_slices(self) -> None:
        """Replay slices per (exec, launch id): from the first to the last block of its node executions."""
        agg, h, rows = self.agg, self.c.host, self.node_rows
        self.replays = []  # (exec j, replay, start, end)
        self.replay_exec = np.zeros(0, np.int64)  # exec j of each replay
        st = en = np.zeros(0, np.uint64)
        if len(rows):
            lid = h.launch_id[rows].astype(np.uint64)  # replay ids are u64 (kept so: a huge one is not negative)
            firsts, inv = _pairs_by_exec(self.node_exec, lid, len(self.execs))
            st = np.full(len(firsts), np.iinfo(np.uint64).max, np.uint64)
            en = np.zeros(len(firsts), np.uint64)
            np.minimum.at(st, inv, agg.first_ts[rows])
            np.maximum.at(en, inv, agg.last_ts[rows])
            self.replay_exec = self.node_exec[firsts]
            self.replays = list(zip(self.replay_exec.tolist(), lid[firsts].tolist(), st.tolist(), en.tolist()))
        self.replay_lane, self.replay_lanes = _per_exec_lanes(self.replay_exec, len(self.execs), st, en)
        self.replay_names = [f"replay {r[1]}" for r in self.replays]

    def exec_tracks(self):
        """``(j, exec, replay lanes, node lanes)`` of each graph exec, in track order."""
        for j, e in enumerate(self.execs):
            yield j, e, self.replay_lanes.get(j, 0), self.node_lanes.get(j, 0)

    def used_sms(self) -> list[int]:
        return np.flatnonzero(self.agg.sm_count).tolist()

    # -- filters --------------------------------------------------------------------------------------------------

    def keep(self, first: int, recs: np.ndarray):
        """The filter mask of a chunk (None: all kept); the join is looked up only when a filter needs it."""
        opt = self.opt
        if opt.window_ms is None and opt.replays is None:
            return None
        hid = self.c.match(first, recs) if opt.replays is not None else None
        return event_keep(self.c, recs, hid, opt, self.agg.t0)

    def kept(self, first: int, recs: np.ndarray):
        """The events of a chunk that pass the filters: ``(recs, dev_index, flow_mask)``.

        ``dev_index`` is None when every event is kept (indices are then ``first + arange``); ``flow_mask`` marks the
        kept events that end a flow (None: none)."""
        keep = self.keep(first, recs)
        has = self.flow_mask(first, len(recs))
        if keep is None:
            return recs, None, has
        idx = np.flatnonzero(keep)
        return recs[idx], first + idx, (has[idx] if has is not None else None)

    def flow_mask(self, first: int, n: int):
        """Which events of the chunk ``first .. first+n`` end a flow (None: none)."""
        return self.agg.flows.mask(first, n) if self.opt.flows else None

    def host_tracks(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The local track id of each shown host record (of ``rows``): its graph exec's host track, or its
        stream's."""
        h = self.c.host
        rows = self.host_rows if rows is None else rows
        ex = np.searchsorted(np.array(self.execs, np.uint64), h.graph_exec[rows])
        st = np.searchsorted(np.array(self.streams, np.uint64), h.stream[rows])
        return np.where(h.kind[rows] == GRAPH_NODE, self.tracks.exec_host(ex), self.tracks.stream(st)).astype(np.uint64)

    def host_flows(self) -> int:
        """Flows the host records start."""
        f = self.agg.flows
        return int(f.counts(self.host_rows).sum()) if f.K else 0
