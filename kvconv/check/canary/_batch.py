"""One batch of canary records checked in numpy passes: columns, page sets, unexpected and missing pages; then the
findings and step dicts of that batch (Python work only for records that have a finding, or when steps are asked for).

A batch is a :class:`Span` of one canary group: at most ``CHUNK`` records and about ``BUDGET`` referenced pages, so a
dump of any size is checked in bounded memory, a batch at a time.

    >>> import os, tempfile
    >>> from kvconv.format import dump
    >>> from kvconv.capture.probe.writer import CanaryRecorder
    >>> p = os.path.join(tempfile.mkdtemp(), "c.kvdump")
    >>> with CanaryRecorder(p) as rec:
    ...     rec.add(step=0, buffer_id=0, name="k", num_pages=8, page_size=1, compression=1, expected=[1, 2],
    ...             changed=[2, 5])
    >>> with dump.open(p) as d:
    ...     (sp,) = spans(source(d, 0), d.groups_of("canary")[0], 0)
    ...     b = compute(sp)
    >>> tally(b)["unexpected_pages"], [(s["unexpected"], s["missing"]) for s in iter_step_dicts(b)]
    (1, [([5], [1])])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvconv.check.canary import _sets
from kvconv.format import dump, layout

FLAGS = layout.ENUMS["canary_flags"]
SNAPSHOT = {FLAGS["snapshot_clone"]: "clone", FLAGS["snapshot_checksum"]: "checksum"}
KNOWN_FLAGS = FLAGS["snapshot_clone"] | FLAGS["snapshot_checksum"]
LISTS = ("expected", "changed", "excluded")
COLUMNS = ("step", "host_ns", "buffer_id", "name_off", "name_len", "num_pages", "page_size", "compression", "flags")
CHUNK = 1 << 16  # records per batch at most
RELEASE_BYTES = 256 << 20  # dumps larger than this give read pages back after each batch (as the emitters do)
BUDGET = 1 << 21  # referenced pages per batch (about); a single record above it gets a batch of its own


@dataclass(frozen=True)
class Source:
    """What every batch of one context reads: its canary_pages (u32) and its strings. ``mm``: the dump's mapping
    when batches give the pages they read back (dumps over RELEASE_BYTES); ``pages_offset``: the file offset of
    ``pages[0]`` when they are the mapping itself (one canary_pages group)."""

    context_id: int
    pages: np.ndarray
    blob: bytes
    mm: object = None
    pages_offset: int | None = None


@dataclass(frozen=True)
class Span:
    """Records ``[start, stop)`` of one canary group; ``base``: the context's record index of ``start``."""

    src: Source
    group: object  # kvconv.format.dump.Group
    start: int
    stop: int
    base: int


@dataclass
class Batch:
    span: Span
    cols: dict  # COLUMNS -> per record (u64 fields as uint64, the others int64)
    firsts: dict  # list -> int64 first index into canary_pages, per record
    counts: dict  # list -> int64 count, per record
    in_range: dict  # list -> bool per record: the list lies inside canary_pages
    sets: dict  # list -> Csr, sorted and unique (empty where not in range)
    unsorted: dict  # list -> (records, value, next value, canary_pages index) of lists not sorted and unique
    readable: np.ndarray
    unexpected: _sets.Csr
    missing: _sets.Csr
    texts: list  # distinct names (None: outside the strings group)
    name_of: np.ndarray  # record -> index into texts

    def name(self, i: int) -> str:
        t = self.texts[self.name_of[i]]
        return t if t is not None else f"buffer{int(self.cols['buffer_id'][i])}"

    def sizes(self, which: str) -> np.ndarray:
        return np.diff(getattr(self, which)[0])


def source(d, ctx: int) -> Source:
    pages = d.records("canary_pages", context_id=ctx)
    pages = pages["page"] if len(pages) else np.zeros(0, dtype="<u4")
    pg = d.groups_of("canary_pages", context_id=ctx)
    mm = getattr(d, "_mm", None) if d.size > RELEASE_BYTES else None
    return Source(ctx, pages, d.strings(context_id=ctx), mm, pg[0].payload_offset if len(pg) == 1 else None)


def release(b: Batch) -> None:
    """The batch's records and the page lists they referenced, once copied out (everything a Batch holds is)."""
    sp, src = b.span, b.span.src
    if src.mm is None:
        return
    rs = int(sp.group.header["record_size"])
    dump.release_pages(src.mm, sp.group.payload_offset + sp.start * rs, (sp.stop - sp.start) * rs)
    if src.pages_offset is not None:
        ends = [b.firsts[k] + b.counts[k] for k in LISTS]
        ok = [b.in_range[k] & (b.counts[k] > 0) for k in LISTS]
        lo = min((int(b.firsts[k][m].min()) for k, m in zip(LISTS, ok) if m.any()), default=None)
        if lo is not None:
            hi = max(int(e[m].max()) for e, m in zip(ends, ok) if m.any())
            step = src.pages.strides[0]  # bytes per canary_pages record
            dump.release_pages(src.mm, src.pages_offset + step * lo, step * (hi - lo))


