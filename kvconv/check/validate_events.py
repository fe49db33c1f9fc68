"""validate's checks of the device events, in one pass over each event group, chunk by chunk: the payload checksum
(in the CRC worker), enums, flags, kernel slots, blockIdx against its launch's grid, sequence and %globaltimer order;
the reconciler's streaming pass takes each chunk too (one read of the file), and checked chunks' pages go back.

    >>> grids = _grid_tables(d, ctx)                                                        # doctest: +SKIP
    >>> _check_device_events(view, c, slots, grids, feed=stream.feed, pages=_Pages(d, None))  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from kvconv._workers import worker
from kvconv.check._collect import (
    RELEASE_BYTES,
    Lookup,
    _bits_mask,
    _Collector,
    _crc_finding,
    _enum_values,
    _known,
)
from kvconv.format import dump as dumpmod
from kvconv.format import layout
from kvconv.join.runs import Runs, chunk_runs

EV_CHUNK = 1 << 15  # 2 MiB of events: every check of a chunk runs while it is in cache


_EV = layout.LAYOUTS["device_event"]


def _check_device_events(d, c: _Collector, kernel_slots: set[int] | None, grids, *, feed=None,
                         pages: _Pages | None = None) -> None:
    """One pass over each event group, chunk by chunk: checksum, enums, flags, kernel slots, blockIdx against its
    launch's grid, and sequence/timer order (events sit at the slot their sequence reserved, so a dump is normally
    in sequence order; anything else falls back to a sort). ``feed(first, records, kind)``: the reconciler's
    streaming pass takes each chunk too (one read of the file); ``pages``: gives each chunk's pages back once checked
    and summed, and reports progress."""
    checks = _EventChecks(kernel_slots, grids)
    ctx_base = 0
    for g in d.groups_of("device_event"):
        # The checksum runs in a second thread while this one checks the records (zlib releases the GIL), chunk by
        # chunk, so that a checked and summed chunk's pages can be given back.
        crc = _ChunkCrc(g) if not g.lost_records and not g.live else None
        order = _SequenceOrder()
        for base, ev in g.chunks(EV_CHUNK):
            if crc is not None:
                crc.add(ev)
            kind = ev["kind"]
            runs = chunk_runs(ev, kind)  # (the reconciler's pass reads the runs too: handed over, not found again)
            if feed is not None:
                feed(ctx_base + base, ev, kind, runs)
            checks.chunk(c, g, ev, base, kind, runs)
            order.add(ev, base, runs.consecutive)
            if pages is not None:
                pages.done(g, base, len(ev), crc)
        if pages is not None:
            pages.flush(crc)
        ctx_base += len(g.records)
        if crc is not None and not crc.ok():
            _crc_finding(c, g)
        if not len(g.records):
            continue
        if order.in_order:
            s0 = int(g.records["sequence"][0])
            order.timer.report(c, g, lambda i: i)
            if g.drop_count == 0 and s0 != 0:
                c.add("warning", "sequence-start", f"sequences start at {s0}, not 0, with no drops recorded",
                      group=g.index, record=0, offset=g.record_offset(0) + _EV.field("sequence").offset,
                      field="device_event.sequence")
        else:
            _check_sequence_unordered(g, c)


_AXES = (("block_x", "grid_x"), ("block_y", "grid_y"), ("block_z", "grid_z"))


class _EventChecks:
    """The per-record checks of a chunk of device events (one context: its kernel slots and launch grids)."""

    def __init__(self, kernel_slots: set[int] | None, grids) -> None:
        self.kind_ok = np.zeros(256, dtype=bool)
        self.kind_ok[_enum_values("event_kind")] = True
        self.known = Lookup(_known(kernel_slots)) if kernel_slots is not None else None
        self.fmask = ~np.uint8(_bits_mask("event_flags"))
        self.has_gid = np.uint8(layout.ENUMS["event_flags"]["has_gridid"])
        self.grids = None
        if grids is not None:  # look-up tables built once per context, not per chunk
            gids, gdims, slots, sdims = grids
            self.grids = (Lookup(gids), gdims, Lookup(slots), sdims)

    def chunk(self, c: _Collector, g: dumpmod.Group, ev: np.ndarray, base: int, kind: np.ndarray, runs: Runs) -> None:
        """The checks of a chunk, per run of one launch's blocks (``runs``: whatever is constant in a run is checked
        once); the events of a run found bad are then named one by one."""
        if not runs.all_enter:  # (a chunk of block entries only holds no unknown kind)
            c.mask("error", "bad-enum", "event kind is not a known kind", g, ~self.kind_ok[kind], "kind", base, kind)
        if bool(((runs.flags & self.fmask) != 0).any()):
            flags = ev["flags"]
            c.mask("error", "bad-flags", "unknown flag bits set", g, (flags & self.fmask) != 0, "flags", base, flags)
        if self.known is not None and not bool(self.known(runs.slot)[1].all()):
            slot = ev["kernel_slot"]
            c.mask("error", "unknown-kernel-slot", "kernel slot is missing from the kernel table", g,
                   ~self.known(slot)[1], "kernel_slot", base, slot)
        if self.grids is not None and len(ev) and self._any_outside(runs):
            c.mask("error", "block-outside-grid", "blockIdx lies outside the grid of its launch", g,
                   self._outside(ev, ev["flags"], ev["kernel_slot"]), "block_x", base, ev["block_x"])

    def _any_outside(self, runs: Runs) -> bool:
        """Whether :meth:`_outside` finds any event, per run (one look-up and the run's largest blockIdx per axis)
        instead of per event."""
        gids, gdims, slots, sdims = self.grids
        ex = (runs.flags & self.has_gid) != 0
        pos_g, found_g = gids(runs.gid)
        pos_s, found_s = slots(runs.slot)
        use = np.where(ex, found_g, found_s)
        if not bool(use.any()):
            return False
        bad = np.zeros(runs.n, dtype=bool)
        for b, dim in _AXES:
            bad |= runs.max[b] >= np.where(ex, gdims[dim][pos_g], sdims[dim][pos_s])
        return bool((bad & use).any())

    def _outside(self, ev: np.ndarray, flags: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """blockIdx outside the grid: of its own launch (events with %gridid), else of the largest grid of any
        launch of its kernel slot."""
        gids, gdims, slots, sdims = self.grids
        exact = (flags & self.has_gid) != 0
        n_exact = int(np.count_nonzero(exact))
        bad = np.zeros(len(ev), dtype=bool)
        if n_exact:
            pos_g, found_g = gids(ev["gridid"])
            use_g = exact & found_g
            for b, dim in _AXES:
                bad |= use_g & (ev[b] >= gdims[dim][pos_g])
        if n_exact < len(ev):
            pos_s, found_s = slots(slot)
            use_s = ~exact & found_s
            for b, dim in _AXES:
                bad |= use_s & (ev[b] >= sdims[dim][pos_s])
        return bad


class _SequenceOrder:
    """Whether a group's events come in sequence order with no gap (chunk by chunk), and meanwhile the timer's
    steps back in that order (:class:`_TimerOrder`)."""

    def __init__(self) -> None:
        self.in_order, self.timer = True, _TimerOrder()
        self.prev_seq = self.prev_t = None

    def add(self, ev: np.ndarray, base: int, consecutive: bool) -> None:
        """``consecutive``: the chunk's sequences rise by 1 from event to event (:attr:`kvconv.join.runs.Runs`)."""
        if not self.in_order or not len(ev):
            return
        seq = ev["sequence"]
        if self.prev_seq is not None and int(seq[0]) != (self.prev_seq + 1) & _U64:
            self.in_order = False
            return
        if not consecutive:
            self.in_order = False
            return
        self.timer.add(ev, base, prev=self.prev_t)
        self.prev_seq, self.prev_t = int(seq[-1]), int(ev["globaltimer"][-1])


_U64 = (1 << 64) - 1


class _ChunkCrc:
    """A group's payload checksum, summed chunk by chunk in the CRC worker beside the checks."""

    def __init__(self, g: dumpmod.Group) -> None:
        self.g, self.fut = g, None

    def add(self, view: np.ndarray) -> None:
        if len(view):
            self.fut = worker("crc").submit(_crc_after, view.view(np.uint8), self.fut)

    def wait(self) -> None:
        if self.fut is not None:
            self.fut.result()

    def ok(self) -> bool:
        return (self.fut.result() if self.fut is not None else 0) == int(self.g.header["payload_crc32"])


def _crc_after(buf, prev) -> int:
    import zlib

    return zlib.crc32(buf, prev.result() if prev is not None else 0)


class _Pages:
    """Gives the pages of checked (and summed) device-event chunks back on large dumps, a few chunks behind the
    checks so that the CRC worker is not waited for; reports progress in bytes of the file."""

    LAG = 8  # chunks

    def __init__(self, d: dumpmod.Dump, progress) -> None:
        self.d, self.progress = d, progress
        self.release = d.size > RELEASE_BYTES
        self.pending: list = []
        self.bytes = 0

    def done(self, g: dumpmod.Group, first: int, n: int, crc: _ChunkCrc | None) -> None:
        rs = int(g.header["record_size"])
        self.bytes += n * rs
        if self.progress is not None:
            self.progress(self.bytes, self.d.size)
        if not self.release:
            return
        self.pending.append((g.payload_offset + first * rs, n * rs, crc.fut if crc is not None else None))
        while len(self.pending) > self.LAG:
            off, nb, fut = self.pending.pop(0)
            if fut is not None:
                fut.result()
            dumpmod.release_pages(self.d._mm, off, nb)

    def flush(self, crc: _ChunkCrc | None) -> None:
        if crc is not None:
            crc.wait()
        for off, nb, _ in self.pending:
            dumpmod.release_pages(self.d._mm, off, nb)
        self.pending = []

    def records(self, g: dumpmod.Group, first: int, n: int) -> None:
        """Records ``first .. first + n`` of a group checked (host records): their pages back, their bytes counted
        (a group of millions of host records is hundreds of MiB: never resident all at once)."""
        rs = int(g.header["record_size"])
        self.bytes += n * rs
        if self.release:
            dumpmod.release_pages(self.d._mm, g.payload_offset + first * rs, n * rs)

    def other(self, g: dumpmod.Group, *, counted: bool = False) -> None:
        """A group checked in full (host records, canary): its pages back, its bytes counted (``counted``: its
        records went through :meth:`records` already)."""
        n = len(g.records) * int(g.header["record_size"]) if g.kind and g.kind.layout else 0
        if not counted:
            self.bytes += n
        if self.release and n and not counted:
            dumpmod.release_pages(self.d._mm, g.payload_offset, n)
        if self.progress is not None:
            self.progress(min(self.bytes, self.d.size), self.d.size)


def _check_sequence_unordered(g: dumpmod.Group, c: _Collector) -> None:
    seq = np.asarray(g.records["sequence"])
    order = np.argsort(seq, kind="stable")
    s = seq[order]
    ds = np.diff(s)
    seq_off = _EV.field("sequence").offset
    dup = np.flatnonzero(ds == 0)
    if len(dup):
        i = int(order[dup[0] + 1])
        c.add("error", "sequence-duplicate", f"sequence {int(s[dup[0]])} appears more than once", group=g.index,
              record=i, offset=g.record_offset(i) + seq_off, field="device_event.sequence", count=len(dup))
    gaps = np.flatnonzero(ds > 1)
    if len(gaps):
        i = int(order[gaps[0] + 1])
        missing = int((ds[gaps] - 1).sum())
        sev = "warning" if g.drop_count else "error"
        c.add(sev, "sequence-gap", f"sequence jumps from {int(s[gaps[0]])} to {int(s[gaps[0] + 1])}; "
              f"{missing} sequence numbers missing in {len(gaps)} gaps", group=g.index, record=i,
              offset=g.record_offset(i) + seq_off, field="device_event.sequence", count=len(gaps))
    if g.drop_count == 0 and int(s[0]) != 0:
        i = int(order[0])
        c.add("warning", "sequence-start", f"sequences start at {int(s[0])}, not 0, with no drops recorded",
              group=g.index, record=i, offset=g.record_offset(i) + seq_off, field="device_event.sequence")
    timer = _TimerOrder()
    timer.add(np.asarray(g.records)[order], 0)
    timer.report(c, g, lambda i: int(order[i]))


# A block reserves its sequence slot with one atomic and reads %globaltimer right after (native/src/patch.cu); a warp
# descheduled between the two comes out with a later time than blocks sequenced after it, by up to how long it waited.
# Measured on the committed H200 captures (tools/timer_inversions.py, docs/FINDINGS.md): up to 224 ns across SMs and
# none between one SM's events (never closer than 1.09 us there: one block of a launch per SM); clean vLLM decode runs
# on an H200 reach 2,976 ns (issue 39). So a step back by more than a descheduled warp explains (8,192 ns) is a clock
# fault anywhere; one SM's block of a later launch cannot have raced a block of an earlier launch on that SM (a
# stream runs its kernels one after the other), so between launches an SM keeps sequence order within a few ticks.
TIMER_SM_LAUNCHES_NS = 256
TIMER_RACE_NS = 8192


def _launch_key(ev: np.ndarray) -> np.ndarray:
    """One number per launch an event belongs to: its %gridid and per-replay tag (0 where the tracer had none)."""
    return ev["gridid"] ^ (ev["tag"] * np.uint64(0x9E3779B97F4A7C15))


class _TimerOrder:
    """%globaltimer steps back in sequence order, chunk by chunk: from one event to the next, and from one SM's event
    to that SM's next; judged at the end against the timer's resolution (the largest power of two
    dividing every timestamp: 32 ns on H200), which is only known after the last chunk."""

    def __init__(self) -> None:
        self.bits = 0
        # (indices of the later events, sizes in ns): between launches on one SM; between events that may race
        self.steps = {"launches": ([], []), "race": ([], [])}
        self.last = np.full(1 << 16, -1, np.int64)  # per %smid, its last event's timestamp so far
        self.last_launch = np.zeros(1 << 16, np.uint64)  # and that event's launch key (:func:`_launch_key`)

    def add(self, ev: np.ndarray, first: int, *, prev: int | None = None) -> None:
        """``ev``: device events in sequence order; ``first``: the index of ``ev[0]``; ``prev``: the timestamp just
        before ``ev[0]`` (the previous chunk's last), if any."""
        t = np.ascontiguousarray(ev["globaltimer"])
        if not len(t):
            return
        self.bits |= int(np.bitwise_or.reduce(t & np.uint64(0xFFFFFFFF)))
        t = t.astype(np.int64)
        if prev is not None and int(t[0]) < prev:
            self._step("race", np.array([0]), np.array([prev - int(t[0])]), first)
        bk = np.flatnonzero(t[1:] < t[:-1])
        self._step("race", bk + 1, t[bk] - t[bk + 1], first)
        self._per_sm(t, first, ev["smid"], ev)

    def _per_sm(self, t: np.ndarray, first: int, sm: np.ndarray, ev: np.ndarray) -> None:
        """Steps back from an SM's event to that SM's next: between launches (``launches``); between blocks of one
        launch (resident together, they race as blocks on different SMs do: ``race``). Launch keys
        (:func:`_launch_key`) are made only for the events that step back and each SM's last: the rest never
        compare them."""
        order = np.argsort(sm, kind="stable")  # each SM's events together, still in sequence order
        ss, ts = sm[order], t[order]
        new = np.r_[True, ss[1:] != ss[:-1]]
        before = np.where(new, self.last[ss], np.r_[-1, ts[:-1]])  # the same SM's previous timestamp, if any
        bk = np.flatnonzero(ts < before)
        if len(bk):
            # the previous event's key: the SM's last of an earlier chunk, or the sorted event before this one
            prev = np.where(new[bk], self.last_launch[ss[bk]], _launch_key(ev[order[np.maximum(bk - 1, 0)]]))
            same = _launch_key(ev[order[bk]]) == prev
            self._step("launches", order[bk[~same]], (before[bk] - ts[bk])[~same], first)
            self._step("race", order[bk[same]], (before[bk] - ts[bk])[same], first)
        ends = np.r_[np.flatnonzero(new)[1:] - 1, len(ss) - 1]
        self.last[ss[ends]], self.last_launch[ss[ends]] = ts[ends], _launch_key(ev[order[ends]])

    def _step(self, which: str, at: np.ndarray, size: np.ndarray, first: int) -> None:
        if len(at):
            self.steps[which][0].append(at.astype(np.int64) + first)
            self.steps[which][1].append(size.astype(np.int64))

    def tolerance(self, ns: int) -> tuple[int, int]:
        res = (self.bits & -self.bits) if self.bits else 1
        return res, -(-ns // res) * res

    def _beyond(self, which: str, ns: int) -> tuple[np.ndarray, np.ndarray]:
        at, size = self.steps[which]
        if not at:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        at, size = np.concatenate(at), np.concatenate(size)
        big = size > self.tolerance(ns)[1]
        return at[big], size[big]

    def report(self, c: _Collector, g: dumpmod.Group, record) -> None:
        sm_at, sm_size = self._beyond("launches", TIMER_SM_LAUNCHES_NS)
        x_at, x_size = self._beyond("race", TIMER_RACE_NS)
        if not len(sm_at) and not len(x_at):
            return
        res = self.tolerance(1)[0]
        parts = []
        if len(sm_at):
            parts.append(f"within one SM, between launches, by up to {int(sm_size.max()):,} ns "
                         f"(allowed: {self.tolerance(TIMER_SM_LAUNCHES_NS)[1]:,})")
        if len(x_at):
            parts.append(f"by up to {int(x_size.max()):,} ns (allowed between blocks that may race: a descheduled "
                         f"warp's {self.tolerance(TIMER_RACE_NS)[1]:,})")
        bad = np.union1d(sm_at, x_at)
        i = record(int(bad[0]))
        c.add("warning", "timer-backwards", f"%globaltimer goes backwards in sequence order {' and '.join(parts)}; "
              f"the timer ticks every {res:,} ns", group=g.index, record=i,
              offset=g.record_offset(i) + _EV.field("globaltimer").offset, field="device_event.globaltimer",
              count=len(bad))


def _max_by_key(keys: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Unique keys (sorted) and, per key, the largest grid_x/y/z of the host records carrying it."""
    order = np.argsort(keys, kind="stable")
    if len(order) < (1 << 31):
        order = order.astype(np.int32)  # millions of host records: the sort's temporaries are the peak here
    k = keys[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]]) if len(k) else np.zeros(0, dtype=np.intp)
    uniq = k[starts]
    del k
    dims = {dim: np.maximum.reduceat(h[dim][order], starts) if len(order) else np.zeros(0, np.uint32)
            for dim in ("grid_x", "grid_y", "grid_z")}
    return uniq, dims


def _grid_tables(d: dumpmod.Dump, ctx: int, table=None):
    """Per grid id and per kernel slot, the largest grid of the host launches carrying it (None without hosts).

    Events with %gridid are checked against their own launch; events without it against the largest grid any
    launch of the same kernel slot had (a weaker, order-free bound). ``table``: the reconciler's launch table of the
    context (:class:`kvconv.check.reconcile.LaunchTable`), whose columns serve instead of reading the records again."""
    if table is not None:
        if not table.n:
            return None
        h = {"grid_id": table.grid_id, "kernel_slot": table.kernel_slot,
             **{f: a.astype(np.uint32, copy=False)
                for f, a in (("grid_x", table.gx), ("grid_y", table.gy), ("grid_z", table.gz))}}
    else:
        from kvconv.join.launches import host_columns

        if not any(len(g.records) for k in ("graph_node", "eager_launch") for g in d.groups_of(k, context_id=ctx)):
            return None
        # the five columns, a chunk of records at a time, each chunk's pages given back (large dumps)
        h = host_columns(d, ctx, ("grid_id", "kernel_slot", "grid_x", "grid_y", "grid_z"))
    gids, gdims = _max_by_key(h["grid_id"], h)
    slots, sdims = _max_by_key(h["kernel_slot"], h)
    return gids, gdims, slots, sdims


class _ContextView:
    """The groups of one context, with the Dump methods the record checks use."""

    def __init__(self, d: dumpmod.Dump, ctx: int) -> None:
        self._d, self._ctx = d, ctx

    def groups_of(self, kind: str):
        return self._d.groups_of(kind, context_id=self._ctx)
