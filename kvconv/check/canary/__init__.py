"""The location canary checker: canary records -> pages written where nothing should have written.

A canary record (``schemas/layouts.json``, layout ``canary``) says, for one step (replay) and one buffer shaped
``[num_pages, page_elems]``, which pages the step was expected to write (``unique(slot_locations // slots_per_page)``),
which pages actually changed, and which pages are excluded (sentinels such as page 0, where padding may write). The
three sets are sorted u32 runs in the ``canary_pages`` group of the same context; the buffer name is in its
``strings`` group. :mod:`kvconv.capture.probe` writes such records around a graph replay (docs/CANARY.md).

    unexpected = changed - expected - excluded    # mechanism (i): aliasing or external writes
    missing    = expected - changed - excluded    # mechanism (iii): expected writes that did not happen

    >>> import numpy as np, tempfile, os
    >>> from kvconv.check import canary
    >>> from kvconv.format import dump
    >>> from kvconv.capture.probe.writer import CanaryRecorder
    >>> path = os.path.join(tempfile.mkdtemp(), "c.kvdump")
    >>> with CanaryRecorder(path) as rec:
    ...     rec.add(step=1, buffer_id=0, name="index_k", num_pages=16, page_size=64, compression=4,
    ...             expected=[3, 4], changed=[3, 4, 9], excluded=[0], host_ns=1)
    >>> with dump.open(path) as d:
    ...     res = canary.check(d)
    ...     [(s["step"], s["unexpected"], s["missing"]) for s in res.steps]
    [(1, [9], [])]
    >>> print(res.findings[0].message)
    step 1 buffer 'index_k' (id 0): 1 page changed outside the expected set: page 9 (slots 2304-2559)
    >>> res.verdict
    'failed'

A record whose lists cannot be read (out of the canary_pages group, unsorted, pages past ``num_pages``, a name outside
the strings group) is reported as an error finding of its own; the readable parts still count. A dump with no canary
record checks nothing: verdict ``nothing-checked``, the warning ``canary-nothing-checked``, ``ok`` false.

How: records are checked in batches (``_batch``: at most 65,536 records and about 2 M referenced pages), each in a
few numpy passes over all its records' page lists at once (``_sets``); Python work is spent only on records with a
finding. ``res.steps`` is made on demand from the dump, a batch at a time, so memory stays bounded whatever the
dump's size; it can be read after the dump is closed (its views keep the mapping alive).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvconv.check.canary import _batch, _json
from kvconv.check.canary._findings import findings as _batch_findings
from kvconv.check.canary._text import MAX_LISTED, describe_pages, runs
from kvconv.format import layout
from kvconv.format.errors import KvconvError
from kvconv.format.findings import Finding

__all__ = ["CanaryOptions", "CanaryResult", "Steps", "check", "describe_pages", "runs", "MAX_LISTED"]

FLAGS = _batch.FLAGS
_COUNTS = ("steps_checked", "steps_with_unexpected", "steps_with_missing", "unexpected_pages", "missing_pages")


@dataclass(frozen=True)
class CanaryOptions:
    """How :func:`check` judges records.

    missing_writes: report expected pages that did not change (mechanism iii). A step that writes the bytes a page
    already held also reads as "not changed", so turn this off for buffers where that is common.
    """

    missing_writes: bool = True


class Steps(Sequence):
    """The checked (context, step, buffer) dicts, in record order, made on demand a batch at a time.

    A sequence: ``len``, indexing, iteration, ``== [...]``. ``flagged()`` yields only the steps with an unexpected
    or a missing page (what a report lists) without building the others.
    """

    def __init__(self, spans: list, lengths: list[int], options: CanaryOptions, flagged: list[dict]) -> None:
        self._spans = spans
        self._flagged = flagged  # few: each has a finding of its own, and findings are kept anyway
        self._ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
        self._options = options
        self._cached: tuple[int, list[dict]] | None = None

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def _batch(self, k: int) -> _batch.Batch:
        return _batch.compute(self._spans[k], missing_writes=self._options.missing_writes)

    def _steps_of(self, k: int) -> list[dict]:
        if self._cached is None or self._cached[0] != k:
            self._cached = (k, list(_batch.iter_step_dicts(self._batch(k))))
        return self._cached[1]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError("step index out of range")
        k = int(np.searchsorted(self._ends, j, "right"))
        return self._steps_of(k)[j - (int(self._ends[k - 1]) if k else 0)]

    def __iter__(self):
        for k in range(len(self._spans)):
            yield from _batch.iter_step_dicts(self._batch(k))

    def flagged(self):
        """The steps with an unexpected or a missing page, in record order (kept by :func:`check`)."""
        return iter(self._flagged)

    def __eq__(self, other):
        if isinstance(other, (Steps, list, tuple)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"<canary.Steps: {len(self)} steps>"


@dataclass
class CanaryResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    steps: Sequence = field(default_factory=list)  # a Steps from check()
    records: int = 0
    counts: dict = field(default_factory=lambda: dict.fromkeys(_COUNTS, 0))

    @property
    def verdict(self) -> str:
        """This check's part of the verdict, as :func:`kvconv.check.verdict.part` judges it: ``failed`` (an
        error-level finding), ``nothing-checked`` (no canary record could be checked) or ``ok``."""
        from kvconv.check.verdict import part

        return part(self.findings, checked=bool(self.counts["steps_checked"]))

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def summary(self) -> dict:
        return {
            "records": self.records,
            **self.counts,
            "errors": sum(1 for f in self.findings if f.severity == "error"),
            "warnings": sum(1 for f in self.findings if f.severity == "warning"),
        }

    def to_dict(self) -> dict:
        """JSON-able; schema ``schemas/canary.schema.json``; what ``kvconv canary --json`` prints
        (:meth:`write_json` writes the same text without holding every step)."""
        return {
            "path": self.path,
            "ok": self.ok,
            "summary": self.summary(),
            "steps": list(self.steps),
            "findings": [f.to_dict() for f in self.findings],
        }

    def write_json(self, out) -> None:
        """``json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\\n"`` to ``out``, a step at a time."""
        import json

        def dumps(obj, indent: str) -> str:
            return json.dumps(obj, indent=2, sort_keys=True).replace("\n", "\n" + indent)

        head = {"findings": [f.to_dict() for f in self.findings], "ok": self.ok, "path": self.path}
        out.write(dumps(head, "")[:-2] + ",\n  \"steps\": [")
        sep = "\n    "
        for s in self.steps:
            out.write(sep + _json.dumps(s, "    "))  # json.dumps's indenting encoder is pure Python: slow
            sep = ",\n    "
        out.write(("\n  ]" if sep != "\n    " else "]") + ",\n  \"summary\": " + dumps(self.summary(), "  ") + "\n}\n")


