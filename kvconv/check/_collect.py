"""What validate's checks share: the collector that turns vectorised masks into aggregated findings (the object a
record kind's own check receives, ``hook(d, c)``), the enum helpers and the look-up of small integer keys.

    >>> c = _Collector("run.kvdump")                                           # doctest: +SKIP
    >>> c.mask("error", "bad-range", "grid_x is 0", g, r["grid_x"] == 0, "grid_x")   # doctest: +SKIP
    >>> Lookup(np.array([1, 2, 5]))(np.array([2, 3], np.uint32))
    (array([1, 0]), array([ True, False]))
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kvconv.format import dump as dumpmod
from kvconv.format import layout
from kvconv.format.findings import Finding

RELEASE_BYTES = 256 << 20  # dumps larger than this give read pages back (the emitters' kvconv.emit._source)


class _Collector:
    """Turns vectorised masks into aggregated findings: one per (code, field, group, message), naming the first bad
    record and counting all of them, however many chunks the records were checked in."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.out: list[Finding] = []
        self._masked: dict[tuple, int] = {}  # (severity, code, message, group, field) -> its finding in out

    def add(self, severity, code, message, *, group=None, record=None, offset=None, field=None, count=1):
        self.out.append(Finding(severity, code, message, path=self.path, group=group, record=record,
                                offset=offset, field=field, count=count))

    def mask(self, severity, code, message, g: dumpmod.Group, bad: np.ndarray, fld: str, base: int = 0,
             values: np.ndarray | None = None) -> None:
        """Report records of group ``g`` where ``bad`` is true (``base`` = index of bad[0] within the group)."""
        idx = np.flatnonzero(bad)
        if not len(idx):
            return
        key = (severity, code, message, g.index, fld)
        at = self._masked.get(key)
        if at is not None:  # a later chunk of the same group: counted in the finding of the first bad record
            self.out[at] = replace(self.out[at], count=self.out[at].count + len(idx))
            return
        self._masked[key] = len(self.out)
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


def _known(kernel_slots: set[int] | None) -> np.ndarray:
    return np.array(sorted(kernel_slots or ()), dtype=np.uint64)


class Lookup:
    """Positions of values in a sorted unique ``table`` and whether each was found, for chunk after chunk.

    Kernel slots and grid ids are small, dense integers: a direct look-up table (built once) answers in one gather,
    several times faster than a binary search over a million events; a sparse table falls back to searchsorted."""

    def __init__(self, table: np.ndarray) -> None:
        self.table = table
        self.lut = None
        if len(table) and int(table[-1]) - int(table[0]) < _LUT_MAX:
            self.lo, self.hi = int(table[0]), int(table[-1])
            self.lut = np.full(self.hi - self.lo + 2, -1, dtype=np.int32)  # last entry: "outside the range"
            self.lut[table.astype(np.int64) - self.lo] = np.arange(len(table), dtype=np.int32)

    def __call__(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        table = self.table
        if not len(table):
            return np.zeros(len(values), dtype=np.intp), np.zeros(len(values), dtype=bool)
        if self.lut is not None:
            lo, hi = self.lo, self.hi
            t = values.dtype.type
            if lo > np.iinfo(values.dtype).max:
                return np.zeros(len(values), dtype=np.intp), np.zeros(len(values), dtype=bool)
            v = values - t(lo)  # wraps below lo to a huge value: clipped next
            pos = self.lut[np.minimum(v, t(min(hi - lo + 1, np.iinfo(values.dtype).max)))]
            return np.maximum(pos, 0), pos >= 0
        pos = np.minimum(np.searchsorted(table, values), len(table) - 1)
        return pos, table[pos] == values


_LUT_MAX = 1 << 22


def _crc_finding(c: _Collector, g: dumpmod.Group) -> None:
    """A group whose payload fails its checksum (validate's pass over the events, and every other group after it)."""
    c.add("error", "payload-checksum", "payload checksum does not match header.payload_crc32 (the records are "
          "damaged)", group=g.index, offset=g.payload_offset, field="header.payload_crc32")
