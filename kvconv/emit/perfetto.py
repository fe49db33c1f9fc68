"""Perfetto TrackEvent trace (.pftrace) of one or more dumps, streamed chunk by chunk.

Track tree, per context of every dump (its own group, named after GPU, context and file)::

    GPU 0 · ctx 0 · run.kvdump
      graph exec 0x...            replays (device clock), nodes (device clock, one slice per node execution,
                                  extra lanes only where executions overlap), host node launches (CLOCK_MONOTONIC)
      eager launches · stream 0x..  (CLOCK_MONOTONIC)
      device blocks / SM n        block instants (device clock): instants never overlap; block-exit events, when
                                  recorded, are instants too, under the same kernel name (not paired into durations)
      block events per ms, dropped device events   counters
      canary                      per step and buffer (CLOCK_MONOTONIC)

Clocks: device packets live on their own sequence whose default clock is a sequence-scoped custom clock (id 64) for
the GPU's %globaltimer; host packets on a second sequence default to BUILTIN_CLOCK_MONOTONIC (3). ClockSnapshot
packets built from the dump's clock-sync pairs relate the two; trace_processor does the conversion, kvconv never
subtracts one domain from the other. Flows run from each host launch record to (up to ``flows``) device blocks.

The device-event packets (the bulk) are encoded by :mod:`kvconv.emit._wire` straight into protobuf wire bytes;
the few dozen descriptor / interning / snapshot packets use perfetto's own protos.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from kvconv.format.errors import OutputError
from kvconv.emit import _wire as w
from kvconv.emit._source import (EAGER, GRAPH_NODE, SLICE, BackgroundWriter, Ctx, EmitOptions, EmitResult, emit_run, event_keep,
                      first_pass, flow_id, release_join, unique_pairs)

DEVICE_CLOCK = 64  # sequence-scoped custom clock: the GPU %globaltimer of that sequence's context
HOST_CLOCK = 3  # BUILTIN_CLOCK_MONOTONIC
SEQ_CLEARED, SEQ_NEEDS = 1, 2
T_BEGIN, T_END, T_INSTANT, T_COUNTER = 1, 2, 3, 4
META_SEQ = 1
DEV_ANN = ("block_x", "replay", "blocks")
HOST_ANN = ("replay", "node", "grid_id", "blocks_predicted", "blocks_recorded", "host_index", "stream")
EST_EVENT_BYTES = 40
HOST_BATCH = 1 << 20  # host records x flows encoded at a time


def _pb():
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    return pb


def frame(packet: bytes) -> bytes:
    """One ``Trace.packet`` field around serialized TracePacket bytes."""
    return b"\x0a" + w.varint_bytes(len(packet)) + packet


class _Uuids:
    def __init__(self, c: Ctx) -> None:
        self.base = (c.serial + 1) << 24
        self.root = self.base + 1
        self.blocks = self.base + 2
        self.rate = self.base + 3
        self.drops = self.base + 4
        self.host_drops = self.base + 5
        self.canary = self.base + 6

    def stream(self, i: int) -> int:
        return self.base + 0x100 + i

    def sm(self, smid) -> int:
        return self.base + 0x10000 + smid

    def exec_group(self, j: int) -> int:
        return self.base + 0x20000 + 2 * j

    def exec_host(self, j: int) -> int:
        return self.exec_group(j) + 1

    def place_lanes(self, replay_lanes: list[int], node_lanes: list[int]) -> None:
        """Give each graph exec's replay and node lanes their uuids, after every exec's group and host track (as
        many lanes as overlapping slices need, none shared with another exec)."""
        n = len(replay_lanes)
        sizes = np.array([x for pair in zip(replay_lanes, node_lanes) for x in pair], np.int64)
        starts = self.exec_group(n) + np.concatenate([[0], np.cumsum(sizes)[:-1]]) if n else np.zeros(0, np.int64)
        self.replay0 = starts[0::2].astype(np.uint64)
        self.node0 = starts[1::2].astype(np.uint64)
        if n and int(starts[-1] + sizes[-1]) >= self.base + (1 << 24):
            raise OutputError(f"context {self.base >> 24}: too many tracks ({int(sizes.sum()):,} lanes)",
                              hint="narrow the trace with --window or --replays", code="too-many-tracks")

    def exec_replays(self, j, lane):
        """The replay lane's uuid (vectorised over ``j`` and ``lane`` arrays)."""
        return _lane_uuid(self.replay0, j, lane)

    def exec_nodes(self, j, lane):
        """The node lane's uuid (vectorised over ``j`` and ``lane`` arrays)."""
        return _lane_uuid(self.node0, j, lane)


