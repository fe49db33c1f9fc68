"""validate's one driver: the passes of :mod:`kvconv.check.passes` over one open dump, run once, whoever drives them.

:func:`kvconv.check.validate.validate` runs a :class:`Validation` over the whole dump at once (:meth:`finish`). A
converter (``kvconv perfetto | chrome | arrow``, which states the dump's verdict beside its output) feeds the same
checks instead of a second pass: the ``launches`` pass (the device-event checks and the reconciler's streaming pass)
takes each chunk of the first walk of a context's device events that runs to its end (the join's probe or the first
pass, whichever comes first; the checksum is the one that walk sums). The registry's other passes read little: those
before ``launches`` (structure, metadata, kernels, clock sync) run when the validation is set up, the rest (the
canaries) at :meth:`Validation.finish`, where its own walk checks every context no walk of the converter finished (a
context the converter streams lazily, ``kvconv.emit._contexts.LAZY_CHECKED_HOSTS``, is checked so, after the
conversion: fed by the walk, the reconciler's launch table would sit beside the converter's). Either way the report is
validate's :class:`~kvconv.check.validate.Report` by construction: the same passes, in the same order
(tests/test_emit_verdict.py holds it to ``kvconv validate`` on every fixture and on damaged dumps). A
:class:`kvconv.run.DumpRun` owns its dump's one Validation: computed once, by whichever pass gets there first.

    >>> v = Validation(d)                                     # doctest: +SKIP
    >>> walk = v.begin(ctx, verifying=True)                   # doctest: +SKIP
    >>> walk.chunk(g, group_first, ctx_first, view); walk.group_end(g, crc); walk.end()   # doctest: +SKIP
    >>> v.finish().verdict                                    # doctest: +SKIP
    'ok'
"""

from __future__ import annotations

import numpy as np

from kvconv.check import passes
from kvconv.check._collect import _Collector, _crc_finding
from kvconv.check.validate import Report, ValidateOptions, conclude
from kvconv.check.validate_events import (
    EV_CHUNK,
    _check_sequence_unordered,
    _ChunkCrc,
    _EventChecks,
    _grid_tables,
    _Pages,
    _SequenceOrder,
)
from kvconv.format import dump as dumpmod
from kvconv.format import layout
from kvconv.join.runs import chunk_runs

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
        self.lc = passes.Launches(self.st) if self.launches_pass.applies(d) else None
        self.active: set[int] = set()  # contexts a walk is feeding now
        self._done: Report | BaseException | None = None

    @property
    def rc(self):
        return self.lc.rc if self.lc is not None else None

    def begin(self, ctx: int, *, verifying: bool) -> _Walk | None:
        """A walk of the context's device events starts: its :class:`_Walk`, or None when the context is checked
        already, another walk is feeding it (a walk read ahead inside the first), or the report is made."""
        lc = self.lc
        if lc is None or self._done is not None or ctx in lc.found or ctx in self.active or ctx not in lc.slots:
            return None
        self.active.add(ctx)
        return _Walk(self, ctx, verifying=verifying)

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
        if self.lc is not None:
            for ctx, _dev in self.d.contexts():
                if ctx not in self.lc.found:  # no walk of a converter ran to the end: the pass over it is here
                    self.active.discard(ctx)
                    self.lc.check_context(ctx)
            passes.took(self.st, "launches", self.lc.result())
        passes.run_all(self.st, self.after)
        conclude(self.rep, self.st)
        if self.progress is not None:
            self.progress(self.d.size, self.d.size)
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
        :meth:`Validation.finish` checks the context again by itself, where the failure is raised as validate raises it."""
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
