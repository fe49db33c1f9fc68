"""Canary records into a dump, with no torch: :class:`CanaryRecorder` collects per (step, buffer) page sets and writes
them through :func:`kvconv.format.dump.new` (metadata, strings, canary, canary_pages groups of one context) on close.
The other probes can record into the same dump: the value canary's ``cache`` and ``value_digest`` records
(:mod:`kvconv.capture.probe.values`), and the slot mapping's ``write_step`` / ``slot_map`` records
(:meth:`CanaryRecorder.add_step`, what :class:`~kvconv.capture.probe.writes.WriteProbe` sends the tracer, kept here
with ``WriteProbe(mirror=recorder)``). A recorder holding only those writes no canary group.

    >>> import tempfile, os
    >>> from kvconv.format import dump
    >>> from kvconv.capture.probe.writer import CanaryRecorder
    >>> path = os.path.join(tempfile.mkdtemp(), "c.kvdump")
    >>> with CanaryRecorder(path, metadata={"producer": "doctest"}) as rec:
    ...     rec.add(step=0, buffer_id=0, name="index_k", num_pages=8, page_size=64, compression=4,
    ...             expected=[2, 1], changed=[1, 2], excluded=[0])
    >>> with dump.open(path) as d:
    ...     [g.kind_name for g in d.groups], d.records("canary_pages")["page"].tolist()
    (['metadata', 'strings', 'canary', 'canary_pages'], [1, 2, 1, 2, 0])

Page sets are stored sorted and unique (the recorder sorts what it is given). Nothing appears at ``path`` until
:meth:`CanaryRecorder.close`. An exception inside ``with`` (a CUDA error in the traced step, say) still writes the
records made before it, with the run metadata's ``outcome`` saying how the run ended, which ``kvconv canary``
reports; then the exception goes on. A process killed outright leaves no file.
"""

from __future__ import annotations

import os
import time

import numpy as np

from kvconv.format import dump, layout
from kvconv.version import __version__

FLAGS = layout.ENUMS["canary_flags"]
_EXTRA = ("cache", "write_step", "slot_map", "value_digest")  # other probes' kinds, in the order they are written
SNAPSHOT_FLAGS = {"clone": FLAGS["snapshot_clone"], "checksum": FLAGS["snapshot_checksum"]}


def _pages(x) -> np.ndarray:
    if isinstance(x, (set, frozenset, dict)) or not hasattr(x, "__len__"):
        x = sorted(x)
    a = np.unique(np.asarray(x, dtype=np.int64).reshape(-1))
    if len(a) and (a[0] < 0 or a[-1] > 0xFFFFFFFF):
        raise ValueError("canary pages must lie in 0..2**32-1")
    return a.astype("<u4")


class RecorderOwner:
    """A probe that writes through its ``recorder`` (a :class:`CanaryRecorder`): closing the probe closes it, and
    leaving a ``with`` block by an exception hands the exception on (the recorder marks the dump as cut short)."""

    recorder: CanaryRecorder

    def close(self) -> None:
        self.recorder.close()

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb) -> None:
        if et is None:
            self.close()
        else:
            self.recorder.__exit__(et, ev, tb)


