"""What every emitter reads: the contexts of several dumps, their clock-sync pairs, host records, the join of device
events to host launches, and a first streaming pass that aggregates what the tracks need.

Memory stays bounded whatever the dump size: device events are walked in chunks of the mmap, each chunk's payload
checksum is folded in as it is read (the dumps are opened with ``verify_checksums=False`` and checked here, in the
same pass), and the pages of a walked chunk are given back to the page cache (``MADV_DONTNEED``) on large dumps.
"""

from __future__ import annotations

import mmap
import os
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import dump as dumpmod
from .. import layout
from ..errors import FormatError, UsageError

GRAPH_NODE = layout.KINDS["graph_node"].id
EAGER = layout.KINDS["eager_launch"].id
_EVF = layout.ENUMS["event_flags"]
_LF = layout.ENUMS["launch_flags"]
_EV_DT = layout.DTYPES["device_event"]
RELEASE_BYTES = 256 << 20  # dumps larger than this give walked pages back to the page cache
PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class EmitOptions:
    """Options shared by the emitters (keyword-only, frozen).

    chunk: device events per streaming chunk (bounds memory).
    flows: flows drawn from each host launch to at most this many of its device blocks (0: no flows).
    window_ms: keep device events from START to END ms after each context's first device event (host records are
      kept when their launch's events are, or, unmatched, when the window mapped through the clock-sync pairs
      holds them).
    replays: keep only graph replays (launch ids) FIRST..LAST, their host records and matched device events.
    reconcile: "auto" (kvconv.reconcile when the dump has at most reconcile_max_events device events, else a
      streaming exact gridid join), "always", "never" (streaming exact gridid join only).
    ui_limit_bytes: warn when a Perfetto/Chrome trace is bigger than the Perfetto UI loads comfortably.
    progress: show a progress bar (None: only when stderr is a terminal).
    arrow_format: "arrow" (IPC files) or "parquet"; compression: None, "lz4" or "zstd".
    """

    chunk: int = 1 << 18
    flows: int = 16
    window_ms: tuple[float, float] | None = None
    replays: tuple[int, int] | None = None
    reconcile: str = "auto"
    reconcile_max_events: int = 4_000_000
    ui_limit_bytes: int = 1 << 30
    progress: bool | None = None
    verify_checksums: bool = True
    arrow_format: str = "arrow"
    compression: str | None = None

    def __post_init__(self) -> None:
        if self.chunk < 1:
            raise UsageError("chunk must be positive", code="bad-chunk")
        if self.flows < 0:
            raise UsageError("--flows must be 0 or more", code="bad-flows")
        if self.reconcile not in ("auto", "always", "never"):
            raise UsageError("reconcile must be auto, always or never", code="bad-reconcile")
        if self.window_ms is not None and not (self.window_ms[0] <= self.window_ms[1]):
            raise UsageError("--window START:END needs START <= END", code="bad-window")
        if self.replays is not None and not (self.replays[0] <= self.replays[1]):
            raise UsageError("--replays FIRST:LAST needs FIRST <= LAST", code="bad-replays")
        if self.arrow_format not in ("arrow", "parquet"):
            raise UsageError("--format must be arrow or parquet", code="bad-format")
        if self.compression not in (None, "lz4", "zstd"):
            raise UsageError("--compression must be none, lz4 or zstd", code="bad-compression")


@dataclass
class EmitResult:
    output: str
    contexts: int = 0
    device_events: int = 0
    host_records: int = 0
    written_events: int = 0
    bytes_written: int = 0
    flows: int = 0
    join: list[str] = field(default_factory=list)
    alignment: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def parse_range(text: str | None, *, what: str, cast=float):
    if text is None:
        return None
    try:
        a, b = text.split(":")
        return cast(a), cast(b)
    except ValueError:
        raise UsageError(f"{what} must look like START:END, not {text!r}", code="bad-range") from None


# ---------------------------------------------------------------------------------------------------------------
# host records