def _lane_uuid(first: np.ndarray, j, lane):
    if np.isscalar(j):
        return int(first[j]) + int(lane)
    return first[j] + np.asarray(lane).astype(np.uint64)


def _lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Greedy lanes so that slices on one lane never overlap (strictly: the next starts after the previous ends)."""
    n = len(start)
    lane = np.zeros(n, np.int64)
    if n <= 1:
        return lane
    order = np.lexsort((end, start))
    s, e = start[order], end[order]
    if bool(np.all(s[1:] > np.maximum.accumulate(e)[:-1])):
        return lane
    # each slice takes the lowest-numbered lane whose last slice ended before it starts (heaps: O(n log n))
    busy: list = []  # (end, lane) of lanes in use
    free: list = []  # lanes whose last slice has ended
    nlanes = 0
    out = np.zeros(n, np.int64)
    for k, (si, ei) in enumerate(zip(s.tolist(), e.tolist())):
        while busy and busy[0][0] < si:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            j = heapq.heappop(free)
        else:
            j, nlanes = nlanes, nlanes + 1
        out[k] = j
        heapq.heappush(busy, (ei, j))
    lane[order] = out
    return lane


class _Names:
    """Interned event names of one sequence (iids from 1, in order of first use)."""

    def __init__(self) -> None:
        self.iid: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        if name not in self.iid:
            self.iid[name] = len(self.iid) + 1
        return self.iid[name]


def _short(name: str) -> str:
    """A kernel's readable name: the function without template arguments and parameters."""
    s = name
    p = s.find("(")
    if p > 0:
        s = s[:p]
    depth, out = 0, []
    for ch in s:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    s = "".join(out).strip()
    if s.startswith("void "):
        s = s[5:]
    return s.split("::")[-1] or name


