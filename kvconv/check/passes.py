"""The checks of ``kvconv validate`` as a registry of passes, derived from schemas/layouts.json.

Each record kind names the pass that checks it (its ``validate`` fact, ``"module:function"``); the registry is the
``structure`` pass (every dump: the scan's problems, group headers, payload checksums) followed by each named pass
once, in the order of the kinds that name it. A pass runs on a dump holding one of its kinds; it takes the
:class:`Checking` state of the dump and returns a :class:`PassResult`: its findings, what it checked, its own result
object and the incidents it builds from its findings (:mod:`kvconv.check.verdict` judges; a pass never does).

    >>> [p.name for p in registry()]
    ['structure', 'metadata', 'kernels', 'clock_sync', 'launches', 'canary', 'writes', 'values']

A new check of a kind's records: ``check(d, c)`` (findings through the collector ``c``) or, for a pass that groups
its findings into incidents or hands on a result, ``fn(st: Checking) -> PassResult``, named by the kind's
``validate`` fact (docs/DEVELOPING.md); tests/test_kinds.py checks that validate reaches it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvconv.check._collect import _Collector, _crc_finding
from kvconv.format import codes, layout
from kvconv.format.findings import Finding

STRUCTURE = f"{__name__}:structure"


@dataclass
class PassResult:
    """What one pass found and checked. ``folds``: the codes whose findings :attr:`build` groups into incidents
    (``build(findings) -> [incident]``, each ``{"severity", "code", "message", "findings", "where"}``)."""

    name: str
    findings: list[Finding] = field(default_factory=list)
    checked: dict = field(default_factory=dict)  # what it checked, counted (steps, records, ...)
    result: Any = None  # the check's own result (ReconcileResult, CanaryResult, WritesResult, ...)
    verified: bool = True  # whether it verified anything (a part with nothing verified is nothing-checked)
    folds: tuple[str, ...] = ()
    build: Callable[[list[Finding]], list[dict]] | None = None


@dataclass
class Checking:
    """One dump under validate: what every pass shares (the open dump, the options, the findings so far)."""

    d: Any
    options: Any  # kvconv.check.validate.ValidateOptions
    progress: Callable | None = None
    findings: list[Finding] = field(default_factory=list)
    results: dict[str, PassResult] = field(default_factory=dict)
    pages: Any = None  # kvconv.check.validate_events._Pages: the device-event chunks' pages given back
    launches: Any = None  # the launches pass's state set up already (:class:`Launches`, a converter's walks fed it)

    @property
    def path(self) -> str:
        return self.d.path

    @property
    def unreadable(self) -> bool:
        return any(f.severity == "error" and f.code in codes.UNREADABLE for f in self.findings)

    @property
    def sound(self) -> bool:
        """Readable as a whole and every payload checksum so far matches: the checks of meaning may run."""
        return not self.unreadable and not any(f.code == "payload-checksum" for f in self.findings)


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[Checking], PassResult | None]
    kinds: tuple[str, ...]  # the record kinds it checks (empty: every dump)

    def applies(self, d) -> bool:
        return not self.kinds or any(d.groups_of(k) for k in self.kinds)


def registry() -> tuple[Pass, ...]:
    """The passes validate runs, in order (module docstring)."""
    named: dict[str, list[str]] = {}
    for k in layout.KINDS.values():
        if k.validate:
            named.setdefault(k.validate, []).append(k.name)
    out = [Pass("structure", structure, ())]
    for spec, kinds in named.items():
        module, _, function = spec.partition(":")
        name = function if module == __name__ else module.rpartition(".")[2]
        out.append(Pass(name, _as_pass(name, layout.resolve_hook(spec)), tuple(kinds)))
    return tuple(out)


def _as_pass(name: str, fn: Callable) -> Callable[[Checking], PassResult | None]:
    """A kind's hook as a pass: ``fn(st) -> PassResult``, or a check of the kind's records ``check(d, c)`` reporting
    through the collector ``c`` (``c.add`` / ``c.mask``; docs/DEVELOPING.md), its findings its pass's."""
    import inspect

    if len(inspect.signature(fn).parameters) != 2:
        return fn

    def run(st: Checking) -> PassResult:
        c = _Collector(st.path)
        fn(st.d, c)
        return PassResult(name, c.out)

    return run


def run_all(st: Checking, passes: tuple[Pass, ...] | None = None) -> None:
    """Every pass of the registry (or of ``passes``, a part of it) that applies to the dump, in order; each one's
    findings join ``st.findings``."""
    for p in registry() if passes is None else passes:
        if p.applies(st.d):
            took(st, p.name, p.run(st))


