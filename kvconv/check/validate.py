"""Validate a dump: structure, schema and semantics, reporting every problem found (aggregated per kind of problem).

    >>> from kvconv.check.validate import validate, ValidateOptions
    >>> report = validate("fixtures/qwen3-14b/qwen3-14b.kvdump")      # doctest: +SKIP
    >>> report.valid, report.exit_code                                 # doctest: +SKIP
    (True, 0)

Three layers, all vectorised over the mmap'd records:
- structure (kvconv.format.dump.scan): magic, versions, header checksums, sizes against the file, payload checksums;
- schema: header fields, the metadata JSON against schemas/metadata.schema.json, record enums, flags and ranges;
- semantics: sequence gaps and duplicates, %globaltimer going backwards, drops, kernel slots missing from the kernel
  table, blockIdx outside its launch's grid, and the reconciler's and the canary's findings.

Exit codes: 0 valid, 1 findings at error level, 2 unreadable input.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from kvconv._workers import worker
from kvconv.format import codes, layout
from kvconv.format import dump as dumpmod
from kvconv.format.errors import KvconvError
from kvconv.format.findings import Finding

# Structural problems after which the file cannot be read as a whole (exit 2): schemas/codes.json's "unreadable".
UNREADABLE = codes.UNREADABLE


@dataclass(frozen=True)
class ValidateOptions:
    """relaxed_reconcile: report the reconciler's mismatches as warnings (e.g. for a dump known to start late).
    reconcile / canary: include those checks. salvage: read a cut-short dump up to its last whole record."""

    reconcile: bool = True
    relaxed_reconcile: bool = False
    canary: bool = True
    salvage: bool = False


@dataclass
class Report:
    path: str
    findings: list[Finding] = field(default_factory=list)
    groups: int = 0
    size: int = 0

    @property
    def errors(self) -> int:
        return sum(1 for f in self.findings if f.severity == "error")

    @property
    def warnings(self) -> int:
        return sum(1 for f in self.findings if f.severity == "warning")

    @property
    def unreadable(self) -> bool:
        return any(f.severity == "error" and f.code in UNREADABLE for f in self.findings)

    @property
    def valid(self) -> bool:
        return self.errors == 0

    @property
    def exit_code(self) -> int:
        return 2 if self.unreadable else (1 if self.errors else 0)

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "valid": self.valid,
            "exit_code": self.exit_code,
            "size": self.size,
            "groups": self.groups,
            "errors": self.errors,
            "warnings": self.warnings,
            "findings": [f.to_dict() for f in self.findings],
        }


class _Collector:
    """Turns vectorised masks into aggregated findings: one per (code, field), naming the first bad record."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.out: list[Finding] = []

    def add(self, severity, code, message, *, group=None, record=None, offset=None, field=None, count=1):
        self.out.append(Finding(severity, code, message, path=self.path, group=group, record=record,
                                offset=offset, field=field, count=count))

    def mask(self, severity, code, message, g: dumpmod.Group, bad: np.ndarray, fld: str, base: int = 0,
             values: np.ndarray | None = None) -> None:
        """Report records of group ``g`` where ``bad`` is true (``base`` = index of bad[0] within the group)."""
        idx = np.flatnonzero(bad)
        if not len(idx):
            return
        first = int(idx[0]) + base
        lay_name = g.kind.layout if g.kind and g.kind.layout else g.kind_name
        try:
            foff = layout.LAYOUTS[lay_name].field(fld).offset
        except KeyError:
            foff = 0
        msg = message
        if values is not None:
            msg = f"{message} (first: {values[idx[0]]!r})".replace("np.uint", "").replace("np.int", "")
        self.add(severity, code, msg, group=g.index, record=first, offset=g.record_offset(first) + foff,
                 field=f"{lay_name}.{fld}", count=len(idx))


def _enum_values(name: str) -> np.ndarray:
    return np.array(sorted(layout.ENUMS[name].values()))


def _bits_mask(name: str) -> int:
    m = 0
    for v in layout.ENUMS[name].values():
        m |= v
    return m