@dataclass
class Host:
    """Graph-node then eager records of one context, as one table; ``hid`` indexes it."""

    n_gn: int
    kind: np.ndarray  # u2: 6 or 7
    index: np.ndarray  # index into d.records(kind, context_id=ctx)
    host_ns: np.ndarray
    graph_exec: np.ndarray
    launch_id: np.ndarray
    node: np.ndarray
    grid_id: np.ndarray
    stream: np.ndarray
    kernel_slot: np.ndarray
    flags: np.ndarray
    tag: np.ndarray
    grid: np.ndarray  # blocks predicted by the grid
    node_ordinal: np.ndarray  # i4, -1 for eager

    @property
    def n(self) -> int:
        return len(self.kind)

    @property
    def shown(self) -> np.ndarray:
        """Records drawn on host tracks (graph uploads are not launches)."""
        return (self.flags & _LF["graph_upload"]) == 0


def _host(d, ctx: int) -> Host:
    gn = d.records("graph_node", context_id=ctx)
    el = d.records("eager_launch", context_id=ctx)
    recs = np.concatenate([np.asarray(gn), np.asarray(el)]) if len(el) else np.array(gn)
    n_gn = len(gn)
    kind = np.concatenate([np.full(n_gn, GRAPH_NODE, np.uint16), np.full(len(el), EAGER, np.uint16)])
    index = np.concatenate([np.arange(n_gn), np.arange(len(el))]).astype(np.int64)
    grid = (recs["grid_x"].astype(np.int64) * recs["grid_y"] * recs["grid_z"]) if len(recs) else np.zeros(0, np.int64)
    # Node ordinal: the position of the node among its graph exec's distinct nodes, in host order of first sight.
    ordn = np.full(len(recs), -1, np.int32)
    if n_gn:
        g = recs[:n_gn]
        order = np.lexsort((g["host_ns"], g["launch_id"], g["graph_exec"]))
        up0, first, inv = unique_pairs(g["graph_exec"][order], g["node"][order])
        by = np.lexsort((first, up0))  # uniques by exec, then first sight
        ex_sorted = up0[by]
        start = np.searchsorted(ex_sorted, ex_sorted, side="left")
        ordinal = np.empty(len(up0), np.int64)
        ordinal[by] = np.arange(len(up0)) - start
        ordn[order] = ordinal[inv.reshape(-1)]
    return Host(n_gn=n_gn, kind=kind, index=index, host_ns=recs["host_ns"].astype(np.uint64),
                graph_exec=recs["graph_exec"], launch_id=recs["launch_id"], node=recs["node"],
                grid_id=recs["grid_id"], stream=recs["stream"], kernel_slot=recs["kernel_slot"],
                flags=recs["flags"], tag=recs["tag"], grid=grid, node_ordinal=ordn)


def unique_pairs(a: np.ndarray, b: np.ndarray):
    """Distinct (a, b) pairs: (a of each pair, index of its first occurrence, inverse per element)."""
    n = len(a)
    if not n:
        return a[:0], np.zeros(0, np.int64), np.zeros(0, np.int64)
    o = np.lexsort((np.arange(n), b, a))
    sa, sb = a[o], b[o]
    new = np.concatenate([[True], (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])])
    gid = np.cumsum(new) - 1
    inv = np.empty(n, np.int64)
    inv[o] = gid
    return sa[new], o[new], inv


# ---------------------------------------------------------------------------------------------------------------
# clock alignment (through the dump's own clock-sync pairs; never raw host - device)


@dataclass
class Clock:
    pairs: np.ndarray  # clock_sync records sorted by gpu_ns

    @property
    def n(self) -> int:
        return len(self.pairs)

    def bound(self) -> dict:
        """Alignment error bound: the worst pair uncertainty plus the worst drift between neighbouring pairs (how
        much the host interval and the device interval between two pairs differ, each measured in its own clock)."""
        p = self.pairs
        if not len(p):
            return {"pairs": 0, "uncertainty_ns": None, "drift_ns": None, "bound_ns": None}
        unc = int(p["uncertainty_ns"].max())
        drift = 0
        if len(p) > 1:
            dh = np.diff(p["host_ns"].astype(np.int64))
            dg = np.diff(p["gpu_ns"].astype(np.int64))
            drift = int(np.abs(dh - dg).max())
        return {"pairs": int(len(p)), "uncertainty_ns": unc, "drift_ns": drift, "bound_ns": unc + drift}

    def to_host(self, gpu_ns: np.ndarray) -> np.ndarray:
        """Device ns -> host CLOCK_MONOTONIC ns through the nearest earlier pair (the first before the first pair),
        as trace_processor converts a clock from its snapshots: host_i + (gpu - gpu_i)."""
        g = np.asarray(gpu_ns, dtype=np.uint64)
        p = self.pairs
        if not len(p):
            return g.astype(np.int64)
        pg = p["gpu_ns"]
        i = np.searchsorted(pg, g, side="right") - 1
        np.clip(i, 0, len(p) - 1, out=i)
        return p["host_ns"].astype(np.int64)[i] + (g.astype(np.int64) - pg.astype(np.int64)[i])

    def to_device(self, host_ns: np.ndarray) -> np.ndarray:
        h = np.asarray(host_ns, dtype=np.uint64)
        p = self.pairs
        if not len(p):
            return h.astype(np.int64)
        ph = p["host_ns"]
        i = np.searchsorted(ph, h, side="right") - 1
        np.clip(i, 0, len(p) - 1, out=i)
        return p["gpu_ns"].astype(np.int64)[i] + (h.astype(np.int64) - ph.astype(np.int64)[i])


