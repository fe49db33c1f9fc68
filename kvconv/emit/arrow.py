"""Arrow IPC / Parquet tables of one or more dumps: one table per record kind plus the reconciled matches.

Layout (a Hive-partitioned dataset, so several dumps read as one table)::

    OUT/<table>/run=<dump name>/device=<device id>/part-ctx<context id>.arrow|.parquet

Tables: device_event (streamed in chunks), graph_node, eager_launch, kernel (with function and module names),
clock_sync, canary (with buffer name), canary_pages, metadata (the run metadata JSON), strings, matches (one row
per device event: the host record it joins, replay, node ordinal, join kind). Every file's schema metadata holds the
dump format version, the table name, the run metadata and the clock alignment of its context.

Columns come out of the record structs in one pass: the chunk, viewed as 8-byte words, is transposed in cache-sized
blocks; 8-byte fields are then rows of the transposed words (no further copy), narrower fields are picked out of
their word. Single-field kinds (canary_pages, the byte blobs) are handed to Arrow without copying. Three threads
share the work: one copies the next batch's columns out, one writes this batch, one writes the small tables.

    >>> from kvconv.emit import write_arrow
    >>> res = write_arrow(["fixtures/qwen3-14b/qwen3-14b.kvdump"], "tables")  # doctest: +SKIP
    >>> import pyarrow.dataset as ds
    >>> ds.dataset("tables/device_event", format="ipc", partitioning="hive").to_table().num_rows  # doctest: +SKIP
    114112
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import numpy as np

from kvconv._workers import worker
from kvconv.emit._arrays import array
from kvconv.emit._contexts import emit_run
from kvconv.emit._stream import GRAPH_NODE, RELEASE_BYTES, SLICE
from kvconv.emit._writer import RESERVE_FROM, release_reserve, reserve
from kvconv.emit.options import EmitOptions, EmitResult
from kvconv.format import layout
from kvconv.format.dump import release_pages
from kvconv.memory import release_heap

BLOCK = 2048  # rows per transpose block (2048 x 64 bytes and their columns stay in L2: 10.4-11.1 ms per 1M rows,
#               11.7 at 8192)
BATCH = 1 << 16  # rows per device-event record batch in Arrow IPC files
MATCH_NP = [("context_id", "<u4"), ("device_index", "<i8"), ("host_kind", "<u2"), ("host_index", "<i8"),
            ("replay", "<u8"), ("node_ordinal", "<i4"), ("join", "u1")]


def _pa():
    import pyarrow as pa

    return pa


class Deinterleave:
    """Struct-of-arrays from array-of-structs, reusing one transposed-words buffer."""

    def __init__(self, dtype: np.dtype, chunk: int) -> None:
        self.dtype = dtype
        self.fields = [(name, dtype.fields[name][0], dtype.fields[name][1]) for name in dtype.names]
        self.words = dtype.itemsize // 8 if dtype.itemsize % 8 == 0 else 0
        self._alloc(chunk)

    def _alloc(self, n: int) -> None:
        # one set of output columns, reused chunk after chunk (fresh pages cost more than the copy itself)
        self.buf = np.empty((self.words, n), np.uint64) if self.words else None
        self.narrow = {name: np.empty(n, dt) for name, dt, off in self.fields
                       if not (dt.itemsize == 8 and off % 8 == 0)}
        self.tmp = np.empty(n, np.uint64)

    def __call__(self, recs: np.ndarray) -> dict[str, np.ndarray]:
        """The columns of ``recs``, valid until the next call."""
        n = len(recs)
        if not self.words or not recs.flags.c_contiguous:
            return {name: np.ascontiguousarray(recs[name]) for name, _, _ in self.fields}
        if self.buf.shape[1] < n:
            self._alloc(n)
        raw = recs.view(np.uint64).reshape(n, self.words) if n else np.zeros((0, self.words), np.uint64)
        T = self.buf[:, :n]
        for s in range(0, n, BLOCK):
            np.copyto(T[:, s : s + BLOCK], raw[s : s + BLOCK].T)
        out = {}
        for name, dt, off in self.fields:
            w, b = divmod(off, 8)
            if dt.itemsize == 8 and b == 0:
                out[name] = T[w].view(dt)
            elif b + dt.itemsize > 8:  # a field across words (a fixed-size name): copied out as it is
                out[name] = np.ascontiguousarray(recs[name])
            else:
                col = self.narrow[name][:n]
                if dt.kind == "u" and dt.byteorder in "<=|" and np.little_endian:
                    # unsigned field inside a word: shift it down, then the casting copy keeps its low bytes
                    src = T[w]
                    if b:
                        src = np.right_shift(T[w], np.uint64(8 * b), out=self.tmp[:n])
                    np.copyto(col, src, casting="unsafe")
                else:
                    np.copyto(col, T[w].view(np.uint8).reshape(n, 8)[:, b : b + dt.itemsize].view(dt).reshape(n))
                out[name] = col
        return out


def _columns(recs: np.ndarray) -> dict[str, np.ndarray]:
    """The columns of a whole record table, copied out in one pass."""
    return Deinterleave(recs.dtype, len(recs))(recs) if len(recs) else {n: recs[n].copy() for n in recs.dtype.names}


def _schema(pa, dtype: np.dtype, extra: list, meta: dict):
    fields = [pa.field("context_id", pa.uint32())]
    for name in dtype.names:
        if name == "context_id":  # the matches layout has its own: one column of a name (readers refuse two)
            continue
        fields.append(pa.field(name, pa.from_numpy_dtype(dtype.fields[name][0].newbyteorder("="))))
    fields += extra
    return pa.schema(fields, metadata=meta)


class _Sink:
    def __init__(self, pa, root: Path, path: Path, schema, options: EmitOptions, *, expect: int = 0) -> None:
        """``expect``: about the bytes the file will take (0: not known), reserved on the disk before the first
        write (:func:`_reserve`)."""
        # the folders below root, one at a time: a root removed meanwhile (a signal's cleanup) is not made again
        for d in reversed(path.relative_to(root).parents[:-1]):
            (root / d).mkdir(exist_ok=True)
        self.pa, self.schema, self.path = pa, schema, path
        self.reserved = False
        if options.arrow_format == "parquet":
            import pyarrow.parquet as pq

            self.w = pq.ParquetWriter(str(path), schema, compression=options.compression or "none",
                                      write_statistics=True)
            self.pq = True
        else:
            opts = pa.ipc.IpcWriteOptions(compression=options.compression)
            self.reserved = expect >= RESERVE_FROM and _reserve(path, expect)
            # a reserved file is appended to (its size is 0: the reservation keeps it), not truncated
            self.w = pa.ipc.new_file(pa.OSFile(str(path), mode="a") if self.reserved else str(path), schema,
                                     options=opts)
            self.pq = False

    def write(self, cols: dict) -> None:
        batch = record_batch(self.pa, self.schema, cols)
        if self.pq:
            self.w.write_batch(batch, row_group_size=max(1, len(batch)))
        else:
            self.w.write_batch(batch)

    def close(self) -> None:
        self.w.close()
        if self.reserved:
            _release_reserve(self.path)




def record_batch(pa, schema, cols: dict):
    """One record batch of a table's columns (numpy arrays, lists or Arrow arrays), in ``schema``'s order."""
    arrays = [array(pa, cols[f.name], f.type) if not isinstance(cols[f.name], pa.Array) else cols[f.name]
              for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _reserve(path: Path, nbytes: int) -> bool:
    """Create ``path`` empty with ``nbytes`` of disk reserved past its end (its size stays 0); False where that
    cannot be done: the file is then written as any other."""
    import os

    try:
        fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return False
    try:
        return reserve(fd, nbytes)
    finally:
        os.close(fd)


def _release_reserve(path: Path) -> None:
    """Give back the reserved blocks the file did not fill (those past its end)."""
    import os

    fd = os.open(str(path), os.O_WRONLY)
    try:
        release_reserve(fd)
    finally:
        os.close(fd)


def write_arrow(dumps, out, *, options: EmitOptions = EmitOptions(), warn=None, checks=None) -> EmitResult:
    """Write the Arrow IPC / Parquet tables of the dumps to ``out``, atomically (nothing left behind on failure).

    Args:
        dumps: dump paths, or dumps open already (:meth:`kvconv.run.Run.write` hands its own; left open).
        out: the dataset's folder (replaced only when it is kvconv's own earlier output).
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
    from kvconv.emit._verdict import warn_reconcile
    from kvconv.format.atomic import atomic_output

    pa = _pa()
    ext = "parquet" if options.arrow_format == "parquet" else "arrow"
    with emit_run(dumps, out, options, warn, "arrow", checks=checks, passes=1) as (res, warn, paths, ctxs, bar):
        warn_reconcile(ctxs, options, warn)
        with atomic_output(out, inputs=paths, directory=True, kind="arrow", force=options.force) as tmp:
            root = Path(tmp)

            def make(table: str, part: str, schema, expect: int) -> _Sink:
                return _Sink(pa, root, root / f"{part}.{ext}", schema, options, expect=expect)

            for c in ctxs:
                context_tables(pa, c, sinks(pa, c, make, res), options, bar, res)
            _contextless(pa, dumps, ctxs, make, options)
    res.bytes_written = sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
    res.tables = sum(1 for p in Path(out).iterdir() if p.is_dir())
    return res