class CanaryRecorder:
    """Collects canary records for one context and writes them as one dump on :meth:`close`."""

    def __init__(self, path: str | os.PathLike, *, context_id: int = 0, device_id: int = 0,
                 metadata: dict | None = None) -> None:
        self.path = str(path)
        self.context_id = context_id
        self.device_id = device_id
        self.metadata = {"tool": "kvconv.capture.probe", "tool_version": __version__, **(metadata or {})}
        self._strings = dump.StringTable()
        self._records: list[np.ndarray] = []
        self._pages: list[np.ndarray] = []
        self._npages = 0
        self._extra: dict[str, list[np.ndarray]] = {k: [] for k in _EXTRA}
        self._nmap = 0
        self._closed = False
        self._flushers: list = []  # probes that hold records not added yet (a ValueProbe's last step)
        # Fail now, not after a long run, if the output folder is missing.
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            from kvconv.format.errors import OutputError

            raise OutputError("output folder does not exist", path=self.path, hint=f"create {parent} first",
                              code="output-dir-missing")

    def __enter__(self) -> CanaryRecorder:
        return self

    def __exit__(self, et, ev, tb) -> None:
        if et is None:
            self.close()
            return
        text = f"{et.__name__}: {ev}"
        try:
            self._flush()
        except Exception:  # noqa: BLE001 - the caller's exception is the one to see; the records held are lost
            pass
        last = max([int(r["step"][-1]) for r in self._records + self._extra["value_digest"] if len(r)], default=None)
        self.metadata["outcome"] = {"ended_by": "exception", "exception": text[:1000], "last_step": last}
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the caller's exception is the one to see
            self._closed = True

    def add_flusher(self, flush) -> None:
        """Have ``flush()`` called before the dump is written: a probe that adds a step's records later than the
        step (ValueProbe's fused path, at the next step) adds what it still holds."""
        self._flushers.append(flush)

    def _flush(self) -> None:
        for flush in self._flushers:
            flush()

    def __len__(self) -> int:
        return len(self._records)

    def add(self, *, step: int, buffer_id: int, name: str, num_pages: int, page_size: int, compression: int,
            expected, changed, excluded=(), host_ns: int | None = None, snapshot: str = "clone") -> None:
        """Append one (step, buffer) record. ``expected``/``changed``/``excluded`` are page numbers (any order)."""
        if self._closed:
            raise RuntimeError("CanaryRecorder is closed")
        r = np.zeros(1, dtype=layout.DTYPES["canary"])
        r["step"] = step
        r["host_ns"] = time.monotonic_ns() if host_ns is None else host_ns
        r["buffer_id"] = buffer_id
        r["name_off"], r["name_len"] = self._strings.add(name)
        r["num_pages"] = num_pages
        r["page_size"] = page_size
        r["compression"] = compression
        r["flags"] = SNAPSHOT_FLAGS[snapshot]
        lists = [(lst, _pages(pages)) for lst, pages in (("expected", expected), ("changed", changed),
                                                          ("excluded", excluded))]  # all checked before any is kept
        for lst, a in lists:
            r[f"{lst}_first"] = self._npages
            r[f"{lst}_count"] = len(a)
            self._pages.append(a)
            self._npages += len(a)
        self._records.append(r)

    def add_records(self, kind: str, records: np.ndarray) -> None:
        """Append records of another probe's kind (``value_digest``; the dtype of docs/FORMAT.md)."""
        if self._closed:
            raise RuntimeError("CanaryRecorder is closed")
        if kind not in ("cache", "value_digest"):
            raise ValueError(f"add_records takes cache or value_digest records, not {kind!r} (steps: add_step)")
        self._extra[kind].append(np.asarray(records, dtype=layout.DTYPES[layout.KINDS[kind].layout]).reshape(-1))

    def add_cache(self, *, cache_id: int, name: str, base: int, size: int, slot_bytes: int, page_size: int) -> None:
        """One ``cache`` record: a watched cache's id and name (value_digest records name it by id)."""
        r = np.zeros(1, layout.DTYPES["cache"])
        r["cache_id"], r["base"], r["size"], r["slot_bytes"], r["page_size"] = cache_id, base, size, slot_bytes, \
            page_size
        r["name"] = name.encode("utf-8")[:32]
        self.add_records("cache", r)

    def add_step(self, *, step: int, begin_ns: int, end_ns: int, slots, request_ids, flags) -> None:
        """One ``write_step`` record and its ``slot_map`` rows: a step's slot mapping, or a release (every row
        flagged ``release``), as the write probe records them in the tracer."""
        slots = np.asarray(slots, np.int64).reshape(-1)
        m = np.zeros(len(slots), layout.DTYPES["slot_map"])
        m["slot"], m["request_id"], m["flags"] = slots, np.asarray(request_ids, np.uint64).reshape(-1), \
            np.asarray(flags, np.uint32).reshape(-1)
        m["token"] = np.arange(len(slots))
        s = np.zeros(1, layout.DTYPES["write_step"])
        s["step"], s["begin_ns"], s["end_ns"], s["map_first"], s["map_count"] = step, begin_ns, end_ns, self._nmap, \
            len(m)
        self._nmap += len(m)
        self._extra["write_step"].append(s)
        self._extra["slot_map"].append(m)

    def close(self) -> None:
        if self._closed:
            return
        self._flush()
        self._closed = True
        recs = np.concatenate(self._records) if self._records else np.zeros(0, dtype=layout.DTYPES["canary"])
        pages = np.zeros(self._npages, dtype=layout.DTYPES["canary_page"])
        if self._pages:
            pages["page"] = np.concatenate(self._pages)
        extra = any(self._extra.values())
        with dump.new(self.path, context_id=self.context_id, device_id=self.device_id) as w:
            w.write_metadata(self.metadata)
            w.write_strings(self._strings)
            if self._records or not extra:
                w.write_records("canary", recs)
                w.write_records("canary_pages", pages)
            for kind, parts in self._extra.items():
                if parts:
                    w.write_records(kind, np.concatenate(parts))