# ---------------------------------------------------------------------------------------------------------------
# contexts


@dataclass
class Ctx:
    serial: int
    dump: object
    label: str
    run: str
    context_id: int
    device_id: int
    groups: list
    n_events: int
    host: Host
    names: dict[int, str]
    clock: Clock
    device_drops: int
    host_drops: int
    meta: dict
    hid: np.ndarray | None = None  # per device event: host table row, -1 unmatched (reconcile mode)
    replay_of_event: np.ndarray | None = None
    join: str = "none"
    reconcile_result: object = None
    _gid_keys: np.ndarray | None = None
    _gid_rows: np.ndarray | None = None

    @property
    def release(self) -> bool:
        return self.dump.size > RELEASE_BYTES

    def kernel_name(self, slot: int) -> str:
        return self.names.get(int(slot), f"kernel slot {int(slot)}")

    # -- streaming over device events ------------------------------------------------------------------------

    def chunks(self, size: int, *, verify: bool = False):
        """Yield ``(first_index, records)`` over all device events of the context, in bounded slices."""
        base = 0
        mm = getattr(self.dump, "_mm", None)
        for g in self.groups:
            crc = 0
            rs = int(g.header["record_size"])
            for s, view in g.chunks(size):
                if verify:
                    crc = zlib.crc32(view.view(np.uint8), crc) if len(view) else crc
                yield base + s, view
                if self.release and mm is not None:
                    lo = (g.payload_offset + s * rs) // PAGE * PAGE
                    hi = (g.payload_offset + (s + len(view)) * rs) // PAGE * PAGE
                    if hi > lo:
                        try:
                            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
                        except (OSError, ValueError, AttributeError):
                            pass
            if verify and not g.lost_records and crc != int(g.header["payload_crc32"]):
                raise FormatError("payload checksum does not match header.payload_crc32", path=self.dump.path,
                                  group=g.index, offset=g.payload_offset, field="header.payload_crc32",
                                  code="payload-checksum", hint="the records are damaged; kvconv validate says more")
            base += len(g.records)

    def match(self, first: int, recs: np.ndarray) -> np.ndarray:
        """Host table row of each event of a chunk (-1: unmatched)."""
        if self.hid is not None:
            return self.hid[first : first + len(recs)]
        if self._gid_keys is None or not len(self._gid_keys):
            return np.full(len(recs), -1, np.int64)
        has = (recs["flags"] & _EVF["has_gridid"]) != 0
        key = _gid_key(recs["gridid"], np.where((recs["flags"] & _EVF["has_tag"]) != 0, recs["tag"], 0))
        pos = np.searchsorted(self._gid_keys, key)
        pos[pos >= len(self._gid_keys)] = 0
        ok = has & (self._gid_keys[pos] == key) & (self.host.grid_id[self._gid_rows[pos]] == recs["gridid"])
        return np.where(ok, self._gid_rows[pos], -1)


def _gid_key(gid: np.ndarray, tag: np.ndarray) -> np.ndarray:
    return gid.astype(np.uint64) ^ (tag.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))


def _safe(s: str) -> str:
    out = "".join(c if (c.isalnum() or c in "-_.") else "_" for c in s)
    return out or "run"