# The tables that read every device event or need the launch table: written only where the context has what they are
# made of (one place for the writer and for Run.tables), and only those asked for (Run.table: one table in memory).
BIG = {"device_event": lambda c: bool(c.groups), "matches": lambda c: c.n_events > 0,
       "launch": lambda c: c.n_host > 0}


def context_tables(pa, c, sink, options: EmitOptions, bar, res: EmitResult, want: set | None = None) -> None:
    """Every table of the context through ``sink`` (:func:`sinks`); ``want``: only those of :data:`BIG` named
    (the small tables are always made: they read little, and a sink may drop them)."""
    _record_tables(pa, c, sink, options, bar, res, want)  # read from the dump alone: no launch table held
    release_heap()  # their buffers: gone before the launch table is loaded
    if want is None or want & {"matches", "launch"}:
        # a large dump's contexts: one launch table in memory at a time, without the columns no table writes
        with c.held(drop=("host_ns", "node", "flags", "dup", "gx", "gy", "gz")):
            _joined_tables(pa, c, sink, options, res, want)


def _contextless(pa, dumps, ctxs, make, options: EmitOptions) -> None:
    """A dump none of whose contexts is drawn (no per-context record: its producer ended before its first target
    launch, say) still gets its metadata table: what ran, and why nothing else is there. ``dumps``: as the writer
    was given them (a path is opened here; an open dump is read as it is)."""
    from kvconv.emit._contexts import run_name
    from kvconv.format import dump as dumpmod

    drawn, runs = {c.dump.path for c in ctxs}, {c.run for c in ctxs}
    for di, src in enumerate(dumps):
        p = src.path if isinstance(src, dumpmod.Dump) else str(src)
        if p == "-" or p in drawn:
            continue
        with contextlib.ExitStack() as stack:
            d = src if isinstance(src, dumpmod.Dump) else stack.enter_context(dumpmod.open(
                src, options=dumpmod.ReadOptions(verify_checksums=False, salvage=options.salvage)))
            stem = run_name(d.path)
            run = stem if stem not in runs else f"{stem}-{di}"
            runs.add(run)
            for g in d.groups_of("metadata"):
                meta = {"kvconv.format_version": f"{layout.MAJOR}.{max((x.minor for x in d.groups), default=0)}",
                        "kvconv.run": run, "kvconv.source": Path(d.path).name, "kvconv.table": "metadata"}
                schema = pa.schema([pa.field("context_id", pa.uint32()), pa.field("json", pa.string())],
                                   metadata=meta)
                s = make("metadata", f"metadata/run={run}/device={g.device_id}/part-ctx{g.context_id}", schema, 0)
                s.write({"context_id": np.full(1, g.context_id, np.uint32),
                         "json": [json.dumps(d.metadata(context_id=g.context_id), sort_keys=True)]})
                s.close()


