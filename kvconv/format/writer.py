"""Write kvconv dumps: :func:`new` (groups written to a temporary file, renamed into place on close), the pair of
:func:`kvconv.format.reader.open`; both are reached as ``dump.new`` / ``dump.open`` (:mod:`kvconv.format.dump`).

    >>> import numpy as np, tempfile, os
    >>> from kvconv.format import dump, layout
    >>> path = os.path.join(tempfile.mkdtemp(), "d.bin")
    >>> ev = np.zeros(3, dtype=layout.DTYPES["device_event"]); ev["sequence"] = [0, 1, 2]
    >>> with dump.new(path) as w:
    ...     w.write_metadata({"tool": "doctest", "tool_version": "0"})
    ...     w.write_records("device_event", ev, capacity=1024)
    >>> with dump.open(path) as d:
    ...     [g.kind_name for g in d.groups], int(d.records("device_event")["sequence"].sum())
    (['metadata', 'device_event'], 3)
"""

from __future__ import annotations

import builtins
import json
import os
import zlib
from pathlib import Path

import numpy as np

from kvconv.format import layout
from kvconv.format.errors import SchemaError


def make_header(
    kind: layout.RecordKind,
    *,
    record_count: int,
    payload_crc32: int,
    capacity: int = 0,
    drop_count: int = 0,
    context_id: int = 0,
    device_id: int = 0,
    clock_domain: int | None = None,
    major: int = layout.MAJOR,
    minor: int | None = None,
    record_size: int | None = None,
    flags: int = 0,
) -> bytes:
    """The 64 header bytes for a group, header checksum included (``minor``: by default the lowest the group's
    flags and record kind need, layout.group_minor)."""
    h = np.zeros(1, dtype=layout.HEADER_DTYPE)
    h["magic"] = layout.MAGIC
    h["major"], h["minor"] = major, layout.group_minor(flags, kind.name) if minor is None else minor
    h["record_kind"] = kind.id
    h["header_size"] = layout.HEADER_SIZE
    h["record_size"] = kind.record_size if record_size is None else record_size
    h["flags"] = flags
    h["record_count"] = record_count
    h["capacity"] = capacity
    h["drop_count"] = drop_count
    h["context_id"] = context_id
    h["device_id"] = device_id
    if clock_domain is None:
        clock_domain = layout.default_clock(kind)  # the kind's "clock" in schemas/layouts.json
    h["clock_domain"] = clock_domain
    h["payload_crc32"] = payload_crc32
    raw = bytearray(h.tobytes())
    raw[60:64] = zlib.crc32(bytes(raw[:60])).to_bytes(4, "little")
    return bytes(raw)