def took(st: Checking, name: str, res: PassResult | None) -> None:
    """A pass's result joins the dump's (None: the pass had nothing to check)."""
    if res is not None:
        st.results[name] = res
        st.findings.extend(res.findings)


# ---------------------------------------------------------------------------------------------------- the passes

def structure(st: Checking) -> PassResult:
    """The scan's problems, the group headers, a missing metadata group, the payload checksums of every group but the
    device events' (checked with their records by :func:`launches`, in the same pass)."""
    from kvconv.check.validate_records import _check_headers
    from kvconv.format import dump as dumpmod

    d, c = st.d, _Collector(st.path)
    _check_headers(d, c)
    if not d.groups_of("metadata"):
        c.add("warning", "no-metadata", "no run metadata group (tool, GPU, driver, counters)", field="metadata")
    release = (lambda off, n: dumpmod.release_pages(d._mm, off, n)) if st.pages.release else None
    for g in d.groups:
        if g.kind_name != "device_event" and not g.lost_records and not g.crc_ok(release=release):
            _crc_finding(c, g)
    return PassResult("structure", list(d.problems) + c.out, checked={"groups": len(d.groups), "bytes": d.size})


def metadata(st: Checking) -> PassResult:
    """The run metadata JSON against schemas/metadata.schema.json."""
    from kvconv.check.validate_records import _check_metadata

    c = _Collector(st.path)
    _check_metadata(st.d, c)
    return PassResult("metadata", c.out, checked={"groups": len(st.d.groups_of("metadata"))})


def kernels(st: Checking) -> PassResult:
    """The kernel tables against their strings; its result: the known kernel slots per context."""
    from kvconv.check.validate_records import _check_kernels

    c = _Collector(st.path)
    slots = _check_kernels(st.d, c)
    return PassResult("kernels", c.out, checked={"kernels": sum(map(len, slots.values()))}, result=slots)


def clock_sync(st: Checking) -> PassResult:
    from kvconv.check.validate_records import _check_clock_sync

    c = _Collector(st.path)
    _check_clock_sync(st.d, c)
    return PassResult("clock_sync", c.out, checked={"pairs": sum(len(g.records) for g in st.d.groups_of("clock_sync"))})


_END_CODES = ("unflushed-blocks", "lost-at-end")  # one cause: the producer died before its last events were copied


def launches(st: Checking) -> PassResult:
    """The device events and host launch records of each context (sequence, timer, grid, kernel slots) and, fed by
    the same chunks, the reconciler; its result: the reconciliation (None with --no-reconcile). The contexts a
    converter's walks checked already (``st.launches``: kvconv.check.validate.Validation) are not read again."""
    lc = st.launches if st.launches is not None else Launches(st)
    for ctx, _dev in st.d.contexts():
        if ctx not in lc.found:  # (a context a converter's walk fed is checked already)
            lc.check_context(ctx)
    return lc.result()


class Launches:
    """The launches pass in its parts, for validate's own walk (:func:`launches`) and for a converter's walks that
    feed the same checks chunk by chunk (:class:`kvconv.check.validate.Validation`): set up once, each context
    checked (its device events, then its host records), then :meth:`result`. Each context's findings stay apart until
    the result, in the contexts' order, whatever order the contexts were checked in."""

    def __init__(self, st: Checking) -> None:
        d = self.d = st.d
        self.st, self.head = st, _Collector(st.path)
        have_table = bool(d.groups_of("kernel"))
        by_ctx = st.results["kernels"].result if "kernels" in st.results else {}
        self.slots = {ctx: by_ctx.get(ctx, set()) if have_table else None for ctx, _ in d.contexts()}
        if not have_table and (d.groups_of("device_event") or d.groups_of("graph_node")):
            self.head.add("warning", "no-kernel-table", "no kernel table: kernel slots cannot be named", field="kernel")
        self.rc = _reconciler(st) if st.options.reconcile and not st.unreadable else None
        self.rc_error = None
        self.found: dict[int, list[Finding]] = {}  # context -> its findings

    def stream(self, ctx: int):
        """The reconciler's streaming pass over the context's device events (None without one)."""
        return self.rc.stream(ctx) if self.rc is not None and ctx in self.rc.contexts else None

    def check_context(self, ctx: int) -> None:
        """validate's own pass over one context's device events, then its host records."""
        from kvconv.check.validate_events import _check_device_events, _ContextView, _grid_tables

        c, s = _Collector(self.st.path), self.stream(ctx)
        _check_device_events(_ContextView(self.d, ctx), c, self.slots[ctx],
                             _grid_tables(self.d, ctx, s.t if s is not None else None),
                             feed=s.feed if s is not None else None, pages=self.st.pages)
        self.context_done(ctx, c, s)

    def context_done(self, ctx: int, c: _Collector, s) -> None:
        """The context's device events were all checked (into ``c``, fed to ``s``): close its reconciliation, check
        its host records, keep its findings."""
        from kvconv.check.validate_events import _ContextView
        from kvconv.check.validate_records import _check_host_launches

        if s is not None:
            try:
                self.rc.close(ctx)
            except Exception as e:  # noqa: BLE001 - damaged records: raised by result() only if the file is sound
                self.rc_error = self.rc_error or e
        _check_host_launches(_ContextView(self.d, ctx), c, self.slots[ctx], self.st.pages)
        self.found[ctx] = c.out

    def result(self) -> PassResult:
        st, d = self.st, self.d
        found = list(self.head.out)
        for ctx, _dev in d.contexts():
            found += self.found.get(ctx, [])
        sound = st.sound and not any(f.code == "payload-checksum" for f in found)
        if sound and self.rc_error is not None:
            raise self.rc_error
        res = None
        if sound and st.options.reconcile:
            res = (self.rc if self.rc is not None else _reconciler(st)).result()
            already = {f.code for f in st.findings + found}
            # its counts-differ (no launch explains the counts: drops, nothing else missing) is `dropped`'s fact
            found += [f for f in res.findings if not (f.code == "counts-differ" and "dropped" in already)]
        n = sum(len(g.records) for k in ("graph_node", "eager_launch") for g in d.groups_of(k))
        return PassResult("launches", found, checked={"host_launches": n}, result=res, folds=_END_CODES,
                          build=lambda fs: _end_incident(d, fs))