def _import_jsonschema():
    """jsonschema without its optional IRI format checker. At import, jsonschema registers format checkers for the
    optional packages it finds; ``rfc3987_syntax`` (installed by Jupyter-era stacks, and by HTA's dependencies) then
    builds a lark grammar: 3.3 s of CPU and 20 MiB on every ``kvconv validate``, measured. kvconv validates with no
    FormatChecker, so formats are never checked and hiding the package while jsonschema imports loses nothing; it is
    importable again right after."""
    import sys

    if "jsonschema" in sys.modules or "rfc3987_syntax" in sys.modules:
        import jsonschema

        return jsonschema
    sys.modules["rfc3987_syntax"] = None  # an import of it raises ImportError, which jsonschema skips
    try:
        import jsonschema
    finally:
        del sys.modules["rfc3987_syntax"]
    return jsonschema


def _check_metadata(d: dumpmod.Dump, c: _Collector) -> None:
    import json

    jsonschema = _import_jsonschema()

    schema = layout.load_json_schema("metadata.schema.json")
    validator = jsonschema.Draft202012Validator(schema)
    groups = d.groups_of("metadata")
    if not groups:
        c.add("warning", "no-metadata", "no run metadata group (tool, GPU, driver, counters)", field="metadata")
        return
    for g in groups:
        raw = g.records.tobytes()
        try:
            obj = dumpmod.loads_metadata(raw)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            pos = getattr(e, "pos", getattr(e, "start", 0)) or 0
            c.add("error", "metadata-json", f"metadata is not valid UTF-8 JSON: {e.__class__.__name__}",
                  group=g.index, offset=g.payload_offset + pos, field="metadata")
            continue
        for err in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
            path = ".".join(str(p) for p in err.absolute_path)
            fld = "metadata" + (f".{path}" if path else "")
            # Point at the key in the JSON text when we can find it: the user sees where to look.
            off = g.payload_offset
            if err.absolute_path:
                key = json.dumps(str(list(err.absolute_path)[-1])).encode()
                at = raw.find(key)
                if at >= 0:
                    off += at
            c.add("error", "metadata-schema", f"{err.message}", group=g.index, offset=off, field=fld)


def _check_headers(d: dumpmod.Dump, c: _Collector) -> None:
    domains = set(layout.ENUMS["clock_domain"].values())
    hdr = layout.LAYOUTS["header"]
    for g in d.groups:
        if g.clock_domain not in domains:
            c.add("error", "bad-enum", f"clock_domain {g.clock_domain} is not one of {sorted(domains)}",
                  group=g.index, offset=g.offset + hdr.field("clock_domain").offset, field="header.clock_domain")
        if g.capacity and g.record_count > g.capacity and g.kind and g.kind.layout:
            c.add("error", "count-exceeds-capacity", f"record_count {g.record_count} exceeds capacity {g.capacity}",
                  group=g.index, offset=g.offset + hdr.field("record_count").offset, field="header.record_count")
        if g.drop_count:
            c.add("error", "dropped", f"the producer dropped {g.drop_count:,} {g.kind_name} records "
                  f"(capacity {g.capacity:,}); raise the capacity and record again",
                  group=g.index, offset=g.offset + hdr.field("drop_count").offset, field="header.drop_count")
        if g.lost_records:
            c.add("warning", "salvaged-loss", f"{g.lost_records:,} {g.kind_name} records lost to truncation (the "
                  "file was cut short; not dropped by the producer)",
                  group=g.index, offset=g.offset + hdr.field("record_count").offset, field="header.record_count")


def _known(kernel_slots: set[int] | None) -> np.ndarray:
    return np.array(sorted(kernel_slots or ()), dtype=np.uint64)


EV_CHUNK = 1 << 15  # 2 MiB of events: every check of a chunk runs while it is in cache


def _crc_finding(c: "_Collector", g: dumpmod.Group) -> None:
    c.add("error", "payload-checksum", "payload checksum does not match header.payload_crc32 (the records are "
          "damaged)", group=g.index, offset=g.payload_offset, field="header.payload_crc32")