def open_contexts(paths: list, options: EmitOptions, warn) -> tuple[list, list[Ctx]]:
    """Open the dumps (checksums are verified while streaming) and describe each context."""
    if not paths:
        raise UsageError("give at least one dump", code="no-input")
    dumps = dumpmod.open_many(paths, options=dumpmod.ReadOptions(verify_checksums=False))
    ctxs: list[Ctx] = []
    runs: dict[str, int] = {}
    try:
        for di, d in enumerate(dumps):
            if options.verify_checksums:
                for g in d.groups:
                    if g.kind is not None and g.kind.name != "device_event" and not g.lost_records and not g.crc_ok():
                        raise FormatError("payload checksum does not match header.payload_crc32", path=d.path,
                                          group=g.index, offset=g.payload_offset, field="header.payload_crc32",
                                          code="payload-checksum", hint="the records are damaged")
            meta = d.metadata()
            stem = _safe(Path(d.path).name.split(".")[0])
            run = stem if stem not in runs else f"{stem}-{di}"
            runs[run] = di
            for ctx, dev in d.contexts():
                if any(c.dump is d and c.context_id == ctx for c in ctxs):
                    continue
                groups = d.groups_of("device_event", context_id=ctx)
                kinds = {g.kind.name for g in d.groups if g.kind is not None and g.context_id == ctx}
                if not (kinds & {"device_event", "graph_node", "eager_launch", "canary", "clock_sync"}):
                    continue
                cs = np.array(d.records("clock_sync", context_id=ctx))
                cs = cs[np.argsort(cs["gpu_ns"], kind="stable")] if len(cs) else cs
                c = Ctx(serial=len(ctxs), dump=d, label=Path(d.path).name, run=run, context_id=ctx, device_id=dev,
                        groups=groups, n_events=sum(len(g.records) for g in groups), host=_host(d, ctx),
                        names=d.kernel_names(context_id=ctx), clock=Clock(cs),
                        device_drops=d.drops("device_event", context_id=ctx),
                        host_drops=d.drops("graph_node", context_id=ctx) + d.drops("eager_launch", context_id=ctx),
                        meta=meta)
                if not len(cs) and c.n_events:
                    warn(f"{c.label} context {ctx}: no clock-sync pairs; device events keep their raw %globaltimer "
                         "times and are not aligned with host records")
                ctxs.append(c)
        _join(ctxs, options, warn)
    except BaseException:
        for d in dumps:
            d.close()
        raise
    return dumps, ctxs


def _join(ctxs: list[Ctx], options: EmitOptions, warn) -> None:
    """Device event -> host record: kvconv.reconcile's matches when affordable, else a streaming exact join."""
    try:
        from .. import reconcile as rec
    except ImportError:  # pragma: no cover - reconcile is part of kvconv
        rec = None
    by_dump: dict[int, list[Ctx]] = {}
    for c in ctxs:
        by_dump.setdefault(id(c.dump), []).append(c)
    for cs in by_dump.values():
        d = cs[0].dump
        total = sum(c.n_events for c in cs)
        use = rec is not None and options.reconcile != "never" and (
            options.reconcile == "always" or total <= options.reconcile_max_events)
        res = None
        if use:
            try:
                res = rec.reconcile(d, options=rec.ReconcileOptions(relaxed=True))
            except Exception as e:  # noqa: BLE001 - fall back to the streaming join, and say so
                warn(f"{cs[0].label}: reconcile failed ({e}); using exact gridid joins only")
                res = None
        elif rec is not None and options.reconcile == "auto" and total:
            warn(f"{cs[0].label}: {total:,} device events exceed reconcile_max_events; flows and node slices use the "
                 "streaming exact (gridid) join only")
        for c in cs:
            h = c.host
            if res is not None:
                m = res.matches[res.matches["context_id"] == c.context_id]
                hid = np.full(c.n_events, -1, np.int64)
                di = m["device_index"]
                ok = (di >= 0) & (di < c.n_events) & (m["host_index"] >= 0)
                hk, hx = m["host_kind"][ok], m["host_index"][ok]
                row = np.where(hk == GRAPH_NODE, hx, h.n_gn + hx)
                good = (row >= 0) & (row < h.n) & ((hk == GRAPH_NODE) | (hk == EAGER))
                hid[di[ok][good]] = row[good]
                c.hid = hid
                c.reconcile_result = res
                la = res.launches[res.launches["context_id"] == c.context_id]
                gl = la[la["host_kind"] == GRAPH_NODE]
                if len(gl):
                    sel = (gl["host_index"] >= 0) & (gl["host_index"] < h.n_gn)
                    h.node_ordinal[gl["host_index"][sel]] = gl["node_ordinal"][sel]
                joins = {int(j) for j in np.unique(m["join"][ok])} if ok.any() else set()
                c.join = "+".join(rec.JOIN_NAMES[j] for j in sorted(joins) if j) or "none"
            else:
                keys = _gid_key(h.grid_id, np.where((h.flags & _LF["has_tag"]) != 0, h.tag, 0))
                sel = np.flatnonzero(h.shown & (h.grid_id != 0))
                order = sel[np.argsort(keys[sel], kind="stable")]
                c._gid_keys = keys[order]
                c._gid_rows = order.astype(np.int64)
                c.join = "exact(gridid)"