class StringTable:
    """Builds a strings blob; :meth:`add` returns ``(offset, length)`` for kernel and canary records."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._index: dict[str, tuple[int, int]] = {}
        self._size = 0

    def add(self, s: str) -> tuple[int, int]:
        if s not in self._index:
            b = s.encode("utf-8")
            self._index[s] = (self._size, len(b))
            self._parts.append(b)
            self._size += len(b)
        return self._index[s]

    def blob(self) -> bytes:
        return b"".join(self._parts)


class DumpWriter:
    """Writes groups to a temporary file; :meth:`close` renames it into place, :meth:`abort` removes it.

    A dump that starts with its metadata says what it holds: :meth:`write_metadata` keeps the metadata until
    :meth:`close`, which writes it first with ``holds`` (every later group counted per kind: groups and records,
    docs/FORMAT.md), then the groups written meanwhile (kept in an unnamed temporary file beside the output)."""

    def __init__(self, path: str | os.PathLike, *, context_id: int = 0, device_id: int = 0) -> None:
        from kvconv.format.atomic import atomic_output

        self.path = Path(path)
        self.context_id = context_id
        self.device_id = device_id
        # dump.new(path) replaces its path, as open(path, "w") would (a library call, not a user's -o)
        self._cm = atomic_output(self.path, kind="kvdump", force=True)
        self._tmp = self._cm.__enter__()
        self._f = builtins.open(self._tmp, "wb")
        self._closed = False
        self._meta: tuple[dict, dict] | None = None  # the metadata written first at close, and its header fields
        self._body = None  # the output file while the groups go to a temporary one (metadata pending)
        self._wrote = False
        self._holds: dict[str, dict[str, int]] = {}  # kind -> {"groups", "records"}: the metadata's "holds"

    def __enter__(self) -> DumpWriter:
        return self

    def __exit__(self, et, ev, tb) -> None:
        if et is None:
            self.close()
        else:
            self.abort(et, ev, tb)

    def write_raw_group(self, kind: layout.RecordKind, payload: bytes | memoryview, *, record_count: int,
                        **header) -> None:
        crc = zlib.crc32(payload)
        self._count(kind, record_count)
        header.setdefault("context_id", self.context_id)
        header.setdefault("device_id", self.device_id)
        self._f.write(make_header(kind, record_count=record_count, payload_crc32=crc, **header))
        self._f.write(payload)
        self._f.write(b"\0" * (layout.padded(len(payload)) - len(payload)))

    def write_records(self, kind: str, records: np.ndarray, **header) -> None:
        """Write one group of ``kind`` records (a structured array of the kind's dtype)."""
        kd = layout.KINDS[kind]
        dt = layout.kind_dtype(kd)
        if records.dtype != dt:
            raise SchemaError(f"records have dtype {records.dtype}, expected the {kind} layout", field=kind,
                              code="writer-dtype")
        arr = np.ascontiguousarray(records)
        self.write_raw_group(kd, memoryview(arr.view(np.uint8).reshape(-1)), record_count=len(arr), **header)

    def write_stream(self, kind: str, chunks, **header) -> int:
        """Write one group of ``kind`` records from an iterable of structured arrays, in bounded memory: the
        header is written last (count and payload CRC-32 are known only then). Returns the record count."""
        kd = layout.KINDS[kind]
        dt = layout.kind_dtype(kd)
        header.setdefault("context_id", self.context_id)
        header.setdefault("device_id", self.device_id)
        at = self._f.tell()
        self._f.write(bytes(layout.HEADER_SIZE))
        count = crc = 0
        for recs in chunks:
            if recs.dtype != dt:
                raise SchemaError(f"records have dtype {recs.dtype}, expected the {kind} layout", field=kind,
                                  code="writer-dtype")
            b = memoryview(np.ascontiguousarray(recs).view(np.uint8).reshape(-1))
            crc = zlib.crc32(b, crc)
            self._f.write(b)
            count += len(recs)
        nbytes = count * kd.record_size
        self._count(kd, count)
        self._f.write(b"\0" * (layout.padded(nbytes) - nbytes))
        end = self._f.tell()
        self._f.seek(at)
        self._f.write(make_header(kd, record_count=count, payload_crc32=crc, **header))
        self._f.seek(end)
        return count

    def write_bytes(self, kind: str, data: bytes, **header) -> None:
        self.write_raw_group(layout.KINDS[kind], data, record_count=len(data), **header)

    def _count(self, kind: layout.RecordKind, records: int) -> None:
        self._wrote = True
        n = self._holds.setdefault(kind.name, {"groups": 0, "records": 0})
        n["groups"] += 1
        n["records"] += int(records)

    def write_metadata(self, meta: dict, *, holds: bool = True, **header) -> None:
        """The run metadata. As the dump's first group (and ``holds``), written at :meth:`close`, first, with
        ``holds``: what the finished dump holds (a reader tells a file cut at a group boundary by it)."""
        if holds and not self._wrote and self._meta is None:
            import tempfile

            self._meta = (dict(meta), header)
            self._body, self._f = self._f, tempfile.TemporaryFile(dir=self._tmp.parent, prefix=".kvconv-groups-")
            return
        meta = {k: v for k, v in meta.items() if k != "holds"}  # a copied one would describe another file
        self.write_bytes("metadata", json.dumps(meta, sort_keys=True, separators=(",", ":")).encode(), **header)

    def _finish_metadata(self) -> None:
        """The pending metadata, with ``holds``, then the groups written after it."""
        import shutil

        meta, header = self._meta
        body, self._f, self._meta = self._f, self._body, None
        meta["holds"] = {"groups": sum(v["groups"] for v in self._holds.values()),
                         "kinds": {k: dict(v) for k, v in sorted(self._holds.items())}}
        self.write_bytes("metadata", json.dumps(meta, sort_keys=True, separators=(",", ":")).encode(), **header)
        body.seek(0)
        shutil.copyfileobj(body, self._f, 1 << 20)
        body.close()

    def write_strings(self, table: StringTable | bytes, **header) -> None:
        self.write_bytes("strings", table.blob() if isinstance(table, StringTable) else table, **header)

    def close(self) -> None:
        if self._closed:
            return
        if self._meta is not None:
            self._finish_metadata()
        self._closed = True
        self._f.close()
        self._cm.__exit__(None, None, None)

    def abort(self, et=None, ev=None, tb=None) -> None:
        if self._closed:
            return
        self._closed = True
        self._f.close()
        if self._body is not None:
            self._body.close()
        try:
            self._cm.__exit__(et or RuntimeError, ev or RuntimeError("aborted"), tb)
        except BaseException:
            pass


def new(path: str | os.PathLike, *, context_id: int = 0, device_id: int = 0) -> DumpWriter:
    """Start writing a dump at ``path`` (atomically: nothing appears there until :meth:`DumpWriter.close`)."""
    return DumpWriter(path, context_id=context_id, device_id=device_id)
