"""One traced run, the centre every command and notebook starts from: ``kvconv.open(path_or_paths) -> Run``.

A run is one dump, or the per-process dumps of one engine run (its front end, scheduler or workers:
:mod:`kvconv.check.runs`). Everything is computed when first asked for and kept: the readers, each dump's checks (the
passes of :mod:`kvconv.check.passes`, run once), the verdict (:mod:`kvconv.check.verdict`, the only judge), the
reconciliation, the canaries, the Arrow tables; the converters write what ``kvconv perfetto | chrome | arrow |
report`` write.

    >>> import kvconv
    >>> run = kvconv.open("qwen3-14b.kvdump")                 # doctest: +SKIP
    >>> run.verdict, run.exit_code                              # doctest: +SKIP
    ('ok', 0)
    >>> run.reconciliation.agreement_line()                     # doctest: +SKIP
    '280 graph-node records = 280 expected executions = 280 device events, 0 drops'
    >>> run.table("launch").to_pandas().head()                  # doctest: +SKIP
    >>> run.to_perfetto("run.pftrace"); run.report("run.html")  # doctest: +SKIP

Per dump: ``run.dumps[i]`` (a :class:`DumpRun`); a one-dump run answers its dump's questions itself
(``run.reconciliation``, ``run.canary``, ...).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

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

    def validate_options(self):
        from kvconv.check.validate import ValidateOptions

        return ValidateOptions(reconcile=self.reconcile, relaxed_reconcile=self.relaxed, canary=self.canary,
                               salvage=self.salvage, missing_writes=self.missing_writes)

    def reconcile_options(self):
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
        self._validation = None  # kvconv.check.validation.Validation: the checks, run once
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
        if first is not None:
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
        """Close the dump, keeping what the run asks of it after (its process, its clocks: a few hundred bytes);
        asked for again, it is opened again."""
        if self._dump is not None:
            self.process  # noqa: B018 - read while the file is open (kvconv.check.runs.one_run asks after)
            self.clocks  # noqa: B018 - (the cross-dump skew of kvconv reconcile and report asks after)
            self._dump.close()
            self._dump = None
            self._verified = False

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
        """The dump's checks (:class:`kvconv.check.validation.Validation`), made once: :attr:`validation` runs them
        over the whole dump, a converter (:meth:`Run.write`) feeds them the chunks it reads; whichever gets there
        first computes the report, once.

        Raises:
            FormatError: the file cannot be opened at all (:meth:`scanned`).
        """
        if self._validation is None:
            from kvconv.check.validation import Validation

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
        return self.validation.exit_code

    @property
    def findings(self) -> list:
        return self.validation.findings

    @property
    def incidents(self) -> list[dict]:
        return self.validation.incidents

    @property
    def passes(self) -> dict:
        """Each pass that ran (name -> :class:`kvconv.check.passes.PassResult`: findings, what it checked)."""
        return self.validation.passes

    def unreadable_error(self):
        """The one-line error of a dump that cannot be read as a whole (its first error finding), else None."""
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
        """The part of the verdict of the passes ``names`` (canary, writes, values), as ``kvconv canary`` states it:
        those passes run on the reader (which refuses a damaged payload), their findings judged with the dump's own
        state (the reader's problems: cut short, unfinished) as the whole is. The other passes do not run."""
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
        """kvconv reconcile's result; ``tables=False``: the report only, memory bounded by the host records."""
        from kvconv.check import reconcile

        return reconcile.reconcile(self.reader, options=self.options.reconcile_options(), tables=tables,
                                   progress=self.progress)

    def launches(self, context_id: int = 0):
        """One context's launch table and its exact (gridid, tag) join (:func:`kvconv.join.exact.load_joined`),
        loaded once."""
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
            return profile(self.reader, join=self.options.join, progress=self.progress)
        except KvconvError:
            if self.verdict != "failed":
                raise
            return None


class Run:
    """A run of one or several dumps (module docstring): each dump opened once (:class:`DumpRun`), and every
    question of the run (verdict, reconciliation, canaries, tables, converters, report) asked of those open dumps.
    A context manager: ``with kvconv.open(p) as run: ...`` closes them.

        >>> with kvconv.open(["rank0.kvdump", "rank1.kvdump"]) as run:   # doctest: +SKIP
        ...     run.exit_code, [d.verdict for d in run.dumps]
        (0, ['ok', 'ok'])

    Args:
        paths: one dump path, or several (one engine run's processes, a tensor-parallel run's ranks).
        options: how the dumps are read and checked (:class:`RunOptions`).

    Raises:
        UsageError: no path given.
    """

    def __init__(self, paths: PathLike | Iterable[PathLike], *, options: RunOptions = RunOptions()) -> None:
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.options = options
        self.dumps: tuple[DumpRun, ...] = tuple(DumpRun(p, options) for p in paths)
        if not self.dumps:
            from kvconv.format.errors import UsageError

            raise UsageError("kvconv.open needs at least one dump path", code="no-input")

    @property
    def paths(self) -> list[str]:
        """The dumps' paths, in the order given."""
        return [d.path for d in self.dumps]

    def __repr__(self) -> str:
        return f"<kvconv Run {self.paths!r}>"

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close every dump (each is opened again if asked for again)."""
        for d in self.dumps:
            d.close()

    # ---- the verdict ---------------------------------------------------------------------------------------------

    @property
    def exit_code(self) -> int:
        """The run's exit status: the worst of its dumps'; the processes of one run as one (a process that ran no
        target kernel does not make it nothing-checked: :func:`kvconv.check.runs.set_exit`)."""
        from kvconv.check.runs import of_run

        return of_run([d.process for d in self.dumps], [d.exit_code for d in self.dumps])

    @property
    def verdict(self) -> str:
        """The run's verdict: the verdict whose exit status is :attr:`exit_code`."""
        from kvconv.check.verdict import EXIT_CODES

        return next(v for v, code in EXIT_CODES.items() if code == self.exit_code)

    @property
    def findings(self) -> list:
        """Every dump's findings (:class:`kvconv.format.findings.Finding`), in dump order."""
        return [f for d in self.dumps for f in d.findings]

    @property
    def incidents(self) -> list[dict]:
        """Every dump's incidents (findings grouped by cause: :func:`kvconv.check.verdict.incidents`)."""
        return [i for d in self.dumps for i in d.incidents]

    # ---- one dump's views, for a one-dump run -------------------------------------------------------------------

    def _one(self) -> DumpRun:
        if len(self.dumps) > 1:
            from kvconv.format.errors import UsageError

            raise UsageError(f"a run of {len(self.dumps)} dumps: ask run.dumps[i] for one dump's", code="several-dumps")
        return self.dumps[0]

    reader = property(lambda self: self._one().reader, doc="the one dump's reader (DumpRun.reader)")
    validation = property(lambda self: self._one().validation, doc="the one dump's validate report")
    passes = property(lambda self: self._one().passes, doc="the one dump's passes (name -> PassResult)")
    reconciliation = property(lambda self: self._one().reconciliation, doc="the one dump's reconciliation")
    canary = property(lambda self: self._one().canary, doc="the one dump's location canary result")
    writes = property(lambda self: self._one().writes, doc="the one dump's write-address canary result")
    values = property(lambda self: self._one().values, doc="the one dump's value canary result")

    # ---- converters -----------------------------------------------------------------------------------------------

    def write(self, fmt: str, out: PathLike, *, options=None, warn=None):
        """Write the run in a registered output format, from the run's open dumps.

        With ``options.verdict`` the converter feeds each dump's checks (:meth:`DumpRun.checking`) the chunks it
        reads: the dumps' verdicts cost no second pass, and are the dumps' own (``dr.validation``).

        Args:
            fmt: a format of :mod:`kvconv.emit.registry` (perfetto, chrome, arrow).
            out: the output path (``-``: standard output, where the format allows it).
            options: :class:`kvconv.emit.EmitOptions` (default: the run's join; salvage always follows the run's).
            warn: ``warn(message)`` for each warning (default: collected in the result's ``warnings``).

        Returns:
            The format's :class:`kvconv.emit.EmitResult`.

        Raises:
            KvconvError: an unreadable or damaged dump (FormatError, DamagedError), an output that may not be
            written (OutputError), options that do not fit (UsageError); nothing is written then.
        """
        from kvconv.emit import EmitOptions
        from kvconv.emit.registry import format_of

        opts = options if options is not None else EmitOptions(join=self.options.join)
        opts = replace(opts, salvage=self.options.salvage)  # the dumps are open as the run reads them
        dumps = [d.opened() for d in self.dumps]
        checks = [d.checking() for d in self.dumps] if opts.verdict else None
        return format_of(fmt).write(dumps, str(out), options=opts, warn=warn, checks=checks)

    def to_perfetto(self, out: PathLike, *, options=None):
        """A Perfetto trace (what ``kvconv perfetto`` writes; ui.perfetto.dev, trace_processor): :meth:`write`."""
        return self.write("perfetto", out, options=options)

    def to_chrome(self, out: PathLike, *, options=None):
        """Chrome JSON trace events (what ``kvconv chrome`` writes): :meth:`write`."""
        return self.write("chrome", out, options=options)

    def to_arrow(self, out: PathLike, *, options=None):
        """A partitioned Arrow IPC / Parquet dataset (what ``kvconv arrow`` writes): :meth:`write`."""
        return self.write("arrow", out, options=options)

    def report(self, out: PathLike, *, force: bool = False) -> dict:
        """Write the self-contained HTML page of ``kvconv report``.

        Args:
            out: the page's path; replaced only with ``force`` or when it is kvconv's own earlier page.
            force: replace an existing file.

        Returns:
            ``{"path", "bytes", "plots"}``.

        Raises:
            OutputError: ``out`` may not be written (an input, another program's file without ``force``).
            FormatError: a dump is not readable as a whole.
        """
        from kvconv.format.atomic import atomic_output, check_output

        check_output(str(out), inputs=self.paths, kind="report", force=force)
        page = self.page()
        data = page.html.encode("utf-8")
        with atomic_output(str(out), inputs=self.paths, kind="report", force=force) as tmp:
            Path(tmp).write_bytes(data)
        return {"path": str(out), "bytes": len(data), "plots": page.plots}

    def page(self):
        """The report page (:func:`kvconv.look.report.page`): each dump's verdict and profile, the cross-dump skew."""
        from kvconv.check import skew
        from kvconv.look import report

        profiles = [d.profile for d in self.dumps]
        whole = [(d, p) for d, p in zip(self.dumps, profiles) if p is not None]
        cross = skew.cross_dump([d.clocks for d, _ in whole], [p.reconcile for _, p in whole]) \
            if len(whole) > 1 else None
        return report.page(profiles, cross=cross, verdicts=[d.validation.to_dict() for d in self.dumps])

    # ---- tables ----------------------------------------------------------------------------------------------------

    @property
    def tables(self) -> list[str]:
        """The names :meth:`table` answers: the tables ``kvconv arrow`` writes of this run (one per exported record
        kind, plus ``launch`` and ``matches``), sorted."""
        from kvconv.emit._tables import table_names

        return table_names([d.opened() for d in self.dumps], options=self._table_options())

    def table(self, name: str):
        """One table of the run (every dump's rows, with ``run`` and ``device`` columns as ``kvconv arrow``'s
        partitions give them), built from the open dumps by the Arrow converter's own code, in memory.

            >>> run.table("launch").to_pandas()      # doctest: +SKIP

        Args:
            name: one of :attr:`tables`.

        Returns:
            A ``pyarrow.Table``.

        Raises:
            UsageError: the run has no such table (the message lists those it has).
        """
        from kvconv.emit._tables import read_table

        return read_table([d.opened() for d in self.dumps], name, options=self._table_options())

    def to_pandas(self, name: str):
        """:meth:`table` as a pandas DataFrame."""
        return self.table(name).to_pandas()

    def _table_options(self):
        from kvconv.emit import EmitOptions

        return EmitOptions(join=self.options.join, salvage=self.options.salvage, progress=False)


def _verify_payloads(d, report) -> None:
    """Refuse a dump whose payload checksums do not match, as :func:`kvconv.format.dump.open` does: from ``report``
    (the checks summed every checksum) when there is one, else summed here (a large file's pages given back as
    they are summed)."""
    from kvconv.format import dump
    from kvconv.format.errors import DamagedError

    if report is not None:
        bad = next((f for f in report.findings if f.code == "payload-checksum"), None)
        if bad is not None:
            raise DamagedError("payload checksum does not match header.payload_crc32", path=d.path, group=bad.group, offset=bad.offset, field=bad.field,
                               code=bad.code)
        return
    release = (lambda off, n: dump.release_pages(d._mm, off, n)) if d.size > dump.RELEASE_AFTER_CRC else None
    for g in d.groups:
        if not g.lost_records and not g.crc_ok(release=release):
            raise DamagedError("payload checksum does not match header.payload_crc32", path=d.path, group=g.index,
                               offset=g.payload_offset, field="header.payload_crc32", code="payload-checksum")


def open(paths: PathLike | Iterable[PathLike], *, options: RunOptions = RunOptions()) -> Run:  # noqa: A001
    """The run of one dump or of several (one engine run's processes): :class:`Run` (nothing is read until asked).

    Raises:
        UsageError: no path given.
    """
    return Run(paths, options=options)