class _Plan:
    """Everything of one context decided before its packets are written."""

    def __init__(self, c: Ctx, agg, options: EmitOptions, canary: "CanarySteps | None" = None) -> None:
        self.c, self.agg, self.opt = c, agg, options
        self.u = _Uuids(c)
        self.dev_seq = 2 + 2 * c.serial
        self.host_seq = 3 + 2 * c.serial
        self.dev_names = _Names()
        self.host_names = _Names()
        h = c.host
        # kernel slot -> device name iid (dense lookup table)
        slots = agg.slots
        hi = int(max(slots.max() if len(slots) else 0, h.kernel_slot.max() if h.n else 0)) + 1
        self.slot_lut = None
        if hi <= (1 << 22):
            self.slot_lut = np.zeros(hi, np.uint64)
            for s in slots.tolist():
                self.slot_lut[s] = self.dev_names(c.kernel_name(s))
        else:
            self.slot_map = {s: self.dev_names(c.kernel_name(s)) for s in slots.tolist()}
        # graph execs and streams of shown host records
        shown = h.shown & agg.kept_hosts
        self.shown = shown
        gn = shown & (h.kind == GRAPH_NODE)
        self.execs = np.unique(h.graph_exec[gn]).tolist()
        self.exec_ix = {e: j for j, e in enumerate(self.execs)}
        el = shown & (h.kind == EAGER)
        self.streams = np.unique(h.stream[el]).tolist()
        self.stream_ix = {s: j for j, s in enumerate(self.streams)}
        # node slices: graph-node rows with matched events
        rows = np.flatnonzero(gn & (agg.count > 0))
        self.node_rows = rows
        self.node_lane = np.zeros(len(rows), np.int64)
        ex_of = np.searchsorted(np.array(self.execs, np.uint64), h.graph_exec[rows]).astype(np.int64)
        self.node_exec = ex_of
        for j in range(len(self.execs)):
            sel = np.flatnonzero(ex_of == j)
            self.node_lane[sel] = _lanes(agg.first_ts[rows[sel]], agg.last_ts[rows[sel]])
        self.node_lanes = {j: int(self.node_lane[ex_of == j].max()) + 1 if (ex_of == j).any() else 0
                           for j in range(len(self.execs))}
        # replay slices per (exec, launch id)
        self.replays = []  # (exec j, replay, start, end)
        self.replay_exec = np.zeros(0, np.int64)  # exec j of each replay
        st = en = np.zeros(0, np.uint64)
        if len(rows):
            lid = h.launch_id[rows].astype(np.uint64)  # replay ids are u64 (kept so: a huge one is not negative)
            _, firsts, inv = unique_pairs(ex_of, lid)
            st = np.full(len(firsts), np.iinfo(np.uint64).max, np.uint64)
            en = np.zeros(len(firsts), np.uint64)
            np.minimum.at(st, inv, agg.first_ts[rows])
            np.maximum.at(en, inv, agg.last_ts[rows])
            self.replays = list(zip(ex_of[firsts].tolist(), lid[firsts].tolist(), st.tolist(), en.tolist()))
            self.replay_exec = ex_of[firsts]
        self.replay_lane = np.zeros(len(self.replays), np.int64)
        self.replay_lanes = {}
        for j in range(len(self.execs)):
            sel = np.flatnonzero(self.replay_exec == j)
            if len(sel):
                self.replay_lane[sel] = _lanes(st[sel], en[sel])
                self.replay_lanes[j] = int(self.replay_lane[sel].max()) + 1
        self.u.place_lanes([self.replay_lanes.get(j, 0) for j in range(len(self.execs))],
                           [self.node_lanes[j] for j in range(len(self.execs))])
        self.node_name_iid = np.zeros(len(rows), np.uint64)
        if len(rows):
            po, ps = h.node_ordinal[rows].astype(np.int64), h.kernel_slot[rows].astype(np.int64)
            _, firsts, inv = unique_pairs(po, ps)
            up = np.stack([po[firsts], ps[firsts]], 1)
            short = {s: _short(c.kernel_name(s)) for s in np.unique(up[:, 1]).tolist()}
            iids = np.array([self.dev_names(f"node {o} · {short[s]}") for o, s in up.tolist()], np.uint64)
            self.node_name_iid = iids[inv.reshape(-1)]
        self.replay_name_iid = np.array([self.dev_names(f"replay {r[1]}") for r in self.replays], np.uint64)
        hs = np.flatnonzero(shown)
        self.host_rows = hs
        self.host_name_iid = np.zeros(len(hs), np.uint64)
        if len(hs):
            us, inv = np.unique(h.kernel_slot[hs], return_inverse=True)
            self.host_name_iid = np.array([self.host_names(c.kernel_name(s)) for s in us.tolist()],
                                          np.uint64)[inv.reshape(-1)]
        self.canary = canary if canary is not None else canary_steps(c.dump).get(c.context_id)

    # -- metadata packets (perfetto protos) ------------------------------------------------------------------

    def descriptors(self, pb) -> list[bytes]:
        c, u, out = self.c, self.u, []
        rank = [0]

        def td(uuid, name, parent=None, counter=None, ordering=None):
            p = pb.TracePacket()
            p.trusted_packet_sequence_id = META_SEQ
            d = p.track_descriptor
            d.uuid = uuid
            d.name = name
            if parent is not None:
                d.parent_uuid = parent
            if ordering is not None:
                d.child_ordering = ordering
            d.sibling_order_rank = rank[0]
            rank[0] += 1
            if counter is not None:
                d.counter.unit_name = counter
            out.append(frame(p.SerializeToString()))

        b = c.clock.bound()
        extra = f" ±{b['bound_ns'] / 1000:.2f} µs" if b["bound_ns"] is not None else " (unaligned)"
        td(u.root, f"GPU {c.device_id} · ctx {c.context_id} · {c.label}{extra}", ordering=3)
        h = c.host
        for j, e in enumerate(self.execs):
            td(u.exec_group(j), f"graph exec {e:#x}", parent=u.root, ordering=3)
            for ln in range(self.replay_lanes.get(j, 0)):
                td(u.exec_replays(j, ln), "replays" + (f" ({ln + 1})" if ln else ""), parent=u.exec_group(j))
            for ln in range(self.node_lanes.get(j, 0)):
                td(u.exec_nodes(j, ln), "nodes" + (f" ({ln + 1})" if ln else ""), parent=u.exec_group(j))
            td(u.exec_host(j), "host node launches", parent=u.exec_group(j))
        for i, s in enumerate(self.streams):
            td(u.stream(i), f"eager launches · stream {s:#x}", parent=u.root)
        used = np.flatnonzero(self.agg.sm_count)
        if len(used):
            td(u.blocks, "device blocks", parent=u.root, ordering=3)
            for s in used.tolist():
                td(u.sm(s), f"SM {s}", parent=u.blocks)
            td(u.rate, "block events per ms", parent=u.root, counter="events/ms")
            td(u.drops, "dropped device events", parent=u.root, counter="events")
        if h.n:
            td(u.host_drops, "dropped host records", parent=u.root, counter="records")
        if self.canary:
            td(u.canary, "canary", parent=u.root)
        _ = h
        return out

    def seq_start(self, pb, seq: int, names: _Names, ann: tuple, clock: int) -> bytes:
        p = pb.TracePacket()
        p.trusted_packet_sequence_id = seq
        p.sequence_flags = SEQ_CLEARED
        p.trace_packet_defaults.timestamp_clock_id = clock
        for name, iid in names.iid.items():
            e = p.interned_data.event_names.add()
            e.iid, e.name = iid, name
        for i, name in enumerate(ann, 1):
            e = p.interned_data.debug_annotation_names.add()
            e.iid, e.name = i, name
        return frame(p.SerializeToString())

    def snapshots(self, pb) -> list[bytes]:
        out = []
        for i, r in enumerate(self.c.clock.pairs):
            p = pb.TracePacket()
            p.trusted_packet_sequence_id = self.dev_seq
            cs = p.clock_snapshot
            a = cs.clocks.add()
            a.clock_id, a.timestamp = HOST_CLOCK, int(r["host_ns"])
            b = cs.clocks.add()
            b.clock_id, b.timestamp = DEVICE_CLOCK, int(r["gpu_ns"])
            cs.primary_trace_clock = HOST_CLOCK
            out.append(frame(p.SerializeToString()))
        return out

    def canary_packets(self, pb):
        """One instant per checked (step, buffer), yielded one by one."""
        for step, buf, host_ns, n in self.canary.rows() if self.canary else ():
            p = pb.TracePacket()
            p.trusted_packet_sequence_id = self.host_seq
            p.sequence_flags = SEQ_NEEDS
            p.timestamp = host_ns
            te = p.track_event
            te.type = T_INSTANT
            te.track_uuid = self.u.canary
            te.name = f"step {step} {buf}: " + ("ok" if not n[2] + n[3] else f"{n[2]} unexpected, {n[3]} missing")
            for key, v in zip(CanarySteps.LISTS, n):
                a = te.debug_annotations.add()
                a.name = key
                a.uint_value = v
            yield frame(p.SerializeToString())

    # -- device events ------------------------------------------------------------------------------------

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
        """The track uuid of each shown host record (of ``rows``): its graph exec's host track, or its stream's."""
        h = self.c.host
        rows = self.host_rows if rows is None else rows
        ex = np.searchsorted(np.array(self.execs, np.uint64), h.graph_exec[rows])
        st = np.searchsorted(np.array(self.streams, np.uint64), h.stream[rows])
        return np.where(h.kind[rows] == GRAPH_NODE, self.u.exec_host(ex), self.u.stream(st)).astype(np.uint64)

    # -- vectorised packets -----------------------------------------------------------------------------------

    def host_packets(self):
        """The host launch instants, with the flows they start: yields byte buffers, a batch of records at a time
        (in the order one encoding of all records gives, :func:`_wire.layout_order`), so that only a batch's flow
        ids and bytes are held."""
        rows, flows = self.host_rows, self.agg.flows
        yield from w.encode_batched(lambda i: self._host_fields(rows, None) if i is None else
                                    self._host_fields(rows[i], flows), len(rows),
                                    max(1, HOST_BATCH // max(1, self.opt.flows)))

    def host_flows(self) -> int:
        """Flows the host records start."""
        f = self.agg.flows
        return int(f.counts(self.host_rows).sum()) if f.K else 0

    def _host_fields(self, rows: np.ndarray, flows) -> list:
        """The fields of the host records ``rows`` (``flows`` None: flow ids left out, only their count)."""
        c, h, agg = self.c, self.c.host, self.agg
        n = len(rows)
        track = self.host_tracks(rows)
        isg = h.kind[rows] == GRAPH_NODE
        K = self.opt.flows
        if not K:
            fids, cnt = np.zeros((n, 0), np.uint64), np.zeros(n, np.int64)
        elif flows is None:
            fids, cnt = np.zeros((n, 0), np.uint64), agg.flows.counts(rows)
        else:
            fd, cnt = flows.of_rows(rows)
            fids = flow_id(c, np.maximum(fd, 0))
        ann = lambda i, v, present=None: w.msg(4, [w.const(bytes([0x08, i])), w.varint(3, v)], present)  # noqa: E731
        te = [
            ann(1, h.launch_id[rows], isg),
            ann(2, np.maximum(h.node_ordinal[rows], 0).astype(np.uint64), isg),
            ann(3, h.grid_id[rows]),
            ann(4, np.maximum(h.grid[rows], 0).astype(np.uint64)),
            ann(5, agg.count[rows].astype(np.uint64)),
            ann(6, h.index[rows].astype(np.uint64)),
            w.const(bytes([0x48, T_INSTANT])),
            w.varint(10, self.host_name_iid[np.searchsorted(self.host_rows, rows)]),
            w.varint(11, track),
            w.rfixed64(47, fids, cnt),
        ]
        return [w.msg(1, [w.varint(8, h.host_ns[rows]), w.varint(10, self.host_seq), w.msg(11, te),
                          w.const(bytes([0x68, SEQ_NEEDS]))])]

    def slice_packets(self):
        """Node executions and replays as slices (yielded, a batch at a time)."""
        agg, u = self.agg, self.u
        rows = self.node_rows
        h = self.c.host
        if len(rows):
            st, en = agg.first_ts[rows].astype(np.uint64), agg.last_ts[rows].astype(np.uint64)
            track = u.exec_nodes(self.node_exec, self.node_lane)
            yield from self._slices(st, en, track, self.node_name_iid,
                                    [(2, h.launch_id[rows].astype(np.uint64)), (3, agg.count[rows].astype(np.uint64))])
        if self.replays:
            r = np.array([(x[2], x[3]) for x in self.replays], np.uint64)
            st, en = r[:, 0].astype(np.uint64), r[:, 1].astype(np.uint64)
            track = u.exec_replays(self.replay_exec, self.replay_lane)
            yield from self._slices(st, en, track, self.replay_name_iid,
                                    [(2, np.array([x[1] for x in self.replays], np.uint64))])

    def _slices(self, st, en, track, name_iid, anns):
        """Begin packets (instants where a slice starts and ends at once), then end packets."""
        def begins(i):
            i = slice(None) if i is None else i
            typ = np.where(st[i] == en[i], T_INSTANT, T_BEGIN).astype(np.uint64)
            te = [w.msg(4, [w.const(bytes([0x08, k])), w.varint(3, v[i])]) for k, v in anns]
            te += [w.varint(9, typ), w.varint(10, name_iid[i]), w.varint(11, track[i])]
            return [w.msg(1, [w.varint(8, st[i]), w.varint(10, self.dev_seq), w.msg(11, te),
                              w.const(bytes([0x68, SEQ_NEEDS]))])]

        yield from w.encode_batched(begins, len(st))
        ends = np.flatnonzero(st != en)

        def finish(i):
            e = ends if i is None else ends[i]
            te = [w.const(bytes([0x48, T_END])), w.varint(11, track[e])]
            return [w.msg(1, [w.varint(8, en[e]), w.varint(10, self.dev_seq), w.msg(11, te),
                              w.const(bytes([0x68, SEQ_NEEDS]))])]

        yield from w.encode_batched(finish, len(ends))

    def counter_packets(self) -> list:
        agg, u, c = self.agg, self.u, self.c
        parts = []
        if len(agg.rate_ms):
            ts = np.minimum(agg.rate_ms, np.uint64((2**64 - 1) // 1_000_000)) * np.uint64(1_000_000)
            vals = agg.rate_vals.astype(np.uint64)
            parts += self._counter(ts, vals, u.rate, self.dev_seq)
        if agg.t0 is not None and agg.t1 is not None:  # t1 None: a --window that keeps no event
            ts = np.array([agg.t0, agg.t1], np.uint64)
            parts += self._counter(ts, np.array([0, c.device_drops], np.uint64), u.drops, self.dev_seq)
        h = c.host
        if h.n:
            hn = h.host_ns
            ts = np.array([int(hn.min()), int(hn.max())], np.uint64)
            parts += self._counter(ts, np.array([0, c.host_drops], np.uint64), u.host_drops, self.host_seq)
        return parts

    def _counter(self, ts, vals, track, seq) -> list:
        te = [w.const(bytes([0x48, T_COUNTER])), w.const(w.tag(11, 0) + w.varint_bytes(track)), w.varint(30, vals)]
        pk = [w.varint(8, ts), w.varint(10, seq), w.msg(11, te), w.const(bytes([0x68, SEQ_NEEDS]))]
        parts, _ = w.encode_parts([w.msg(1, pk)], len(ts))
        return parts

    def device_packets(self, first: int, recs: np.ndarray) -> tuple[list, int, int]:
        """The block instants (entries, and exits when recorded) of one chunk: (buffers, events written, flows
        ended).

        The chunk is encoded in cache-sized slices; the slices' layout groups are merged back into the order one
        encoding of the whole chunk gives (see :func:`_wire.encode_groups`)."""
        recs, dev_index, has = self.kept(first, recs)
        n = len(recs)
        if not n:
            return [], 0, 0
        nflow = int(has.sum()) if has is not None else 0
        if nflow == n:
            has = None  # every event ends a flow: the field is not optional
        groups = []
        for s in range(0, n, SLICE):
            e = min(n, s + SLICE)
            di = (first + np.arange(s, e, dtype=np.uint64)) if dev_index is None else dev_index[s:e]
            for sig, m in self._device_slice(recs[s:e], di, nflow, has[s:e] if has is not None else None):
                groups.append((sig, s, m))
        if len(groups) > 1:
            groups.sort(key=lambda g: (g[0], g[1]))
        return [g[2] for g in groups], n, nflow

    def _device_slice(self, recs, di, nflow: int, has) -> list:
        c = self.c
        slot = recs["kernel_slot"]
        if self.slot_lut is not None:
            iid = self.slot_lut[slot]
        else:
            iid = np.array([self.slot_map[int(s)] for s in slot], np.uint64)
        track = np.uint64(self.u.sm(0)) + recs["smid"].astype(np.uint64)
        te = [w.msg(4, [w.const(b"\x08\x01"), w.varint(3, recs["block_x"])]),
              w.const(bytes([0x48, T_INSTANT])), w.varint(10, iid), w.varint(11, track)]
        if nflow:
            te.append(w.fixed64(48, flow_id(c, di), present=has))
        pk = [w.varint(8, recs["globaltimer"]), w.varint(10, self.dev_seq), w.msg(11, te),
              w.const(bytes([0x68, SEQ_NEEDS]))]
        return w.encode_groups([w.msg(1, pk)], len(recs))


@dataclass(frozen=True)
class CanarySteps:
    """The checked (step, buffer) records of one context, as the traces show them: step, buffer name, host time and
    the page counts of :attr:`LISTS` (a few numbers per record, not the page lists :func:`kvconv.check.canary.check`'s
    step dicts carry)."""

    LISTS = ("expected", "changed", "unexpected", "missing")
    step: np.ndarray
    buffer: np.ndarray  # index into names
    names: list
    host_ns: np.ndarray
    counts: np.ndarray  # (records, 4)

    def __len__(self) -> int:
        return len(self.step)

    def rows(self):
        """``(step, buffer name, host ns, (expected, changed, unexpected, missing))`` per record, as Python ints."""
        for st, b, hn, n in zip(self.step.tolist(), self.buffer.tolist(), self.host_ns.tolist(), self.counts.tolist()):
            yield st, self.names[b], hn, n


def canary_steps(d) -> dict:
    """context id -> :class:`CanarySteps` of the dump ``d`` (one check of the dump for all its contexts; the step
    dicts are read a batch at a time and only their counts kept)."""
    if not d.groups_of("canary"):
        return {}
    from kvconv.check import canary

    cols: dict = {}
    names: dict = {}
    for s in canary.check(d).steps:
        ctx = s["context_id"]
        c = cols.setdefault(ctx, ([], [], [], []))
        buf = s.get("buffer", s.get("buffer_id"))
        c[0].append(s["step"])
        c[1].append(names.setdefault(buf, len(names)))
        c[2].append(s["host_ns"])
        c[3].append([len(s.get(k, ())) for k in CanarySteps.LISTS])
    nl = list(names)
    return {ctx: CanarySteps(step=np.array(a, np.uint64), buffer=np.array(b, np.int64), names=nl,
                             host_ns=np.array(h, np.uint64), counts=np.array(n, np.int64).reshape(-1, 4))
            for ctx, (a, b, h, n) in cols.items() if a}


def canaries(ctxs) -> list:
    """Each context's :class:`CanarySteps` (empty: none), each dump checked once."""
    by_dump: dict = {}
    for c in ctxs:
        if id(c.dump) not in by_dump:
            by_dump[id(c.dump)] = canary_steps(c.dump)
    return [by_dump[id(c.dump)].get(c.context_id, ()) for c in ctxs]


def estimate_bytes(ctxs, aggs, options: EmitOptions) -> int:
    return sum(a.kept * EST_EVENT_BYTES + c.host.n * (60 + 10 * options.flows) for c, a in zip(ctxs, aggs))


def write_perfetto(paths, out, *, options: EmitOptions = EmitOptions(), warn=None) -> EmitResult:
    """Write a Perfetto trace of the dumps ``paths`` to ``out`` (atomically); returns what was written."""
    from kvconv.atomic import atomic_output
    from kvconv.emit._verdict import warn_empty, warn_reconcile

    with emit_run(paths, out, options, warn, "perfetto", passes=2) as (res, warn, paths, ctxs, bar):
        pb = _pb()
        aggs = [first_pass(c, options, bar) for c in ctxs]
        warn_empty(ctxs, aggs, options, warn)
        warn_reconcile(ctxs, options, warn)
        release_join(ctxs, options)
        est = estimate_bytes(ctxs, aggs, options)
        if est > options.ui_limit_bytes:
            warn(f"the trace will be about {est / 2**30:.1f} GiB, more than the Perfetto UI loads comfortably "
                 f"({options.ui_limit_bytes / 2**30:.1f} GiB); use --window START_MS:END_MS or "
                 "--replays FIRST:LAST, or open it with trace_processor --httpd")
        plans = [_Plan(c, a, options, canary=k) for c, a, k in zip(ctxs, aggs, canaries(ctxs))]
        # "r+b": the fresh temporary is empty; truncating it ("wb") would make ext4 (auto_da_alloc) start writing
        # the whole file back when it is closed, which the close then waits on
        with atomic_output(out, inputs=paths, kind="perfetto", force=options.force) as tmp, open(tmp, "r+b") as raw, \
                BackgroundWriter(raw) as f:
            for pl in plans:
                for b in pl.descriptors(pb):
                    f.write(b)
            for pl in plans:
                c = pl.c
                dev_clock = DEVICE_CLOCK if c.clock.n else HOST_CLOCK
                f.write(pl.seq_start(pb, pl.dev_seq, pl.dev_names, DEV_ANN, dev_clock))
                for b in pl.snapshots(pb):
                    f.write(b)
                f.write(pl.seq_start(pb, pl.host_seq, pl.host_names, HOST_ANN, HOST_CLOCK))
                for b in pl.host_packets():
                    f.write(b)
                for b in pl.canary_packets(pb):
                    f.write(b)
                for b in pl.slice_packets():
                    f.write(b)
                for b in pl.counter_packets():
                    f.write(b)
                res.flows += pl.host_flows()
                for first, recs in c.chunks(options.chunk):
                    parts, n, _ = pl.device_packets(first, recs)
                    for b in parts:
                        f.write(b)
                    res.written_events += n
                    bar(len(recs))
                res.host_records += len(pl.host_rows)
                res.alignment.append(_align(c))
                res.join.append(c.join)
            f.close()  # all written: the size, which stdout (-o -) cannot be asked for afterwards
            res.bytes_written = raw.tell()
    return res


def _align(c: Ctx) -> dict:
    return {"dump": c.dump.path, "run": c.run, "context_id": c.context_id, "device_id": c.device_id,
            **c.clock.bound()}
