"""The value canary (issue 29, mechanism ii: right slot, wrong data): ``value_digest`` records (one per step, watched
cache and mapped slot; kvconv.capture.probe.values) compared digest to digest.

- ``expected != actual`` and the slot changed in the step (``actual != before``): the slot was written with data
  other than the row the engine meant to write there: ``canary-wrong-value`` (a K/V source buffer the graph captured
  before it was refilled, a conversion on one path only, a rotary offset applied twice). The write and location
  canaries pass on it: the right slot, on the right page, was written.
- ``expected != actual == before``: the slot still holds what it held before the step: the write did not happen
  there (``canary-value-not-written``; mechanism iii, which the write and location canaries see as missing).
- Records without a digest before the step (flag ``no_before``) can only say ``canary-wrong-value``.

Each finding names the step, cache, slot (page and offset), request, batch row and both digests. A dump without
value_digest records is not value-checked (nothing is said: the other checks stand). :func:`incidents` groups the
findings by cause, one line per (step, kind, set of caches): a stale K buffer in one step is one line "in 40 of 80
caches" however many rows it spoiled.

    >>> from kvconv.check.canary import value
    >>> value.CODES
    ('canary-wrong-value', 'canary-value-not-written')
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from kvconv.format import layout
from kvconv.format.findings import Finding

WRONG, NOT_WRITTEN = "canary-wrong-value", "canary-value-not-written"
CODES = (WRONG, NOT_WRITTEN)
MAX_NAMED = 200  # findings named one by one per code; the rest are counted in one more finding
_FLAGS = layout.ENUMS["value_digest_flags"]
_FIELD = {f.name: f.offset for f in layout.LAYOUTS["value_digest"].fields}
_SOURCE = {_FLAGS["given"]: "the rows given to the probe", _FLAGS["source"]: "the source tensor read before the step",
           _FLAGS["eager"]: "the eager reference run"}


@dataclass
class ValueResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    summary: dict = field(default_factory=dict)


def _names(d, ctx) -> dict[int, str]:
    c = d.records("cache", context_id=ctx)
    return {int(r["cache_id"]): bytes(r["name"]).rstrip(b"\0").decode("utf-8", "replace") for r in c}


def _bad(recs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the wrong values and of the slots not written."""
    mism = recs["expected"] != recs["actual"]
    has_before = (recs["flags"] & _FLAGS["no_before"]) == 0
    unwritten = mism & has_before & (recs["actual"] == recs["before"])
    return mism & ~unwritten, unwritten


def _what(code: str, r, name: str, spp: int) -> str:
    slot = int(r["slot"])
    where = f"slot {slot}" + (f" (page {slot // spp} offset {slot % spp})" if spp > 0 else "")
    who = f"request {int(r['request_id'])}'s token (batch row {int(r['row'])})"
    src = _SOURCE.get(int(r["flags"]) & (_FLAGS["given"] | _FLAGS["source"] | _FLAGS["eager"]), "the expected rows")
    e, a = f"{int(r['expected']):#018x}", f"{int(r['actual']):#018x}"
    if code == WRONG:
        return (f"step {int(r['step'])} cache {name!r} (id {int(r['cache_id'])}) {where}: {who} holds data other "
                f"than the row the engine meant to write: digest {a}, expected {e} (from {src})")
    return (f"step {int(r['step'])} cache {name!r} (id {int(r['cache_id'])}) {where}: {who} was not written: the slot "
            f"holds what it held before the step (digest {a}), not the row the engine meant to write (expected {e}, "
            f"from {src})")


