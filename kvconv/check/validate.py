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

One verdict (:mod:`kvconv.check.verdict`, the only module that judges): ok, failed, incomplete, nothing-checked,
unreadable; its exit status from schemas/codes.json ``verdicts``. ``Report.incidents``: the findings grouped by cause
(each pass groups its own).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kvconv.format import codes
from kvconv.format import dump as dumpmod
from kvconv.format.errors import KvconvError
from kvconv.format.findings import Finding

__all__ = ["ValidateOptions", "Report", "validate", "unopened", "UNREADABLE"]

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
    (:class:`kvconv.check.validation.Validation`, the one driver, over the whole dump).

    Args:
        dump: a path (opened here with :func:`kvconv.format.dump.scan`, closed after), or a dump already open
            (``dump.scan``'s, read with ``options.salvage``; left open: a :class:`kvconv.run.DumpRun` hands its own).
        options: which checks run (:class:`ValidateOptions`).
        progress: ``progress(done, total)`` in bytes of the file (:mod:`kvconv.progress`).

    Returns:
        The report. A file that cannot be opened or read as a whole is a report too (its one error finding,
        verdict ``unreadable``): validate raises nothing for bad input.
    """
    from kvconv.check.validation import Validation

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
    verdict's coverage finding and the incidents (the end of :meth:`kvconv.check.validation.Validation.finish`)."""
    from kvconv.check import verdict

    rep.findings, rep.passes = st.findings, st.results
    if rep.unreadable:
        rep.incidents = [_one(f) for f in rep.findings if f.severity != "info"]
        return
    cov = verdict.coverage(st.d, canary_steps=_checked(st, "canary"), write_steps=_checked(st, "writes"))
    if cov is not None:
        rep.findings.append(cov)
    rep.incidents = verdict.incidents(rep.findings, st.results)


def _checked(st, name: str) -> int:
    r = st.results.get(name)
    return int(r.checked.get("steps", 0)) if r is not None else 0


def _one(f: Finding) -> dict:
    return {"severity": f.severity, "code": f.code, "message": f.line(), "findings": 1, "where": {}}
