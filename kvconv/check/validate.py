"""Validate a dump: structure, schema and semantics, reporting every problem found (aggregated per kind of problem).

    >>> from kvconv.check.validate import validate, ValidateOptions
    >>> report = validate("fixtures/qwen3-14b/qwen3-14b.kvdump")      # doctest: +SKIP
    >>> report.valid, report.exit_code                                 # doctest: +SKIP
    (True, 0)

The checks are the passes of :mod:`kvconv.check.passes`, a registry derived from schemas/layouts.json (each record
kind names the pass that checks it), all vectorised over the mmap'd records:
- structure (kvconv.format.dump.scan and the ``structure`` pass): magic, versions, header checksums, sizes against
  the file, payload checksums;
- schema: header fields, the metadata JSON against schemas/metadata.schema.json, record enums, flags and ranges;
- semantics: sequence gaps and duplicates, %globaltimer going backwards, drops, kernel slots missing from the kernel
  table, blockIdx outside its launch's grid, and the reconciler's, the location canary's, the write-address canary's
  and the value canary's findings;
- coverage: nothing traced and nothing checked (``coverage-none``).

One driver (:class:`Validation`, below): validate runs it over the whole dump; a converter feeds it the chunks it reads
(its verdict line costs no second pass); a :class:`kvconv.run.DumpRun` owns its dump's one.

One verdict (:mod:`kvconv.check.verdict`, the only module that judges): ok, failed, incomplete, nothing-checked,
unreadable; its exit status from schemas/codes.json ``verdicts``. ``Report.incidents``: the findings grouped by cause
(each pass groups its own).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvconv.check import passes
from kvconv.check._collect import _Collector, _crc_finding
from kvconv.check.validate_events import (
    EV_CHUNK,
    _check_sequence_unordered,
    _ChunkCrc,
    _EventChecks,
    _grid_tables,
    _Pages,
    _SequenceOrder,
)
from kvconv.format import codes, layout
from kvconv.format import dump as dumpmod
from kvconv.format.errors import KvconvError
from kvconv.format.findings import Finding
from kvconv.join.runs import chunk_runs

__all__ = ["ValidateOptions", "Report", "Validation", "validate", "unopened", "UNREADABLE"]

# Structural problems after which the file cannot be read as a whole (exit 2): schemas/codes.json's "unreadable".
UNREADABLE = codes.UNREADABLE


@dataclass(frozen=True)
class ValidateOptions:
    """relaxed_reconcile: report the reconciler's mismatches as warnings (e.g. for a dump known to start late).
    reconcile / canary: include those checks. salvage: read a cut-short dump up to its last whole record.
    missing_writes: the location canary reports expected pages that did not change (kvconv.check.canary)."""

    reconcile: bool = True
    relaxed_reconcile: bool = False
    canary: bool = True
    salvage: bool = False
    missing_writes: bool = True


@dataclass
class Report:
    path: str
    findings: list[Finding] = field(default_factory=list)
    groups: int = 0
    size: int = 0
    incidents: list[dict] = field(default_factory=list)  # kvconv.check.verdict.incidents: findings by cause
    passes: dict = field(default_factory=dict, repr=False)  # name -> kvconv.check.passes.PassResult, in order
    asked: Any = field(default=None, repr=False)  # kvconv.check.asked.Asked: what was asked, what the dump holds

    @property
    def errors(self) -> int:
        return sum(1 for f in self.findings if f.severity == "error")

    @property
    def warnings(self) -> int:
        return sum(1 for f in self.findings if f.severity == "warning")

    @property
    def unreadable(self) -> bool:
        return any(f.severity == "error" and f.code in UNREADABLE for f in self.findings)

    @property
    def valid(self) -> bool:
        return self.errors == 0

    @property
    def verdict(self) -> str:
        """ok, failed, incomplete, nothing-checked or unreadable (:func:`kvconv.check.verdict.judge`)."""
        from kvconv.check.verdict import judge

        return judge(self.findings)

    @property
    def exit_code(self) -> int:
        from kvconv.check.verdict import EXIT_CODES

        return EXIT_CODES[self.verdict]

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "valid": self.valid,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "size": self.size,
            "groups": self.groups,
            "errors": self.errors,
            "warnings": self.warnings,
            "findings": [f.to_dict() for f in self.findings],
            "incidents": self.incidents,
        }


def validate(dump: str | os.PathLike | dumpmod.Dump, *, options: ValidateOptions = ValidateOptions(),
             progress=None) -> Report:
    """Validate one dump and return a :class:`Report` with every finding: the passes of
    :func:`kvconv.check.passes.registry` that the dump's groups allow, then the verdict's coverage and incidents
    (:class:`Validation`, the one driver, over the whole dump).

    Args:
        dump: a path (opened here with :func:`kvconv.format.dump.scan`, closed after), or a dump already open
            (``dump.scan``'s, read with ``options.salvage``; left open: a :class:`kvconv.run.DumpRun` hands its own).
        options: which checks run (:class:`ValidateOptions`).
        progress: ``progress(done, total)`` in bytes of the file (:mod:`kvconv.progress`).

    Returns:
        The report. A file that cannot be opened or read as a whole is a report too (its one error finding,
        verdict ``unreadable``): validate raises nothing for bad input.
    """
    if isinstance(dump, dumpmod.Dump):
        return Validation(dump, options, progress).finish()
    try:
        # Checksums are computed by the passes, in the same pass over the records as their checks.
        d = dumpmod.scan(str(dump), options=dumpmod.ReadOptions(salvage=options.salvage, verify_checksums=False))
    except KvconvError as e:
        return unopened(str(dump), e)
    with d:
        return Validation(d, options, progress).finish()


def unopened(path: str, error: KvconvError) -> Report:
    """The report of a dump that could not be opened at all (no such file, not a file, unreadable): its one error."""
    rep = Report(path=path)
    rep.findings.append(Finding.from_error(error))
    rep.incidents = [_one(f) for f in rep.findings]
    return rep


def conclude(rep: Report, st) -> None:
    """The report of passes that have run (``st``: :class:`kvconv.check.passes.Checking`): their findings, then the
    verdict's coverage finding and the incidents (the end of :meth:`Validation.finish`)."""
    from kvconv.check import verdict

    rep.findings, rep.passes = st.findings, st.results
    if rep.unreadable:
        rep.incidents = [_one(f) for f in rep.findings if f.severity != "info"]
        return
    cov = verdict.coverage(st.d, canary_steps=_checked(st, "canary"), write_steps=_checked(st, "writes"))
    if cov is not None:
        rep.findings.append(cov)
    from kvconv.check import asked  # what was asked and did not run here: said, never a plain pass

    rep.asked = asked.of_dump(st.d)
    rep.findings += asked.findings(st.d, rep.asked)
    rep.incidents = verdict.incidents(rep.findings, st.results)


def _checked(st, name: str) -> int:
    r = st.results.get(name)
    return int(r.checked.get("steps", 0)) if r is not None else 0


def _one(f: Finding) -> dict:
    return {"severity": f.severity, "code": f.code, "message": f.line(), "findings": 1, "where": {}}

# ---- the one driver -------------------------------------------------------------------------------------------------
# validate's one driver (Validation): the passes of kvconv.check.passes over one open dump, run once, whoever drives
# them.
# :func:`kvconv.check.validate.validate` runs a :class:`Validation` over the whole dump at once (:meth:`finish`). A
# converter (``kvconv perfetto | chrome | arrow``, which states the dump's verdict beside its output) feeds the same
# checks instead of a second pass: the ``launches`` pass (the device-event checks and the reconciler's streaming pass)
# takes each chunk of the first walk of a context's device events that runs to its end (the join's probe or the first
# pass, whichever comes first; the checksum is the one that walk sums). The registry's other passes read little: those
# before ``launches`` (structure, metadata, kernels, clock sync) run when the validation is set up, the rest (the
# canaries) at :meth:`Validation.finish`, where its own walk checks every context no walk of the converter finished (a
# context the converter streams lazily, ``kvconv.emit._contexts.LAZY_CHECKED_HOSTS``, is checked so, after the
# conversion: fed by the walk, the reconciler's launch table would sit beside the converter's). Either way the report is
# validate's :class:`~kvconv.check.validate.Report` by construction: the same passes, in the same order
# (tests/test_emit_verdict.py holds it to ``kvconv validate`` on every fixture and on damaged dumps). A
# :class:`kvconv.run.DumpRun` owns its dump's one Validation: computed once, by whichever pass gets there first.

_SEQ_OFF = layout.LAYOUTS["device_event"].field("sequence").offset


class Validation:
    """validate's passes over one open dump ``d``: those before ``launches`` at once, ``launches`` fed context by
    context by a converter's walks (:meth:`begin`), the rest, and every context no walk finished, at :meth:`finish`.
    ``progress(done, total)``: bytes of the file checked (:mod:`kvconv.progress`)."""

    def __init__(self, d: dumpmod.Dump, options: ValidateOptions = ValidateOptions(), progress=None) -> None:
        self.d, self.options, self.progress = d, options, progress
        self.rep = Report(path=d.path, size=d.size, groups=len(d.groups))
        self.st = passes.Checking(d, options, progress, pages=_Pages(d, progress))
        reg = passes.registry()
        at = next(i for i, p in enumerate(reg) if p.name == "launches")
        self.launches_pass, self.after = reg[at], reg[at + 1:]
        passes.run_all(self.st, reg[:at])
        self.lc = self.st.launches = passes.Launches(self.st) if self.launches_pass.applies(d) else None
        self.active: set[int] = set()  # contexts a walk is feeding now
        self._done: Report | BaseException | None = None

    def begin(self, ctx: int, *, verifying: bool) -> _Walk | None:
        """A walk of the context's device events starts: its :class:`_Walk`, or None when the context is checked
        already, another walk is feeding it (a walk read ahead inside the first), or the report is made."""
        lc = self.lc
        if lc is None or self._done is not None or ctx in lc.found or ctx in self.active or ctx not in lc.slots:
            return None
        self.active.add(ctx)
        return _Walk(self, ctx, verifying=verifying)

    @property
    def done(self) -> bool:
        """Whether the report is made (or the checks raised): :meth:`finish` reads the dump no more."""
        return self._done is not None

    def finish(self) -> Report:
        """The dump's report, as :func:`kvconv.check.validate.validate` gives it; made once (a later call returns
        it, or raises again what the checks raised)."""
        if self._done is None:
            try:
                self._done = self._finish()
            except Exception as e:
                self._done = e
                raise
        if isinstance(self._done, BaseException):
            raise self._done
        return self._done

    def _finish(self) -> Report:
        if self.lc is not None:  # the pass itself checks each context no walk of a converter ran to the end
            self.active.clear()
            passes.took(self.st, "launches", self.launches_pass.run(self.st))
        passes.run_all(self.st, self.after)
        conclude(self.rep, self.st)
        if self.progress is not None:
            self.progress(self.d.size, self.d.size)
        # the walks' state (the reconciler's, pages pending): the report holds the rest
        self.lc = self.st.launches = self.st.pages = None
        return self.rep


class _Walk:
    """One walk of a context's device events feeding the checks: chunk by chunk (:meth:`chunk`), group by group
    (:meth:`group_end`); its findings count only once it has run to the end (:meth:`end`)."""

    def __init__(self, checks: Validation, ctx: int, *, verifying: bool) -> None:
        self.checks, self.ctx, self.verifying = checks, ctx, verifying
        d, lc = checks.d, checks.lc
        self.c = _Collector(d.path)
        self.s = lc.stream(ctx)
        grids = _grid_tables(d, ctx, self.s.t if self.s is not None else None)
        self.ev = _EventChecks(lc.slots[ctx], grids)
        self.order = self.crc = None
        self.failed = False

    def chunk(self, g: dumpmod.Group, group_first: int, ctx_first: int, view: np.ndarray) -> None:
        """The records ``view`` of group ``g``, from its record ``group_first`` (the context's ``ctx_first``)."""
        self._safely(self._chunk, g, group_first, ctx_first, view)

    def group_end(self, g: dumpmod.Group, crc: int | None) -> None:
        """The group's records are all walked; ``crc``: their checksum, when the walk summed it."""
        self._safely(self._group_end, g, crc)

    def _safely(self, f, *a) -> None:
        """A failure of the checks never costs the emitter its output: the walk stops feeding them, and
        :meth:`Validation.finish` checks the context again by itself, where the failure is raised as validate raises
        it."""
        if self.failed:
            return
        try:
            f(*a)
        except Exception:  # noqa: BLE001 - see the docstring
            self.failed = True

    def _chunk(self, g: dumpmod.Group, group_first: int, ctx_first: int, view: np.ndarray) -> None:
        if self.order is None:  # the group's first chunk
            self.order = _SequenceOrder()
            self.crc = _ChunkCrc(g) if not self.verifying and g.checksummed else None
        for a in range(0, len(view), EV_CHUNK):
            ev = view[a : a + EV_CHUNK]
            if self.crc is not None:
                self.crc.add(ev)
            kind = ev["kind"]
            runs = chunk_runs(ev, kind)
            if self.s is not None:
                self.s.feed(ctx_first + a, ev, kind, runs)
            self.ev.chunk(self.c, g, ev, group_first + a, kind, runs)
            self.order.add(ev, group_first + a, runs.consecutive)

    def _group_end(self, g: dumpmod.Group, crc: int | None) -> None:
        c, order = self.c, self.order or _SequenceOrder()
        if self.crc is not None:
            ok = self.crc.ok()
        elif crc is not None:
            ok = crc == int(g.header["payload_crc32"])
        else:  # a group with no records (or none summed): validate's sum of nothing
            ok = g.crc_ok()
        if g.checksummed and not ok:
            _crc_finding(c, g)
        self.order = self.crc = None
        if not len(g.records):
            return
        if not order.in_order:
            _check_sequence_unordered(g, c)
            return
        s0 = int(g.records["sequence"][0])
        order.timer.report(c, g, lambda i: i)
        if g.drop_count == 0 and s0 != 0:
            c.add("warning", "sequence-start", f"sequences start at {s0}, not 0, with no drops recorded",
                  group=g.index, record=0, offset=g.record_offset(0) + _SEQ_OFF, field="device_event.sequence")

    def end(self) -> None:
        """The walk ran to the end: the context's reconciliation closes, its host records are checked, and its
        findings count."""
        if self.failed:
            self.abandon()
            return
        self.checks.lc.context_done(self.ctx, self.c, self.s)
        self.checks.active.discard(self.ctx)

    def abandon(self) -> None:
        """The walk stopped before the end (a probe that gave up): a later walk feeds the checks again."""
        self.checks.active.discard(self.ctx)