def check(d, *, path: str | None = None) -> ValueResult:
    """Compare the digests of every value_digest record of dump ``d``."""
    res = ValueResult(path=str(path or d.path))
    counts = defaultdict(int)
    more = defaultdict(int)
    steps, caches, records = set(), set(), 0
    multi = len({c for c, _ in d.contexts()}) > 1
    for ctx in dict.fromkeys(c for c, _dev in d.contexts()):
        groups = d.groups_of("value_digest", context_id=ctx)
        if not groups:
            continue
        names = _names(d, ctx)
        spp = {int(r["cache_id"]): int(r["page_size"]) for r in d.records("cache", context_id=ctx)}
        for g in groups:
            recs = g.records
            records += len(recs)
            steps.update((ctx, s) for s in np.unique(recs["step"]).tolist())
            caches.update((ctx, c) for c in np.unique(recs["cache_id"]).tolist())
            wrong, unwritten = _bad(recs)
            for code, mask in (("canary-wrong-value", wrong), ("canary-value-not-written", unwritten)):
                bad = np.flatnonzero(mask)
                named = bad[: max(0, MAX_NAMED - counts[code])]  # the rest only counted (no loop over them)
                counts[code] += len(bad)
                more[code] += len(bad) - len(named)
                for i in named.tolist():
                    r = recs[i]
                    cid = int(r["cache_id"])
                    msg = _what(code, r, names.get(cid, f"cache {cid}"), spp.get(cid, 0))
                    res.findings.append(Finding(
                        "error", code, (f"context {ctx} " if multi else "") + msg, path=res.path, group=g.index,
                        record=i, offset=g.record_offset(i) + _FIELD["actual"], field="value_digest.actual"))
    for code, n in ((c, n) for c, n in more.items() if n):
        res.findings.append(Finding("error", code, f"{n} more like the above, not listed", path=res.path, count=n))
    res.summary = {"records": records, "steps": len(steps), "caches": len(caches),
                   "wrong_values": counts[WRONG], "not_written": counts[NOT_WRITTEN]}
    return res


def steps_checked(d) -> int:
    """How many (context, step) pairs the dump's value_digest records check (the verdict's coverage)."""
    seen = set()
    for ctx in dict.fromkeys(c for c, _dev in d.contexts()):
        for g in d.groups_of("value_digest", context_id=ctx):
            seen.update((ctx, s) for s in np.unique(g.records["step"]).tolist())
    return len(seen)


def incidents(d) -> list[dict]:
    """The value findings by cause: per context, step and kind (wrong / not written), the tokens whose slots share
    one set of caches; each ``{"severity", "code", "message", "findings", "where"}`` as kvconv.check.verdict's."""
    out = []
    for ctx in dict.fromkeys(c for c, _dev in d.contexts()):
        recs = [g.records for g in d.groups_of("value_digest", context_id=ctx)]
        if not recs:
            continue
        recs = np.concatenate(recs)
        names = _names(d, ctx)
        o = np.lexsort((recs["cache_id"], recs["step"]))
        st, ci = recs["step"][o], recs["cache_id"][o]
        first = np.r_[True, (st[1:] != st[:-1]) | (ci[1:] != ci[:-1])]  # each (step, cache) once
        steps, per_step = np.unique(st[first], return_counts=True)  # caches each step checked
        ncache = dict(zip(steps.tolist(), per_step.tolist()))
        wrong, unwritten = _bad(recs)
        for code, mask in (("canary-wrong-value", wrong), ("canary-value-not-written", unwritten)):
            tokens = defaultdict(set)  # (step, slot, request, row) -> caches
            for i in np.flatnonzero(mask).tolist():
                r = recs[i]
                tokens[(int(r["step"]), int(r["slot"]), int(r["request_id"]), int(r["row"]))].add(int(r["cache_id"]))
            causes = defaultdict(list)  # (step, caches) -> tokens
            for (step, slot, req, row), cs in sorted(tokens.items()):
                causes[(step, tuple(sorted(cs)))].append((slot, req, row))
            for (step, cs), toks in causes.items():
                what = "hold data other than the rows the engine meant to write" if code == WRONG else \
                    "were not written (the slots hold what they held before the step)"
                listed = ", ".join(f"request {q}'s token at slot {s} (batch row {w})" for s, q, w in toks[:4])
                if len(toks) == 1:
                    head = listed + (" holds data other than the row the engine meant to write" if code == WRONG
                                     else " was not written (the slot holds what it held before the step)")
                else:
                    head = f"{len(toks)} tokens ({listed}{', ...' if len(toks) > 4 else ''}) {what}"
                shown = ", ".join(repr(names.get(c, f"cache {c}")) for c in cs[:4]) + (", ..." if len(cs) > 4 else "")
                msg = f"context {ctx} step {step}: {head}, in {len(cs)} of {ncache[step]} caches ({shown})"
                out.append({"severity": "error", "code": code, "message": msg, "findings": len(toks) * len(cs),
                            "where": {"context": ctx, "step": step, "tokens": len(toks), "caches": len(cs),
                                      "slot": toks[0][0], "request": toks[0][1]}})
    return out