def _check_device_events(d, c: "_Collector", kernel_slots: set[int] | None, grids, *, feed=None,
                         pages: "_Pages | None" = None) -> None:
    """One pass over each event group, chunk by chunk: checksum, enums, flags, kernel slots, blockIdx against its
    launch's grid, and sequence/timer order (events sit at the slot their sequence reserved, so a dump is normally
    in sequence order; anything else falls back to a sort). ``feed(first, records)``: the reconciler's streaming
    pass takes each chunk too (one read of the file); ``pages``: gives each chunk's pages back once checked and
    summed, and reports progress."""
    kind_ok = np.zeros(256, dtype=bool)
    kind_ok[_enum_values("event_kind")] = True
    known = _known(kernel_slots)
    fmask = ~np.uint8(_bits_mask("event_flags"))
    has_gid = np.uint8(layout.ENUMS["event_flags"]["has_gridid"])
    axes = (("block_x", "grid_x"), ("block_y", "grid_y"), ("block_z", "grid_z"))
    ctx_base = 0
    for g in d.groups_of("device_event"):
        # The checksum runs in a second thread while this one checks the records (zlib releases the GIL), chunk by
        # chunk, so that a checked and summed chunk's pages can be given back.
        crc = _ChunkCrc(g) if not g.lost_records and not g.live else None
        in_order, timer = True, _TimerOrder()
        prev_seq = prev_t = None
        for base, ev in g.chunks(EV_CHUNK):
            if crc is not None:
                crc.add(ev)
            if feed is not None:
                feed(ctx_base + base, ev)
            c.mask("error", "bad-enum", "event kind is not a known kind", g, ~kind_ok[ev["kind"]], "kind",
                   base, ev["kind"])
            flags = ev["flags"]
            c.mask("error", "bad-flags", "unknown flag bits set", g, (flags & fmask) != 0, "flags", base, flags)
            if kernel_slots is not None:
                c.mask("error", "unknown-kernel-slot", "kernel slot is missing from the kernel table", g,
                       ~_lookup(known, ev["kernel_slot"])[1], "kernel_slot", base, ev["kernel_slot"])
            if grids is not None:
                gids, gdims, slots, sdims = grids
                exact = (flags & has_gid) != 0
                n_exact = int(np.count_nonzero(exact))
                bad = np.zeros(len(ev), dtype=bool)
                if n_exact:
                    pos_g, found_g = _lookup(gids, ev["gridid"])
                    use_g = exact & found_g
                    for b, dim in axes:
                        bad |= use_g & (ev[b] >= gdims[dim][pos_g])
                if n_exact < len(ev):
                    pos_s, found_s = _lookup(slots, ev["kernel_slot"])
                    use_s = ~exact & found_s
                    for b, dim in axes:
                        bad |= use_s & (ev[b] >= sdims[dim][pos_s])
                c.mask("error", "block-outside-grid", "blockIdx lies outside the grid of its launch", g, bad,
                       "block_x", base, ev["block_x"])
            if in_order:
                seq, t = ev["sequence"], ev["globaltimer"]
                if prev_seq is not None:
                    seq = np.r_[prev_seq, seq]
                    t = np.r_[prev_t, t]
                if not np.all(np.diff(seq) == 1):
                    in_order = False
                else:
                    timer.add(t, base - (1 if prev_seq is not None else 0))
                    prev_seq, prev_t = ev["sequence"][-1:].copy(), ev["globaltimer"][-1:].copy()
            if pages is not None:
                pages.done(g, base, len(ev), crc)
        if pages is not None:
            pages.flush(crc)
        ctx_base += len(g.records)
        if crc is not None and not crc.ok():
            _crc_finding(c, g)
        if not len(g.records):
            continue
        if in_order:
            s0 = int(g.records["sequence"][0])
            timer.report(c, g, lambda i: i)
            if g.drop_count == 0 and s0 != 0:
                c.add("warning", "sequence-start", f"sequences start at {s0}, not 0, with no drops recorded",
                      group=g.index, record=0, offset=g.record_offset(0) + _EV.field("sequence").offset,
                      field="device_event.sequence")
        else:
            _check_sequence_unordered(g, c)


_EV = layout.LAYOUTS["device_event"]


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

    def done(self, g: dumpmod.Group, first: int, n: int, crc: "_ChunkCrc | None") -> None:
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

    def flush(self, crc: "_ChunkCrc | None") -> None:
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


RELEASE_BYTES = 256 << 20  # dumps larger than this give read pages back (the emitters' kvconv.emit._source)


def _check_sequence_unordered(g: dumpmod.Group, c: "_Collector") -> None:
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
    timer.add(np.asarray(g.records["globaltimer"])[order], 0)
    timer.report(c, g, lambda i: int(order[i]))


# Blocks on different SMs reserve their sequence slot and read %globaltimer in two steps, so two blocks may come
# out inverted by the time between them: on H200 captures by 32-128 ns (one to four ticks of the 32 ns timer).
# Steps back within this window (rounded up to whole ticks) are that race, not a timer going backwards.
TIMER_RACE_NS = 256