# ---------------------------------------------------------------------------------------------------------------
# first pass: what the tracks need


@dataclass
class Agg:
    """Per-context aggregates of the first streaming pass."""

    count: np.ndarray  # per host row: matched device events kept
    first_ts: np.ndarray  # per host row: earliest matched block entry (device ns, uint64)
    last_ts: np.ndarray
    flow_dev: np.ndarray  # (host rows, K) device indices that get a flow, -1 padding
    sm_count: np.ndarray  # events per SM id
    slots: np.ndarray  # kernel slots seen
    t0: int | None  # first device event ns (min)
    t1: int | None
    hist_base: int  # ms bin of hist[0]
    hist: np.ndarray  # device events per ms
    kept: int  # device events kept by the filters
    kept_hosts: np.ndarray  # bool per host row


def event_keep(c: Ctx, recs: np.ndarray, hid: np.ndarray, options: EmitOptions, t0: int | None) -> np.ndarray | None:
    """Filter mask of a chunk (None: keep all)."""
    keep = None
    if options.window_ms is not None and t0 is not None:
        lo = t0 + int(options.window_ms[0] * 1e6)
        hi = t0 + int(options.window_ms[1] * 1e6)
        ts = recs["globaltimer"]
        keep = (ts >= np.uint64(max(lo, 0))) & (ts <= np.uint64(max(hi, 0)))
    if options.replays is not None:
        h = c.host
        a, b = options.replays
        ok_h = (h.kind == GRAPH_NODE) & (h.launch_id >= a) & (h.launch_id <= b)
        k2 = (hid >= 0) & ok_h[np.maximum(hid, 0)]
        keep = k2 if keep is None else keep & k2
    return keep


