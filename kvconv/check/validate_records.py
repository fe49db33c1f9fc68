"""validate's checks of everything but the device events: group headers, the run metadata against its JSON schema,
kernel tables against their strings, host launch records (ranges, flags, kernel slots), clock-sync pairs.

    >>> c = _Collector(d.path)                                 # doctest: +SKIP
    >>> _check_headers(d, c); _check_metadata(d, c)            # doctest: +SKIP
    >>> slots = _check_kernels(d, c)                           # known kernel slots per context
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvconv.check._collect import Lookup, _bits_mask, _Collector, _known
from kvconv.format import dump as dumpmod
from kvconv.format import layout

if TYPE_CHECKING:
    from kvconv.check.validate_events import _Pages


# Optional packages for which jsonschema registers format checkers at import: kvconv validates with no
# FormatChecker, so none of them is ever used. rfc3987_syntax (installed by Jupyter-era stacks, and by HTA's
# dependencies) builds a lark grammar: 3.3 s of CPU and 20 MiB on every ``kvconv validate``; the others (arrow,
# isoduration, webcolors, ...) cost 55-85 ms of every converter and validate process, measured (docs/BENCH.md).
_FORMAT_PACKAGES = ("rfc3987_syntax", "rfc3987", "rfc3339_validator", "rfc3986_validator", "fqdn", "idna",
                    "jsonpointer", "uri_template", "isoduration", "webcolors")


def _import_jsonschema():
    """jsonschema without its optional format checkers (:data:`_FORMAT_PACKAGES`): hidden while jsonschema imports,
    which loses nothing since formats are never checked; importable again right after."""
    import sys

    if "jsonschema" in sys.modules:
        import jsonschema

        return jsonschema
    hidden = [m for m in _FORMAT_PACKAGES if m not in sys.modules]
    for m in hidden:
        sys.modules[m] = None  # an import of it raises ImportError, which jsonschema skips
    try:
        import jsonschema
    finally:
        for m in hidden:
            del sys.modules[m]
    return jsonschema


def _check_metadata(d: dumpmod.Dump, c: _Collector) -> None:
    import json

    jsonschema = _import_jsonschema()

    schema = layout.load_json_schema("metadata.schema.json")
    validator = jsonschema.Draft202012Validator(schema)
    for g in d.groups_of("metadata"):  # a dump without one: kvconv.check.passes.structure says so
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
            _check_drops(g, c, g.offset + hdr.field("drop_count").offset)
        if g.lost_records:
            c.add("warning", "salvaged-loss", f"{g.lost_records:,} {g.kind_name} records lost to truncation (the "
                  "file was cut short; not dropped by the producer)",
                  group=g.index, offset=g.offset + hdr.field("record_count").offset, field="header.record_count")


def _check_drops(g, c: _Collector, offset: int) -> None:
    """A group's drop_count. A live group (its producer died) counts in it the records not yet in the file when the
    producer ended (device events launched after the flusher's last copy, host rows being written) as well as those
    refused for want of room; while the published and the counted ones fit in the capacity, none can have been
    refused (a full buffer is the only way to drop): they were lost at the producer's end (``lost-at-end``: the
    verdict is incomplete, as for every unfinished dump), not dropped."""
    n = refused_records(g)
    if g.live and n == 0:
        c.add("warning", "lost-at-end", f"{g.drop_count:,} {g.kind_name} records were not yet in the file when the "
              f"producer ended ({g.record_count:,} published of a capacity of {g.capacity:,}: none refused for want "
              "of room); lost at its end, not dropped", group=g.index, offset=offset, field="header.drop_count")
        return
    more = f" (of {g.drop_count:,} counted lost, the rest at the producer's end)" if n < g.drop_count else ""
    c.add("error", "dropped", f"the producer dropped {n:,} {g.kind_name} records{more} (capacity {g.capacity:,}); "
          + _room_hint(g, n), group=g.index, offset=offset, field="header.drop_count")


# kvconv record's option for each table's capacity (docs/TRACER.md)
_CAPACITY_OPTION = {"device_event": "--device-capacity", "graph_node": "--host-capacity",
                    "eager_launch": "--host-capacity"}


def _room_hint(g, refused: int) -> str:
    """What to do about a full table: the capacity that holds every record, and, for device events, the capture
    range that leaves an engine's eager warm-up out of the buffer."""
    need = g.capacity + refused
    opt = _CAPACITY_OPTION.get(g.kind_name)
    if opt is None:
        return "raise the capacity and record again"
    hint = f"all of them take a capacity of {need:,}: kvconv record {opt} {need}"
    if g.kind_name == "device_event":
        hint += (f" ({need * g.record_size / 2**20:,.0f} MiB of device memory), or keep only the steady state: "
                 "--capture-range graph (from the first graph replay) or profiler")
    return hint


def refused_records(g) -> int:
    """Of a group's drop_count, the records its producer refused for want of room (the rest of a live group's count
    was lost at its end). One rule for validate's ``dropped`` and for reconcile, which blames on the producer's end
    (``unflushed-blocks``) only the blocks of a group that refused nothing."""
    if not g.live:
        return g.drop_count
    over = g.record_count + g.drop_count - g.capacity if g.capacity else g.drop_count
    return min(g.drop_count, max(over, 0))


HOST_CHUNK = 1 << 16  # host records checked (and their pages given back) at a time: 6 MiB


def _check_host_launches(d: dumpmod.Dump, c: _Collector, kernel_slots: set[int] | None,
                         pages: _Pages | None = None) -> None:
    fmask = ~np.uint32(_bits_mask("launch_flags"))
    lf = layout.ENUMS["launch_flags"]
    known = Lookup(_known(kernel_slots))
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
                           ~known(r["kernel_slot"])[1], "kernel_slot", base, r["kernel_slot"])
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