def sinks(pa, c, make, res: EmitResult):
    """``sink(table, dtype, extra=(), fields=None, expect=0)``: a sink of one of the context's tables (``make(table,
    part, schema, expect)``: a file under the dataset's folder, or a table kept in memory), every one's schema
    metadata the context's; records the context's alignment and join in ``res``."""
    ctx = c.context_id
    align = c.alignment()
    res.alignment.append(align)
    res.join.append(c.join)
    base_meta = {
        "kvconv.format_version": f"{layout.MAJOR}.{max((g.minor for g in c.dump.groups), default=0)}",  # the dump's
        "kvconv.run": c.run,
        "kvconv.source": c.label,
        # every file's schema carries the run metadata, but not the tracer's list of loaded kernels (1,551 names,
        # 484 KB on an H200 run: 13 MB over a dataset of 13 tables); the metadata table holds it whole
        "kvconv.run_metadata": json.dumps({k: v for k, v in c.meta.items() if k != "loaded_kernels"},
                                          sort_keys=True, separators=(",", ":")),
        "kvconv.alignment": json.dumps(align, sort_keys=True, separators=(",", ":")),
        "kvconv.join": c.join,
    }

    def sink(table: str, dtype: np.dtype | None, extra=(), fields=None, expect: int = 0):
        meta = {**base_meta, "kvconv.table": table}
        if fields is not None:
            schema = pa.schema([pa.field("context_id", pa.uint32())] + list(fields), metadata=meta)
        else:
            schema = _schema(pa, dtype, list(extra), meta)
        return make(table, f"{table}/run={c.run}/device={c.device_id}/part-ctx{ctx}", schema, expect)

    return sink