def spans(src: Source, g, base: int):
    """The group's records cut into batches of at most CHUNK records and about BUDGET referenced pages."""
    n, npages = len(g.records), len(src.pages)
    for s in range(0, n, CHUNK):
        r = g.records[s : s + CHUNK]
        tot = np.ones(len(r), dtype=np.int64)
        for lst in LISTS:
            f, c = r[f"{lst}_first"].astype(np.int64), r[f"{lst}_count"].astype(np.int64)
            tot += np.where(f + c <= npages, c, 0)
        cum = np.cumsum(tot)
        a = 0
        while a < len(r):
            b = max(int(np.searchsorted(cum, (cum[a - 1] if a else 0) + BUDGET, "right")), a + 1)
            yield Span(src, g, s + a, s + b, base + s + a)
            a = b


def _names(blob: bytes, off: np.ndarray, ln: np.ndarray) -> tuple[list, np.ndarray]:
    key = (off.astype(np.uint64) << np.uint64(32)) | ln.astype(np.uint64)
    uniq, inv = np.unique(key, return_inverse=True)
    texts = []
    for k in uniq.tolist():
        o, n = k >> 32, k & 0xFFFFFFFF
        texts.append(blob[o : o + n].decode("utf-8", "replace") if o + n <= len(blob) else None)
    return texts, inv.reshape(-1)


def compute(sp: Span, *, missing_writes: bool = True) -> Batch:
    """Check every record of the span at once."""
    recs = sp.group.records[sp.start : sp.stop]
    pages = sp.src.pages
    # u64 columns (step, host_ns) stay u64: int64 would turn the top half negative
    cols = {c: recs[c].astype(np.uint64 if recs.dtype[c].itemsize == 8 else np.int64) for c in COLUMNS}
    firsts, counts, in_range, sets, unsorted = {}, {}, {}, {}, {}
    for lst in LISTS:
        first, count = recs[f"{lst}_first"].astype(np.int64), recs[f"{lst}_count"].astype(np.int64)
        ok = first + count <= len(pages)
        offs, vals = _sets.gather(pages, np.where(ok, first, 0), np.where(ok, count, 0))
        bad, at = _sets.first_unsorted(offs, vals)
        if len(bad):
            unsorted[lst] = (bad, vals[at], vals[at + 1], first[bad] + at - offs[bad])
            offs, vals = _sets.sort_unique(offs, vals)
        firsts[lst], counts[lst], in_range[lst], sets[lst] = first, count, ok, (offs, vals)
    readable = in_range["expected"] & in_range["changed"] & in_range["excluded"]
    exp, chg, exc = (_sets.keyed(sets[lst]) for lst in LISTS)
    unexpected = _sets.difference(sets["changed"], exp, exc, keys=chg)
    missing = (_sets.difference(sets["expected"], chg, exc, keys=exp) if missing_writes
               else (np.zeros(len(recs) + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)))
    texts, name_of = _names(sp.src.blob, cols["name_off"], cols["name_len"])
    b = Batch(sp, cols, firsts, counts, in_range, sets, unsorted, readable, unexpected, missing, texts, name_of)
    release(b)
    return b


def tally(b: Batch) -> dict:
    """This batch's share of the summary counts."""
    un, mi = b.sizes("unexpected")[b.readable], b.sizes("missing")[b.readable]
    return {"steps_checked": int(b.readable.sum()), "steps_with_unexpected": int(np.count_nonzero(un)),
            "steps_with_missing": int(np.count_nonzero(mi)), "unexpected_pages": int(un.sum()),
            "missing_pages": int(mi.sum())}


def flagged(b: Batch) -> np.ndarray:
    """Readable records with an unexpected or a missing page."""
    return b.readable & ((b.sizes("unexpected") > 0) | (b.sizes("missing") > 0))


def iter_step_dicts(b: Batch, which: np.ndarray | None = None, *, size: int = 4096):
    """The step dicts of the readable records (of ``which`` of them, a bool mask, when given), ``size`` at a time:
    a batch's dicts are never all held at once."""
    idx = np.flatnonzero(b.readable if which is None else (b.readable & which))
    for s in range(0, len(idx), size):
        yield from step_dicts(b, idx[s : s + size])


def step_dicts(b: Batch, idx: np.ndarray) -> list[dict]:
    """The step dicts of records ``idx`` (readable ones)."""
    if not len(idx):
        return []
    c = {k: v[idx].tolist() for k, v in b.cols.items()}
    lists = {}
    for key, (offs, vals) in (*b.sets.items(), ("unexpected", b.unexpected), ("missing", b.missing)):
        vl, lo, hi = vals.tolist(), offs[idx].tolist(), offs[idx + 1].tolist()
        lists[key] = [vl[x:y] for x, y in zip(lo, hi)]
    ctx, base = b.span.src.context_id, b.span.base
    out = []
    for j, i in enumerate(idx.tolist()):
        ps, cm, fl = c["page_size"][j], c["compression"][j], c["flags"][j]
        out.append({
            "context_id": ctx, "step": c["step"][j], "buffer_id": c["buffer_id"][j], "buffer": b.name(i),
            "host_ns": c["host_ns"][j], "num_pages": c["num_pages"][j], "page_size": ps, "compression": cm,
            "slots_per_page": ps * cm, "snapshot": SNAPSHOT.get(fl & KNOWN_FLAGS, "unknown"), "record": base + i,
            "expected": lists["expected"][j], "changed": lists["changed"][j], "excluded": lists["excluded"][j],
            "unexpected": lists["unexpected"][j], "missing": lists["missing"][j],
        })
    return out
