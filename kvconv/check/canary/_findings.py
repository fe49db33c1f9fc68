"""The findings of one checked batch, in record order and, within a record, in the order a reader meets the fields
(name, geometry, flags, then expected / changed / excluded lists, then unexpected and missing pages). Only records
that have a finding cost Python work."""

from __future__ import annotations

import numpy as np

from kvconv.check.canary import _sets
from kvconv.check.canary._batch import KNOWN_FLAGS, LISTS, Batch
from kvconv.check.canary._text import describe_pages
from kvconv.format import layout
from kvconv.format.findings import Finding

_LAYOUT = layout.LAYOUTS["canary"]
_FIELD_OFFSET = {f.name: f.offset for f in _LAYOUT.fields}


class _Out:
    """Collects (record, order, finding) so the batch's findings come out as a per-record loop would give them."""

    def __init__(self, b: Batch, path: str) -> None:
        self.b, self.path = b, path
        self.items: list[tuple[int, int, Finding]] = []
        g = b.span.group
        self.first_offset = g.payload_offset + b.span.start * int(g.header["record_size"])
        self.rsize = int(g.header["record_size"])

    def add(self, i: int, order: int, severity: str, code: str, fld: str, msg: str) -> None:
        sp = self.b.span
        self.items.append((i, order, Finding(
            severity, code, msg, path=self.path, group=sp.group.index, record=sp.base + i,
            offset=self.first_offset + i * self.rsize + _FIELD_OFFSET[fld], field=f"canary.{fld}")))

    def label(self, i: int) -> str:
        c = self.b.cols
        return f"step {int(c['step'][i])} buffer {self.b.name(i)!r} (id {int(c['buffer_id'][i])})"

    def sorted(self) -> list[Finding]:
        return [f for _i, _o, f in sorted(self.items, key=lambda t: (t[0], t[1]))]


def _record_fields(o: _Out) -> None:
    b, c = o.b, o.b.cols
    blob_len = len(b.span.src.blob)
    for i in np.flatnonzero(c["name_off"] + c["name_len"] > blob_len).tolist():
        no, nl = int(c["name_off"][i]), int(c["name_len"][i])
        o.add(i, 0, "error", "canary-name-range", "name_off",
              f"buffer name at {no}+{nl} lies outside the strings group ({blob_len} bytes)")
    ps, cm = c["page_size"], c["compression"]
    for i in np.flatnonzero(ps * cm == 0).tolist():
        p, k = int(ps[i]), int(cm[i])
        o.add(i, 1, "error", "canary-geometry", "page_size" if p == 0 else "compression",
              f"{o.label(i)}: page_size {p} x compression {k} is 0 slots per page")
    unknown = c["flags"] & ~KNOWN_FLAGS
    for i in np.flatnonzero(unknown).tolist():
        o.add(i, 2, "warning", "canary-flags", "flags", f"{o.label(i)}: unknown flag bits {int(unknown[i]):#x}")


def _lists(o: _Out) -> None:
    b = o.b
    npages = len(b.span.src.pages)
    for k, lst in enumerate(LISTS):
        fld = f"{lst}_first"
        first, count = b.firsts[lst], b.counts[lst]
        for i in np.flatnonzero(~b.in_range[lst]).tolist():
            o.add(i, 3 + 3 * k, "error", "canary-pages-range", fld,
                  f"{o.label(i)}: {lst} pages {int(first[i])}+{int(count[i])} run past the canary_pages group "
                  f"({npages} pages)")
        if lst in b.unsorted:
            recs, v, nxt, at = b.unsorted[lst]
            for i, a, z, p in zip(recs.tolist(), v.tolist(), nxt.tolist(), at.tolist()):
                o.add(i, 4 + 3 * k, "error", "canary-pages-unsorted", fld,
                      f"{o.label(i)}: {lst} pages are not sorted and unique ({a} then {z} at canary_pages[{p}])")
        offs, vals = b.sets[lst]
        for i in _sets.over(offs, vals, b.cols["num_pages"]).tolist():
            seg = vals[offs[i] : offs[i + 1]]
            past = seg[seg >= b.cols["num_pages"][i]]
            o.add(i, 5 + 3 * k, "error", "canary-page-range", fld,
                  f"{o.label(i)}: {lst} page {int(past[0])} is not below num_pages {int(b.cols['num_pages'][i])}"
                  + (f" ({len(past)} pages)" if len(past) > 1 else ""))


def _pages(o: _Out) -> None:
    b = o.b
    spp = b.cols["page_size"] * b.cols["compression"]
    for which, order, code, fld, what in (
            ("unexpected", 12, "canary-unexpected-write", "changed_first", "changed outside the expected set"),
            ("missing", 13, "canary-missing-write", "expected_first", "did not change")):
        offs, vals = getattr(b, which)
        for i in np.flatnonzero(b.readable & (np.diff(offs) > 0)).tolist():
            pages = vals[offs[i] : offs[i + 1]]
            n = len(pages)
            noun = f"page{'s' if n != 1 else ''}" if which == "unexpected" else f"expected page{'s' if n != 1 else ''}"
            pages_text = describe_pages(pages, int(spp[i]))
            o.add(i, order, "error", code, fld, f"{o.label(i)}: {n} {noun} {what}: {pages_text}")


def findings(b: Batch, path: str) -> list[Finding]:
    """Every finding of the batch's records, in record order."""
    o = _Out(b, path)
    _record_fields(o)
    _lists(o)
    _pages(o)
    return o.sorted()
