"""One traced run, the centre every command and notebook starts from: ``kvconv.open(path_or_paths) -> Run``.

A run is one dump, or the per-process dumps of one engine run (its front end, scheduler or workers:
:mod:`kvconv.check.runs`). Each dump is opened once (:class:`kvconv.dumprun.DumpRun`) and everything takes that open
dump, computed when first asked for and kept: each dump's checks (the passes of :mod:`kvconv.check.passes`, run
once, by validate or fed by a converter's pass), the verdict (:mod:`kvconv.check.verdict`, the only judge), the
reconciliation, the canaries, the Arrow tables (built in memory by the Arrow writer's code); the converters write what
``kvconv perfetto | chrome | arrow | report`` write, from the same open dumps (tests/test_opens.py counts the opens).

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
from dataclasses import replace
from pathlib import Path

from kvconv.dumprun import DumpRun, Part, RunOptions  # noqa: F401 - kvconv.run.DumpRun / Part / RunOptions

PathLike = str | os.PathLike


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
        one_run: the dumps are one run whatever their metadata says (what ``kvconv record`` ran).
        held: dumps already open (path -> :class:`DumpRun`, of these ``options``), taken as the run's own (each
            taken is removed from ``held``).

    Raises:
        UsageError: no path given.
    """

    def __init__(self, paths: PathLike | Iterable[PathLike], *, options: RunOptions = RunOptions(),
                 one_run: bool = False, held: dict | None = None) -> None:
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.options = options
        self.one_run = one_run  # the dumps are one run whatever their metadata says (what kvconv record ran)
        held = held if held is not None else {}
        self.dumps: tuple[DumpRun, ...] = tuple(held.pop(str(p), None) or DumpRun(p, options) for p in paths)
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

            self._runs = split(self.paths, one=self.one_run, metas=[d.metadata_or_none() or {} for d in self.dumps]
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

    def write(self, fmt: str, out: PathLike, *, options=None, warn=None, force: bool = False):
        """Write the run in a registered output format, from the run's open dumps.

        With ``options.verdict`` the converter feeds each dump's checks (:meth:`DumpRun.checking`) the chunks it
        reads: the dumps' verdicts cost no second pass, and are the dumps' own (``dr.validation``).

        Args:
            fmt: a format of :mod:`kvconv.emit.registry` (perfetto, chrome, arrow).
            out: the output path (``-``: standard output, where the format allows it).
            options: :class:`kvconv.emit.EmitOptions` (default: the run's join; salvage always follows the run's).
            warn: ``warn(message)`` for each warning (default: collected in the result's ``warnings``).
            force: replace an existing output (as ``--force``).

        Returns:
            The format's :class:`kvconv.emit.EmitResult`.

        Raises:
            KvconvError: an unreadable or damaged dump (FormatError, DamagedError), an output that may not be
            written (OutputError), options that do not fit (UsageError); nothing is written then.
        """
        from kvconv.emit import EmitOptions
        from kvconv.emit.registry import format_of

        opts = options if options is not None else EmitOptions(join=self.options.join)
        # salvage: the dumps are open as the run reads them
        opts = replace(opts, salvage=self.options.salvage, force=opts.force or force)
        dumps = [d.opened() for d in self.dumps]
        checks = [d.checking() for d in self.dumps] if opts.verdict else None
        return format_of(fmt).write(dumps, str(out), options=opts, warn=warn, checks=checks)

    def to_perfetto(self, out: PathLike, *, options=None, force: bool = False):
        """A Perfetto trace (what ``kvconv perfetto`` writes; ui.perfetto.dev, trace_processor): :meth:`write`."""
        return self.write("perfetto", out, options=options, force=force)

    def to_chrome(self, out: PathLike, *, options=None, force: bool = False):
        """Chrome JSON trace events (what ``kvconv chrome`` writes): :meth:`write`."""
        return self.write("chrome", out, options=options, force=force)

    def to_arrow(self, out: PathLike, *, options=None, force: bool = False):
        """A partitioned Arrow IPC / Parquet dataset (what ``kvconv arrow`` writes): :meth:`write`."""
        return self.write("arrow", out, options=options, force=force)

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


def open(paths: PathLike | Iterable[PathLike], *, options: RunOptions = RunOptions(),  # noqa: A001
         whole_run: bool = True) -> Run:
    """The run of one dump or of several (one engine run's processes): :class:`Run`.

    Args:
        paths: a dump, several, or a run's ``kvconv record -o`` path (literal or with %p).
        options: how the dumps are read and checked.
        whole_run: with every file of the run found beside them (:func:`kvconv.check.runs.find`: the other
            processes' dumps, the engine plugins' probe dumps); False: the paths as given.

    Returns:
        The :class:`Run` (nothing is read until asked); ``run.paths`` lists the dumps it holds.

    Raises:
        UsageError: no path given.
    """
    if whole_run:
        return whole([paths] if isinstance(paths, (str, os.PathLike)) else list(paths), options)
    return Run(paths, options=options)


def whole(paths: list[PathLike], options: RunOptions, held: dict | None = None) -> Run:
    """The run of ``paths`` with every file of it found beside them (:func:`kvconv.check.runs.find`), each file
    opened once: a file found is asked its metadata through the :class:`DumpRun` the run then holds; one found not
    to be of the run is closed.

        >>> whole(["range-profiler.kvdump.zst"], RunOptions()).paths   # doctest: +SKIP
        ['range-profiler.kvdump.zst', 'range-profiler.pid959.kvdump.zst']

    Args:
        paths: the paths named (a dump, several, or a run's ``-o`` path).
        options: how the dumps are read and checked.
        held: dumps already open (path -> :class:`DumpRun`), which the run takes rather than opening them again.

    Returns:
        The :class:`Run`.
    """
    from kvconv.check.runs import find

    held = dict(held or {})

    def meta(p: str) -> dict:
        if p not in held:
            held[p] = DumpRun(p, options)
        return held[p].metadata_or_none() or {}

    run = Run(find([str(p) for p in paths], meta=meta), options=options, held=held)
    for dr in held.values():  # found beside them, not of the run
        dr.close()
    return run