def _outcome_finding(d, ctx: int) -> Finding | None:
    """``canary-ended-by-exception`` when the recorder was left by an exception (metadata.outcome)."""
    try:
        outcome = d.metadata(context_id=ctx).get("outcome")
    except KvconvError:
        return None  # unreadable metadata is kvconv validate's to report
    if not (isinstance(outcome, dict) and outcome.get("ended_by") == "exception"):
        return None
    after = outcome.get("last_step")
    mg = d.groups_of("metadata", context_id=ctx)
    return Finding(
        "warning", "canary-ended-by-exception",
        f"the recording ended by an exception ({outcome.get('exception', 'unknown')}) "
        + (f"after step {after}" if after is not None else "before any step was recorded")
        + "; later steps were not checked", path=d.path, group=mg[0].index if mg else None,
        offset=mg[0].payload_offset if mg else None, field="metadata.outcome")


def _dropped(d, g) -> Finding:
    return Finding("warning", "canary-dropped", f"the producer dropped {g.drop_count} canary records", path=d.path,
                   group=g.index, offset=g.offset + layout.LAYOUTS["header"].field("drop_count").offset,
                   field="header.drop_count")


def _nothing_checked(d, res: CanaryResult) -> Finding:
    what = ("the dump holds no canary records" if not res.records
            else f"none of its {res.records:,} canary records could be read")
    return Finding("warning", "canary-nothing-checked",
                   f"nothing was checked: {what} (canary data is recorded by kvconv.capture.probe around each replay; "
                   "see docs/CANARY.md)", path=d.path, field="canary")


def check(d, *, options: CanaryOptions = CanaryOptions(), progress=None) -> CanaryResult:
    """Check every canary record of an opened dump (:func:`kvconv.format.dump.open`).

    progress: None, or a callback ``progress(done, total)`` in canary records, called once per batch
    (kvconv/progress.py).
    """
    res = CanaryResult(path=d.path)
    contexts = list(dict.fromkeys(ctx for ctx, _dev in d.contexts()))
    groups = {ctx: d.groups_of("canary", context_id=ctx) for ctx in contexts}
    total = sum(len(g.records) for gs in groups.values() for g in gs)
    spans, lengths, flagged = [], [], []
    for ctx in contexts:
        if not groups[ctx]:
            continue
        if (f := _outcome_finding(d, ctx)) is not None:
            res.findings.append(f)
        src, base = _batch.source(d, ctx), 0
        for g in groups[ctx]:
            if g.drop_count:
                res.findings.append(_dropped(d, g))
            for sp in _batch.spans(src, g, base):
                b = _batch.compute(sp, missing_writes=options.missing_writes)
                res.findings.extend(_batch_findings(b, d.path))
                for k, v in _batch.tally(b).items():
                    res.counts[k] += v
                flagged.extend(_batch.iter_step_dicts(b, _batch.flagged(b)))
                spans.append(sp)
                lengths.append(int(b.readable.sum()))
                res.records += sp.stop - sp.start
                if progress is not None:
                    progress(res.records, total)
            base += len(g.records)
    res.steps = Steps(spans, lengths, options, flagged)
    if res.verdict == "nothing-checked":
        res.findings.append(_nothing_checked(d, res))
    return res
