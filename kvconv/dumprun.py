"""One dump of a run (:class:`DumpRun`): the dump opened once, and everything asked of it computed once from that
open file: its checks and verdict, reconciliation, canaries, launch tables, profile, process and clocks. A
:class:`kvconv.run.Run` holds one per dump (``run.dumps[i]``); ``kvconv.run.DumpRun`` names it too.

    >>> import kvconv
    >>> with kvconv.open("qwen3-14b.kvdump") as run:           # doctest: +SKIP
    ...     dr = run.dumps[0]
    ...     dr.verdict, dr.reconciliation.agreement_line()
    ('ok', '280 graph-node records = 280 expected executions = 280 device events, 0 drops')
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

PathLike = str | os.PathLike


@dataclass(frozen=True)
class RunOptions:
    """How a run is read and checked (keyword-only, frozen).

    salvage: read dumps cut short up to their last whole record. reconcile / relaxed: run the reconciler in the
    checks, its mismatches as warnings with ``relaxed``. canary / missing_writes: run the canaries; report expected
    pages that did not change. join / strict_coverage: the join of :attr:`DumpRun.reconciliation` and of the report's
    profile (``kvconv reconcile --join``), the late-coverage blocks as errors.
    """

    salvage: bool = False
    reconcile: bool = True
    relaxed: bool = False
    canary: bool = True
    missing_writes: bool = True
    join: str = "auto"
    strict_coverage: bool = False
    verify_checksums: bool = True  # the reader refuses a payload checksum that does not match (the checks report it)

    def __post_init__(self) -> None:
        from kvconv.format.errors import UsageError
        from kvconv.join import JOINS

        if self.join not in JOINS:  # refused when the run is made, before any work
            raise UsageError(f"--join must be one of {', '.join(JOINS)}, not {self.join!r}", code="bad-join")

    def validate_options(self):
        """These options as validate's (:class:`kvconv.check.validate.ValidateOptions`)."""
        from kvconv.check.validate import ValidateOptions

        return ValidateOptions(reconcile=self.reconcile, relaxed_reconcile=self.relaxed, canary=self.canary,
                               salvage=self.salvage, missing_writes=self.missing_writes)

    def reconcile_options(self):
        """These options as reconcile's (:class:`kvconv.check.reconcile.ReconcileOptions`)."""
        from kvconv.check.reconcile import ReconcileOptions

        return ReconcileOptions(join=self.join, relaxed=self.relaxed, strict_coverage=self.strict_coverage)


@dataclass(frozen=True)
class Part:
    """Some checks' part of a dump's verdict (``kvconv canary``'s): their findings with the dump's own state, judged
    as the whole is (:func:`kvconv.check.verdict.part`)."""

    verdict: str
    findings: list  # the checks' own findings (the dump's structure findings judged, not listed)
    incidents: list[dict]
    results: dict  # check name -> its result (CanaryResult, WritesResult, ...)

    @property
    def exit_code(self) -> int:
        """The part's verdict's exit status (schemas/codes.json ``verdicts``)."""
        from kvconv.check.verdict import EXIT_CODES

        return EXIT_CODES[self.verdict]


