"""Read kvconv dumps: :func:`open` (mmap + numpy views, no copies) and :func:`scan` (every structural problem
collected instead of raised). Its pair, :func:`kvconv.format.writer.new`, writes them; both are reached as
``dump.open`` / ``dump.new`` (:mod:`kvconv.format.dump`).

    >>> from kvconv.format import reader
    >>> with reader.open("fixtures/qwen3-14b/qwen3-14b.kvdump") as d:
    ...     len(d.records("graph_node")), d.contexts()
    (280, [(0, 0)])

Header counts are never trusted beyond the file's size; a file larger than memory is fine, since the views are backed
by the page cache and :meth:`Group.chunks` walks them in bounded slices.
"""

from __future__ import annotations

import builtins
import json
import mmap
import os
import stat
import sys
import tempfile
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from kvconv.format import holds, layout
from kvconv.format.errors import DamagedError, FormatError, SchemaError
from kvconv.format.findings import Finding

H = layout.HEADER_DTYPE
_HDR = layout.LAYOUTS["header"]
LIVE = layout.ENUMS["header_flags"]["live"]
# A live group's header (written in place by a running producer) is checksummed with these fields as 0: they are
# the only ones that change, each with one 8-byte store, so the header checks at every instant.
_LIVE_VOLATILE = [(_HDR.field(f).offset, _HDR.field(f).size) for f in ("record_count", "drop_count", "payload_crc32")]
DEFAULT_CHUNK = 1 << 20  # records per chunk when walking large groups
RELEASE_AFTER_CRC = 256 << 20  # files larger than this give the pages their payload CRC read back

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

    @property
    def checksummed(self) -> bool:
        """The payload has a checksum to compare: not a live group (its producer never summed it: its
        payload_crc32 is 0) and not cut short (salvage). Every reader claims a checksum only for these groups."""
        return not self.live and not self.lost_records

    def payload_bytes(self) -> memoryview:
        return memoryview(self.records.view(np.uint8).reshape(-1)) if len(self.records) else memoryview(b"")

    def crc_ok(self, *, release=None) -> bool:
        """The payload matches its CRC. ``release(offset, nbytes)``: called on each file range once it is summed."""
        if not self.checksummed:
            return True  # a live group's payload_crc32 is 0 (not computed while the producer ran); a cut one is short
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

    def __enter__(self) -> Dump:
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


STDIN = "-"  # an input named "-" is standard input
_SPOOL_CHUNK = 1 << 20
_EMPTY = {"pipe": "nothing was piped in: pipe a kvconv dump, or name the file", "device": "it gave no bytes"}
_stdin_copy: list = []  # the process's one copy of a piped standard input (it can be read only once)


def _spool(src, path: str):
    """A pipe's bytes in an unlinked temporary file (the map needs a file; memory stays one chunk; nothing is left
    behind, even on a kill): the dump of ``kvconv validate -`` or ``... | kvconv info /dev/stdin``."""
    tmp = tempfile.TemporaryFile(prefix="kvconv-stdin-")
    try:
        while chunk := src.read(_SPOOL_CHUNK):
            tmp.write(chunk)
        tmp.flush()
    except OSError as e:
        tmp.close()
        raise FormatError(f"cannot read the input: {e.strerror}", path=path, code="unreadable") from None
    return tmp


def _decompressor(head: bytes):
    """(name, a function file -> decompressing reader, the errors it raises on a damaged stream) for a compressed
    dump's first bytes; None for any other file, or for zstd without the ``zstandard`` package (the reader then says
    how to decompress it)."""
    import bz2
    import gzip
    import lzma

    if head.startswith(b"\x1f\x8b"):
        return "gzip", lambda f: gzip.GzipFile(fileobj=f, mode="rb"), (OSError, ValueError, EOFError)
    if head.startswith(b"BZh"):
        return "bzip2", lambda f: bz2.BZ2File(f, mode="rb"), (OSError, ValueError, EOFError)
    if head.startswith(b"\xfd7zXZ\x00"):
        return "xz", lambda f: lzma.LZMAFile(f, mode="rb"), (lzma.LZMAError, OSError, EOFError)
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        try:
            import zstandard
        except ImportError:
            return None
        return ("zstd", lambda f: zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True),
                (zstandard.ZstdError, OSError, EOFError))
    return None