def _record_tables(pa, c, sink, options: EmitOptions, bar, res: EmitResult, want: set | None = None) -> None:
    """The tables of the context's records as they are (device_event, host records, kernels, ...): read from the
    dump alone, so written before the launch table is loaded (on a large dump that table is the state that grows
    with the run: issue 13). The small tables are written by a second thread while this one streams the device
    events: the device-event pipeline leaves each core idle part of the time (1M events + 65,536 host records:
    38-45 ms -> 30-34 ms)."""
    t_start = time.perf_counter()
    side = worker("tables").submit(_small_tables, pa, c, sink)
    try:
        if BIG["device_event"](c) and (want is None or "device_event" in want):
            _device_table(c, sink, options, bar, res)
    finally:
        side_error = side.exception()  # wait: the temporary folder must not go while the thread writes into it
    if side_error is not None:
        raise side_error
    res.host_records += side.result()
    res.timings["record_tables"] = res.timings.get("record_tables", 0.0) + time.perf_counter() - t_start


def _joined_tables(pa, c, sink, options: EmitOptions, res: EmitResult, want: set | None = None) -> None:
    """The tables of the join: matches (one row per device event) and launch (one per launch), the context's
    launch table held."""
    t_start = time.perf_counter()
    ctx = c.context_id
    if BIG["matches"](c) and (want is None or "matches" in want):
        mt = np.dtype(MATCH_NP)
        s = sink("matches", mt, [pa.field("join_name", pa.dictionary(pa.int8(), pa.string()))])
        rr = c.reconcile_result
        if rr is not None:
            m = rr.matches[rr.matches["context_id"] == ctx]
            cols = {n: np.ascontiguousarray(m[n]) for n in m.dtype.names}
            cols["join_name"] = _join_names(pa, m["join"])
            s.write(cols)
        else:
            # the exact join's matches: one batch per context when they are reconcile's (auto: the same table, the
            # same bytes), a batch per chunk otherwise (bounded memory)
            tabs = _match_tables(c)
            if c._runs is not None:
                cols = _match_arrays(c.context_id, 0, c.n_events)
                for first, recs in c.chunks(options.chunk):
                    _fill_matches(c, first, recs, cols, first, tabs)
                cols["join_name"] = _join_names(pa, cols["join"])
                s.write(cols)
            else:
                for first, recs in c.chunks(options.chunk):
                    cols = _match_arrays(c.context_id, first, len(recs))
                    _fill_matches(c, first, recs, cols, 0, tabs)
                    cols["join_name"] = _join_names(pa, cols["join"])
                    s.write(cols)
        s.close()
    res.timings["matches"] = res.timings.get("matches", 0.0) + time.perf_counter() - t_start
    if BIG["launch"](c) and c.host.n and (want is None or "launch" in want):
        _launch_table(pa, c, sink, options)


def _kernel_names(pa, c, slots: np.ndarray):
    us, inv = np.unique(slots, return_inverse=True)
    return pa.DictionaryArray.from_arrays(array(pa, inv.reshape(-1).astype(np.int32)),
                                          array(pa, [c.kernel_name(k) for k in us.tolist()], pa.string()))