def first_pass(c: Ctx, options: EmitOptions, progress=None) -> Agg:
    h = c.host
    K = options.flows
    count = np.zeros(h.n, np.int64)
    first = np.full(h.n, np.iinfo(np.uint64).max, np.uint64)
    last = np.zeros(h.n, np.uint64)
    flow_dev = np.full((h.n, K), -1, np.int64)
    sm = np.zeros(1 << 16, np.int64)
    slots: set[int] = set()
    t0 = t1 = None
    # t0 (the window's origin) needs the first event time before filtering: take the min over the first chunk
    # walk cheaply when a window is asked for.
    if options.window_ms is not None and c.n_events:
        mins = [int(g.records["globaltimer"].min()) for g in c.groups if len(g.records)]
        t0 = min(mins) if mins else None
    hist = np.zeros(0, np.int64)
    hbase = 0
    kept = 0
    for first_i, recs in c.chunks(options.chunk, verify=options.verify_checksums):
        hid = c.match(first_i, recs)
        keep = event_keep(c, recs, hid, options, t0)
        ts = recs["globaltimer"]
        if keep is not None:
            idx = np.flatnonzero(keep)
            recs_k, hid, ts = recs[idx], hid[idx], ts[idx]
            dev_index = first_i + idx
        else:
            recs_k = recs
            dev_index = None
        n = len(ts)
        if progress is not None:
            progress(len(recs))
        if not n:
            continue
        kept += n
        tsi = ts.astype(np.uint64, copy=False)
        lo, hi = int(tsi.min()), int(tsi.max())
        t0 = lo if t0 is None or (options.window_ms is None and lo < t0) else t0
        t1 = hi if t1 is None or hi > t1 else t1
        sm += np.bincount(recs_k["smid"], minlength=1 << 16)
        ks = recs_k["kernel_slot"]
        kmin, kmax = int(ks.min()), int(ks.max())
        slots.update([kmin] if kmin == kmax else np.unique(ks).tolist())
        # events per ms
        ms = (tsi // np.uint64(1_000_000)).astype(np.int64)
        mlo, mhi = int(ms.min()), int(ms.max())
        if not len(hist):
            hbase = mlo
        if mlo < hbase:
            hist = np.concatenate([np.zeros(hbase - mlo, np.int64), hist])
            hbase = mlo
        need = mhi - hbase + 1
        if need > 50_000_000:
            need = len(hist)
        else:
            if need > len(hist):
                hist = np.concatenate([hist, np.zeros(need - len(hist), np.int64)])
            hist[: need] += np.bincount(ms - hbase, minlength=need)[:need]
        # per host row
        m = hid >= 0
        if m.any():
            hm = hid[m]
            tm = tsi[m]
            np.add.at(count, hm, 1) if len(hm) < 4096 else _add_counts(count, hm)
            np.minimum.at(first, hm, tm)
            np.maximum.at(last, hm, tm)
            if K:
                di = (np.flatnonzero(m) + first_i) if dev_index is None else dev_index[m]
                rank = _ranks(hm) + (count[hm] - _bincount_at(hm, count.shape[0]))
                sel = rank < K
                flow_dev[hm[sel], rank[sel]] = di[sel]
    kept_hosts = np.ones(h.n, bool)
    if options.replays is not None:
        a, b = options.replays
        kept_hosts = (h.kind == GRAPH_NODE) & (h.launch_id >= a) & (h.launch_id <= b)
    if options.window_ms is not None:
        in_win = count > 0
        unm = count == 0
        if t0 is not None and c.clock.n:
            lo = c.clock.to_host(np.array([t0 + int(options.window_ms[0] * 1e6)], np.uint64))[0]
            hi = c.clock.to_host(np.array([t0 + int(options.window_ms[1] * 1e6)], np.uint64))[0]
            hn = h.host_ns.astype(np.int64)
            in_win = in_win | (unm & (hn >= lo) & (hn <= hi))
        kept_hosts &= in_win
    return Agg(count=count, first_ts=first, last_ts=last, flow_dev=flow_dev, sm_count=sm, slots=np.array(sorted(slots),
               np.int64), t0=t0, t1=t1, hist_base=hbase, hist=hist, kept=kept, kept_hosts=kept_hosts)


def _add_counts(count: np.ndarray, hm: np.ndarray) -> None:
    count += np.bincount(hm, minlength=len(count))


def _bincount_at(hm: np.ndarray, n: int) -> np.ndarray:
    """How many times each element's value occurs in ``hm`` (per element)."""
    return np.bincount(hm, minlength=n)[hm]


def _ranks(hm: np.ndarray) -> np.ndarray:
    """Rank of each element among equal values, in order (0 for the first occurrence)."""
    n = len(hm)
    if n == 0:
        return np.zeros(0, np.int64)
    if n == 1 or bool(np.all(hm[1:] >= hm[:-1])):
        start = np.flatnonzero(np.concatenate([[True], hm[1:] != hm[:-1]]))
        runlen = np.diff(np.concatenate([start, [n]]))
        return np.arange(n) - np.repeat(start, runlen)
    order = np.argsort(hm, kind="stable")
    s = hm[order]
    start = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
    runlen = np.diff(np.concatenate([start, [n]]))
    r = np.empty(n, np.int64)
    r[order] = np.arange(n) - np.repeat(start, runlen)
    return r


def flow_id(c: Ctx, dev_index) -> np.ndarray:
    """Trace-wide flow id of a (context, device event) pair."""
    return (np.uint64(c.serial + 1) << np.uint64(40)) | np.asarray(dev_index, dtype=np.uint64)


def is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """A rich progress bar on a terminal, nothing otherwise."""

    def __init__(self, enabled: bool | None, total: int, label: str) -> None:
        self.bar = None
        if (is_tty() if enabled is None else enabled) and total:
            from rich.progress import Progress as RP

            self.bar = RP(transient=True)
            self.bar.start()
            self.task = self.bar.add_task(label, total=total)

    def __call__(self, n: int) -> None:
        if self.bar is not None:
            self.bar.advance(self.task, n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def out_size(path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
