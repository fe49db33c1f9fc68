"""Load stage: a context's device block-enter events in sequence order, and the drop counters of both sides.

    >>> ev = load_events(d, ctx, notes)        # doctest: +SKIP
    >>> ev.n, ev.pos[:3]                        # block-enter slots, gaps included
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvconv.format import layout
from kvconv.format.errors import SchemaError
from kvconv.join.notes import Notes

_EV_FLAGS = layout.ENUMS["event_flags"]
BLOCK_ENTER = layout.ENUMS["event_kind"]["block_enter"]
SEQ_LIMIT = 1 << 48  # no device buffer has this many slots


@dataclass(frozen=True)
class Events:
    """Block-enter events of one context, in sequence order (arrays aligned, one entry per event)."""

    n_all: int  # device events of every kind
    idx: np.ndarray  # device index (into d.records("device_event", context_id=ctx))
    pos: np.ndarray  # i8: block-enter slot (sequence minus the other events' slots before it)
    gridid: np.ndarray
    tag: np.ndarray
    flags: np.ndarray
    has_gid: np.ndarray
    has_tag: np.ndarray
    slot: np.ndarray
    x: np.ndarray  # blockIdx
    y: np.ndarray
    z: np.ndarray
    t: np.ndarray  # %globaltimer ns

    @property
    def n(self) -> int:
        return len(self.idx)

    @property
    def other(self) -> int:
        return self.n_all - len(self.idx)


def load_events(d, ctx: int, notes: Notes) -> Events:
    ev = d.records("device_event", context_id=ctx)
    kinds = ev["kind"]
    be = np.flatnonzero(kinds == BLOCK_ENTER)
    other = int(len(ev) - len(be))
    seq = ev["sequence"][be]
    if len(seq) > 1 and np.any(seq[1:] < seq[:-1]):
        o = np.argsort(seq, kind="stable")
        be, seq = be[o], seq[o]
    # non-block-enter events consume sequence numbers too; positions count block-enter slots only
    if len(seq) and int(seq[-1]) >= SEQ_LIMIT:
        # A slot sequence can never exceed the buffer it indexes: numbers this large are damage. Keep the event
        # order, give up the gap information (positions are ranks), and say so.
        notes.add("error", "sequence-range", f"device event sequences reach {int(seq[-1]):,}, beyond any buffer; "
                  "the ordered join uses event order without gap positions", kind="device_event", index=int(be[-1]),
                  listed=False)
        pos = np.arange(len(seq), dtype=np.int64)
    elif other:
        oseq = np.sort(ev["sequence"][kinds != BLOCK_ENTER])
        pos = seq.astype(np.int64) - np.searchsorted(oseq, seq).astype(np.int64)
    else:
        pos = seq.astype(np.int64)
    if len(be) == len(ev) and (len(be) < 2 or bool(np.all(be[1:] > be[:-1]))):
        def col(name):  # every event a block entry, in sequence order: the columns as they are (no copy)
            return ev[name]
    else:
        def col(name):
            return ev[name][be]
    flags = col("flags")
    return Events(n_all=len(ev), idx=be, pos=pos, gridid=col("gridid"), tag=col("tag"), flags=flags,
                  has_gid=(flags & _EV_FLAGS["has_gridid"]) != 0, has_tag=(flags & _EV_FLAGS["has_tag"]) != 0,
                  slot=col("kernel_slot"), x=col("block_x"), y=col("block_y"), z=col("block_z"), t=col("globaltimer"))


@dataclass(frozen=True)
class Drops:
    """Per record kind: header drop_count, metadata counter, records lost to truncation, effective."""

    by_kind: dict

    @property
    def device(self) -> int:  # dropped + lost: records this dump lacks, which is what the joins need
        return self.by_kind["device_event"]["effective"]

    @property
    def host(self) -> int:
        return self.by_kind["graph_node"]["effective"] + self.by_kind["eager_launch"]["effective"]

    @property
    def device_lost(self) -> int:
        return self.by_kind["device_event"]["lost_records"]

    @property
    def host_lost(self) -> int:
        return self.by_kind["graph_node"]["lost_records"] + self.by_kind["eager_launch"]["lost_records"]

    def loss(self) -> str:
        """Why device events may be missing anywhere: dropped by the device, lost when the file was cut short."""
        from kvconv.join.notes import plural

        dropped, lost = self.device - self.device_lost, self.device_lost
        parts = ([f"the device dropped {plural(dropped, 'event')}"] if dropped else []) + (
            [f"{plural(lost, 'device event')} lost to truncation"] if lost else [])
        return " and ".join(parts) or "0 device events dropped or lost"


_COUNTERS = {"device_event": "device_event_drops", "graph_node": "graph_node_table_drops",
             "eager_launch": "eager_table_drops"}


def load_drops(d, ctx: int, notes: Notes) -> Drops:
    """Group headers and metadata counters; where they differ the larger is used, and said."""
    try:
        meta = d.metadata(context_id=ctx) or d.metadata()
        counters = meta.get("counters") if isinstance(meta.get("counters"), dict) else {}
    except SchemaError:
        counters = {}
        notes.add("warning", "reconcile-metadata", "metadata unreadable; drop counters taken from group headers only",
                  listed=False)
    out = {}
    for kind, cname in _COUNTERS.items():
        v = counters.get(cname)
        dd = {"header": d.drops(kind, context_id=ctx),
              "counter": int(v) if isinstance(v, int) and not isinstance(v, bool) else None,
              "lost_records": sum(g.lost_records for g in d.groups_of(kind, context_id=ctx))}
        out[kind] = dd
    for kind, dd in out.items():
        dd["effective"] = max(dd["header"], dd["counter"] or 0) + dd["lost_records"]
        if dd["counter"] is not None and dd["counter"] != dd["header"]:
            notes.add("warning", "drop-counters-differ", f"{kind}: group header drop_count {dd['header']:,} but "
                      f"metadata counter says {dd['counter']:,}; using the larger", listed=False)
    return Drops(out)


RELEASE_BYTES = 256 << 20  # dumps larger than this give read pages back (the emitters' threshold too)
CHUNK = 1 << 16  # device events per chunk of the streaming pass (4 MiB)


def event_chunks(d, ctx: int, size: int = CHUNK):
    """``(first index, records)`` over a context's device events, giving the pages of each chunk back once the
    next is asked for on large dumps (:func:`kvconv.format.dump.release_pages`)."""
    from kvconv.format.dump import release_pages

    release = d.size > RELEASE_BYTES
    base = 0
    for g in d.groups_of("device_event", context_id=ctx):
        rs = int(g.header["record_size"])
        for s, view in g.chunks(size):
            yield base + s, view
            if release:
                release_pages(d._mm, g.payload_offset + s * rs, len(view) * rs)
        base += len(g.records)