def _decompress(f, path: str):
    """A compressed dump (fixtures ship as .kvdump.gz) decompressed into an unlinked temporary file, a chunk at a
    time (memory: one chunk; disk: the dump's size in TMPDIR, freed when it is closed); byte offsets in messages are
    then the decompressed dump's. A stream cut short keeps what it held: the reader then says where the dump ends."""
    got = _decompressor(os.pread(f.fileno(), 8, 0))
    if got is None:
        return f
    name, reader, errors = got
    f.seek(0)
    tmp = tempfile.TemporaryFile(prefix="kvconv-unpacked-")
    src = reader(f)
    read = getattr(src, "read1", src.read)  # read1: what is decompressed so far (read() drops it at a cut)
    try:
        while True:
            try:
                chunk = read(_SPOOL_CHUNK)
            except EOFError:  # the compressed stream was cut short
                if not tmp.tell():
                    tmp.close()
                    f.close()
                    raise FormatError(f"{name}-compressed and cut short before anything could be decompressed",
                                      path=path, offset=0, field="header.magic", code="unreadable",
                                      hint="copy or download it again") from None
                break
            if not chunk:
                break
            tmp.write(chunk)
    except errors as e:
        tmp.close()
        f.close()
        raise FormatError(f"{name}-compressed, but cannot be decompressed ({e})", path=path, offset=0,
                          field="header.magic", code="unreadable", hint=f"test it with {name} -t") from None
    tmp.flush()
    f.close()
    return tmp


def _open_file(path: str):
    """The file, its size, its read-only map (None when empty) and whether it was piped (not a regular file: read
    through a temporary copy; "pipe" for a pipe or socket, "device" else); an unopenable path is a FormatError."""
    try:
        f = os.fdopen(os.dup(sys.stdin.fileno()), "rb") if path == STDIN else builtins.open(path, "rb")
    except FileNotFoundError:
        raise FormatError("no such file", path=path, code="not-found", hint="check the path") from None
    except IsADirectoryError:
        raise FormatError("is a folder, not a dump file", path=path, code="not-a-file") from None
    except OSError as e:
        raise FormatError(f"cannot open: {e.strerror}", path=path, code="unreadable") from None
    mode = os.fstat(f.fileno()).st_mode
    piped = not stat.S_ISREG(mode) and ("pipe" if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) else "device")
    if piped and path == STDIN and _stdin_copy:  # read again in this process (report, diff): the same bytes
        f.close()
        f = os.fdopen(os.dup(_stdin_copy[0].fileno()), "rb")
    elif piped:
        spooled = _spool(f, path)
        f.close()
        if path == STDIN:  # standard input is read once per process; later opens of "-" share its copy
            _stdin_copy.append(spooled)
            f = os.fdopen(os.dup(spooled.fileno()), "rb")
        else:
            f = spooled
    f = _decompress(f, path)
    size = os.fstat(f.fileno()).st_size
    mm = None
    if size:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            f.close()
            raise FormatError(f"cannot map file: {e}", path=path, code="unreadable") from None
    return f, size, mm, piped


@dataclass
class _Scan:
    """What the steps of :func:`scan` share: the mapped file, the options, and the dump being filled in."""

    d: Dump
    buf: object
    options: ReadOptions

    def problem(self, severity: str, msg: str, offset: int, fld: str, *, group: int | None, code: str,
                hint: str | None = None) -> None:
        err = FormatError(msg, path=self.d.path, offset=offset, field=fld, group=group, code=code, hint=hint)
        self.d.problems.append(Finding.from_error(err, severity))

    def cut_hint(self, index: int, nothing_left: str) -> str:
        """What to do about a file cut short: --salvage, unless it is already on (then say what it could not do)."""
        if not self.options.salvage:
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
    f, size, mm, piped = _open_file(path)
    d = Dump(path=path, size=size, groups=[], _mm=mm, _file=f)
    s = _Scan(d=d, buf=mm if mm is not None else b"", options=options)
    if size == 0:
        s.problem("error", "empty input" if piped else "empty file", 0, "header", group=None, code="truncated-header",
                  hint=_EMPTY.get(piped, "the producer wrote nothing"))
        return d
    pos, index = 0, 0
    while pos is not None and pos < size:
        hdr = _header_at(s, pos, index)
        pos = None if hdr is None else _group_at(s, pos, index, hdr)
        index += 1
    cut = holds.problem(d, salvage=options.salvage) if d.groups else None  # a cut at a group boundary
    d.problems += [cut] if cut is not None else []
    if options.salvage and not d.groups and not any(p.severity == "error" for p in d.problems):
        # Salvage that kept nothing has checked nothing: never let it read as a valid, empty dump.
        s.problem("error", "no whole record group could be salvaged: nothing to check", 0, "header", group=None,
                  code="nothing-salvaged", hint="the file was cut inside its first group; record or copy it again")
    return d