def _launch_table(pa, c, sink, options: EmitOptions) -> None:
    """The ``launch`` table: one row per launch or graph-node execution (launch-table row, graph uploads left out):
    its device start (first block entry), last block entry, end (last block exit: null when the dump records no
    exits) and duration (kvconv.join.durations, the computation reconcile reports), the duration corrected by the
    tracer's calibration (null where the dump records none), blocks predicted and recorded, replay and node."""
    from kvconv.join import calibration
    from kvconv.join.durations import LaunchDurations
    from kvconv.join.exact import ExactJoin

    h = c.host
    ld = LaunchDurations(h, c.xjoin if c.xjoin is not None else ExactJoin(h))
    count = np.zeros(h.n, np.int64)
    last = np.full(h.n, -1, np.int64)
    for first, recs in c.chunks(options.chunk, sub=SLICE):
        ld.feed(first, recs)
        enter = recs["kind"] == _BLOCK_ENTER
        r = ld.xj.lookup(recs["gridid"][enter], recs["tag"][enter], recs["flags"][enter], recs["kind"][enter])
        ok = r >= 0
        np.add.at(count, r[ok], 1)
        np.maximum.at(last, r[ok], recs["globaltimer"][enter][ok].astype(np.int64))
    ld.xj = c.xjoin = None  # the join's own tables (the last use of it): gone before the durations' columns
    release_heap()
    d = ld.finish()
    timed, dur = d.timed, d.duration_ns  # computed once, not per batch
    cal = calibration.of_dump(c.dump, c.context_id)
    fixed = cal.corrected(dur) if cal is not None else None
    rows = np.flatnonzero(h.shown)
    slots = np.unique(h.kernel_slot[rows])
    kernels = array(pa, [c.kernel_name(k) for k in slots.tolist()], pa.string())  # one dictionary for every batch
    s = None
    # a record batch (Parquet: row group) of BATCH launches at a time, as the other tables: one on small dumps
    for a in range(0, max(len(rows), 1), BATCH):
        r = rows[a : a + BATCH]
        cols = _launch_columns(pa, c, d, count[r], last[r], r, timed[r], dur[r])
        known = timed[r] if fixed is not None else np.zeros(len(r), bool)  # null without a calibration
        cols["duration_corrected_ns"] = array(pa, (fixed if fixed is not None else dur)[r].astype(np.int64),
                                              pa.int64(), mask=~known)
        cols["kernel"] = pa.DictionaryArray.from_arrays(
            array(pa, np.searchsorted(slots, h.kernel_slot[r]).astype(np.int32)), kernels)
        if s is None:
            fields = [pa.field(k, v.type if isinstance(v, pa.Array) else pa.from_numpy_dtype(v.dtype))
                      for k, v in cols.items() if k != "context_id"]
            s = sink("launch", None, fields=fields)
        s.write(cols)
    s.close()


def _launch_columns(pa, c, d, count, last, rows, timed, dur) -> dict:
    """The launch table's columns of the launch-table ``rows`` (``count``, ``last``, ``timed``, ``dur``: their
    recorded blocks, last entry, whether timed and duration; ``d``: the durations of every row); the kernel column
    is the caller's."""
    h = c.host
    has_start = count > 0
    isg = h.kind[rows] == GRAPH_NODE
    i64 = lambda v, m: array(pa, v.astype(np.int64, copy=False), pa.int64(), mask=~m)  # noqa: E731 - null where not known
    return {"context_id": np.full(len(rows), c.context_id, np.uint32),
            "kind": pa.DictionaryArray.from_arrays(array(pa, np.where(isg, 0, 1).astype(np.int8)),
                                                   array(pa, ["graph_node", "eager_launch"], pa.string())),
            "host_index": h.index[rows].astype(np.int64), "graph_exec": h.graph_exec[rows],
            "replay": np.where(isg, h.launch_id[rows], 0).astype(np.uint64),
            "node_ordinal": h.node_ordinal[rows].astype(np.int32),
            "stream": h.stream[rows], "grid_id": h.grid_id[rows],
            "kernel": None,
            "blocks_predicted": np.maximum(h.grid[rows], 0), "blocks_recorded": count,
            "start_ns": i64(d.start_ns[rows], has_start), "last_entry_ns": i64(last, has_start),
            "end_ns": i64(d.end_ns[rows], timed), "duration_ns": i64(dur, timed),
            "blocks_paired": d.blocks[rows]}


