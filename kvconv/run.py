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
    """One dump of a run: its reader, checks, verdict and views, each computed once when first asked for."""

    def __init__(self, path: PathLike, options: RunOptions, *, progress=None) -> None:
        self.path = str(path)
        self.options = options
        self.progress = progress  # progress(done, total) of the checks, in bytes (kvconv.progress)
        self._reader = None
        self._joins: dict = {}  # context id -> (LaunchTable, ExactJoin)

    def __repr__(self) -> str:
        return f"<kvconv DumpRun {self.path!r}>"

    @property
    def reader(self):
        """The open dump (:func:`kvconv.format.dump.open`): groups, records as numpy views, metadata."""
        if self._reader is None:
            from kvconv.format import dump

            self._reader = dump.open(self.path, options=dump.ReadOptions(salvage=self.options.salvage,
                                                                         verify_checksums=self.options.verify_checksums))
        return self._reader

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def metadata_or_none(self) -> dict | None:
        """The dump's run metadata from its reader (which the run's other views share); None where it cannot be
        read (the verdict says why)."""
        import warnings

        from kvconv.format.errors import KvconvError

        try:
            with warnings.catch_warnings():  # an unfinished dump's warning is its validation's to say
                warnings.simplefilter("ignore")
                meta = self.reader.metadata()
        except (KvconvError, OSError, ValueError):
            return None
        return meta if isinstance(meta, dict) else None

    @cached_property
    def validation(self):
        """kvconv validate's report (:class:`kvconv.check.validate.Report`): every pass's findings, the incidents,
        the verdict."""
        from kvconv.check.validate import validate

        return validate(self.path, options=self.options.validate_options(), progress=self.progress)

    def adopt(self, report) -> None:
        """Take ``report`` (validate's, of this dump, made elsewhere: by a converter's own pass over the events) as
        :attr:`validation`, so that it is not computed again."""
        self.__dict__["validation"] = report

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
    """A run of one or several dumps (module docstring). A context manager: ``with kvconv.open(p) as run: ...``
    closes the readers it opened."""

    def __init__(self, paths: PathLike | Iterable[PathLike], *, options: RunOptions = RunOptions(),
                 one_run: bool = False) -> None:
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.options = options
        self.one_run = one_run  # the dumps are one run whatever their metadata says (what kvconv record ran)
        self.dumps: tuple[DumpRun, ...] = tuple(DumpRun(p, options) for p in paths)
        if not self.dumps:
            from kvconv.format.errors import UsageError

            raise UsageError("kvconv.open needs at least one dump path")
        self._tables_dir = None

    @property
    def paths(self) -> list[str]:
        return [d.path for d in self.dumps]

    def __repr__(self) -> str:
        return f"<kvconv Run {self.paths!r}>"

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for d in self.dumps:
            d.close()
        if self._tables_dir is not None:
            self._tables_dir.cleanup()
            self._tables_dir = None

    # ---- the verdict ---------------------------------------------------------------------------------------------

    @property
    def exit_code(self) -> int:
        """The run's exit status: its :attr:`verdict`'s."""
        from kvconv.check.verdict import EXIT_CODES

        return EXIT_CODES[self.verdict]

    @property
    def verdict(self) -> str:
        """The run's one verdict (:func:`kvconv.check.runs.judge`, :func:`kvconv.check.verdict.of_run`): each run
        among its dumps (the processes and probe dumps of one engine run) judged as one, the worst of them; a
        process that ran no target kernel does not make a checked run nothing-checked; what was asked and ran in
        none of its dumps (:attr:`run_findings`) is judged with them."""
        from kvconv.check.verdict import worst

        return worst(j.verdict for j in self.judged)

    @property
    def run_findings(self) -> list:
        """The findings of the run as a whole (:func:`kvconv.check.asked.of_run`): each check asked for that none of
        its dumps ran (a dump's own findings are in :attr:`findings`)."""
        return [f for j in self.judged for f in j.findings]

    @property
    def runs(self) -> list[set[int]]:
        """The runs among its dumps (indices into :attr:`dumps`): the processes and probe dumps linked by their
        metadata (:func:`kvconv.check.runs.split`); one for a lone dump or what kvconv record ran."""
        if "_runs" not in vars(self):
            from kvconv.check.runs import split

            self._runs = split(self.paths, one=self.one_run, metas=[d.metadata_or_none() for d in self.dumps]
                               if len(self.dumps) > 1 and not self.one_run else None)
        return self._runs

    @property
    def judged(self) -> list:
        """Each run among its dumps judged as one (:func:`kvconv.check.runs.judge`: dumps, verdict, findings)."""
        if "_judged" not in vars(self):
            from kvconv.check.runs import judge

            reps = [d.validation for d in self.dumps]
            self._judged = judge(self.paths, [r.verdict for r in reps], [r.asked for r in reps], per=self.runs)
        return self._judged

    @property
    def findings(self) -> list:
        return [f for d in self.dumps for f in d.findings]

    @property
    def incidents(self) -> list[dict]:
        return [i for d in self.dumps for i in d.incidents]

    # ---- one dump's views, for a one-dump run -------------------------------------------------------------------

    def _one(self) -> DumpRun:
        if len(self.dumps) > 1:
            raise ValueError(f"a run of {len(self.dumps)} dumps: ask run.dumps[i] for one dump's")
        return self.dumps[0]

    reader = property(lambda self: self._one().reader, doc="the one dump's reader (DumpRun.reader)")
    validation = property(lambda self: self._one().validation, doc="the one dump's validate report")
    passes = property(lambda self: self._one().passes, doc="the one dump's passes (name -> PassResult)")
    reconciliation = property(lambda self: self._one().reconciliation, doc="the one dump's reconciliation")
    canary = property(lambda self: self._one().canary, doc="the one dump's location canary result")
    writes = property(lambda self: self._one().writes, doc="the one dump's write-address canary result")
    values = property(lambda self: self._one().values, doc="the one dump's value canary result")

    # ---- converters -----------------------------------------------------------------------------------------------

    def write(self, fmt: str, out: PathLike, *, options=None, warn=None, force: bool = False):
        """Write the run in a registered output format (:mod:`kvconv.emit.registry`: perfetto, chrome, arrow);
        ``options``: :class:`kvconv.emit.EmitOptions` (salvage follows the run's); ``force``: replace an existing
        output (as ``--force``)."""
        from kvconv.emit import EmitOptions
        from kvconv.emit.registry import FORMATS

        opts = options if options is not None else EmitOptions()
        if (self.options.salvage and not opts.salvage) or (force and not opts.force):
            opts = replace(opts, salvage=opts.salvage or self.options.salvage, force=opts.force or force)
        res = FORMATS[fmt].write(self.paths, str(out), options=opts, warn=warn)
        self._adopt(getattr(res, "verdicts", None) or [])
        return res

    def _adopt(self, reports: list) -> None:
        """Take each dump's validate report from the pass that converted it (``EmitOptions(verdict=True)``), so
        that the run's verdict costs no second pass; a dump whose checks failed there is validated on its own."""
        from kvconv.check.validate import Report

        if len(reports) != len(self.dumps):
            return
        for dr, rep in zip(self.dumps, reports):
            if isinstance(rep, Report) and "validation" not in vars(dr):
                dr.adopt(rep)

    def to_perfetto(self, out: PathLike, *, options=None, force: bool = False):
        """A Perfetto trace (what ``kvconv perfetto`` writes): ui.perfetto.dev, trace_processor."""
        return self.write("perfetto", out, options=options, force=force)

    def to_chrome(self, out: PathLike, *, options=None, force: bool = False):
        """Chrome JSON trace events (what ``kvconv chrome`` writes)."""
        return self.write("chrome", out, options=options, force=force)

    def to_arrow(self, out: PathLike, *, options=None, force: bool = False):
        """A partitioned Arrow IPC / Parquet dataset (what ``kvconv arrow`` writes)."""
        return self.write("arrow", out, options=options, force=force)

    def report(self, out: PathLike, *, force: bool = False) -> dict:
        """Write the self-contained HTML page of ``kvconv report`` (replacing ``out`` only with ``force`` or when it
        is kvconv's own earlier page); returns ``{"path", "bytes", "plots"}``."""
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
        whole = [(d.path, p) for d, p in zip(self.dumps, profiles) if p is not None]
        cross = skew.cross_dump([w for w, _ in whole], [p.reconcile for _, p in whole]) if len(whole) > 1 else None
        return report.page(profiles, cross=cross, verdicts=[d.validation.to_dict() for d in self.dumps])

    # ---- tables ----------------------------------------------------------------------------------------------------

    @property
    def tables(self) -> list[str]:
        """The names :meth:`table` answers: the tables of ``kvconv arrow`` (one per exported record kind, plus
        ``launch`` and ``matches``)."""
        return sorted(p.name for p in self._arrow_dir().iterdir() if p.is_dir())

    def table(self, name: str):
        """A ``pyarrow.Table`` of the run (every dump's rows): ``run.table("launch").to_pandas()``."""
        import pyarrow.dataset as ds

        path = self._arrow_dir() / name
        if not path.is_dir():
            raise KeyError(f"no table {name!r}: the run has {', '.join(self.tables)}")
        return ds.dataset(path, format="arrow", partitioning="hive").to_table()

    def to_pandas(self, name: str):
        """:meth:`table` as a pandas DataFrame."""
        return self.table(name).to_pandas()

    def _arrow_dir(self) -> Path:
        if self._tables_dir is None:
            import tempfile

            from kvconv.emit import EmitOptions

            tmp = tempfile.TemporaryDirectory(prefix="kvconv-run-")
            self.to_arrow(Path(tmp.name) / "tables", options=EmitOptions(progress=False))
            self._tables_dir = tmp
        return Path(self._tables_dir.name) / "tables"


def open(paths: PathLike | Iterable[PathLike], *, options: RunOptions = RunOptions(),  # noqa: A001
         whole_run: bool = True) -> Run:
    """The run of one dump or of several (one engine run's processes): :class:`Run`.

    Args:
        paths: a dump, several, or a run's ``kvconv record -o`` path (literal or with %p).
        options: how the dumps are read and checked.
        whole_run: with every file of the run found beside them (:func:`kvconv.check.runs.find`: the other
            processes' dumps, the engine plugins' probe dumps); False: the paths as given.

    Returns:
        The :class:`Run`; ``run.paths`` lists the dumps it holds.
    """
    if whole_run:
        from kvconv.check.runs import find

        paths = find([paths] if isinstance(paths, (str, os.PathLike)) else list(paths))
    return Run(paths, options=options)
