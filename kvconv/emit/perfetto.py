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
the few dozen descriptor / interning / snapshot / canary packets by :mod:`kvconv.emit._proto` (perfetto's generated
protos are not imported: their descriptor pool cost every process ~45 ms of CPU).
"""

from __future__ import annotations

import numpy as np

from kvconv.emit import _proto as pr
from kvconv.emit import _wire as w
from kvconv.emit._canary import CanarySteps
from kvconv.emit._contexts import Plans, emit_run, first_passes, release_join
from kvconv.emit._first_pass import flow_id
from kvconv.emit._stream import GRAPH_NODE, SLICE
from kvconv.emit._writer import RESERVE_FROM, BackgroundWriter, release_reserve, reserve
from kvconv.emit._writes import FLAGGED, STATUS_TEXT, BlockWrites
from kvconv.emit.options import EmitOptions, EmitResult
from kvconv.emit.plan import SPAN, Plan
from kvconv.progress import human_size

DEVICE_CLOCK = 64  # sequence-scoped custom clock: the GPU %globaltimer of that sequence's context
HOST_CLOCK = 3  # BUILTIN_CLOCK_MONOTONIC
BOOT_CLOCK = 6  # BUILTIN_CLOCK_BOOTTIME: the clock trace_processor takes a proto trace's own to be
SEQ_CLEARED, SEQ_NEEDS = 1, 2
T_BEGIN, T_END, T_INSTANT, T_COUNTER = 1, 2, 3, 4
META_SEQ = 1
DEV_ANN = ("block_x", "replay", "blocks")
# with slot_write records (kvconv record --writes): what a block that wrote is annotated with (kvconv.emit._writes)
WRITE_ANN = ("cache", "page", "offset", "slot", "request", "slot_owner", "write", "step", "writes")
HOST_ANN = ("replay", "node", "grid_id", "blocks_predicted", "blocks_recorded", "host_index", "stream")
EST_EVENT_BYTES = 40
HOST_BATCH = 1 << 18  # host records x flows encoded at a time (up to HOST_WHOLE records: all at once)
# host records encoded at once, without the batches' layout pass: 131,072 on a dump read whole (the bench's 65,537:
# 30 -> 24 ms of CPU, the same bytes), 65,536 past RELEASE_BYTES (the slow tier's bounds on allocations)
HOST_WHOLE, HOST_WHOLE_LARGE = 1 << 17, 1 << 16


def trace_clock_anchor() -> bytes:
    """The first packet of every trace: CLOCK_MONOTONIC is the trace's time (``primary_trace_clock``), and
    CLOCK_BOOTTIME is related to it.

    trace_processor registers BOOTTIME as the clock of every proto trace file and, on the first timestamp it
    converts, bridges that clock to the trace time clock; with the trace time MONOTONIC and no snapshot holding
    BOOTTIME the bridge is refused and the import logs ``clock_sync_unrelatable_clock_domains`` (an error in
    ui.perfetto.dev's trace health). Dumps record host times in MONOTONIC only, so the two are related at offset 0:
    exact on a host that has not been suspended since boot (where BOOTTIME = MONOTONIC); it moves only events of
    another trace recorded in BOOTTIME and merged with this one, by the time the host spent suspended. The
    snapshot also sets the trace time when no context has clock-sync pairs (no other snapshot is written then)."""
    return pr.clock_snapshot_packet([(BOOT_CLOCK, 0), (HOST_CLOCK, 0)], primary=HOST_CLOCK, seq=META_SEQ)


frame = pr.frame  # one ``Trace.packet`` field around serialized TracePacket bytes


class _Names:
    """Interned event names of one sequence (iids from 1, in order of first use)."""

    def __init__(self) -> None:
        self.iid: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        if name not in self.iid:
            self.iid[name] = len(self.iid) + 1
        return self.iid[name]


class _Uuids:
    """Track uuids of a context: its plan's local track ids in the context's own range of uuids."""

    def __init__(self, plan: Plan) -> None:
        t = self.t = plan.tracks
        self.base = (plan.c.serial + 1) * SPAN
        b = self.base
        self.root, self.blocks, self.rate = b + t.ROOT, b + t.BLOCKS, b + t.RATE
        self.drops, self.host_drops, self.canary = b + t.DROPS, b + t.HOST_DROPS, b + t.CANARY

    def __call__(self, local):
        """The uuid of a local track id (or of an array of them)."""
        return self.base + local if np.isscalar(local) else np.uint64(self.base) + np.asarray(local, np.uint64)

    def stream(self, i):
        return self.base + self.t.stream(i)

    def sm(self, smid):
        return self.base + self.t.sm(smid)

    def exec_group(self, j):
        return self.base + self.t.exec_group(j)

    def exec_host(self, j):
        return self.base + self.t.exec_host(j)

    def exec_replays(self, j, lane):
        return self(self.t.exec_replays(j, lane))

    def exec_nodes(self, j, lane):
        return self(self.t.exec_nodes(j, lane))


class _Packets:
    """The Perfetto packets of one context's :class:`Plan`: its sequences, interned names and track uuids."""

    def __init__(self, plan: Plan) -> None:
        self.plan, self.c, self.agg, self.opt = plan, plan.c, plan.agg, plan.opt
        self.u = _Uuids(plan)
        self.dev_seq = 2 + 2 * self.c.serial
        self.host_seq = 3 + 2 * self.c.serial
        self.dev_names = _Names()
        self.host_names = _Names()
        self.host_rows, self.canary = plan.host_rows, plan.canary
        self.writes = BlockWrites.of(self.c)
        self._intern()
        self.dev_ann = DEV_ANN + WRITE_ANN if self.writes is not None else DEV_ANN

    def _intern(self) -> None:
        """Interned names, in the order of first use: device-event kernels, node names, replay names; host kernels."""
        c, h, pl = self.c, self.c.host, self.plan
        slots = self.agg.slots
        hi = int(max(slots.max() if len(slots) else 0, h.kernel_slot.max() if h.n else 0)) + 1
        self.slot_lut = None
        self.slot_shift = None  # every kept slot's iid is slot + this: no lookup per event
        self.iid_bounds = None  # (min, max) of the kept slots' iids
        if hi <= (1 << 22):  # kernel slot -> device name iid (dense lookup table)
            self.slot_lut = np.zeros(hi, np.uint64)
            for s in slots.tolist():
                self.slot_lut[s] = self.dev_names(c.kernel_name(s))
            if len(slots):
                ids = self.slot_lut[slots].astype(np.int64)
                self.iid_bounds = (int(ids.min()), int(ids.max()))
                d = ids - slots.astype(np.int64)
                if bool(np.all(d == d[0])):
                    self.slot_shift = int(d[0])
        else:
            self.slot_map = {s: self.dev_names(c.kernel_name(s)) for s in slots.tolist()}
        used = np.flatnonzero(self.agg.sm_count)
        self.sm_bounds = (int(used.min()), int(used.max())) if len(used) else None  # the kept events' SMs
        # per distinct name its iid; per row only the plan's index of its name (looked up a batch at a time)
        self.node_iids = np.array([self.dev_names(n) for n in pl.node_names] or [0], np.uint64)
        self.replay_name_iid = np.array([self.dev_names(n) for n in pl.replay_names], np.uint64)
        self.kernel_iids = np.array([self.dev_names(n) for n in pl.kernel_names], np.uint64) \
            if pl.exits_recorded and pl.kernel_names else None
        hs = pl.host_rows
        self.host_slots, self.host_slot_iids = np.zeros(0, h.kernel_slot.dtype), np.zeros(0, np.uint64)
        if len(hs):
            self.host_slots = np.unique(h.kernel_slot[hs])
            self.host_slot_iids = np.array([self.host_names(c.kernel_name(s)) for s in self.host_slots.tolist()],
                                           np.uint64)
        self._intern_writes()

    def _intern_writes(self) -> None:
        """With slot_write records: the names of the events of blocks whose writes are flagged ("<kernel> · write
        outside every cache") and the annotations' interned string values (cache labels, then statuses)."""
        self.flag_iid: dict = {}
        self.write_strings: list[str] = []
        bw = self.writes
        if bw is None:
            return
        flagged = sorted({int(x) for x in np.unique(bw.status)} & set(FLAGGED))
        for slot in self.agg.slots.tolist():
            for st in flagged:
                self.flag_iid[(slot, st)] = self.dev_names(f"{self.c.kernel_name(slot)} · {FLAGGED[st]}")
        self.write_strings = list(bw.labels) + [STATUS_TEXT[k] for k in sorted(STATUS_TEXT)]

    def host_tracks(self, rows=None) -> np.ndarray:
        return self.u(self.plan.host_tracks(rows))

    # -- metadata packets (kvconv.emit._proto) ------------------------------------------------------------------

    def descriptors(self) -> list[bytes]:
        c, u, out = self.c, self.u, []

        def td(uuid, name, parent=None, counter=None, ordering=None):
            out.append(pr.track_descriptor_packet(seq=META_SEQ, uuid=uuid, name=name, rank=len(out), parent=parent,
                                                  counter=counter, ordering=ordering))

        b = c.clock.bound()
        extra = f" ±{b['bound_ns'] / 1000:.2f} µs" if b["bound_ns"] is not None else " (unaligned)"
        td(u.root, f"GPU {c.device_id} · ctx {c.context_id} · {c.label}{extra}", ordering=3)
        h = c.host
        for j, e, n_replay, n_node in self.plan.exec_tracks():
            td(u.exec_group(j), f"graph exec {e:#x}", parent=u.root, ordering=3)
            for ln in range(n_replay):
                td(u.exec_replays(j, ln), "replays" + (f" ({ln + 1})" if ln else ""), parent=u.exec_group(j))
            for ln in range(n_node):
                td(u.exec_nodes(j, ln), "nodes" + (f" ({ln + 1})" if ln else ""), parent=u.exec_group(j))
            td(u.exec_host(j), "host node launches", parent=u.exec_group(j))
            for _, _, lid, name in self._kernel_tracks("exec", j):
                td(u(lid), name, parent=u.exec_group(j))
        for i, s in enumerate(self.plan.streams):
            td(u.stream(i), f"eager launches · stream {s:#x}", parent=u.root)
            for _, _, lid, name in self._kernel_tracks("stream", i):
                td(u(lid), name, parent=u.root)
        used = self.plan.used_sms()
        if len(used):
            td(u.blocks, "device blocks", parent=u.root, ordering=3)
            for s in used:
                td(u.sm(s), f"SM {s}", parent=u.blocks)
                for k, lid in enumerate(self.plan.sm_lane_tracks(s), 2):
                    td(u(lid), f"SM {s} ({k})", parent=u.blocks)
            td(u.rate, "block events per ms", parent=u.root, counter="events/ms")
            td(u.drops, "dropped device events", parent=u.root, counter="events")
        if h.n:
            td(u.host_drops, "dropped host records", parent=u.root, counter="records")
        if self.canary:
            td(u.canary, "canary", parent=u.root)
        return out

    def _kernel_tracks(self, kind: str, ix: int):
        if not self.plan.exits_recorded:  # no kernel durations without block exits
            return []
        return [t for t in self.plan.kernel_track_names() if t[0] == kind and t[1] == ix]

    def seq_start(self, seq: int, names: _Names, ann: tuple, clock: int) -> bytes:
        strings = [(i, text.encode()) for i, text in enumerate(self.write_strings, 1)] if seq == self.dev_seq else []
        return pr.sequence_start_packet(seq=seq, flags=SEQ_CLEARED, clock=clock,
                                        event_names=[(iid, name) for name, iid in names.iid.items()],
                                        annotation_names=list(enumerate(ann, 1)), string_values=strings)

    def snapshots(self) -> list[bytes]:
        return [pr.clock_snapshot_packet([(HOST_CLOCK, int(r["host_ns"])), (DEVICE_CLOCK, int(r["gpu_ns"]))],
                                         primary=HOST_CLOCK, seq=self.dev_seq) for r in self.c.clock.pairs]

    def canary_packets(self):
        """One instant per checked (step, buffer), yielded one by one."""
        for step, buf, host_ns, n in self.canary.rows() if self.canary else ():
            name = f"step {step} {buf}: " + ("ok" if not n[2] + n[3] else f"{n[2]} unexpected, {n[3]} missing")
            yield pr.instant_packet(seq=self.host_seq, flags=SEQ_NEEDS, ts=host_ns, track=self.u.canary,
                                    kind=T_INSTANT, name=name, annotations=zip(CanarySteps.LISTS, n))

    # -- vectorised packets -----------------------------------------------------------------------------------

    def host_packets(self):
        """The host launch instants, with the flows they start: yields byte buffers, a batch of records at a time
        (in the order one encoding of all records gives, :func:`_wire.encode_batched`), so that only a batch's
        flow ids and bytes are held."""
        rows, flows = self.host_rows, self.agg.flows
        yield from w.encode_batched(lambda i, full: self._host_fields(rows[i], flows if full else None), len(rows),
                                    max(1, min(1 << 16, HOST_BATCH // max(1, self.opt.flows))),
                                    whole=HOST_WHOLE_LARGE if self.c.release else HOST_WHOLE)

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
            fids, cnt = flows.ids_of_rows(rows, int(flow_id(c, 0)))
        ann = lambda i, v, present=None: w.msg(4, [w.const(bytes([0x08, i])), w.varint(3, v)], present)  # noqa: E731
        te = [
            ann(1, h.launch_id[rows], isg),
            ann(2, np.maximum(h.node_ordinal[rows], 0).astype(np.uint64), isg),
            ann(3, h.grid_id[rows]),
            ann(4, np.maximum(h.grid[rows], 0).astype(np.uint64)),
            ann(5, agg.count[rows].astype(np.uint64)),
            ann(6, h.index[rows].astype(np.uint64)),
            w.const(bytes([0x48, T_INSTANT])),
            w.varint(10, self.host_slot_iids[np.searchsorted(self.host_slots, h.kernel_slot[rows])]),
            w.varint(11, track),
            w.rfixed64(47, fids, cnt),
        ]
        return [w.msg(1, [w.varint(8, h.host_ns[rows]), w.varint(10, self.host_seq), w.msg(11, te),
                          w.const(bytes([0x68, SEQ_NEEDS]))])]

    def slice_packets(self):
        """Node executions and replays as slices (yielded, a batch at a time)."""
        agg, u, pl = self.agg, self.u, self.plan
        rows = pl.node_rows
        h = self.c.host
        if len(rows):
            def nodes(i):
                r = rows[i]
                return (agg.first_ts[r], agg.last_ts[r], u.exec_nodes(pl.node_exec[i], pl.node_lane[i]),
                        self.node_iids[pl.node_name_ix[i]], [(2, h.launch_id[r]), (3, agg.count[r])])

            yield from self._slices(len(rows), nodes)
        if pl.replays:
            r = np.array([(x[2], x[3]) for x in pl.replays], np.uint64)
            track = u.exec_replays(pl.replay_exec, pl.replay_lane)
            lid = np.array([x[1] for x in pl.replays], np.uint64)
            yield from self._slices(len(r), lambda i: (r[i, 0], r[i, 1], track[i], self.replay_name_iid[i],
                                                       [(2, lid[i])]))

    def _slices(self, n: int, cols):
        """Begin packets (instants where a slice starts and ends at once), then end packets, of ``n`` slices;
        ``cols(i)`` gives ``(start, end, track uuid, name iid, [(annotation iid, values)])`` of the slices ``i`` (a
        batch at a time: nothing per slice is held but the indices of those that end)."""
        def begins(i, full=True):
            st, en, track, name_iid, anns = cols(i)
            typ = np.where(st == en, T_INSTANT, T_BEGIN).astype(np.uint64)
            te = [w.msg(4, [w.const(bytes([0x08, k])), w.varint(3, v)]) for k, v in anns]
            te += [w.varint(9, typ), w.varint(10, name_iid), w.varint(11, track)]
            return [w.msg(1, [w.varint(8, st), w.varint(10, self.dev_seq), w.msg(11, te),
                              w.const(bytes([0x68, SEQ_NEEDS]))])]

        yield from w.encode_batched(begins, n)
        ends = []
        for a in range(0, n, 1 << 16):
            st, en = cols(slice(a, min(n, a + (1 << 16))))[:2]
            ends.append(np.flatnonzero(st != en) + a)
        ends = np.concatenate(ends) if ends else np.zeros(0, np.int64)

        def finish(i, full=True):
            _, en, track, _, _ = cols(ends[i])
            te = [w.const(bytes([0x48, T_END])), w.varint(11, track)]
            return [w.msg(1, [w.varint(8, en), w.varint(10, self.dev_seq), w.msg(11, te),
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
        recs, dev_index, has = self.plan.kept(first, recs)
        pair, recs, dev_index, has = self.plan.paired(first, recs, dev_index, has)
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
            p = pair[s:e] if pair is not None else None
            for sig, m in self._device_slice(recs[s:e], di, nflow, has[s:e] if has is not None else None, p):
                groups.append((sig, s, m))
        if len(groups) > 1:
            groups.sort(key=lambda g: (g[0], g[1]))
        return [g[2] for g in groups] + self._block_ends(recs, pair), n, nflow

    def _block_track(self, recs, pair):
        """Track uuid of each event: its SM's (lane 0), or the lane of its block's slice."""
        if pair is None:
            return np.uint64(self.u.sm(0)) + recs["smid"].astype(np.uint64)
        return self.u(self.plan.block_track_ids(recs, pair))

    def _device_slice(self, recs, di, nflow: int, has, pair=None) -> list:
        c = self.c
        slot = recs["kernel_slot"]
        if self.slot_shift is not None:  # (kept events' slots are the first pass's: agg.slots)
            iid = slot.astype(np.int64)
            iid += self.slot_shift
            iid = iid.view(np.uint64)
        elif self.slot_lut is not None:
            iid = self.slot_lut[slot]
        else:
            iid = np.array([self.slot_map[int(s)] for s in slot], np.uint64)
        iid_bounds = self.iid_bounds  # of the kept events (the first pass's slots and SMs): none read again
        track_bounds = None
        if pair is None and self.sm_bounds is not None:
            track_bounds = (self.u.sm(self.sm_bounds[0]), self.u.sm(self.sm_bounds[1]))
        track = self._block_track(recs, pair)
        typ = w.const(bytes([0x48, T_INSTANT])) if pair is None else \
            w.varint(9, np.where(pair >= 0, T_BEGIN, T_INSTANT).astype(np.uint64))
        te = [w.msg(4, [w.const(b"\x08\x01"), w.varint(3, recs["block_x"])])]
        if self.writes is not None:
            iid = self._write_fields(recs, iid, te)
            iid_bounds = None  # flagged blocks renamed
        te += [typ, w.varint(10, iid, bounds=iid_bounds), w.varint(11, track, bounds=track_bounds)]
        if nflow:
            te.append(w.fixed64(48, flow_id(c, di), present=has))
        pk = [w.varint(8, recs["globaltimer"]), w.varint(10, self.dev_seq), w.msg(11, te),
              w.const(bytes([0x68, SEQ_NEEDS]))]
        return w.encode_groups([w.msg(1, pk)], len(recs))

    def _write_fields(self, recs, iid, te: list):
        """The write annotations of the events of blocks that wrote (appended to ``te``); returns the events' name
        iids, flagged ones renamed."""
        bw = self.writes
        k = bw.lookup(recs)
        wrote = k >= 0
        if not wrote.any():
            return iid
        j = np.maximum(k, 0)
        base = len(DEV_ANN)

        def ann(i, field, v, present):
            te.append(w.msg(4, [w.const(bytes([0x08, base + i])), w.varint(field, v)], wrote & present))

        ann(1, 17, bw.cache_ix[j] + 1, True)
        for i, col in ((2, bw.page), (3, bw.offset), (4, np.maximum(bw.slot, 0))):
            ann(i, 3, col[j], bw.has_slot[j])
        ann(5, 3, bw.request[j], bw.has_request[j])
        ann(6, 3, bw.owner[j], bw.has_owner[j])
        ann(7, 17, len(bw.labels) + 1 + bw.status[j].astype(np.uint64), True)
        ann(8, 3, bw.step[j], bw.has_step[j])
        ann(9, 3, bw.writes[j], True)
        st = np.where(wrote, bw.status[j], 0)
        flag = np.flatnonzero(np.isin(st, list(FLAGGED)))
        if len(flag):
            iid = np.array(iid, np.uint64, copy=True)
            slots = recs["kernel_slot"][flag].tolist()
            iid[flag] = [self.flag_iid[(s, int(x))] for s, x in zip(slots, st[flag].tolist())]
        return iid

    def _block_ends(self, recs, pair) -> list:
        """The end packets of the block slices begun in the chunk (at their exit's time, on their lane)."""
        if pair is None or not (pair >= 0).any():
            return []
        k = np.flatnonzero(pair >= 0)
        track = self._block_track(recs[k], pair[k])
        end = self.plan.window.end_ns[pair[k]].astype(np.uint64)
        te = [w.const(bytes([0x48, T_END])), w.varint(11, track)]
        pk = [w.varint(8, end), w.varint(10, self.dev_seq), w.msg(11, te), w.const(bytes([0x68, SEQ_NEEDS]))]
        parts, _ = w.encode_parts([w.msg(1, pk)], len(k))
        return parts

    def kernel_packets(self):
        """The kernel slices (first block entry to last block exit of each timed launch), yielded a batch at a
        time."""
        pl, h = self.plan, self.c.host
        if not pl.exits_recorded or not len(pl.kernel_rows):
            return
        rows = pl.kernel_rows

        def cols(i):
            r = rows[i]
            return (pl.kernel_start[i].astype(np.uint64), pl.kernel_end[i].astype(np.uint64),
                    self.u(pl.kernel_track[i]), self.kernel_iids[pl.kernel_name_ix[i]],
                    [(2, np.where(h.kind[r] == GRAPH_NODE, h.launch_id[r], 0)), (3, self.agg.count[r])])

        yield from self._slices(len(rows), cols)


def estimate_bytes(ctxs, aggs, options: EmitOptions) -> int:
    """The trace's size before it is written (for the too-big-to-view warning): per kept device event and host record
    (measured: 38-43 bytes per event on qwen3-14b and generated dumps)."""
    return sum(a.kept * EST_EVENT_BYTES + c.n_host * (60 + 10 * options.flows) for c, a in zip(ctxs, aggs))


def write_perfetto(dumps, out, *, options: EmitOptions = EmitOptions(), warn=None, checks=None) -> EmitResult:
    """Write a Perfetto trace (TrackEvent protobuf) of dumps to ``out``, atomically (nothing left behind on failure).

    Args:
        dumps: dump paths, or dumps open already (:meth:`kvconv.run.Run.write` hands its own; left open).
        out: the .pftrace path ('-': standard output).
        options: :class:`~kvconv.emit.options.EmitOptions`; ``verdict``: also check each dump as kvconv validate
            does, from the chunks the conversion reads (``EmitResult.verdicts``).
        warn: ``warn(message)`` for each warning (default: ``EmitResult.warnings``).
        checks: each dump's :class:`kvconv.check.validate.Validation` to feed (a Run's own), instead of new ones.

    Returns:
        An :class:`~kvconv.emit.options.EmitResult`: counts, the join used and the clock alignment per context.

    Raises:
        FormatError / DamagedError: a dump is not readable, or its records are damaged (without ``salvage``).
        OutputError: ``out`` may not be written (an input; another program's file without ``force``).
        UsageError: options that do not fit the dumps.
    """
    from kvconv.emit._verdict import warn_empty, warn_reconcile
    from kvconv.format.atomic import atomic_output

    with emit_run(dumps, out, options, warn, "perfetto", checks=checks, passes=2) as (res, warn, paths, ctxs, bar):
        aggs = first_passes(ctxs, options, bar)
        warn_empty(ctxs, aggs, options, warn)
        warn_reconcile(ctxs, options, warn)
        release_join(ctxs, options)
        est = estimate_bytes(ctxs, aggs, options)
        if est > options.ui_limit_bytes:
            warn(f"the trace will be about {human_size(est)}, more than the Perfetto UI loads comfortably "
                 f"({human_size(options.ui_limit_bytes)}); use --window START_MS:END_MS or "
                 "--replays FIRST:LAST, or open it with trace_processor --httpd")
        plans = Plans(ctxs, aggs, lambda c, a, k: _Packets(Plan(c, a, options, canary=k)), options,
                      unused=("tag", "node", "flags", "dup", "gx", "gy", "gz"))
        # "r+b": the fresh temporary is empty; truncating it ("wb") would make ext4 (auto_da_alloc) start writing
        # the whole file back when it is closed, which the close then waits on
        with atomic_output(out, inputs=paths, kind="perfetto", force=options.force) as tmp, open(tmp, "r+b") as raw, \
                BackgroundWriter(raw) as f:
            # the file's blocks reserved before the first write, about its size (the estimate runs
            # 0.9-1.0 of it): the writer thread's page-cache copy costs less (kvconv.emit._writer.reserve)
            reserved = est >= RESERVE_FROM and reserve(raw.fileno(), est + est // 8)
            f.write(trace_clock_anchor())
            for pl in plans:
                for b in pl.descriptors():
                    f.write(b)
                pl = None  # a lazy context's plan goes before the next one's is made (Plans)
            for pl in plans:
                c = pl.c
                dev_clock = DEVICE_CLOCK if c.clock.n else HOST_CLOCK
                f.write(pl.seq_start(pl.dev_seq, pl.dev_names, pl.dev_ann, dev_clock))
                for b in pl.snapshots():
                    f.write(b)
                f.write(pl.seq_start(pl.host_seq, pl.host_names, HOST_ANN, HOST_CLOCK))
                for b in pl.host_packets():
                    f.write(b)
                for b in pl.canary_packets():
                    f.write(b)
                for b in pl.slice_packets():
                    f.write(b)
                for b in pl.kernel_packets():
                    f.write(b)
                for b in pl.counter_packets():
                    f.write(b)
                res.flows += pl.plan.host_flows()
                for first, recs in c.chunks(options.chunk):
                    parts, n, _ = pl.device_packets(first, recs)
                    for b in parts:
                        f.write(b)
                    res.written_events += n
                    bar(len(recs))
                res.host_records += len(pl.host_rows)
                res.alignment.append(c.alignment())
                res.join.append(c.join)
                pl = None
            f.close()  # all written: the size, which stdout (-o -) cannot be asked for afterwards
            res.bytes_written = raw.tell()
            if reserved:  # what the trace did not fill goes back
                raw.flush()
                release_reserve(raw.fileno())
    return res

