"""The location canary checker: canary records -> pages written where nothing should have written.

A canary record (``schemas/layouts.json``, layout ``canary``) says, for one step (replay) and one buffer shaped
``[num_pages, page_elems]``, which pages the step was expected to write (``unique(slot_locations // slots_per_page)``),
which pages actually changed, and which pages are excluded (sentinels such as page 0, where padding may write). The
three sets are sorted u32 runs in the ``canary_pages`` group of the same context; the buffer name is in its
``strings`` group. :mod:`kvconv.probe` writes such records around a graph replay.

    unexpected = changed - expected - excluded    # mechanism (i): aliasing or external writes
    missing    = expected - changed - excluded    # mechanism (iii): expected writes that did not happen

    >>> import numpy as np, tempfile, os
    >>> from kvconv import canary, dump
    >>> from kvconv.probe.writer import CanaryRecorder
    >>> path = os.path.join(tempfile.mkdtemp(), "c.kvdump")
    >>> with CanaryRecorder(path) as rec:
    ...     rec.add(step=1, buffer_id=0, name="index_k", num_pages=16, page_size=64, compression=4,
    ...             expected=[3, 4], changed=[3, 4, 9], excluded=[0], host_ns=1)
    >>> with dump.open(path) as d:
    ...     res = canary.check(d)
    >>> [(s["step"], s["unexpected"], s["missing"]) for s in res.steps]
    [(1, [9], [])]
    >>> print(res.findings[0].message)
    step 1 buffer 'index_k' (id 0): 1 page changed outside the expected set: page 9 (slots 2304-2559)

A record whose lists cannot be read (out of the canary_pages group, unsorted, pages past ``num_pages``, a name outside
the strings group) is reported as an error finding of its own; the readable parts still count.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import layout
from .errors import KvconvError
from .findings import Finding

FLAGS = layout.ENUMS["canary_flags"]
_SNAPSHOT = {FLAGS["snapshot_clone"]: "clone", FLAGS["snapshot_checksum"]: "checksum"}
_KNOWN_FLAGS = FLAGS["snapshot_clone"] | FLAGS["snapshot_checksum"]
_LISTS = ("expected", "changed", "excluded")
MAX_LISTED = 16  # pages named in one finding message before "... and N more"


@dataclass(frozen=True)
class CanaryOptions:
    """How :func:`check` judges records.

    missing_writes: report expected pages that did not change (mechanism iii). A step that writes the bytes a page
    already held also reads as "not changed", so turn this off for buffers where that is common.
    """

    missing_writes: bool = True


@dataclass
class CanaryResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    records: int = 0

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def summary(self) -> dict:
        return {
            "records": self.records,
            "steps_checked": len(self.steps),
            "steps_with_unexpected": sum(1 for s in self.steps if s["unexpected"]),
            "steps_with_missing": sum(1 for s in self.steps if s["missing"]),
            "unexpected_pages": sum(len(s["unexpected"]) for s in self.steps),
            "missing_pages": sum(len(s["missing"]) for s in self.steps),
            "errors": sum(1 for f in self.findings if f.severity == "error"),
            "warnings": sum(1 for f in self.findings if f.severity == "warning"),
        }

    def to_dict(self) -> dict:
        """JSON-able; schema ``schemas/canary.schema.json``; what ``kvconv canary --json`` prints."""
        return {
            "path": self.path,
            "ok": self.ok,
            "summary": self.summary(),
            "steps": self.steps,
            "findings": [f.to_dict() for f in self.findings],
        }


def runs(pages) -> list[tuple[int, int]]:
    """Sorted pages -> inclusive ``(first, last)`` runs.

    >>> runs([1, 2, 3, 7, 9, 10])
    [(1, 3), (7, 7), (9, 10)]
    """
    out: list[tuple[int, int]] = []
    for p in pages:
        p = int(p)
        if out and p == out[-1][1] + 1:
            out[-1] = (out[-1][0], p)
        else:
            out.append((p, p))
    return out


def describe_pages(pages, slots_per_page: int) -> str:
    """``page 9 (slots 2304-2559)``, ``pages 3-5, 9 (slots 768-1535, 2304-2559)``; long lists are cut short."""
    rs = runs(pages)
    shown, rest = rs[:MAX_LISTED], rs[MAX_LISTED:]
    word = "page" if len(pages) == 1 else "pages"
    ptxt = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in shown)
    stxt = ", ".join(f"{a * slots_per_page}-{(b + 1) * slots_per_page - 1}" for a, b in shown)
    more = f" ... and {sum(b - a + 1 for a, b in rest)} more" if rest else ""
    return f"{word} {ptxt}{more} (slots {stxt}{', ...' if rest else ''})"


def _check_context(d, ctx: int, res: CanaryResult, options: CanaryOptions) -> None:
    groups = d.groups_of("canary", context_id=ctx)
    if not groups:
        return
    try:
        outcome = d.metadata(context_id=ctx).get("outcome")
    except KvconvError:
        outcome = None  # unreadable metadata is kvconv validate's to report
    if isinstance(outcome, dict) and outcome.get("ended_by") == "exception":
        after = outcome.get("last_step")
        mg = d.groups_of("metadata", context_id=ctx)
        res.findings.append(Finding(
            "warning", "canary-ended-by-exception",
            f"the recording ended by an exception ({outcome.get('exception', 'unknown')}) "
            + (f"after step {after}" if after is not None else "before any step was recorded")
            + "; later steps were not checked", path=d.path, group=mg[0].index if mg else None,
            offset=mg[0].payload_offset if mg else None, field="metadata.outcome"))
    pages = d.records("canary_pages", context_id=ctx)
    pages = pages["page"] if len(pages) else np.zeros(0, dtype="<u4")
    npages_total = len(pages)
    blob = d.strings(context_id=ctx)
    index = 0  # record index into d.records("canary", context_id=ctx)
    for g in groups:
        rsize = int(g.header["record_size"])
        drops = g.drop_count
        if drops:
            res.findings.append(Finding("warning", "canary-dropped", f"the producer dropped {drops} canary records",
                                        path=d.path, group=g.index,
                                        offset=g.offset + layout.LAYOUTS["header"].field("drop_count").offset,
                                        field="header.drop_count"))
        for i, r in enumerate(g.records):
            rec_index = index + i
            res.records += 1
            off = g.payload_offset + i * rsize

            def bad(code: str, fld: str, msg: str, _i=rec_index, _o=off) -> None:
                res.findings.append(Finding("error", code, msg, path=d.path, group=g.index, record=_i,
                                            offset=_o + layout.LAYOUTS["canary"].field(fld).offset,
                                            field=f"canary.{fld}"))

            step, buf_id = int(r["step"]), int(r["buffer_id"])
            num_pages = int(r["num_pages"])
            page_size, compression = int(r["page_size"]), int(r["compression"])
            spp = page_size * compression
            flags = int(r["flags"])
            # Buffer name.
            no, nl = int(r["name_off"]), int(r["name_len"])
            if no + nl > len(blob):
                bad("canary-name-range", "name_off",
                    f"buffer name at {no}+{nl} lies outside the strings group ({len(blob)} bytes)")
                name = f"buffer{buf_id}"
            else:
                name = blob[no : no + nl].decode("utf-8", "replace")
            label = f"step {step} buffer {name!r} (id {buf_id})"
            if spp == 0:
                bad("canary-geometry", "page_size" if page_size == 0 else "compression",
                    f"{label}: page_size {page_size} x compression {compression} is 0 slots per page")
            if flags & ~_KNOWN_FLAGS:
                res.findings.append(Finding("warning", "canary-flags", f"{label}: unknown flag bits "
                                            f"{flags & ~_KNOWN_FLAGS:#x}", path=d.path, group=g.index,
                                            record=rec_index, offset=off + layout.LAYOUTS["canary"].field(
                                                "flags").offset, field="canary.flags"))
            sets: dict[str, np.ndarray] = {}
            readable = True
            for lst in _LISTS:
                first, count = int(r[f"{lst}_first"]), int(r[f"{lst}_count"])
                if first + count > npages_total:
                    bad("canary-pages-range", f"{lst}_first",
                        f"{label}: {lst} pages {first}+{count} run past the canary_pages group "
                        f"({npages_total} pages)")
                    readable = False
                    continue
                arr = np.asarray(pages[first : first + count], dtype=np.int64)
                if count > 1 and not bool(np.all(arr[1:] > arr[:-1])):
                    j = int(np.argmax(arr[1:] <= arr[:-1]))
                    bad("canary-pages-unsorted", f"{lst}_first",
                        f"{label}: {lst} pages are not sorted and unique ({int(arr[j])} then {int(arr[j + 1])} "
                        f"at canary_pages[{first + j}])")
                    arr = np.unique(arr)
                if count and int(arr.max()) >= num_pages:
                    past = arr[arr >= num_pages]
                    bad("canary-page-range", f"{lst}_first",
                        f"{label}: {lst} page {int(past[0])} is not below num_pages {num_pages}"
                        + (f" ({len(past)} pages)" if len(past) > 1 else ""))
                sets[lst] = arr
            if not readable:
                continue
            exp, chg, exc = sets["expected"], sets["changed"], sets["excluded"]
            unexpected = np.setdiff1d(np.setdiff1d(chg, exp, assume_unique=True), exc, assume_unique=True)
            missing = (np.setdiff1d(np.setdiff1d(exp, chg, assume_unique=True), exc, assume_unique=True)
                       if options.missing_writes else np.zeros(0, dtype=np.int64))
            res.steps.append({
                "context_id": ctx,
                "step": step,
                "buffer_id": buf_id,
                "buffer": name,
                "host_ns": int(r["host_ns"]),
                "num_pages": num_pages,
                "page_size": page_size,
                "compression": compression,
                "slots_per_page": spp,
                "snapshot": _SNAPSHOT.get(flags & _KNOWN_FLAGS, "unknown"),
                "record": rec_index,
                "expected": exp.tolist(),
                "changed": chg.tolist(),
                "excluded": exc.tolist(),
                "unexpected": unexpected.tolist(),
                "missing": missing.tolist(),
            })
            if len(unexpected):
                n = len(unexpected)
                res.findings.append(Finding(
                    "error", "canary-unexpected-write",
                    f"{label}: {n} page{'s' if n != 1 else ''} changed outside the expected set: "
                    f"{describe_pages(unexpected, spp)}",
                    path=d.path, group=g.index, record=rec_index,
                    offset=off + layout.LAYOUTS["canary"].field("changed_first").offset,
                    field="canary.changed_first"))
            if len(missing):
                n = len(missing)
                res.findings.append(Finding(
                    "error", "canary-missing-write",
                    f"{label}: {n} expected page{'s' if n != 1 else ''} did not change: "
                    f"{describe_pages(missing, spp)}",
                    path=d.path, group=g.index, record=rec_index,
                    offset=off + layout.LAYOUTS["canary"].field("expected_first").offset,
                    field="canary.expected_first"))
        index += len(g.records)


def check(d, *, options: CanaryOptions = CanaryOptions()) -> CanaryResult:
    """Check every canary record of an opened dump (:func:`kvconv.dump.open`)."""
    res = CanaryResult(path=d.path)
    seen: set[int] = set()
    for ctx, _dev in d.contexts():
        if ctx in seen:
            continue
        seen.add(ctx)
        _check_context(d, ctx, res, options)
    return res