def _device_table(c, sink, options: EmitOptions, bar, res: EmitResult) -> None:
    """The device_event table, streamed. IPC batches of BATCH rows and two column sets: a worker thread copies
    batch i's columns out while this thread writes batch i-1 (both release the GIL); small batches keep the columns
    in cache until written. The next batch is only asked for once the worker is done with this one, since the
    chunk source may drop the pages it yielded. Parquet keeps chunk-sized row groups."""
    dt = layout.DTYPES["device_event"]
    rows = options.chunk if options.arrow_format == "parquet" else min(BATCH, options.chunk)
    # uncompressed IPC: the columns (the records' fields and context_id), a few KiB of metadata a batch
    expect = c.n_events * (sum(dt.fields[k][0].itemsize for k in dt.names) + 4) + (c.n_events // rows + 2) * 4096 \
        if options.compression is None else 0
    s = sink("device_event", dt, expect=expect)
    ctxcol = np.full(rows, c.context_id, np.uint32)
    deis = (Deinterleave(dt, rows), Deinterleave(dt, rows))
    copier = worker("columns")
    pending = None  # (columns, rows) of the previous batch, not yet written

    def flush():
        cols, n = pending
        cols["context_id"] = ctxcol[:n]
        s.write(cols)
        res.written_events += n
        bar(n)

    for i, (_, recs) in enumerate(c.chunks(options.chunk, verify=options.verify_checksums, sub=rows)):
        fut = copier.submit(deis[i % 2], recs)
        if pending is not None:
            flush()
        pending = (fut.result(), len(recs))
    if pending is not None:
        flush()
    s.close()


# Record kinds whose table is made by code of its own here (names resolved, pages flattened, ...); any other kind
# whose "arrow" is set in schemas/layouts.json is exported as its records (tests/test_kinds.py checks the set).
_BLOCK_ENTER = layout.ENUMS["event_kind"]["block_enter"]
_OWN_TABLES = frozenset({"device_event", "graph_node", "eager_launch", "kernel", "canary", "canary_pages", "metadata",
                         "strings", "slot_write"})


def _small_tables(pa, c, sink) -> int:
    """Every table of the context but device_event and matches; returns the host records written."""
    d, ctx = c.dump, c.context_id
    blob = d.strings(context_id=ctx)
    ctxcol = lambda n: np.full(n, ctx, np.uint32)  # noqa: E731

    def put(kind: str, cols: dict, dtype: np.dtype | None, extra=(), fields=None) -> None:
        s = sink(kind, dtype, extra, fields)
        s.write(cols)
        s.close()

    def table(kind: str, dtype: np.dtype, extra=(), more=None) -> int:
        s = sink(kind, dtype, extra)
        n = 0
        for recs in _record_batches(d, kind, ctx):
            s.write({**_columns(recs), "context_id": ctxcol(len(recs)), **(more(recs) if more is not None else {})})
            n += len(recs)
        s.close()
        return n

    def names(recs, off: str, n: str) -> list[str]:
        return [blob[int(o) : int(o) + int(k)].decode("utf-8", "replace") for o, k in zip(recs[off], recs[n])]

    def has(kind: str) -> bool:
        return bool(d.groups_of(kind, context_id=ctx))

    host = sum(table(kind, layout.DTYPES["host_launch"]) for kind in ("graph_node", "eager_launch") if has(kind))
    if has("kernel"):
        table("kernel", layout.DTYPES["kernel"], [pa.field("name", pa.string()), pa.field("module", pa.string())],
              lambda r: {"name": names(r, "name_off", "name_len"), "module": names(r, "module_off", "module_len")})
    for kind in layout.KINDS.values():  # every other exported kind: its records as they are, a column per field
        if kind.arrow and kind.layout and kind.name not in _OWN_TABLES and has(kind.name):
            dt = layout.DTYPES[kind.layout]
            text = [n for n in dt.names if dt.fields[n][0].kind == "S"]  # NUL-padded names: string columns
            rest = np.dtype({"names": [n for n in dt.names if n not in text],
                             "formats": [dt.fields[n][0] for n in dt.names if n not in text],
                             "offsets": [dt.fields[n][1] for n in dt.names if n not in text], "itemsize": dt.itemsize})
            table(kind.name, rest, [pa.field(n, pa.string()) for n in text],
                  (lambda r, text=text: {n: [x.rstrip(b"\0").decode("utf-8", "replace") for x in r[n]] for n in text})
                  if text else None)
    if has("canary"):
        table("canary", layout.DTYPES["canary"], [pa.field("buffer", pa.string())],
              lambda r: {"buffer": names(r, "name_off", "name_len")})
    if has("canary_pages"):
        pages = d.records("canary_pages", context_id=ctx).view(np.uint32).reshape(-1)
        put("canary_pages", {"context_id": ctxcol(len(pages)), "page": pages}, layout.DTYPES["canary_page"])
    if has("slot_write"):
        _slot_write_table(pa, c, put)
    if has("metadata"):
        put("metadata", {"context_id": ctxcol(1), "json": [json.dumps(d.metadata(context_id=ctx), sort_keys=True)]},
            None, fields=[pa.field("json", pa.string())])
    if has("strings"):
        put("strings", {"context_id": ctxcol(1), "blob": array(pa, [blob], pa.binary())}, None,
            fields=[pa.field("blob", pa.binary())])
    return host


def _slot_write_table(pa, c, put) -> None:
    """The ``slot_write`` table: one row per record, joined by the write-address canary's join to its launch (host
    kind and index, replay, node), step, cache slot and request (kvconv.emit._writes); joins device_event on
    (context_id, gridid, tag, block_x, block_y, block_z)."""
    from kvconv.emit import _writes

    cols = _writes.arrow_columns(pa, _writes.join(c), lambda slots: _kernel_names(pa, c, slots))
    fields = [pa.field(k, v.type if isinstance(v, (pa.Array, pa.ChunkedArray)) else pa.from_numpy_dtype(v.dtype))
              for k, v in cols.items() if k != "context_id"]
    put("slot_write", cols, None, fields=fields)


def _record_batches(d, kind: str, ctx: int):
    """The records of a small table: all at once up to BATCH records (one record batch), else BATCH at a time, the
    pages of each given back once written on large dumps (host records grow with the run)."""
    gs = d.groups_of(kind, context_id=ctx)
    if sum(len(g.records) for g in gs) <= BATCH:
        yield d.records(kind, context_id=ctx)
        return
    mm = getattr(d, "_mm", None) if d.size > RELEASE_BYTES else None
    for g in gs:
        rs = int(g.header["record_size"])
        for s, view in g.chunks(BATCH):
            yield view
            if mm is not None:
                release_pages(mm, g.payload_offset + s * rs, len(view) * rs)


def _match_tables(c) -> list:
    """Per host row (and one more row for "unmatched"): the matches columns kvconv.check.reconcile writes."""
    h = c.host
    isg = h.kind == layout.KINDS["graph_node"].id
    return [("host_kind", np.append(h.kind, 0).astype(np.uint16)),
            ("host_index", np.append(h.index, -1).astype(np.int64)),
            ("replay", np.append(np.where(isg, h.launch_id, 0), 0).astype(np.uint64)),
            ("node_ordinal", np.append(h.node_ordinal, -1).astype(np.int32)),
            ("join", np.append(np.ones(h.n, np.uint8), 0).astype(np.uint8))]


def _match_arrays(ctx: int, first: int, n: int) -> dict:
    out = {"context_id": np.full(n, ctx, np.uint32), "device_index": np.arange(first, first + n, dtype=np.int64)}
    for name, dt in MATCH_NP[2:]:
        out[name] = np.empty(n, dt)
    return out


def _fill_matches(c, first: int, recs: np.ndarray, cols: dict, at: int, tabs: list) -> None:
    """The matches rows of the events ``recs`` (device indices from ``first``) into ``cols`` from row ``at``, run by
    run of the exact join, in cache-sized slices."""
    nh = c.host.n
    for s in range(0, len(recs), SLICE):
        sub = recs[s : s + SLICE]
        starts, rhid = c.match_runs(first + s, sub)
        r = np.where(rhid >= 0, rhid, nh)
        rl = np.diff(np.append(starts, len(sub)))
        lo = at + s
        for name, tab in tabs:
            cols[name][lo : lo + len(sub)] = np.repeat(tab[r], rl)


def _join_names(pa, join: np.ndarray):
    return pa.DictionaryArray.from_arrays(array(pa, join.astype(np.int8)),
                                          array(pa, ["none", "exact", "ordered"], pa.string()))