class DumpRun:
    """One dump of a run: the dump opened once, its checks, verdict and views, each computed once when first asked
    for. Everything that reads the dump takes this one open file: the checks (:attr:`validation`), the converters
    (:meth:`Run.write`), :attr:`reader`'s users (reconcile, canaries, the report's profile) and the run's process
    links (:attr:`process`).

    Args:
        path: the dump file ('-': standard input; ``.gz``/``.zst``: decompressed once, into a temporary file).
        options: how it is read and checked (:class:`RunOptions`).
        progress: ``progress(done, total)`` of the checks, in bytes (:mod:`kvconv.progress`).
    """

    def __init__(self, path: PathLike, options: RunOptions, *, progress=None) -> None:
        self.path = str(path)
        self.options = options
        self.progress = progress
        self._dump = None  # the one open dump (kvconv.format.dump.scan's); None until asked for, or once closed
        self._open_error = None  # the error opening it raised (said again, never retried)
        self._told = False  # its readable problems said as warnings (once)
        self._verified = False  # its payload checksums verified for :attr:`reader`
        self._validation = None  # kvconv.check.validate.Validation: the checks, run once
        self._report = None
        self._joins: dict = {}  # context id -> (LaunchTable, ExactJoin)

    def __repr__(self) -> str:
        return f"<kvconv DumpRun {self.path!r}>"

    def scanned(self):
        """The dump as it was opened, once (:func:`kvconv.format.dump.scan`): every structural problem collected in
        ``.problems``, payload checksums not yet summed (the checks and the converters sum them as they read).

        Raises:
            FormatError: the file cannot be opened at all (no such file, a folder, a compressed stream that does not
                decompress), each time it is asked for.
        """
        from kvconv.format import dump
        from kvconv.format.errors import KvconvError

        if self._dump is None:
            if self._open_error is not None:
                raise self._open_error
            try:
                self._dump = dump.scan(self.path, options=dump.ReadOptions(salvage=self.options.salvage,
                                                                           verify_checksums=False))
            except KvconvError as e:
                self._open_error = e
                raise
        return self._dump

    def opened(self):
        """The open dump as :func:`kvconv.format.dump.open` gives it, its payload checksums not verified (a converter
        sums them as it streams the records): its first structural error raised, its other problems said once as
        warnings (:class:`kvconv.format.dump.DumpWarning`).

        Raises:
            FormatError: the dump is not readable as a whole (the one-line error of its first structural problem).
        """
        import warnings

        from kvconv.format.dump import DumpWarning
        from kvconv.format.errors import FormatError

        d = self.scanned()
        first = next((p for p in d.problems if p.severity == "error"), None)
        if first is not None:  # closed, as dump.open closes what it refuses (the checks' report, if made, is kept)
            self._release()
            raise FormatError(first.message, path=first.path, group=first.group, offset=first.offset,
                              field=first.field, code=first.code)
        if not self._told:
            self._told = True
            for p in d.problems:
                warnings.warn(p.line(), DumpWarning, stacklevel=2)
        return d

    @property
    def reader(self):
        """The open dump (:func:`kvconv.format.dump.open`'s ``Dump``: groups, records as numpy views, metadata),
        its payload checksums verified once (``RunOptions.verify_checksums``; from the checks' own sums when they
        ran first).

        Raises:
            FormatError: the dump is not readable as a whole. DamagedError: a payload checksum does not match.
        """
        d = self.opened()
        if self.options.verify_checksums and not self._verified:
            _verify_payloads(d, self._report)
            self._verified = True
        return d

    def close(self) -> None:
        """Close the dump, keeping what the run asks of it after (its process and metadata: a few kilobytes);
        asked for again, it is opened again."""
        if self._dump is not None:
            self.process  # noqa: B018 - read while the file is open (kvconv.run.Run.runs asks after)
            self.metadata_or_none()
            self._release()

    def _release(self) -> None:
        """The file closed; checks not finished would read it: made again, on the file opened again, if asked for."""
        if self._validation is not None and not self._validation.done:
            self._validation = None
        if self._dump is not None:
            self._dump.close()
            self._dump = None
            self._verified = False

    def __del__(self) -> None:
        # a run let go without close (a notebook's, a command stopped by an error): its file closed with it
        try:
            self._release()
        except Exception:  # noqa: BLE001, S110 - at interpreter exit the modules it needs may be gone already
            pass

    @cached_property
    def process(self) -> dict:
        """The traced process the dump came from (:func:`kvconv.format.info.process_of`, from the open dump's
        metadata): pid, ppid, command, hostname, ...; empty when the metadata cannot be read."""
        from kvconv.format.errors import KvconvError
        from kvconv.format.info import process_of

        try:
            return process_of(self.scanned())
        except KvconvError:
            return {}

    def metadata_or_none(self) -> dict | None:
        """The dump's run metadata, from the one open dump (no checksum summed for it), read once and kept after
        :meth:`close`; None where it cannot be read (the verdict says why)."""
        from kvconv.format.errors import KvconvError

        if "_meta" not in vars(self):
            try:
                meta = self.scanned().metadata()
            except (KvconvError, OSError, ValueError):
                meta = None
            self._meta = meta if isinstance(meta, dict) else None
        return self._meta

    @cached_property
    def clocks(self):
        """What the cross-dump replay skew needs of the dump (:func:`kvconv.check.skew.clocks`: its path, hostname
        and clock per context); None when it cannot be read."""
        from kvconv.check import skew
        from kvconv.format.errors import KvconvError

        try:
            return skew.clocks(self.scanned())
        except KvconvError:
            return None

    def checking(self):
        """The dump's checks (:class:`kvconv.check.validate.Validation`), made once: :attr:`validation` runs them
        over the whole dump, a converter (:meth:`Run.write`) feeds them the chunks it reads; whichever gets there
        first computes the report, once.

        Raises:
            FormatError: the file cannot be opened at all (:meth:`scanned`).
        """
        if self._validation is None:
            from kvconv.check.validate import Validation

            self._validation = Validation(self.scanned(), self.options.validate_options(), self.progress)
        return self._validation

    @property
    def validation(self):
        """kvconv validate's report (:class:`kvconv.check.validate.Report`): every pass's findings, the incidents,
        the verdict; computed once (:meth:`checking`). A dump that cannot be opened has a report too (its one error
        finding, verdict unreadable)."""
        if self._report is None:
            from kvconv.check.validate import unopened
            from kvconv.format.errors import KvconvError

            try:
                v = self.checking()
            except KvconvError as e:
                self._report = unopened(self.path, e)
            else:
                self._report = v.finish()
        return self._report

    @property
    def verdict(self) -> str:
        """ok, failed, incomplete, nothing-checked or unreadable (:func:`kvconv.check.verdict.judge`)."""
        return self.validation.verdict

    @property
    def exit_code(self) -> int:
        """The verdict's exit status (schemas/codes.json ``verdicts``: 0 ok, 1 failed, 2 unreadable, ...)."""
        return self.validation.exit_code

    @property
    def findings(self) -> list:
        """Every finding of the checks (:class:`kvconv.format.findings.Finding`), in the passes' order."""
        return self.validation.findings

    @property
    def incidents(self) -> list[dict]:
        """The findings grouped by cause (:func:`kvconv.check.verdict.incidents`)."""
        return self.validation.incidents

    @property
    def passes(self) -> dict:
        """Each pass that ran (name -> :class:`kvconv.check.passes.PassResult`: findings, what it checked)."""
        return self.validation.passes

    def unreadable_error(self):
        """The one-line error of a dump that cannot be read as a whole (its first error finding, a
        :class:`~kvconv.format.errors.FormatError` to raise or print), else None."""
        from kvconv.format.errors import FormatError

        rep = self.validation
        if not rep.unreadable:
            return None
        first = next(f for f in rep.findings if f.severity == "error")
        return FormatError(first.message, path=first.path, offset=first.offset, field=first.field, group=first.group,
                           code=first.code)

    def _result(self, name: str):
        res = self.passes.get(name)
        return res.result if res is not None else None

    def part(self, *names: str) -> Part:
        """The part of the verdict of some passes, as ``kvconv canary`` states it: those passes run on the reader,
        their findings judged with the dump's own state (the reader's problems: cut short, unfinished) as the whole
        is. The other passes do not run.

        Args:
            names: passes of :func:`kvconv.check.passes.registry` (canary, writes, values).

        Returns:
            A :class:`Part`: verdict, findings, incidents, each pass's result.

        Raises:
            FormatError: the dump is not readable as a whole. DamagedError: a payload checksum does not match.
        """
        from kvconv.check import passes, verdict

        d = self.reader
        st = passes.Checking(d, self.options.validate_options())
        results = {name: res for name in names if (res := getattr(passes, name)(st)) is not None}
        found = [f for r in results.values() for f in r.findings]
        checked = any(r.verified for r in results.values())
        return Part(verdict.part(list(d.problems) + found, checked=checked), found, verdict.incidents(found, results),
                    {k: r.result for k, r in results.items()})

    @property
    def canary(self):
        """The location canary's result (None: no canary record, or not checked)."""
        return self._result("canary")

    @property
    def writes(self):
        """The write-address canary's result (None: no slot_write or write_step record, or not checked)."""
        return self._result("writes")

    @property
    def values(self):
        """The value canary's result (None: no value_digest record)."""
        return self._result("values")

    @cached_property
    def reconciliation(self):
        """kvconv reconcile's result with the run's join (:class:`kvconv.check.reconcile.ReconcileResult`), its
        match and launch tables included (``.to_arrow("matches")``)."""
        return self.reconcile(tables=True)

    def reconcile(self, *, tables: bool = True):
        """kvconv reconcile's result with the run's join (computed again on each call; :attr:`reconciliation` keeps
        one).

        Args:
            tables: keep the match and launch tables; False: the report only, memory bounded by the host records.

        Returns:
            A :class:`kvconv.check.reconcile.ReconcileResult`.

        Raises:
            FormatError / DamagedError: the dump is not readable, or its records are damaged.
        """
        from kvconv.check import reconcile

        return reconcile.reconcile(self.reader, options=self.options.reconcile_options(), tables=tables,
                                   progress=self.progress)

    def launches(self, context_id: int = 0):
        """One context's launch table and its exact (gridid, tag) join, loaded once.

        Args:
            context_id: the context (``reader.contexts()``).

        Returns:
            ``(LaunchTable, ExactJoin)`` (:func:`kvconv.join.exact.load_joined`).

        Raises:
            FormatError / DamagedError: the dump is not readable, or its records are damaged.
        """
        from kvconv.join.exact import load_joined

        if context_id not in self._joins:
            self._joins[context_id] = load_joined(self.reader, context_id)
        return self._joins[context_id]

    @cached_property
    def profile(self):
        """What kvconv report and diff plot (:func:`kvconv.look.profile.profile`); None where the records are
        damaged (the verdict says so)."""
        from kvconv.format.errors import KvconvError
        from kvconv.look.profile import profile

        try:
            p = profile(self.reader, join=self.options.join, progress=self.progress)
            self.clocks  # noqa: B018 - what the report pairs with it across dumps, read while the file is open
            return p
        except KvconvError:
            if self.verdict != "failed":
                raise
            return None


def _verify_payloads(d, report) -> None:
    """Refuse a dump whose payload checksums do not match, as :func:`kvconv.format.dump.open` does: from ``report``
    (the checks summed every checksum) when there is one, else summed here (a large file's pages given back as
    they are summed)."""
    from kvconv.format import dump
    from kvconv.format.errors import DamagedError

    if report is not None:
        bad = next((f for f in report.findings if f.code == "payload-checksum"), None)
        if bad is not None:
            raise DamagedError("payload checksum does not match header.payload_crc32", path=d.path, group=bad.group,
                               offset=bad.offset, field=bad.field, code=bad.code)
        return
    release = (lambda off, n: dump.release_pages(d._mm, off, n)) if d.size > dump.RELEASE_AFTER_CRC else None
    for g in d.groups:
        if not g.lost_records and not g.crc_ok(release=release):
            raise DamagedError("payload checksum does not match header.payload_crc32", path=d.path, group=g.index,
                               offset=g.payload_offset, field="header.payload_crc32", code="payload-checksum")
