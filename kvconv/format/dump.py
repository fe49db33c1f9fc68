"""Read and write kvconv dumps: ``open()`` (mmap + numpy views, no copies) and its pair ``new()``.

A dump is a sequence of record groups, each a 64-byte header (``schemas/layouts.json``, layout ``header``) followed by
``record_count * record_size`` payload bytes, zero-padded to a multiple of 8. See docs/FORMAT.md.

    >>> import numpy as np, tempfile, os
    >>> from kvconv import dump, layout
    >>> path = os.path.join(tempfile.mkdtemp(), "d.bin")
    >>> ev = np.zeros(3, dtype=layout.DTYPES["device_event"]); ev["sequence"] = [0, 1, 2]
    >>> with dump.new(path) as w:
    ...     w.write_metadata({"tool": "doctest", "tool_version": "0"})
    ...     w.write_records("device_event", ev, capacity=1024)
    >>> with dump.open(path) as d:
    ...     [g.kind_name for g in d.groups], int(d.records("device_event")["sequence"].sum())
    (['metadata', 'device_event'], 3)

Header counts are never trusted beyond the file's size; a file larger than memory is fine, since the views are backed
by the page cache and :meth:`Group.chunks` walks them in bounded slices.
"""

from __future__ import annotations

import builtins
import json
import mmap
import os
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvconv.format import layout
from kvconv.format.errors import FormatError, KvconvError, SchemaError
from kvconv.format.findings import Finding

H = layout.HEADER_DTYPE
_HDR = layout.LAYOUTS["header"]
LIVE = layout.ENUMS["header_flags"]["live"]
# A live group's header (written in place by a running producer) is checksummed with these fields as 0: they are
# the only ones that change, each with one 8-byte store, so the header checks at every instant.
_LIVE_VOLATILE = [(_HDR.field(f).offset, _HDR.field(f).size) for f in ("record_count", "drop_count", "payload_crc32")]
DEFAULT_CHUNK = 1 << 20  # records per chunk when walking large groups
RELEASE_AFTER_CRC = 256 << 20  # files larger than this give the pages their payload CRC read back

_DEFAULT_CLOCK = {
    "device_event": "gpu_globaltimer",
    "graph_node": "host_monotonic",
    "eager_launch": "host_monotonic",
    "canary": "host_monotonic",
}


class DumpWarning(UserWarning):
    """Readable, but something is off (unknown minor version or record kind, salvaged loss)."""


@dataclass(frozen=True)
class ReadOptions:
    """How :func:`open` treats damage.

    salvage: read a dump cut short up to its last whole record (the loss is reported per group) instead of refusing.
    verify_checksums: compute each group's payload CRC-32 and refuse a mismatch (validate reports it instead).
    """

    salvage: bool = False
    verify_checksums: bool = True


