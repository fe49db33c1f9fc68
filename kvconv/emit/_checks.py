"""kvconv validate's verdict of a dump, computed from the chunks an emitter reads anyway (``EmitOptions.verdict``).

The converters print the dump's verdict beside their output. Instead of a second, separate validate pass, the
device-event checks of :mod:`kvconv.check.validate_events` and the reconciler's streaming pass take each chunk of the
first walk of a context's device events that runs to its end (the join's probe or the first pass, whichever comes
first; the checksum is the one that walk sums). Everything else validate checks (headers, metadata, kernels, host
records, clock sync, the canaries, the coverage) reads little and runs at :meth:`Checks.finish`, as validate runs
it, and so does the device-event pass of a context no walk of the emitter finished, or that the emitter streams
lazily with many host records (a large dump joined by the streaming exact join, its launch table loaded for each walk
and let go after; ``_contexts.LAZY_CHECKED_HOSTS``): beside the reconciler's own table the peak memory would be the
sum of the two passes' host state, checked after the conversion it is the larger of the two (issue 13's bound).
The result is validate's :class:`~kvconv.check.validate.Report`, in the same order of findings
(tests/test_emit_verdict.py holds it to ``kvconv validate`` on every fixture and on damaged dumps).

    >>> checks = Checks(d)                                    # doctest: +SKIP
    >>> walk = checks.begin(ctx, verifying=True)              # doctest: +SKIP
    >>> walk.chunk(g, group_first, ctx_first, view); walk.group_end(g, crc); walk.end()   # doctest: +SKIP
    >>> checks.finish().verdict                               # doctest: +SKIP
    'ok'
"""

from __future__ import annotations

import numpy as np

from kvconv.check import validate as v
from kvconv.check._collect import _Collector, _crc_finding
from kvconv.check.validate_events import (
    EV_CHUNK,
    _check_sequence_unordered,
    _ChunkCrc,
    _ContextView,
    _EventChecks,
    _grid_tables,
    _Pages,
    _SequenceOrder,
)
from kvconv.format import dump as dumpmod
from kvconv.format import layout
from kvconv.join.runs import chunk_runs

_SEQ_OFF = layout.LAYOUTS["device_event"].field("sequence").offset