# Magic numbers of the compressors a dump is shipped with: (magic, (name, the command that undoes it)).
_COMPRESSED = ((b"\x1f\x8b", ("gzip", "gunzip")), (b"\x28\xb5\x2f\xfd", ("zstd", "unzstd")),
               (b"\xfd7zXZ\x00", ("xz", "unxz")), (b"BZh", ("bzip2", "bunzip2")))


def _header_at(s: _Scan, pos: int, index: int) -> np.void | None:
    """The header of group ``index`` at ``pos``, or None (a problem recorded) when it cannot be trusted."""
    size, buf = s.d.size, s.buf
    head = bytes(buf[pos : pos + min(8, size - pos)])
    if not layout.MAGIC.startswith(head):
        # Checked first, even on a stub shorter than a header: a text file is "not a kvconv dump", not "cut".
        packed = next((c for m, c in _COMPRESSED if head.startswith(m)), None) if index == 0 else None
        if packed is not None:  # a compressed dump (four fixtures ship as .kvdump.gz): say how to read it
            tool, flag = packed
            s.problem("error", f"{tool}-compressed: {flag} it first", pos, "header.magic", group=index,
                      code="bad-magic", hint=f"{flag} -k {s.d.path}")
            return None
        what = "bad magic" if index == 0 else "bad magic at the start of a record group"
        s.problem("error", f"{what} {head!r}", pos, "header.magic", group=index, code="bad-magic",
                  hint="not a kvconv dump" if index == 0 else "the file is damaged here")
        return None
    if size - pos < layout.HEADER_SIZE:
        s.problem("warning" if s.options.salvage and index > 0 else "error",
                  f"file ends {size - pos} byte{'s' * (size - pos != 1)} into a 64-byte header", pos, "header",
                  group=index, code="truncated-header",
                  hint=s.cut_hint(index, "its first header is incomplete, so no group can be read"))
        return None
    hdr = np.frombuffer(buf, dtype=H, count=1, offset=pos)[0]
    major, minor = int(hdr["major"]), int(hdr["minor"])
    if major not in layout.SUPPORTED_MAJORS:
        s.problem("error", f"format major version {major} is not supported (supported: "
                  f"{', '.join(map(str, layout.SUPPORTED_MAJORS))})", pos + _HDR.field("major").offset,
                  "header.major", group=index, code="unsupported-version", hint="upgrade kvconv")
        return None
    hcrc = _header_crc(bytes(buf[pos : pos + 60]), live=bool(int(hdr["flags"]) & LIVE))
    if hcrc != int(hdr["header_crc32"]):
        s.problem("error", f"header checksum {int(hdr['header_crc32']):#010x} does not match {hcrc:#010x}",
                  pos + _HDR.field("header_crc32").offset, "header.header_crc32", group=index,
                  code="header-checksum", hint="the header is damaged")
        return None
    if int(hdr["header_size"]) != layout.HEADER_SIZE:
        s.problem("error", f"header_size is {int(hdr['header_size'])}, expected {layout.HEADER_SIZE}",
                  pos + _HDR.field("header_size").offset, "header.header_size", group=index,
                  code="bad-header-size")
        return None
    if minor > layout.MINOR:
        s.problem("warning", f"format minor version {minor} is newer than {layout.MINOR}; fields added since are "
                  "ignored", pos + _HDR.field("minor").offset, "header.minor", group=index, code="newer-minor")
    return hdr


def _group_at(s: _Scan, pos: int, index: int, hdr: np.void) -> int | None:
    """Read group ``index`` (its trusted header ``hdr`` at ``pos``) into ``s.d.groups``; the position of the next
    group, or None when reading must stop here."""
    rsize, count = int(hdr["record_size"]), int(hdr["record_count"])
    kind = layout.KINDS_BY_ID.get(int(hdr["record_kind"]))
    payload = pos + layout.HEADER_SIZE
    if rsize == 0 and count:
        s.problem("error", "record_size is 0", pos + _HDR.field("record_size").offset, "header.record_size",
                  group=index, code="record-size-mismatch")
        return None
    live = bool(int(hdr["flags"]) & LIVE)
    if live and not any(p.code == "unfinished" for p in s.d.problems):
        s.problem("warning", "written live by a producer that did not finish (it died or was killed): each group "
                  "holds what it had published; header.drop_count counts records possibly lost",
                  pos + _HDR.field("flags").offset, "header.flags", group=index, code="unfinished")
    fit = _fit_payload(s, pos, index, hdr, kind)
    if fit is None:
        return None
    count, nbytes, lost = fit
    recs = _records_view(s, pos, index, hdr, kind, count, nbytes)
    if recs is not None:
        g = Group(index=index, offset=pos, header=hdr, kind=kind, records=recs, path=s.d.path, lost_records=lost)
        # A large file's pages are given back as the CRC goes (the page cache keeps them): a command that then
        # reads only a part of the file stays in bounded memory.
        mm = s.d._mm
        if s.options.verify_checksums and not lost and not g.crc_ok(
                release=(lambda lo, n: release_pages(mm, lo, n)) if s.d.size > RELEASE_AFTER_CRC else None):
            s.problem("error", "payload checksum does not match header.payload_crc32", payload,
                      "header.payload_crc32", group=index, code="payload-checksum", hint="the records are damaged")
        s.d.groups.append(g)
    if lost:
        return None  # the file ends inside this group: what follows is the cut-off rest of a record
    # A live group reserves `capacity` records; the space past its published ones may not exist on disk yet.
    return payload + layout.padded(max(nbytes, int(hdr["capacity"]) * rsize if live else 0))