def _reconciler(st: Checking):
    from kvconv.check import reconcile

    return reconcile.Reconciler(st.d, options=reconcile.ReconcileOptions(relaxed=st.options.relaxed_reconcile),
                                tables=False)


def _end_incident(d, findings: list[Finding]) -> list[dict]:
    """Every launch whose blocks were lost at a dead producer's end, and the records its live groups count as not
    yet in the file (their drop_count: the groups the lost-at-end findings name), as one incident: one cause, named
    at the first such launch."""
    from kvconv.check.verdict import incident

    lost = [f for f in findings if f.code == "unflushed-blocks"]
    counted = [f for f in findings if f.code == "lost-at-end"]
    records = sum(d.groups[f.group].drop_count for f in counted if f.group is not None)
    first = (lost or counted)[0]
    at = ", ".join(w for w in first.where() if w != first.field)  # path, byte, group and record
    launches = sum(int(f.count or 1) for f in lost)  # a "N more ... not listed" finding counts its N
    parts = [f"{launches:,} of its last launches lost their blocks ({at} on)"] if lost else []
    if records:
        parts.append(f"{records:,} records were not yet in the file")
    msg = "the producer ended before the tracer copied its last events out: " + " and ".join(parts) + \
        "; lost at its end, not a fault of the GPU"
    return [incident("warning", "unflushed-blocks" if lost else "lost-at-end", msg, len(lost) + len(counted),
                     path=first.path, group=first.group, record=first.record)]


def canary(st: Checking) -> PassResult | None:
    """The location canary (:mod:`kvconv.check.canary`); its result: the CanaryResult."""
    if not (st.sound and st.options.canary):
        return None
    from kvconv.check import canary as check
    from kvconv.check.canary import _text

    res = check.check(st.d, options=check.CanaryOptions(missing_writes=st.options.missing_writes))
    steps = res.counts["steps_checked"]
    return PassResult("canary", res.findings, checked={"steps": steps}, result=res, verified=bool(steps),
                      folds=_text.CODES, build=lambda fs: _text.incidents(res))


def writes(st: Checking) -> PassResult | None:
    """The write-address canary and the slot ownership (:mod:`kvconv.check.canary.writes`)."""
    if not (st.sound and st.options.canary):
        return None
    from kvconv.check.canary import write_incidents
    from kvconv.check.canary import writes as check

    res = check.check(st.d, path=st.path)
    checked = {"records": res.summary.get("records", 0), "steps": res.summary.get("steps", 0)}
    return PassResult("writes", res.findings, checked=checked, result=res, verified=res.checked,
                      folds=write_incidents.CODES,
                      build=lambda fs: write_incidents.incidents(st.d))


def values(st: Checking) -> PassResult:
    """The value canary (:mod:`kvconv.check.canary.value`): each watched slot's digest against the engine's row."""
    from kvconv.check.canary import value

    res = value.check(st.d, path=st.path)
    steps = res.summary.get("steps", 0)
    return PassResult("values", res.findings, checked={"steps": steps}, result=res, verified=bool(steps),
                      folds=value.CODES, build=lambda fs: value.incidents(st.d))