class Checks:
    """validate's checks of one open dump, fed context by context by the emitter's walks (:meth:`begin`)."""

    def __init__(self, d: dumpmod.Dump, *, salvage: bool = False) -> None:
        self.d, self.options = d, v.ValidateOptions(salvage=salvage)
        self.rep = v.Report(path=d.path, size=d.size, groups=len(d.groups))
        self.rep.findings.extend(d.problems)  # (warnings only: the emitter's open raised on any error)
        c = self.c = _Collector(d.path)
        v._check_headers(d, c)
        v._check_metadata(d, c)
        slots = v._check_kernels(d, c)
        self.have_table = bool(d.groups_of("kernel"))
        self.slots = {ctx: slots.get(ctx, set()) if self.have_table else None for ctx, _ in d.contexts()}
        if not self.have_table and (d.groups_of("device_event") or d.groups_of("graph_node")):
            c.add("warning", "no-kernel-table", "no kernel table: kernel slots cannot be named", field="kernel")
        self.rc = v._reconciler(d, self.options) if not self.rep.unreadable else None
        self.pages = _Pages(d, None)
        self.done: dict[int, _Collector] = {}  # context -> its device-event and host-record findings
        self.active: set[int] = set()  # contexts a walk is feeding now
        self.rc_error = None

    def begin(self, ctx: int, *, verifying: bool) -> _Walk | None:
        """A walk of the context's device events starts: its :class:`_Walk`, or None when the context is checked
        already or another walk is feeding it (a walk read ahead inside the first)."""
        if ctx in self.done or ctx in self.active or ctx not in self.slots:
            return None
        self.active.add(ctx)
        return _Walk(self, ctx, verifying=verifying)

    def finish(self) -> v.Report:
        """The dump's report, as :func:`kvconv.check.validate.validate` gives it."""
        d, c, rep = self.d, self.c, self.rep
        for ctx, _dev in d.contexts():
            if ctx not in self.done:  # no walk of the emitter ran to the end: validate's own pass over it
                self._own_walk(ctx)
            c.out.extend(self.done[ctx].out)
        release = (lambda off, n: dumpmod.release_pages(d._mm, off, n)) if self.pages.release else None
        for g in d.groups:
            if g.kind_name != "device_event" and not g.lost_records and not g.crc_ok(release=release):
                _crc_finding(c, g)
        v._check_clock_sync(d, c)
        v._check_kinds(d, c)
        rep.findings.extend(c.out)
        sound = not rep.unreadable and not any(f.code == "payload-checksum" for f in rep.findings)
        if sound and self.rc_error is not None:
            raise self.rc_error
        if sound:
            rep.findings.extend(v._reconcile_findings(d, self.options, self.rc,
                                                      already={f.code for f in rep.findings}))
        self._canaries(sound)
        return rep

    def _canaries(self, sound: bool) -> None:
        """The canaries' findings, the coverage finding and the incidents (validate's tail)."""
        d, rep, path = self.d, self.rep, self.d.path
        can = writes = None
        if sound and d.groups_of("canary"):
            from kvconv.check import canary

            can = canary.check(d)
            rep.findings.extend(can.findings)
        if sound and (d.groups_of("slot_write") or d.groups_of("write_step")):
            from kvconv.check.canary import writes as writes_canary

            writes = writes_canary.check(d, path=path)
            rep.findings.extend(writes.findings)
        if rep.unreadable:
            rep.incidents = [v._one(f) for f in rep.findings if f.severity != "info"]
            return
        from kvconv.check import verdict

        steps = can.counts["steps_checked"] if can is not None else 0
        cov = verdict.coverage(d, canary_steps=steps,
                               write_steps=writes.summary.get("steps", 0) if writes is not None else 0)
        if cov is not None:
            rep.findings.append(cov)
        rep.incidents = verdict.incidents(d, rep.findings, canary_res=can)

    def _own_walk(self, ctx: int) -> None:
        """The device-event pass of a context no emitter walk finished, read here, as validate reads it."""
        self.active.discard(ctx)
        w = _Walk(self, ctx, verifying=False)
        first = 0
        for g in self.d.groups_of("device_event", context_id=ctx):
            for base, ev in g.chunks(EV_CHUNK):
                w._chunk(g, base, first + base, ev)  # (a failure of the checks is raised here, as validate's)
                self.pages.done(g, base, len(ev), w.crc)  # a large dump's checked pages go back, as validate's
            self.pages.flush(w.crc)
            w._group_end(g, None)
            first += len(g.records)
        w.end()


class _Walk:
    """One walk of a context's device events feeding the checks: chunk by chunk (:meth:`chunk`), group by group
    (:meth:`group_end`); its findings count only once it has run to the end (:meth:`end`)."""

    def __init__(self, checks: Checks, ctx: int, *, verifying: bool) -> None:
        self.checks, self.ctx, self.verifying = checks, ctx, verifying
        d, rc = checks.d, checks.rc
        self.c = _Collector(d.path)
        self.s = rc.stream(ctx) if rc is not None and ctx in rc.contexts else None
        grids = _grid_tables(d, ctx, self.s.t if self.s is not None else None)
        self.ev = _EventChecks(checks.slots[ctx], grids)
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
        :meth:`Checks.finish` checks the context again by itself, where the failure is raised as validate raises it."""
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
        """The walk ran to the end: the reconciler closes the context, the host records are checked, and the
        context's findings count."""
        ch = self.checks
        if self.failed:
            self.abandon()
            return
        if self.s is not None:
            try:
                ch.rc.close(self.ctx)
            except Exception as e:  # noqa: BLE001 - damaged records: raised at finish only if the file is sound
                ch.rc_error = ch.rc_error or e
        v._check_host_launches(_ContextView(ch.d, self.ctx), self.c, ch.slots[self.ctx], ch.pages)
        ch.done[self.ctx] = self.c
        ch.active.discard(self.ctx)

    def abandon(self) -> None:
        """The walk stopped before the end (a probe that gave up): a later walk feeds the checks again."""
        self.checks.active.discard(self.ctx)