def _fit_payload(s: _Scan, pos: int, index: int, hdr: np.void, kind) -> tuple[int, int, int] | None:
    """``(count, nbytes, lost)`` of the records the file holds for this group: all of them, or (salvage) the whole
    records before the file's end; None (a problem recorded) when the group cannot be read."""
    rsize, count, cap = int(hdr["record_size"]), int(hdr["record_count"]), int(hdr["capacity"])
    size, nbytes = s.d.size, count * rsize
    left = size - pos - layout.HEADER_SIZE
    if nbytes <= left:
        return count, nbytes, 0
    whole = left // rsize if rsize else 0
    # More than the whole file: a damaged count, unless the producer's capacity vouches for it (a big group cut
    # short, e.g. a 1M-event buffer of which the first half reached the disk). Groups without a capacity (metadata,
    # strings, tables) have nothing to vouch for or contradict their count: either.
    if nbytes > size and not (0 < count <= cap):
        code, msg = "count-exceeds-file", (
            f"record_count {count:,} x record_size {rsize} = {nbytes:,} bytes exceeds the whole file "
            f"({size:,} bytes)" + (f" and the group's capacity ({cap:,} records)" if cap else ""))
    else:
        code, msg = "truncated-payload", (
            f"payload of {count:,} records ends {nbytes - left:,} bytes past the end of the file "
            f"({whole:,} whole records present)")
    at = pos + _HDR.field("record_count").offset
    if s.options.salvage and kind is not None and kind.record_size == rsize:
        if not kind.layout:
            whole = 0  # a byte blob (metadata JSON, strings) cut short is not readable in part
        s.problem("warning", msg + f"; salvaged {whole:,}, lost {count - whole:,}"
                  + ("" if kind.layout else f" (the {kind.name} cannot be read in part)"), at,
                  "header.record_count", group=index, code="salvaged")
        return None if not kind.layout else (whole, whole * rsize, count - whole)
    if code == "count-exceeds-file" and cap:
        hint = "the header's record_count is damaged"
    elif code == "count-exceeds-file" and not s.options.salvage:
        hint = "the file was cut short, or record_count is damaged; try --salvage"
    elif s.options.salvage:
        hint = "the file was cut short, and records of an unknown kind or size cannot be salvaged"
    else:
        hint = "the file was cut short; try --salvage"
    s.problem("error", msg, at, "header.record_count", group=index, code=code, hint=hint)
    return None


def _records_view(s: _Scan, pos: int, index: int, hdr: np.void, kind, count: int, nbytes: int) -> np.ndarray | None:
    """The zero-copy view of a group's records (its raw bytes for an unknown kind), or None (a problem recorded)
    when its record size is not its kind's."""
    payload, rsize = pos + layout.HEADER_SIZE, int(hdr["record_size"])
    if kind is None:
        s.problem("warning", f"unknown record kind {int(hdr['record_kind'])}; group skipped",
                  pos + _HDR.field("record_kind").offset, "header.record_kind", group=index, code="unknown-kind")
        return np.frombuffer(s.buf, dtype=np.uint8, count=nbytes, offset=payload)
    if kind.record_size != rsize:
        s.problem("error", f"record_size is {rsize} for {kind.name} records, expected {kind.record_size}",
                  pos + _HDR.field("record_size").offset, "header.record_size", group=index,
                  code="record-size-mismatch")
        return None
    return np.frombuffer(s.buf, dtype=layout.kind_dtype(kind), count=count, offset=payload)


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
            cls = DamagedError if p.code == "payload-checksum" else FormatError  # damaged records: exit 1, not 2
            raise cls(p.message, path=p.path, group=p.group, offset=p.offset, field=p.field, code=p.code)
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