@dataclass
class Group:
    """One record group: its header fields and a zero-copy structured view of its records."""

    index: int
    offset: int
    header: np.void
    kind: layout.RecordKind | None
    records: np.ndarray
    path: str
    lost_records: int = 0  # records the header promised that a cut-short file no longer holds (salvage)

    @property
    def live(self) -> bool:
        """Written in place by a producer that never finished the dump: the header's record_count is what it had
        published, its drop_count what may be missing, and the payload has no checksum."""
        return bool(int(self.header["flags"]) & LIVE)

    @property
    def kind_name(self) -> str:
        return self.kind.name if self.kind else f"unknown({int(self.header['record_kind'])})"

    @property
    def payload_offset(self) -> int:
        return self.offset + layout.HEADER_SIZE

    def __getattr__(self, name: str):
        # Header fields read as plain ints: g.record_count, g.drop_count, g.context_id, ...
        if name in H.names and name != "magic":
            return int(self.header[name])
        raise AttributeError(name)

    @property
    def clock_domain_name(self) -> str:
        inv = {v: k for k, v in layout.ENUMS["clock_domain"].items()}
        return inv.get(self.clock_domain, f"unknown({self.clock_domain})")

    def record_offset(self, i: int) -> int:
        """Byte offset of record ``i`` in the file."""
        return self.payload_offset + i * int(self.header["record_size"])

    def chunks(self, size: int = DEFAULT_CHUNK) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(first_index, view)`` slices of at most ``size`` records."""
        n = len(self.records)
        for start in range(0, n, size):
            yield start, self.records[start : start + size]

    def payload_bytes(self) -> memoryview:
        return memoryview(self.records.view(np.uint8).reshape(-1)) if len(self.records) else memoryview(b"")

    def crc_ok(self, *, release=None) -> bool:
        """The payload matches its CRC. ``release(offset, nbytes)``: called on each file range once it is summed."""
        if self.live:
            return True  # a live group's payload_crc32 is 0: not computed while the producer ran
        crc = 0
        step = 64 << 20
        buf = self.payload_bytes()
        for s in range(0, len(buf), step):
            crc = zlib.crc32(buf[s : s + step], crc)
            if release is not None:
                release(self.payload_offset + s, min(step, len(buf) - s))
        return crc == int(self.header["payload_crc32"])


def release_pages(mm, offset: int, nbytes: int) -> None:
    """Give the whole pages of ``mm`` inside ``[offset, offset + nbytes)`` back (MADV_DONTNEED; a later read faults
    them in again from the page cache), so that what has been read stops counting in the resident set."""
    lo = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
    hi = (offset + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if mm is not None and hi > lo:
        try:
            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        except (OSError, ValueError, AttributeError):  # closed, or no madvise here: only memory is at stake
            pass


@dataclass
class Dump:
    """An opened dump. Use as a context manager, or call :meth:`close`."""

    path: str
    size: int
    groups: list[Group]
    problems: list[Finding] = field(default_factory=list)
    _mm: mmap.mmap | None = None
    _file: object = None

    def __enter__(self) -> "Dump":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.groups = []
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                # A caller still holds a view into the map; it is released when the last view goes.
                pass
            self._mm = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def groups_of(self, kind: str, *, context_id: int | None = None) -> list[Group]:
        return [
            g
            for g in self.groups
            if g.kind is not None and g.kind.name == kind and (context_id is None or g.context_id == context_id)
        ]

    def contexts(self) -> list[tuple[int, int]]:
        """Distinct (context_id, device_id) pairs, in order of appearance."""
        seen: dict[tuple[int, int], None] = {}
        for g in self.groups:
            seen.setdefault((g.context_id, g.device_id), None)
        return list(seen)

    def records(self, kind: str, *, context_id: int | None = None) -> np.ndarray:
        """All records of one kind: the mmap view itself when one group holds them, else a concatenation."""
        gs = self.groups_of(kind, context_id=context_id)
        if not gs:
            kd = layout.KINDS[kind]
            return np.zeros(0, dtype=layout.kind_dtype(kd))
        if len(gs) == 1:
            return gs[0].records
        return np.concatenate([g.records for g in gs])

    def drops(self, kind: str, *, context_id: int | None = None) -> int:
        return sum(g.drop_count for g in self.groups_of(kind, context_id=context_id))

    def metadata(self, *, context_id: int | None = None) -> dict:
        """The run metadata (merged across metadata groups); raises SchemaError if it is not a JSON object."""
        out: dict = {}
        for g in self.groups_of("metadata", context_id=context_id):
            raw = g.records.tobytes()
            try:
                obj = loads_metadata(raw)
            except (UnicodeDecodeError, ValueError, RecursionError) as e:
                pos = getattr(e, "pos", getattr(e, "start", 0)) or 0
                raise SchemaError(
                    f"metadata is not valid UTF-8 JSON ({e.__class__.__name__})",
                    path=self.path,
                    group=g.index,
                    offset=g.payload_offset + pos,
                    field="metadata",
                    code="metadata-json",
                ) from None
            if not isinstance(obj, dict):
                raise SchemaError("metadata must be a JSON object", path=self.path, group=g.index,
                                  offset=g.payload_offset, field="metadata", code="metadata-json")
            out.update(obj)
        return out

    def strings(self, *, context_id: int) -> bytes:
        gs = self.groups_of("strings", context_id=context_id)
        return b"".join(g.records.tobytes() for g in gs)

    def kernel_names(self, *, context_id: int | None = None) -> dict[int, str]:
        """Kernel slot -> function name, from the kernel table and strings of each context."""
        names: dict[int, str] = {}
        for ctx, _dev in self.contexts():
            if context_id is not None and ctx != context_id:
                continue
            blob = self.strings(context_id=ctx)
            for g in self.groups_of("kernel", context_id=ctx):
                for r in g.records:
                    off, n = int(r["name_off"]), int(r["name_len"])
                    names[int(r["slot"])] = blob[off : off + n].decode("utf-8", "replace")
        return names


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    v = float(text)
    if v in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:20]} overflows a float")
    return v


def loads_metadata(raw: bytes):
    """Parse metadata JSON strictly: UTF-8, no NaN/Infinity (nor numbers that overflow to it). Raises
    UnicodeDecodeError, ValueError (bad JSON, or an integer too long to convert) or RecursionError (too deep)."""
    return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float)


def _err(cls, msg, path, offset, fld=None, *, group=None, code, hint=None):
    return cls(msg, path=path, offset=offset, field=fld, group=group, code=code, hint=hint)


def _cut_hint(options: ReadOptions, index: int, nothing_left: str) -> str:
    """What to do about a file cut short: --salvage, unless it is already on (then say what it could not do)."""
    if not options.salvage:
        return "the file was cut short; try --salvage"
    if index == 0:
        return f"the file was cut short: {nothing_left}"
    return "the file was cut short; the groups before it were read"


def scan(path: str | os.PathLike, *, options: ReadOptions = ReadOptions()) -> Dump:
    """Parse a dump's structure, collecting every structural problem in ``Dump.problems`` instead of raising.

    Parsing stops at the first header that cannot be trusted (bad magic, unknown major, bad header checksum,
    truncated header), since the position of the next group is then unknown. Payload checksums are checked when
    ``options.verify_checksums``.
    """
    path = str(path)
    try:
        f = builtins.open(path, "rb")
    except FileNotFoundError:
        raise FormatError("no such file", path=path, code="not-found", hint="check the path") from None
    except IsADirectoryError:
        raise FormatError("is a folder, not a dump file", path=path, code="not-a-file") from None
    except OSError as e:
        raise FormatError(f"cannot open: {e.strerror}", path=path, code="unreadable") from None
    size = os.fstat(f.fileno()).st_size
    mm = None
    if size:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            f.close()
            raise FormatError(f"cannot map file: {e}", path=path, code="unreadable") from None
    d = Dump(path=path, size=size, groups=[], _mm=mm, _file=f)
    buf = mm if mm is not None else b""
    probs = d.problems

    def problem(severity, err: KvconvError):
        probs.append(Finding.from_error(err, severity))

    if size == 0:
        problem("error", _err(FormatError, "empty file", path, 0, "header", code="truncated-header",
                              hint="the producer wrote nothing"))
        return d

    pos = 0
    index = 0
    while pos < size:
        head = bytes(buf[pos : pos + min(8, size - pos)])
        if not layout.MAGIC.startswith(head):
            # Checked first, even on a stub shorter than a header: a text file is "not a kvconv dump", not "cut".
            what = "bad magic" if index == 0 else "bad magic at the start of a record group"
            problem("error", _err(FormatError, f"{what} {head!r}", path, pos, "header.magic", group=index,
                                  code="bad-magic",
                                  hint="not a kvconv dump" if index == 0 else "the file is damaged here"))
            break
        if size - pos < layout.HEADER_SIZE:
            salvaged = options.salvage and index > 0
            problem("warning" if salvaged else "error",
                    _err(FormatError, f"file ends {size - pos} bytes into a 64-byte header", path, pos, "header",
                         group=index, code="truncated-header",
                         hint=_cut_hint(options, index, "its first header is incomplete, so no group can be read")))
            break
        hdr = np.frombuffer(buf, dtype=H, count=1, offset=pos)[0]
        major, minor = int(hdr["major"]), int(hdr["minor"])
        if major not in layout.SUPPORTED_MAJORS:
            problem("error", _err(FormatError, f"format major version {major} is not supported (supported: "
                                  f"{', '.join(map(str, layout.SUPPORTED_MAJORS))})", path,
                                  pos + _HDR.field("major").offset, "header.major", group=index,
                                  code="unsupported-version", hint="upgrade kvconv"))
            break
        hcrc = _header_crc(bytes(buf[pos : pos + 60]), live=bool(int(hdr["flags"]) & LIVE))
        if hcrc != int(hdr["header_crc32"]):
            problem("error", _err(FormatError, f"header checksum {int(hdr['header_crc32']):#010x} does not match "
                                  f"{hcrc:#010x}", path, pos + _HDR.field("header_crc32").offset,
                                  "header.header_crc32", group=index, code="header-checksum",
                                  hint="the header is damaged"))
            break
        if int(hdr["header_size"]) != layout.HEADER_SIZE:
            problem("error", _err(FormatError, f"header_size is {int(hdr['header_size'])}, expected "
                                  f"{layout.HEADER_SIZE}", path, pos + _HDR.field("header_size").offset,
                                  "header.header_size", group=index, code="bad-header-size"))
            break
        if minor > layout.MINOR:
            problem("warning", _err(FormatError, f"format minor version {minor} is newer than {layout.MINOR}; "
                                    "fields added since are ignored", path, pos + _HDR.field("minor").offset,
                                    "header.minor", group=index, code="newer-minor"))
        rsize, count = int(hdr["record_size"]), int(hdr["record_count"])
        kind = layout.KINDS_BY_ID.get(int(hdr["record_kind"]))
        payload = pos + layout.HEADER_SIZE
        left = size - payload
        if rsize == 0 and count:
            problem("error", _err(FormatError, "record_size is 0", path, pos + _HDR.field("record_size").offset,
                                  "header.record_size", group=index, code="record-size-mismatch"))
            break
        nbytes = count * rsize
        lost = 0
        live = bool(int(hdr["flags"]) & LIVE)
        if live and not any(p.code == "unfinished" for p in probs):
            problem("warning", _err(FormatError, "written live by a producer that did not finish (it died or was "
                                    "killed): each group holds what it had published; header.drop_count counts "
                                    "records possibly lost", path, pos + _HDR.field("flags").offset, "header.flags",
                                    group=index, code="unfinished"))
        if nbytes > left:
            whole = left // rsize if rsize else 0
            # More than the whole file: a damaged count, unless the producer's capacity vouches for it (a big
            # group cut short, e.g. a 1M-event buffer of which the first half reached the disk). Groups without a
            # capacity (metadata, strings, tables) have nothing to vouch for or contradict their count: either.
            cap = int(hdr["capacity"])
            if nbytes > size and not (0 < count <= cap):
                code, msg = "count-exceeds-file", (
                    f"record_count {count:,} x record_size {rsize} = {nbytes:,} bytes exceeds the whole file "
                    f"({size:,} bytes)" + (f" and the group's capacity ({cap:,} records)" if cap else ""))
            else:
                code, msg = "truncated-payload", (
                    f"payload of {count:,} records ends {nbytes - left:,} bytes past the end of the file "
                    f"({whole:,} whole records present)")
            if options.salvage and kind is not None and kind.record_size == rsize:
                if not kind.layout:
                    whole = 0  # a byte blob (metadata JSON, strings) cut short is not readable in part
                problem("warning", _err(FormatError, msg + f"; salvaged {whole:,}, lost {count - whole:,}"
                                        + ("" if kind.layout else f" (the {kind.name} cannot be read in part)"),
                                        path, pos + _HDR.field("record_count").offset, "header.record_count",
                                        group=index, code="salvaged"))
                lost = count - whole
                count, nbytes = whole, whole * rsize
                if not kind.layout:
                    break
            else:
                if code == "count-exceeds-file" and cap:
                    hint = "the header's record_count is damaged"
                elif code == "count-exceeds-file" and not options.salvage:
                    hint = "the file was cut short, or record_count is damaged; try --salvage"
                elif options.salvage:
                    hint = ("the file was cut short, and records of an unknown kind or size cannot be salvaged")
                else:
                    hint = "the file was cut short; try --salvage"
                problem("error", _err(FormatError, msg, path, pos + _HDR.field("record_count").offset,
                                      "header.record_count", group=index, code=code, hint=hint))
                break
        if kind is None:
            problem("warning", _err(FormatError, f"unknown record kind {int(hdr['record_kind'])}; group skipped",
                                    path, pos + _HDR.field("record_kind").offset, "header.record_kind",
                                    group=index, code="unknown-kind"))
            recs = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=payload)
        elif kind.record_size != rsize:
            problem("error", _err(FormatError, f"record_size is {rsize} for {kind.name} records, expected "
                                  f"{kind.record_size}", path, pos + _HDR.field("record_size").offset,
                                  "header.record_size", group=index, code="record-size-mismatch"))
            recs = None
        else:
            recs = np.frombuffer(buf, dtype=layout.kind_dtype(kind), count=count, offset=payload)
        if recs is not None:
            g = Group(index=index, offset=pos, header=hdr, kind=kind, records=recs, path=path, lost_records=lost)
            # A large file's pages are given back as the CRC goes (the page cache keeps them): a command that then
            # reads only a part of the file stays in bounded memory.
            if options.verify_checksums and not lost and not g.crc_ok(
                    release=(lambda lo, n: release_pages(mm, lo, n)) if size > RELEASE_AFTER_CRC else None):
                problem("error", _err(FormatError, "payload checksum does not match header.payload_crc32", path,
                                      payload, "header.payload_crc32", group=index, code="payload-checksum",
                                      hint="the records are damaged"))
            d.groups.append(g)
        if lost:
            break  # the file ends inside this group: what follows is the cut-off rest of a record
        # A live group reserves `capacity` records; the space past its published ones may not exist on disk yet.
        pos = payload + layout.padded(max(nbytes, int(hdr["capacity"]) * rsize if live else 0))
        index += 1
    if options.salvage and not d.groups and not any(p.severity == "error" for p in probs):
        # Salvage that kept nothing has checked nothing: never let it read as a valid, empty dump.
        problem("error", _err(FormatError, "no whole record group could be salvaged: nothing to check", path, 0,
                              "header", code="nothing-salvaged",
                              hint="the file was cut inside its first group; record or copy it again"))
    return d


def _header_crc(head: bytes, *, live: bool) -> int:
    if live:
        b = bytearray(head)
        for off, n in _LIVE_VOLATILE:
            if off < len(b):
                b[off : off + n] = bytes(n)
        head = bytes(b)
    return zlib.crc32(head)


def open(path: str | os.PathLike, *, options: ReadOptions = ReadOptions()) -> Dump:  # noqa: A001 - paired with new()
    """Open a dump for reading. Raises the first structural error; warnings go through :mod:`warnings`."""
    d = scan(path, options=options)
    for p in d.problems:
        if p.severity == "error":
            d.close()
            raise FormatError(p.message, path=p.path, group=p.group, offset=p.offset, field=p.field, code=p.code)
    for p in d.problems:
        warnings.warn(p.line(), DumpWarning, stacklevel=2)
    return d


def open_many(paths, *, options: ReadOptions = ReadOptions()) -> list[Dump]:
    """Open several dumps (several contexts, GPUs or processes); closes those already open if one fails."""
    out: list[Dump] = []
    try:
        for p in paths:
            out.append(open(p, options=options))
    except BaseException:
        for d in out:
            d.close()
        raise
    return out


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
    h = np.zeros(1, dtype=H)
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
        clock_domain = layout.ENUMS["clock_domain"][_DEFAULT_CLOCK.get(kind.name, "none")]
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
    """Writes groups to a temporary file; :meth:`close` renames it into place, :meth:`abort` removes it."""

    def __init__(self, path: str | os.PathLike, *, context_id: int = 0, device_id: int = 0) -> None:
        from kvconv.atomic import atomic_output

        self.path = Path(path)
        self.context_id = context_id
        self.device_id = device_id
        # dump.new(path) replaces its path, as open(path, "w") would (a library call, not a user's -o)
        self._cm = atomic_output(self.path, kind="kvdump", force=True)
        self._tmp = self._cm.__enter__()
        self._f = builtins.open(self._tmp, "wb")
        self._closed = False

    def __enter__(self) -> "DumpWriter":
        return self

    def __exit__(self, et, ev, tb) -> None:
        if et is None:
            self.close()
        else:
            self.abort(et, ev, tb)

    def write_raw_group(self, kind: layout.RecordKind, payload: bytes | memoryview, *, record_count: int,
                        **header) -> None:
        crc = zlib.crc32(payload)
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
        self._f.write(b"\0" * (layout.padded(nbytes) - nbytes))
        end = self._f.tell()
        self._f.seek(at)
        self._f.write(make_header(kd, record_count=count, payload_crc32=crc, **header))
        self._f.seek(end)
        return count

    def write_bytes(self, kind: str, data: bytes, **header) -> None:
        self.write_raw_group(layout.KINDS[kind], data, record_count=len(data), **header)

    def write_metadata(self, meta: dict, **header) -> None:
        self.write_bytes("metadata", json.dumps(meta, sort_keys=True, separators=(",", ":")).encode(), **header)

    def write_strings(self, table: StringTable | bytes, **header) -> None:
        self.write_bytes("strings", table.blob() if isinstance(table, StringTable) else table, **header)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._f.close()
        self._cm.__exit__(None, None, None)

    def abort(self, et=None, ev=None, tb=None) -> None:
        if self._closed:
            return
        self._closed = True
        self._f.close()
        try:
            self._cm.__exit__(et or RuntimeError, ev or RuntimeError("aborted"), tb)
        except BaseException:
            pass


def new(path: str | os.PathLike, *, context_id: int = 0, device_id: int = 0) -> DumpWriter:
    """Start writing a dump at ``path`` (atomically: nothing appears there until :meth:`DumpWriter.close`)."""
    return DumpWriter(path, context_id=context_id, device_id=device_id)
