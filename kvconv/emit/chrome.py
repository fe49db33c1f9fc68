"""Chrome JSON trace-event file (X / i / C / M events, flows s / f, displayTimeUnit ns), streamed chunk by chunk.

The same tracks as the Perfetto trace: each context of every dump is a process (pid), each track a thread (tid).
The trace-event format has one time base, so device %globaltimer times are placed on the host CLOCK_MONOTONIC
timeline through the dump's own clock-sync pairs (the nearest earlier pair: host_i + (gpu - gpu_i), the rule
trace_processor applies to clock snapshots); durations are measured in the device clock alone. The subset written is
described by ``schemas/chrome.schema.json``.

Device blocks are events on their SM's track, named after their kernel. Without block exits each entry is a
zero-length event (``"dur":0``); when the dump holds them (``kvconv record --events enter,exit``) a block's entry and
exit are paired into one slice from entry to exit (on extra lanes where blocks overlap), an exit without its entry
stays a zero-length ``<kernel> (block exit)``, and a launch's slice runs from its first entry to its last exit.

Lines are rendered many at a time as fixed-width byte matrices (:mod:`kvconv.emit._text`): a number of few values
whose digit count differs from line to line (block indices, 0 to 131) is right-aligned with leading spaces
(``"block":[  7,0,0]``, JSON whitespace); other fields are written without any.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from kvconv.emit import _text as t
from kvconv.emit._canary import CanarySteps
from kvconv.emit._contexts import Plans, emit_run, first_passes, release_join
from kvconv.emit._first_pass import flow_id
from kvconv.emit._stream import EAGER, GRAPH_NODE, RELEASE_BYTES
from kvconv.emit._writer import RESERVE_FROM, BackgroundWriter, release_reserve, reserve
from kvconv.emit._writes import FLAGGED, STATUS_TEXT, BlockWrites
from kvconv.emit.options import EmitOptions, EmitResult
from kvconv.emit.plan import Plan
from kvconv.format import layout
from kvconv.join.launches import Dropped, release_groups, short_name
from kvconv.memory import release_heap
from kvconv.progress import human_size

# JSON bytes per device event, measured: 194 (qwen3-14b), 255 (generated), 263 (10 GiB), 329 (h200-single)
EST_EVENT_BYTES = 250
BLOCK_EXIT = layout.ENUMS["event_kind"]["block_exit"]
EXIT_SUFFIX = " (block exit)"  # the name of a block-exit event: its kernel's, with this
LINES = 1 << 14  # device events rendered at a time (SLICE once; 1 << 16 gained nothing and holds 4x the lines)
WRITE_AHEAD = 8 << 20  # bytes rendered ahead of the writer (32 MiB: as much again in the peak, for no speed)


def _j(s: str) -> bytes:
    return json.dumps(s, ensure_ascii=False).encode()


def _ms_to_ns(ms: np.ndarray) -> np.ndarray:
    return np.minimum(ms, np.uint64((2**64 - 1) // 1_000_000)) * np.uint64(1_000_000)


class _Chrome:
    """The Chrome trace events of one context's :class:`Plan`: the context is a process, its tracks threads (thread
    ids: the plan's local track ids)."""

    def __init__(self, pl: Plan) -> None:
        self.pl = pl
        self.c = pl.c
        self.pid = pl.c.serial + 1
        self.writes = BlockWrites.of(self.c)

    @staticmethod
    def tid(local) -> np.ndarray | int:
        return local if np.isscalar(local) else np.asarray(local).astype(np.int64)

    def meta(self):
        """The metadata, canary and clock-sync lines (yielded)."""
        pl, c, u = self.pl, self.c, self.pl.tracks
        b = c.clock.bound()
        out = []

        def ev(d: dict) -> None:
            out.append(b",\n" + json.dumps(d, ensure_ascii=False, separators=(",", ":")).encode())

        name = f"GPU {c.device_id} · ctx {c.context_id} · {c.label}"
        ev({"ph": "M", "pid": self.pid, "name": "process_name", "args": {"name": name}})
        ev({"ph": "M", "pid": self.pid, "name": "process_sort_index", "args": {"sort_index": self.pid}})
        ev({"ph": "M", "pid": self.pid, "name": "process_labels",
            "args": {"labels": f"clock-sync pairs {b['pairs']}, alignment ±{(b['bound_ns'] or 0) / 1000:.2f} µs"}})
        rank = [0]

        def thread(uuid, tname):
            tid = int(self.tid(uuid))
            ev({"ph": "M", "pid": self.pid, "tid": tid, "name": "thread_name", "args": {"name": tname}})
            ev({"ph": "M", "pid": self.pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": rank[0]}})
            rank[0] += 1

        for j, e, n_replay, n_node in pl.exec_tracks():
            for ln in range(n_replay):
                thread(u.exec_replays(j, ln), f"graph exec {e:#x} · replays" + (f" ({ln + 1})" if ln else ""))
            for ln in range(n_node):
                thread(u.exec_nodes(j, ln), f"graph exec {e:#x} · nodes" + (f" ({ln + 1})" if ln else ""))
            thread(u.exec_host(j), f"graph exec {e:#x} · host node launches")
            for kind, ix, lid, tname in pl.kernel_track_names():
                if kind == "exec" and ix == j:
                    thread(lid, f"graph exec {e:#x} · {tname}")
        for i, s in enumerate(pl.streams):
            thread(u.stream(i), f"eager launches · stream {s:#x}")
            for kind, ix, lid, tname in pl.kernel_track_names():
                if kind == "stream" and ix == i:
                    thread(lid, tname)
        for s in pl.used_sms():
            thread(u.sm(s), f"SM {s}")
            for k, lid in enumerate(pl.sm_lane_tracks(s), 2):
                thread(lid, f"SM {s} ({k})")
        if pl.canary:
            thread(u.CANARY, "canary")
            for step, buf, host_ns, n in pl.canary.rows():
                bad = n[2] + n[3]
                ev({"ph": "i", "s": "t", "pid": self.pid, "tid": int(self.tid(u.CANARY)), "ts": host_ns / 1000,
                    "name": f"step {step} {buf}: " + ("ok" if not bad else f"{bad} pages off"),
                    "args": dict(zip(CanarySteps.LISTS, n))})
                if len(out) >= 4096:  # a few lines held at a time
                    yield from out
                    out.clear()
        for r in c.clock.pairs:
            ev({"ph": "i", "s": "p", "pid": self.pid, "tid": 0, "ts": int(r["host_ns"]) / 1000, "name": "clock sync",
                "args": {"gpu_ns": int(r["gpu_ns"]), "uncertainty_ns": int(r["uncertainty_ns"])}})
        yield from out

    def host(self):
        """The host launch events, then the flow starts ("s", one per flow): yields byte buffers, ``t.SLICE`` lines
        at a time (the slices :func:`_text.render_parts` renders one by one), so that only a slice's values and
        lines are held."""
        pl, c, h, agg = self.pl, self.c, self.c.host, self.pl.agg
        rows = pl.host_rows
        n = len(rows)
        if not n:
            return
        us = np.unique(h.kernel_slot[rows])
        names = [_j(c.kernel_name(s)) for s in us.tolist()]
        for a in range(0, n, t.SLICE):
            r = rows[a : a + t.SLICE]
            ids = np.searchsorted(us, h.kernel_slot[r])  # the name's index, a slice at a time
            yield from t.render_parts([
                t.lit(b',\n{"ph":"X","pid":%d,"tid":' % self.pid), t.uint(self.tid(pl.host_tracks(r))),
                t.lit(',"ts":'), t.ts_us(h.host_ns[r]), t.lit(',"dur":0,"name":'), t.choice(ids, names),
                t.lit(',"cat":"host","args":{"replay":'), t.uint(h.launch_id[r]), t.lit(',"node":'),
                t.uint(np.maximum(h.node_ordinal[r], 0)), t.lit(',"grid_id":'), t.uint(h.grid_id[r]),
                t.lit(',"blocks_predicted":'), t.uint(np.maximum(h.grid[r], 0)), t.lit(',"blocks_recorded":'),
                t.uint(agg.count[r]), t.lit("}}")], len(r))
        if not agg.flows.K:
            return
        # flow starts: one "s" per (host record, device block) flow, record by record
        cum = np.cumsum(agg.flows.counts(rows))
        for a in range(0, int(cum[-1]), t.SLICE):
            b = min(a + t.SLICE, int(cum[-1]))
            i0, i1 = int(np.searchsorted(cum, a, side="right")), int(np.searchsorted(cum, b, side="left")) + 1
            r = rows[i0:i1]
            fd, cnt = agg.flows.of_rows(r)
            k = np.arange(fd.shape[1])
            ri, ki = np.nonzero(k[None, :] < cnt[:, None])
            skip = a - (int(cum[i0 - 1]) if i0 else 0)  # flows of the first record written by the slice before
            ri, ki = ri[skip : skip + b - a], ki[skip : skip + b - a]
            yield from t.render_parts([
                t.lit(b',\n{"ph":"s","pid":%d,"tid":' % self.pid), t.uint(self.tid(pl.host_tracks(r))[ri]),
                t.lit(',"ts":'), t.ts_us(h.host_ns[r][ri]), t.lit(',"id":'), t.uint(flow_id(c, fd[ri, ki])),
                t.lit(',"name":"launch","cat":"flow"}')], b - a)

    def slices(self):
        """Node executions and replays as "X" events (yielded, ``t.SLICE`` lines at a time)."""
        pl, c, agg, u, h = self.pl, self.c, self.pl.agg, self.pl.tracks, self.c.host
        rows = pl.node_rows
        if len(rows):
            nid, names = pl.node_name_ix, [_j(n) for n in pl.node_names]
            for a in range(0, len(rows), t.SLICE):
                r, s = rows[a : a + t.SLICE], slice(a, a + t.SLICE)
                st = agg.first_ts[r]
                yield from t.render_parts([
                    t.lit(b',\n{"ph":"X","pid":%d,"tid":' % self.pid),
                    t.uint(self.tid(u.exec_nodes(pl.node_exec[s], pl.node_lane[s]))), t.lit(',"ts":'),
                    t.ts_us(c.clock.to_host(st.astype(np.uint64))), t.lit(',"dur":'), t.ts_us(agg.last_ts[r] - st),
                    t.lit(',"name":'), t.choice(nid[s], names), t.lit(',"cat":"node","args":{"replay":'),
                    t.uint(h.launch_id[r]), t.lit(',"blocks":'), t.uint(agg.count[r]), t.lit("}}")], len(r))
        if pl.replays:
            r = np.array([(x[2], x[3], x[1]) for x in pl.replays], np.uint64)
            tid = self.tid(u.exec_replays(pl.replay_exec, pl.replay_lane))
            yield from t.render_parts([
                t.lit(b',\n{"ph":"X","pid":%d,"tid":' % self.pid), t.uint(tid), t.lit(',"ts":'),
                t.ts_us(c.clock.to_host(r[:, 0].astype(np.uint64))), t.lit(',"dur":'), t.ts_us(r[:, 1] - r[:, 0]),
                t.lit(',"name":"replay","cat":"replay","args":{"replay":'), t.uint(r[:, 2]), t.lit("}}")], len(r))

    def kernels(self):
        """Each launch with recorded blocks as a GPU kernel the way torch.profiler (Kineto) writes one: ``"cat":
        "kernel"``, ``"ph":"X"`` from its first block entry to its last block exit (to its last block entry when the
        dump records no exits: ``args.span`` says which), ``args`` device, stream, correlation (the launch's grid
        id), grid and block; Holistic Trace Analysis counts GPU kernels by ``args.stream``."""
        pl, c, h = self.pl, self.c, self.c.host
        rows, start, end = pl.kernel_rows, pl.kernel_start, pl.kernel_end  # Plan.launch_spans
        if not len(rows):
            return
        us = np.unique(h.kernel_slot[rows])
        names = [_j(c.kernel_name(s)) for s in us.tolist()]
        span = b"entry-exit" if pl.exits_recorded else b"entries"
        for a in range(0, len(rows), t.SLICE):
            r, k = rows[a : a + t.SLICE], slice(a, a + t.SLICE)
            dims = _block_dims(c, r)
            yield from t.render_parts([
                t.lit(b',\n{"ph":"X","cat":"kernel","pid":%d,"tid":' % self.pid), t.uint(pl.kernel_track[k]),
                t.lit(',"ts":'), t.ts_us(c.clock.to_host(start[k].astype(np.uint64))), t.lit(',"dur":'),
                t.ts_us(end[k] - start[k]), t.lit(',"name":'), t.choice(np.searchsorted(us, h.kernel_slot[r]), names),
                t.lit(b',"args":{"device":%d,"stream":' % c.device_id), t.uint(h.stream[r]),
                t.lit(',"correlation":'), t.uint(h.grid_id[r]), t.lit(',"grid":['), t.uint(h.gx[r]), t.lit(","),
                t.uint(h.gy[r]), t.lit(","), t.uint(h.gz[r]), t.lit('],"block":['), t.uint(dims[0]), t.lit(","),
                t.uint(dims[1]), t.lit(","), t.uint(dims[2]), t.lit('],"blocks":'), t.uint(pl.agg.count[r]),
                t.lit(b',"span":"%s"}}' % span)], len(r))

    def counters(self) -> list:
        c, agg = self.c, self.pl.agg
        parts = []
        if len(agg.rate_ms):
            ts = _ms_to_ns(agg.rate_ms)
            vals = agg.rate_vals
            parts += t.render_parts([
                t.lit(b',\n{"ph":"C","pid":%d,"ts":' % self.pid), t.ts_us(c.clock.to_host(ts)),
                t.lit(',"name":"block events per ms","args":{"events":'), t.uint(vals), t.lit("}}")], len(ts))
        if agg.t0 is not None and agg.t1 is not None:  # t1 None: a --window that keeps no event
            ts = c.clock.to_host(np.array([agg.t0, agg.t1], np.uint64))
            parts += t.render_parts([
                t.lit(b',\n{"ph":"C","pid":%d,"ts":' % self.pid), t.ts_us(ts),
                t.lit(',"name":"dropped device events","args":{"events":'),
                t.uint(np.array([0, c.device_drops])), t.lit("}}")], 2)
        return parts

    def device(self, first: int, recs: np.ndarray, write) -> int:
        """Write the lines of one chunk's device events with ``write``, slice by slice (slices whose records and
        temporaries stay in cache; only one slice's lines are held); returns the events written."""
        recs, dev_index, hasm = self.pl.kept(first, recs)
        pair, recs, dev_index, hasm = self.pl.paired(first, recs, dev_index, hasm)
        n = len(recs)
        for s in range(0, n, LINES):
            e = min(n, s + LINES)
            di = (first + np.arange(s, e)) if dev_index is None else dev_index[s:e]
            for b in self._device_slice(recs[s:e], di, hasm[s:e] if hasm is not None else None,
                                        pair[s:e] if pair is not None else None):
                write(b)
        return n

    def _device_slice(self, recs: np.ndarray, di: np.ndarray, hasm, pair=None) -> list:
        """Block events: a paired block entry as an "X" from its entry to its exit on its SM's lane; other
        events (entries of enter-only dumps, unpaired entries and exits) as zero-length "X" on their SM."""
        pl, c = self.pl, self.c
        n = len(recs)
        ts = c.clock.to_host(recs["globaltimer"])
        if pair is None:
            tid, dur = recs["smid"].astype(np.int64) + pl.tracks.sm(0), t.lit(',"dur":0,"name":')
        else:
            end = pl.window.of(pl.window.end_ns, pair, recs["globaltimer"].astype(np.int64))
            tid = pl.block_track_ids(recs, pair).astype(np.int64)
            dur = [t.lit(',"dur":'), t.ts_us(end - recs["globaltimer"].astype(np.int64)), t.lit(',"name":')]
        slot = recs["kernel_slot"]
        kmin, kmax = int(slot.min()), int(slot.max())
        ex = recs["kind"] == BLOCK_EXIT
        if not ex.any():
            if kmin == kmax:
                nid, strings = np.zeros(n, np.int64), [_j(short_name(c.kernel_name(kmin)))]
            else:
                us, nid = np.unique(slot, return_inverse=True)
                strings = [_j(short_name(c.kernel_name(s))) for s in us.tolist()]
        else:
            # unpaired block exits: zero-length like unpaired entries, named apart
            us, nid = np.unique(slot.astype(np.int64) * 2 + ex, return_inverse=True)
            strings = [_j(short_name(c.kernel_name(k >> 1)) + (EXIT_SUFFIX if k & 1 else "")) for k in us.tolist()]
        nid = nid.reshape(-1)
        k = self.writes.lookup(recs) if self.writes is not None else None
        if k is not None and (k >= 0).any():
            nid, strings = self._flag_names(recs, k, nid, strings)
        head = [
            t.lit(b',\n{"ph":"X","pid":%d,"tid":' % self.pid), t.uint(tid), t.lit(',"ts":'), t.ts_us(ts),
            *(dur if isinstance(dur, list) else [dur]), t.choice(nid, strings),
            t.lit(',"cat":"block","args":{"block":['),
            t.uint(recs["block_x"]), t.lit(","), t.uint(recs["block_y"]), t.lit(","), t.uint(recs["block_z"]),
            t.lit('],"seq":'), t.uint(recs["sequence"])]
        if k is None or not (k >= 0).any():
            parts = t.render_parts(head + [t.lit("}}")], n)
        else:
            parts = self._write_args(head, k)
        if hasm is not None:
            has = np.flatnonzero(hasm)
            if len(has):
                if len(has) == n:  # every block ends a flow
                    has = slice(None)
                parts += t.render_parts([
                    t.lit(b',\n{"ph":"f","bp":"e","pid":%d,"tid":' % self.pid), t.uint(tid[has]), t.lit(',"ts":'),
                    t.ts_us(ts[has]), t.lit(',"id":'), t.uint(flow_id(c, di[has])),
                    t.lit(',"name":"launch","cat":"flow"}')], len(tid[has]))
        return parts


    def _flag_names(self, recs, k, nid, strings):
        """Events of blocks whose writes are flagged renamed "<kernel> · write outside every cache"."""
        st = np.where(k >= 0, self.writes.status[np.maximum(k, 0)], 0)
        flag = np.flatnonzero(np.isin(st, list(FLAGGED)))
        if not len(flag):
            return nid, strings
        nid, strings = nid.copy(), list(strings)
        for i in flag.tolist():
            name = _j(short_name(self.c.kernel_name(int(recs["kernel_slot"][i]))) + f" · {FLAGGED[int(st[i])]}")
            if name not in strings:
                strings.append(name)
            nid[i] = strings.index(name)
        return nid, strings

    def _write_args(self, head: list, k: np.ndarray) -> list:
        """The events' lines, those of blocks that wrote with the write args (cache, page, offset, slot, request,
        slot_owner, write, step, writes; kvconv.emit._writes), grouped by which of them are known."""
        bw = self.writes
        j = np.maximum(k, 0)
        labels = [_j(x) for x in bw.labels]
        status = [_j(STATUS_TEXT[x]) for x in sorted(STATUS_TEXT)]
        opt = [(',"page":', bw.page, bw.has_slot), (',"offset":', bw.offset, bw.has_slot),
               (',"slot":', np.maximum(bw.slot, 0), bw.has_slot), (',"request":', bw.request, bw.has_request),
               (',"slot_owner":', bw.owner, bw.has_owner), (',"step":', bw.step, bw.has_step)]
        pattern = np.where(k >= 0, 1, 0)
        for b, (_, _, has) in enumerate(opt):
            pattern = pattern | (np.where(k >= 0, has[j], False).astype(np.int64) << (b + 1))
        out = []
        for pat in np.unique(pattern).tolist():
            idx = np.flatnonzero(pattern == pat)
            parts = [p if p.kind == "lit" else t.Part(p.kind, p.value[idx], p.choices) for p in head]
            if pat & 1:
                ji = j[idx]
                parts += [t.lit(',"cache":'), t.choice(bw.cache_ix[ji], labels)]
                for b, (key, col, _) in enumerate(opt):
                    if pat >> (b + 1) & 1:
                        parts += [t.lit(key), t.uint(col[ji])]
                parts += [t.lit(',"write":'), t.choice(bw.status[ji].astype(np.int64), status), t.lit(',"writes":'),
                          t.uint(bw.writes[ji])]
            out += t.render_parts(parts + [t.lit("}}")], len(idx))
        return out


def estimate_bytes(ctxs, aggs, options: EmitOptions) -> int:
    """The trace's size before it is written (the too-big-to-view warning): per kept device event and host record."""
    return sum(a.kept * EST_EVENT_BYTES + c.n_host * 200 for c, a in zip(ctxs, aggs))


def write_chrome(dumps, out, *, options: EmitOptions = EmitOptions(), warn=None, checks=None) -> EmitResult:
    """Write Chrome JSON trace events of the dumps to ``out``, atomically (nothing left behind on failure).

    Args:
        dumps: dump paths, or dumps open already (:meth:`kvconv.run.Run.write` hands its own; left open).
        out: the .json path ('-': standard output).
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

    with emit_run(dumps, out, options, warn, "chrome", checks=checks, passes=2) as (res, warn, paths, ctxs, bar):
        aggs = first_passes(ctxs, options, bar)
        warn_empty(ctxs, aggs, options, warn)
        warn_reconcile(ctxs, options, warn)
        release_join(ctxs, options)
        est = estimate_bytes(ctxs, aggs, options)
        if est > options.ui_limit_bytes:
            warn(f"the trace will be about {human_size(est)}, more than trace viewers load comfortably "
                 f"({human_size(options.ui_limit_bytes)}); use --window START_MS:END_MS or --replays "
                 "FIRST:LAST, or the Perfetto format")
        plans = Plans(ctxs, aggs, lambda c, a, k: _Chrome(Plan(c, a, options, canary=k)), options,
                      unused=("tag", "node", "flags", "dup"))
        other = {"tool": "kvconv", "clock": "host CLOCK_MONOTONIC; device %globaltimer aligned through each "
                 "dump's clock-sync pairs", "alignment": [c.alignment() for c in ctxs]}
        head = {"displayTimeUnit": "ns", "otherData": other, "schemaVersion": 1}
        # "r+b": the fresh temporary is empty; truncating it ("wb") would make ext4 (auto_da_alloc) start writing
        # the whole file back when it is closed, which the close then waits on
        with atomic_output(out, inputs=paths, kind="chrome", force=options.force) as tmp, open(tmp, "r+b") as raw, \
                BackgroundWriter(raw, limit=WRITE_AHEAD) as f:
            # the file's blocks reserved before the first write, about its size (the estimate leaves the flows
            # out: 0.6 of the bench's trace): the writer thread's page-cache copy costs less (_writer.reserve)
            reserved = est >= RESERVE_FROM and reserve(raw.fileno(), est + est // 2)
            f.write(json.dumps(head, ensure_ascii=False, separators=(",", ":"))[:-1].encode())
            # Kineto's header: HTA finds a trace's rank with the pattern '"rank":\s+N' (a space after the colon)
            f.write(b',"distributedInfo":{"rank": %d}' % _rank(ctxs))
            f.write(b',"traceEvents":[\n{"ph":"M","pid":0,"name":"process_name","args":{"name":"kvconv"}}')
            for ch in plans.walk(drop=_NOT_IN_META):
                _descriptors_only(ch, options)
                for b in ch.meta():
                    f.write(b)
                ch = None  # a lazy context's plan goes before the next one's is made (Plans)
            for ch in plans:
                for b in ch.host():
                    f.write(b)
                res.flows += ch.pl.host_flows()
                for b in ch.slices():
                    f.write(b)
                _let_go_before_kernels(ch, options)
                for b in ch.kernels():
                    f.write(b)
                ch.pl.forget_kernel_rows()
                for b in ch.counters():
                    f.write(b)
                for first, recs in ch.c.chunks(options.chunk):
                    res.written_events += ch.device(first, recs, f.write)
                    bar(len(recs))
                res.host_records += len(ch.pl.host_rows)
                res.join.append(ch.c.join)
                ch = None
            f.write(b"\n]}\n")
            f.close()  # all written: the size, which stdout (-o -) cannot be asked for afterwards
            res.bytes_written = raw.tell()
            if reserved:  # what the trace did not fill goes back
                raw.flush()
                release_reserve(raw.fileno())
        res.alignment = [c.alignment() for c in ctxs]
    return res


# what the host launch events and the node slices read, and the kernel slices and device events do not
_HOST_AND_NODES = ("host_ns", "launch_id", "node_ordinal", "grid", "upload")


# what neither the plan nor the metadata lines read (the tracks and their names are planned without them)
_NOT_IN_META = ("index", "host_ns", "grid_id", "gx", "gy", "gz", "grid")


def _descriptors_only(ch: _Chrome, options: EmitOptions) -> None:
    """The plan of a lazy context made for the metadata lines alone (its tracks, the kernel slices' among them): the
    per-launch rows and aggregates that only the events read go before the kernel slices are planned. Planned with
    every column the events' walk holds, the descriptors' walk was the peak of a 10 GiB trace (issue 13)."""
    if not ch.c.lazy or options.replays is not None:
        return
    ch.pl.host_rows = None
    ch.pl.agg = dataclasses.replace(ch.pl.agg, flows=None, kept_hosts=None)
    _let_go_before_kernels(ch, options)


def _let_go_before_kernels(ch: _Chrome, options: EmitOptions) -> None:
    """A lazy context's per-launch columns that only the host launch events and the node slices read (32 bytes a
    launch), let go once they are written and before the kernel slices are planned (their columns and temporaries
    were the peak of a 10 GiB trace: issue 13); then ``graph_exec``, which only that planning reads after them.
    Contexts kept in memory (small dumps) keep theirs; ``--replays`` filters device events by the launch ids."""
    pl, c = ch.pl, ch.c
    if not c.lazy or options.replays is not None:
        return
    c.host = dataclasses.replace(c.host, **{k: Dropped(k) for k in _HOST_AND_NODES})
    pl.node_rows = pl.node_exec = pl.node_lane = pl.node_name_ix = None
    release_heap()
    pl.kernel_rows  # noqa: B018 - planned now (Plan.__getattr__), while graph_exec is there
    c.host = dataclasses.replace(c.host, graph_exec=Dropped("graph_exec"))
    # the slices' spans are the plan's own now: the first pass's first and last block per launch go (16 bytes a
    # launch; the kernel slices and the device events read its counts, flows and lanes)
    pl.agg = dataclasses.replace(pl.agg, first_ts=None, last_ts=None, kept_hosts=None)
    release_heap()


def _rank(ctxs) -> int:
    """The trace's rank for tools that read one trace per rank (HTA): the dump's ``metadata.rank`` where the tracer
    recorded one, else the GPU of its first context (one GPU per rank, as tensor-parallel engines run)."""
    meta = ctxs[0].meta or {} if ctxs else {}
    r = meta.get("rank") if isinstance(meta, dict) else None
    return int(r) if isinstance(r, int) and r >= 0 else (ctxs[0].device_id if ctxs else 0)


def _block_dims(c, rows: np.ndarray) -> tuple:
    """blockDim x, y, z of the launch-table ``rows`` (read from their records: the table keeps the grid only), group
    by group: ``dump.records`` of a kind held in many groups (every long run) is a copy of all of them, 96 bytes a
    launch, which this did per slice of rows (issue 13: the peak of a 10 GiB Chrome trace)."""
    h = c.host
    out = [np.zeros(len(rows), np.uint64) for _ in range(3)]
    for kind, name in ((GRAPH_NODE, "graph_node"), (EAGER, "eager_launch")):
        sel = np.flatnonzero(h.kind[rows] == kind)
        if not len(sel):
            continue
        groups = c.dump.groups_of(name, context_id=c.context_id)
        ends = np.cumsum([len(g.records) for g in groups])
        idx = h.index[rows[sel]].astype(np.int64)  # index into the kind's records, groups in order
        gi = np.searchsorted(ends, idx, side="right")
        used = np.unique(gi).tolist()
        for g in used:
            m = np.flatnonzero(gi == g) if len(used) > 1 else slice(None)
            recs = groups[g].records
            local = idx[m] - (int(ends[g - 1]) if g else 0)
            for k, f in enumerate(("block_dim_x", "block_dim_y", "block_dim_z")):
                out[k][sel[m]] = recs[f][local]
    if c.dump.size > RELEASE_BYTES:  # the records' pages just read go back (the launch table holds the rest)
        release_groups(c.dump, ("graph_node", "eager_launch"), c.context_id)
    return tuple(out)