class _TimerOrder:
    """%globaltimer steps back in sequence order, chunk by chunk; judged at the end against the timer's resolution
    (the largest power of two dividing every timestamp: 32 ns on H200), which is only known after the last chunk."""

    def __init__(self) -> None:
        self.bits = 0
        self.at: list[np.ndarray] = []    # index (of the later event) of each step back
        self.size: list[np.ndarray] = []  # its size in ns

    def add(self, t: np.ndarray, first: int) -> None:
        """``t``: timestamps in sequence order; ``first``: the index of ``t[0]``."""
        if len(t):
            self.bits |= int(np.bitwise_or.reduce(t & np.uint64(0xFFFFFFFF)))
        bk = np.flatnonzero(t[1:] < t[:-1])
        if len(bk):
            self.at.append(bk + first + 1)
            self.size.append((t[bk] - t[bk + 1]).astype(np.uint64))

    def tolerance(self) -> tuple[int, int]:
        res = (self.bits & -self.bits) if self.bits else 1
        return res, -(-TIMER_RACE_NS // res) * res

    def report(self, c: "_Collector", g: dumpmod.Group, record) -> None:
        if not self.at:
            return
        res, tol = self.tolerance()
        at, size = np.concatenate(self.at), np.concatenate(self.size)
        big = np.flatnonzero(size > tol)
        if not len(big):
            return
        i = record(int(at[big[0]]))
        c.add("warning", "timer-backwards", f"%globaltimer goes backwards in sequence order by up to "
              f"{int(size[big].max()):,} ns (the timer ticks every {res:,} ns; blocks on different SMs come out "
              f"inverted by at most {tol:,} ns)", group=g.index, record=i,
              offset=g.record_offset(i) + _EV.field("globaltimer").offset, field="device_event.globaltimer",
              count=len(big))


HOST_CHUNK = 1 << 16  # host records checked (and their pages given back) at a time: 6 MiB


def _check_host_launches(d: dumpmod.Dump, c: _Collector, kernel_slots: set[int] | None,
                         pages: "_Pages | None" = None) -> None:
    fmask = ~np.uint32(_bits_mask("launch_flags"))
    lf = layout.ENUMS["launch_flags"]
    known = _known(kernel_slots)
    for kind in ("graph_node", "eager_launch"):
        for g in d.groups_of(kind):
            for base, r in g.chunks(HOST_CHUNK):
                for dim in ("grid_x", "grid_y", "grid_z", "block_dim_x", "block_dim_y", "block_dim_z"):
                    c.mask("error", "bad-range", f"{dim} is 0", g, r[dim] == 0, dim, base)
                c.mask("error", "bad-range", "grid_y/grid_z above 65535", g, (r["grid_y"] > 65535) |
                       (r["grid_z"] > 65535), "grid_y", base)
                threads = (r["block_dim_x"].astype(np.uint64) * r["block_dim_y"] * r["block_dim_z"])
                c.mask("error", "bad-range", "more than 1024 threads per block", g, threads > 1024, "block_dim_x",
                       base)
                c.mask("error", "bad-flags", "unknown flag bits set", g, (r["flags"] & fmask) != 0, "flags", base,
                       r["flags"])
                c.mask("error", "graph-upload-record", "a graph-upload callback was recorded as a launch", g,
                       (r["flags"] & lf["graph_upload"]) != 0, "flags", base)
                if kind == "graph_node":
                    c.mask("error", "bad-flags", "graph_node record without the graph_node flag", g,
                           (r["flags"] & lf["graph_node"]) == 0, "flags", base)
                    c.mask("error", "bad-range", "graph launch_id is 0 (replays count from 1)", g,
                           r["launch_id"] == 0, "launch_id", base)
                    c.mask("error", "bad-range", "graph_exec is 0", g, r["graph_exec"] == 0, "graph_exec", base)
                else:
                    c.mask("error", "bad-flags", "eager_launch record without the eager flag", g,
                           (r["flags"] & lf["eager"]) == 0, "flags", base)
                if kernel_slots is not None:
                    c.mask("error", "unknown-kernel-slot", "kernel slot is missing from the kernel table", g,
                           ~_lookup(known, r["kernel_slot"])[1], "kernel_slot", base, r["kernel_slot"])
                if pages is not None:
                    pages.records(g, base, len(r))
            if pages is not None:
                pages.other(g, counted=True)


def _check_kernels(d: dumpmod.Dump, c: _Collector) -> dict[int, set[int]]:
    """Check kernel tables against their strings; return the known slots per context."""
    slots: dict[int, set[int]] = {}
    for ctx, _dev in d.contexts():
        blob_len = len(d.strings(context_id=ctx))
        for g in d.groups_of("kernel", context_id=ctx):
            k = g.records
            for off, ln, fld in (("name_off", "name_len", "name_off"), ("module_off", "module_len", "module_off")):
                end = k[off].astype(np.uint64) + k[ln]
                c.mask("error", "bad-string-ref", f"{fld}+length runs past the strings group ({blob_len} bytes)", g,
                       end > blob_len, fld)
            uniq, counts = np.unique(k["slot"], return_counts=True)
            dup = uniq[counts > 1]
            if len(dup):
                c.mask("error", "duplicate-kernel-slot", "kernel slot listed more than once", g,
                       np.isin(k["slot"], dup), "slot", values=k["slot"])
            slots.setdefault(ctx, set()).update(int(s) for s in k["slot"])
    return slots


def _check_clock_sync(d: dumpmod.Dump, c: _Collector) -> None:
    for g in d.groups_of("clock_sync"):
        r = g.records
        if len(r) < 2:
            continue
        c.mask("error", "clock-sync-backwards", "host_ns goes backwards between clock-sync pairs", g,
               np.r_[False, r["host_ns"][1:] < r["host_ns"][:-1]], "host_ns")
        c.mask("error", "clock-sync-backwards", "gpu_ns goes backwards between clock-sync pairs", g,
               np.r_[False, r["gpu_ns"][1:] < r["gpu_ns"][:-1]], "gpu_ns")


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


def _lookup(table: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``values`` in the sorted unique ``table`` and whether each was found.

    Kernel slots and grid ids are small, dense integers: a direct look-up table answers in one gather, several
    times faster than a binary search over a million events; a sparse table falls back to searchsorted."""
    if not len(table):
        return np.zeros(len(values), dtype=np.intp), np.zeros(len(values), dtype=bool)
    lo, hi = int(table[0]), int(table[-1])
    if hi - lo < _LUT_MAX:
        lut = np.full(hi - lo + 2, -1, dtype=np.int32)  # last entry: "outside the range"
        lut[table.astype(np.int64) - lo] = np.arange(len(table), dtype=np.int32)
        t = values.dtype.type
        if lo > np.iinfo(values.dtype).max:
            return np.zeros(len(values), dtype=np.intp), np.zeros(len(values), dtype=bool)
        v = values - t(lo)  # wraps below lo to a huge value: clipped next
        pos = lut[np.minimum(v, t(min(hi - lo + 1, np.iinfo(values.dtype).max)))]
        found = pos >= 0
        return np.maximum(pos, 0), found
    pos = np.minimum(np.searchsorted(table, values), len(table) - 1)
    return pos, table[pos] == values


_LUT_MAX = 1 << 22


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
        from kvconv.check.reconcile.launches import host_columns

        if not any(len(g.records) for k in ("graph_node", "eager_launch") for g in d.groups_of(k, context_id=ctx)):
            return None
        # the five columns, a chunk of records at a time, each chunk's pages given back (large dumps)
        h = host_columns(d, ctx, ("grid_id", "kernel_slot", "grid_x", "grid_y", "grid_z"))
    gids, gdims = _max_by_key(h["grid_id"], h)
    slots, sdims = _max_by_key(h["kernel_slot"], h)
    return gids, gdims, slots, sdims


def validate(path: str | os.PathLike, *, options: ValidateOptions = ValidateOptions(), progress=None) -> Report:
    """Validate one dump file and return a :class:`Report` with every finding. The device events are read once:
    the reconciler's streaming pass takes each chunk beside the checks. ``progress(done, total)``: bytes of the
    file (:mod:`kvconv.progress`)."""
    path = str(path)
    rep = Report(path=path)
    try:
        # Checksums are computed below, in the same pass as the record checks.
        d = dumpmod.scan(path, options=dumpmod.ReadOptions(salvage=options.salvage, verify_checksums=False))
    except KvconvError as e:
        rep.findings.append(Finding.from_error(e))
        return rep
    with d:
        rep.size = d.size
        rep.groups = len(d.groups)
        rep.findings.extend(d.problems)
        c = _Collector(path)
        _check_headers(d, c)
        _check_metadata(d, c)
        slots_by_ctx = _check_kernels(d, c)
        have_table = bool(d.groups_of("kernel"))
        if not have_table and (d.groups_of("device_event") or d.groups_of("graph_node")):
            c.add("warning", "no-kernel-table", "no kernel table: kernel slots cannot be named", field="kernel")
        rc = _reconciler(d, options) if options.reconcile and not rep.unreadable else None
        pages = _Pages(d, progress)
        rc_error = None
        for ctx, _dev in d.contexts():
            slots = slots_by_ctx.get(ctx, set()) if have_table else None
            sub = _ContextView(d, ctx)
            s = rc.stream(ctx) if rc is not None and ctx in rc.contexts else None
            _check_device_events(sub, c, slots, _grid_tables(d, ctx, s.t if s is not None else None),
                                 feed=s.feed if s is not None else None, pages=pages)
            if s is not None:
                try:
                    rc.close(ctx)
                except Exception as e:  # noqa: BLE001 - damaged records: raised below only if the file is sound
                    rc_error = rc_error or e
            _check_host_launches(sub, c, slots, pages)
        release = (lambda off, n: dumpmod.release_pages(d._mm, off, n)) if pages.release else None
        for g in d.groups:
            if g.kind_name != "device_event" and not g.lost_records and not g.crc_ok(release=release):
                _crc_finding(c, g)
        _check_clock_sync(d, c)
        _check_kinds(d, c)
        rep.findings.extend(c.out)
        structurally_sound = not rep.unreadable and not any(f.code == "payload-checksum" for f in rep.findings)
        if structurally_sound and rc_error is not None:
            raise rc_error
        if structurally_sound and options.reconcile:
            rep.findings.extend(_reconcile_findings(d, options, rc, already={f.code for f in rep.findings}))
        if structurally_sound and options.canary and d.groups_of("canary"):
            from kvconv.check import canary

            rep.findings.extend(canary.check(d).findings)
        if progress is not None:
            progress(d.size, d.size)
    return rep


# The record kinds' checks that the passes of validate() run themselves (schemas/layouts.json "validate"); any other
# kind's hook runs in _check_kinds. tests/test_kinds.py checks that validate reaches every kind's hook.
_OWN_HOOKS = frozenset(f"{__name__}:{f.__name__}" for f in (_check_metadata, _check_kernels, _check_device_events,
                                                             _check_host_launches, _check_clock_sync)) | {
    "kvconv.check.canary:check"}


def _check_kinds(d: dumpmod.Dump, c: _Collector) -> None:
    """A record kind checked by a hook of its own (``"validate": "module:function"`` in schemas/layouts.json):
    ``hook(d, c)``, reporting through ``c.add`` / ``c.mask``, once per dump holding the kind (docs/DEVELOPING.md)."""
    hooks = [k.validate for k in layout.KINDS.values() if k.validate and d.groups_of(k.name)]
    for spec in dict.fromkeys(h for h in hooks if h not in _OWN_HOOKS):
        layout.resolve_hook(spec)(d, c)


def _reconciler(d: dumpmod.Dump, options: ValidateOptions):
    from kvconv.check import reconcile

    return reconcile.Reconciler(d, options=reconcile.ReconcileOptions(relaxed=options.relaxed_reconcile),
                                tables=False)


def _reconcile_findings(d: dumpmod.Dump, options: ValidateOptions, rc, *, already: set[str]) -> list[Finding]:
    """The reconciler's findings (of the pass the record checks fed, ``rc``). Its ``counts-differ`` (the counts
    disagree and no launch explains it: in practice drops with nothing else missing) is the fact validate's
    ``dropped`` already reports: said once."""
    if not (d.groups_of("device_event") or d.groups_of("graph_node") or d.groups_of("eager_launch")):
        return []
    res = (rc if rc is not None else _reconciler(d, options)).result()
    return [f for f in res.findings if not (f.code == "counts-differ" and "dropped" in already)]


class _ContextView:
    """The groups of one context, with the Dump methods the record checks use."""

    def __init__(self, d: dumpmod.Dump, ctx: int) -> None:
        self._d, self._ctx = d, ctx

    def groups_of(self, kind: str):
        return self._d.groups_of(kind, context_id=self._ctx)
