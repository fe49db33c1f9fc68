"""Validate a dump: structure, schema and semantics, reporting every problem found (aggregated per kind of problem).

    >>> from kvconv.check.validate import validate, ValidateOptions
    >>> report = validate("fixtures/qwen3-14b/qwen3-14b.kvdump")      # doctest: +SKIP
    >>> report.valid, report.exit_code                                 # doctest: +SKIP
    (True, 0)

Three layers, all vectorised over the mmap'd records:
- structure (kvconv.format.dump.scan): magic, versions, header checksums, sizes against the file, payload checksums;
- schema: header fields, the metadata JSON against schemas/metadata.schema.json, record enums, flags and ranges;
- semantics: sequence gaps and duplicates, %globaltimer going backwards, drops, kernel slots missing from the kernel
  table, blockIdx outside its launch's grid, and the reconciler's, the location canary's and the write-address
  canary's findings;
- coverage: nothing traced and nothing checked (``coverage-none``).

One verdict (:mod:`kvconv.check.verdict`): ok, failed, incomplete, nothing-checked, unreadable; its exit status from
schemas/codes.json ``verdicts`` (0, 1, 5, 4, 2). ``Report.incidents``: the findings grouped by cause.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kvconv.check._collect import _Collector, _crc_finding
from kvconv.check.validate_events import _check_device_events, _ContextView, _grid_tables, _Pages
from kvconv.check.validate_records import (
    _check_clock_sync,
    _check_headers,
    _check_host_launches,
    _check_kernels,
    _check_metadata,
)
from kvconv.format import codes, layout
from kvconv.format import dump as dumpmod
from kvconv.format.errors import KvconvError
from kvconv.format.findings import Finding

# The checks live in rooms of their own (kvconv.check.validate_records, kvconv.check.validate_events); the record
# kinds' hooks name them here (schemas/layouts.json "validate": "kvconv.check.validate:_check_...").
__all__ = ["ValidateOptions", "Report", "validate", "UNREADABLE", "_check_metadata", "_check_kernels",
           "_check_device_events", "_check_host_launches", "_check_clock_sync", "_Collector"]

# Structural problems after which the file cannot be read as a whole (exit 2): schemas/codes.json's "unreadable".
UNREADABLE = codes.UNREADABLE


@dataclass(frozen=True)
class ValidateOptions:
    """relaxed_reconcile: report the reconciler's mismatches as warnings (e.g. for a dump known to start late).
    reconcile / canary: include those checks. salvage: read a cut-short dump up to its last whole record."""

    reconcile: bool = True
    relaxed_reconcile: bool = False
    canary: bool = True
    salvage: bool = False


@dataclass
class Report:
    path: str
    findings: list[Finding] = field(default_factory=list)
    groups: int = 0
    size: int = 0
    incidents: list[dict] = field(default_factory=list)  # kvconv.check.verdict.incidents: findings by cause

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


def validate(path: str | os.PathLike, *, options: ValidateOptions = ValidateOptions(), progress=None) -> Report:
    """Validate one dump file and return a :class:`Report` with every finding. The device events are read once:
    the reconciler's streaming pass takes each chunk beside the checks. ``progress(done, total)``: bytes of the
    file (:mod:`kvconv.progress`)."""
    path = str(path)
    rep = Report(path=path)
    try:
        # Checksums are computed below, in the same pass as the record checks.
        d = dumpmod.scan(path, options=dumpmod.ReadOptions(salvage=options.salvage, verify_checksums=False))
    except KvconvError as e:
        rep.findings.append(Finding.from_error(e))
        rep.incidents = [_one(f) for f in rep.findings]
        return rep
    with d:
        rep.size = d.size
        rep.groups = len(d.groups)
        rep.findings.extend(d.problems)
        c = _Collector(path)
        _check_headers(d, c)
        _check_metadata(d, c)
        slots_by_ctx = _check_kernels(d, c)
        have_table = bool(d.groups_of("kernel"))
        if not have_table and (d.groups_of("device_event") or d.groups_of("graph_node")):
            c.add("warning", "no-kernel-table", "no kernel table: kernel slots cannot be named", field="kernel")
        rc = _reconciler(d, options) if options.reconcile and not rep.unreadable else None
        pages = _Pages(d, progress)
        rc_error = None
        for ctx, _dev in d.contexts():
            slots = slots_by_ctx.get(ctx, set()) if have_table else None
            sub = _ContextView(d, ctx)
            s = rc.stream(ctx) if rc is not None and ctx in rc.contexts else None
            _check_device_events(sub, c, slots, _grid_tables(d, ctx, s.t if s is not None else None),
                                 feed=s.feed if s is not None else None, pages=pages)
            if s is not None:
                try:
                    rc.close(ctx)
                except Exception as e:  # noqa: BLE001 - damaged records: raised below only if the file is sound
                    rc_error = rc_error or e
            _check_host_launches(sub, c, slots, pages)
        release = (lambda off, n: dumpmod.release_pages(d._mm, off, n)) if pages.release else None
        for g in d.groups:
            if g.kind_name != "device_event" and not g.lost_records and not g.crc_ok(release=release):
                _crc_finding(c, g)
        _check_clock_sync(d, c)
        _check_kinds(d, c)
        rep.findings.extend(c.out)
        structurally_sound = not rep.unreadable and not any(f.code == "payload-checksum" for f in rep.findings)
        if structurally_sound and rc_error is not None:
            raise rc_error
        if structurally_sound and options.reconcile:
            rep.findings.extend(_reconcile_findings(d, options, rc, already={f.code for f in rep.findings}))
        can = writes = None
        if structurally_sound and options.canary and d.groups_of("canary"):
            from kvconv.check import canary

            can = canary.check(d)
            rep.findings.extend(can.findings)
        if structurally_sound and options.canary and (d.groups_of("slot_write") or d.groups_of("write_step")):
            from kvconv.check.canary import writes as writes_canary

            writes = writes_canary.check(d, path=path)
            rep.findings.extend(writes.findings)
        if not rep.unreadable:
            from kvconv.check import verdict

            steps = can.counts["steps_checked"] if can is not None else 0
            cov = verdict.coverage(d, canary_steps=steps,
                                   write_steps=writes.summary.get("steps", 0) if writes is not None else 0)
            if cov is not None:
                rep.findings.append(cov)
            rep.incidents = verdict.incidents(d, rep.findings, canary_res=can)
        else:
            rep.incidents = [_one(f) for f in rep.findings if f.severity != "info"]
        if progress is not None:
            progress(d.size, d.size)
    return rep


# The record kinds' checks that the passes of validate() run themselves (schemas/layouts.json "validate"); any other
# kind's hook runs in _check_kinds. tests/test_kinds.py checks that validate reaches every kind's hook.
_OWN_HOOKS = frozenset(f"{__name__}:{f.__name__}" for f in (_check_metadata, _check_kernels, _check_device_events,
                                                             _check_host_launches, _check_clock_sync)) | {
    "kvconv.check.canary:check"}


def _one(f: Finding) -> dict:
    return {"severity": f.severity, "code": f.code, "message": f.line(), "findings": 1, "where": {}}


def _check_kinds(d: dumpmod.Dump, c: _Collector) -> None:
    """A record kind checked by a hook of its own (``"validate": "module:function"`` in schemas/layouts.json):
    ``hook(d, c)``, reporting through ``c.add`` / ``c.mask``, once per dump holding the kind (docs/DEVELOPING.md)."""
    hooks = [k.validate for k in layout.KINDS.values() if k.validate and d.groups_of(k.name)]
    for spec in dict.fromkeys(h for h in hooks if h not in _OWN_HOOKS):
        layout.resolve_hook(spec)(d, c)


def _reconciler(d: dumpmod.Dump, options: ValidateOptions):
    from kvconv.check import reconcile

    return reconcile.Reconciler(d, options=reconcile.ReconcileOptions(relaxed=options.relaxed_reconcile),
                                tables=False)


def _reconcile_findings(d: dumpmod.Dump, options: ValidateOptions, rc, *, already: set[str]) -> list[Finding]:
    """The reconciler's findings (of the pass the record checks fed, ``rc``). Its ``counts-differ`` (the counts
    disagree and no launch explains it: in practice drops with nothing else missing) is the fact validate's
    ``dropped`` already reports: said once."""
    if not (d.groups_of("device_event") or d.groups_of("graph_node") or d.groups_of("eager_launch")):
        return []
    res = (rc if rc is not None else _reconciler(d, options)).result()
    return [f for f in res.findings if not (f.code == "counts-differ" and "dropped" in already)]
