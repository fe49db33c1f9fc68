"""One verdict per dump: what every check of :func:`kvconv.check.validate.validate` found, told once.

    >>> from kvconv.check.validate import validate
    >>> rep = validate("fixtures/writes-stale-pad/writes-stale-pad.kvdump")   # doctest: +SKIP
    >>> rep.verdict, rep.exit_code, [i["message"] for i in rep.incidents][:1]   # doctest: +SKIP
    ('failed', 1, ['context 0 step 3, replay 3: batch row 3 (a padding row) wrote slot 60, ...'])

Verdicts (schemas/codes.json ``verdicts``: each one's exit status, the same for every command that states one):

- ``unreadable``: the file cannot be read as a whole;
- ``failed``: an error-level finding, evidence of a fault;
- ``nothing-checked``: no target launch was traced and no canary step recorded (a mistyped ``-k`` pattern, a program
  that died before its first target launch): nothing was verified, which is not a pass (``coverage-none``);
- ``incomplete``: the producer died or was killed (a live dump, ``unfinished``) and what it published is consistent;
- ``ok``: none of the above.

Incidents: findings that share one cause are one line. The same block of a step writing the same wrong slot in every
cache (a padding row's stale slot, a stale page-table entry) is one ``writes-unmapped-slot`` incident "in 80 of 80
caches", the token it should have written (missing in those caches) folded into it; a token not written in several
caches, the stores outside every cache of one block, the location canary's same pages in several buffers of a step:
one each. Every other finding is an incident of its own. Text output leads with incidents; ``--all`` and ``--json``
keep every finding.
"""

from __future__ import annotations

import difflib
from collections import defaultdict

from kvconv.format.findings import Finding
from kvconv.format.layout import load_json_schema

_TABLE = {k: v for k, v in load_json_schema("codes.json")["verdicts"].items() if not k.startswith("$")}
VERDICTS: tuple[str, ...] = tuple(_TABLE)
EXIT_CODES: dict[str, int] = {k: int(v["exit"]) for k, v in _TABLE.items()}
# the codes folded into incidents built from the joins (all of their findings, named or counted)
_WRITE_CODES = ("writes-unmapped-slot", "writes-missing-slot", "writes-outside-cache")
_CANARY_CODES = ("canary-unexpected-write", "canary-missing-write")
_VALUE_CODES = ("canary-wrong-value", "canary-value-not-written")  # kvconv.check.canary.value
_END_CODES = ("unflushed-blocks", "lost-at-end")  # one cause: the producer died before its last events were copied


def exit_table() -> str:
    """docs/CLI.md's table of verdicts and exit statuses (python -m kvconv.formatdoc cli)."""
    rows = ["| verdict | exit | means |", "| --- | --- | --- |"]
    rows += [f"| `{k}` | {v['exit']} | {v['means']} |" for k, v in _TABLE.items()]
    note = load_json_schema("codes.json")["verdicts"].get("$comment", "")
    return "\n".join(rows) + "\n\n" + note + "\n"


def judge(findings: list[Finding]) -> str:
    """The verdict of a dump's findings (every check's, ``coverage-none`` and ``unfinished`` included)."""
    from kvconv.format import codes

    errors = [f for f in findings if f.severity == "error"]
    if any(f.code in codes.UNREADABLE for f in errors):
        return "unreadable"
    if errors:
        return "failed"
    found = {f.code for f in findings}
    if "coverage-none" in found:
        return "nothing-checked"
    if "unfinished" in found:
        return "incomplete"
    return "ok"


# ---------------------------------------------------------------------------------------------------- coverage

def coverage(d, *, canary_steps: int, write_steps: int) -> Finding | None:
    """``coverage-none`` when nothing was traced: the tracer's counters say 0 target launches or 0 patched modules
    (or, without counters, the dump holds no host launch record and no device event), and no canary or write step
    was checked. Names the target pattern(s) of the metadata and, where it lists the kernels it saw loaded
    (``loaded_kernels``), the closest ones."""
    if canary_steps or write_steps or any(len(g.records) for g in d.groups_of("value_digest")):  # value canary
        return None
    try:
        meta = d.metadata()
    except Exception:  # noqa: BLE001 - unreadable metadata is validate's own finding
        meta = {}
    meta = meta if isinstance(meta, dict) else {}
    counters = meta.get("counters") if isinstance(meta.get("counters"), dict) else None
    launches = patched = None
    if counters is not None:
        launches, patched = counters.get("target_launches"), counters.get("modules_patched")
    recorded = sum(len(g.records) for k in ("graph_node", "eager_launch", "device_event") for g in d.groups_of(k))
    if launches is not None or patched is not None:
        empty = launches == 0 or patched == 0
    else:
        empty = recorded == 0
    if not empty:
        return None
    pats = [str(p) for p in meta.get("target_kernels") or []]
    what = []
    if launches is not None:
        what.append(f"{launches:,} target launches")
    if patched is not None:
        what.append(f"{patched:,} patched modules")
    if not what:
        what.append("no host launch record and no device event")
    msg = f"nothing was checked: {', '.join(what)}, no canary or write step"
    if pats:
        msg += "; no kernel matched " + " or ".join(repr(p) for p in pats)
        loaded = [str(k) for k in meta.get("loaded_kernels") or [] if isinstance(k, str)]
        dropped = meta.get("loaded_kernels_dropped")
        seen = len(loaded) + (dropped if isinstance(dropped, int) and dropped > 0 else 0)
        close = closest(pats, loaded)
        if close:
            msg += "; loaded kernels close to it: " + ", ".join(close)
        elif loaded:
            msg += f"; none of the {seen:,} loaded kernels is close to it"
    mg = d.groups_of("metadata")
    return Finding("warning", "coverage-none", msg, path=d.path, group=mg[0].index if mg else None,
                   offset=mg[0].payload_offset if mg else None, field="metadata.counters" if counters else None)


def closest(patterns: list[str], loaded: list[str], *, n: int = 5, cutoff: float = 0.6) -> list[str]:
    """The loaded kernel names closest to the ``-k`` patterns, best first, as a person types them: each name's
    function (its demangled name without return type, scopes, template arguments and parameters: a substring ``-k``
    matches), a pattern compared (difflib's ratio) with it and with the whole demangled name."""
    from kvconv.join.launches import short_name
    from kvconv.names import demangle

    keys: dict[str, str] = {}  # what a pattern is compared with -> what the message offers
    for name in loaded:
        full = demangle(name)
        short = short_name(full) or full
        keys.setdefault(short, short)
        if full != short and len(full) <= 200:
            keys.setdefault(full, short)
    best: dict[str, float] = {}
    for p in patterns:
        sm = difflib.SequenceMatcher()
        sm.set_seq2(p)
        for key, shown in keys.items():
            sm.set_seq1(key)
            if sm.real_quick_ratio() >= cutoff and sm.quick_ratio() >= cutoff:
                r = sm.ratio()
                if r >= cutoff and r > best.get(shown, 0.0):
                    best[shown] = r
    return [k for k, _ in sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def part(findings: list[Finding], *, checked: bool) -> str:
    """The verdict of one part of the checks (``kvconv canary``'s: its records' findings and the dump's own state),
    judged as the whole is (:func:`judge`): a part with nothing to check and no error is ``nothing-checked``."""
    if not checked and not any(f.severity == "error" for f in findings):
        return "nothing-checked"
    return judge(findings)


# ---------------------------------------------------------------------------------------------------- incidents

def _incident(severity: str, code: str, message: str, findings: int, **where) -> dict:
    return {"severity": severity, "code": code, "message": message, "findings": findings, "where": where}


def incidents(d, findings: list[Finding], *, canary_res=None) -> list[dict]:
    """The incidents of a dump's findings (``d`` open; ``canary_res``: the location canary's result, if run)."""
    have = {f.code for f in findings}
    grouped: dict[str, list[dict]] = {}  # a folded code -> the incidents of its family, placed at its first finding
    if have & set(_WRITE_CODES) and d.groups_of("slot_write"):
        fam = _write_incidents(d)
        grouped.update(dict.fromkeys(_WRITE_CODES, fam))
    if canary_res is not None and have & set(_CANARY_CODES):
        fam = _canary_incidents(canary_res)
        grouped.update(dict.fromkeys(_CANARY_CODES, fam))
    if have & set(_VALUE_CODES) and d.groups_of("value_digest"):
        from kvconv.check.canary import value

        fam = value.incidents(d)
        grouped.update(dict.fromkeys(_VALUE_CODES, fam))
    if have & set(_END_CODES):
        grouped.update(dict.fromkeys(_END_CODES, _end_incident(d, findings)))
    out: list[dict] = []
    placed: set[int] = set()
    for f in findings:
        if f.code in grouped:
            fam = grouped[f.code]
            if id(fam) not in placed:
                placed.add(id(fam))
                out += fam
        elif f.severity != "info":
            out.append(_incident(f.severity, f.code, f.line(), 1))
    return out


def _end_incident(d, findings: list[Finding]) -> list[dict]:
    """Every launch whose blocks were lost at a dead producer's end, and the records its live groups count as not
    yet in the file (their drop_count: the groups the lost-at-end findings name), as one incident: one cause, named
    at the first such launch."""
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
    return [_incident("warning", "unflushed-blocks" if lost else "lost-at-end", msg, len(lost) + len(counted),
                      path=first.path, group=first.group, record=first.record)]


def line(incident: dict) -> str:
    """An incident's text line: a finding's own line, or the cause of several with their count."""
    if not incident["where"]:
        return incident["message"]
    n = incident["findings"]
    return f"{incident['severity']} {incident['code']}: {incident['message']}" + (f" ({n:,} findings)" if n > 1 else "")


def _write_incidents(d) -> list[dict]:
    import numpy as np

    from kvconv.check.canary import write_join as wj

    out = []
    for ctx, _dev in dict.fromkeys(d.contexts()):
        w = wj.join(d, ctx)
        if w is None or not len(w.steps):
            continue
        names = d.kernel_names(context_id=ctx)
        ncache = len(w.caches)
        maps = {}

        def step_map(si, w=w, maps=maps):
            if si not in maps:
                maps[si] = wj.step_map(w.steps, w.smap, si)
            return maps[si]

        def row(si, r):
            rows = step_map(si)["rows"]
            x = int(r["block_x"])
            if int(r["block_y"]) or int(r["block_z"]) or x >= len(rows):
                return None
            return rows[x]

        written = defaultdict(set)  # (step idx, slot) -> caches written (any status but outside / unknown)
        for i in np.flatnonzero(w.slot >= 0).tolist():
            if w.step_idx[i] >= 0:
                written[(int(w.step_idx[i]), int(w.slot[i]))].add(int(w.records[i]["cache_id"]))
        # writes to an unmapped slot, by (step, replay, block, slot): the caches it happened in
        groups = defaultdict(list)
        for i in np.flatnonzero(w.status == wj.UNMAPPED).tolist():
            r = w.records[i]
            key = (int(w.step_idx[i]), int(w.replay[i]), int(r["block_x"]), int(r["block_y"]), int(r["block_z"]),
                   int(w.slot[i]))
            groups[key].append(i)
        absorbed = set()  # (step idx, slot) of tokens whose missing writes an unmapped incident explains
        for (si, replay, bx, by, bz, slot), recs in groups.items():
            r = w.records[recs[0]]
            caches = {int(w.records[i]["cache_id"]) for i in recs}
            t = row(si, r)
            if t is not None:
                pad = bool(int(t["flags"]) & wj._PAD)
                who = f"batch row {bx} (" + ("a padding row" if pad else f"request {int(t['request_id'])}") + ")"
                instead = int(t["slot"])
                if not pad:
                    absorbed.add((si, instead))
                tail = f", instead of {instead}"
            else:
                who, tail = f"block ({bx},{by},{bz})", ""
            i0 = recs[0]
            owner = (f", a slot of request {int(w.owner[i0])} since step {int(w.owner_step[i0])}" if w.has_owner[i0]
                     else ", a slot no request had mapped")
            step = int(w.steps[si]["step"])
            kernel = names.get(int(r["kernel_slot"]), "?")
            msg = (f"context {ctx} step {step}, replay {replay}: {who} wrote slot {slot}{owner}{tail}, in "
                   f"{len(caches)} of {ncache} caches (kernel {kernel!r})")
            out.append(_incident("error", "writes-unmapped-slot", msg, len(recs), context=ctx, step=step,
                                 replay=replay, slot=slot, caches=len(caches),
                                 request=int(t["request_id"]) if t is not None and not pad else None))
        # tokens not written, by (step, slot): the caches that miss them (those an unmapped write explains folded)
        for si in range(len(w.steps)):
            step = int(w.steps[si]["step"])
            for slot, req in sorted(step_map(si)["live"].items()):
                miss = ncache - len(written.get((si, slot), ()))
                if miss <= 0 or (si, slot) in absorbed:
                    continue
                msg = (f"context {ctx} step {step}: request {req}'s token at slot {slot} was not written in {miss} of "
                       f"{ncache} caches")
                out.append(_incident("error", "writes-missing-slot", msg, miss, context=ctx, step=step, slot=slot,
                                     request=req, caches=miss))
        # stores outside every cache, by (step, replay, block)
        outside = defaultdict(list)
        for i in np.flatnonzero(w.status == wj.OUTSIDE).tolist():
            r = w.records[i]
            outside[(int(w.step_idx[i]), int(w.replay[i]), int(r["block_x"]), int(r["block_y"]),
                     int(r["block_z"]))].append(i)
        for (si, replay, bx, by, bz), recs in outside.items():
            r = w.records[recs[0]]
            t = row(si, r) if si >= 0 else None
            who = (f"batch row {bx} (" + ("a padding row" if int(t["flags"]) & wj._PAD
                                          else f"request {int(t['request_id'])}") + f", slot {int(t['slot'])})"
                   if t is not None else f"block ({bx},{by},{bz})")
            before = sum(1 for i in recs if any(int(w.records[i]["addr_hi"]) <= int(c["base"])
                                                and int(c["base"]) - int(w.records[i]["addr_hi"]) < int(c["slot_bytes"])
                                                for c in w.caches))
            where = (f"step {int(w.steps[si]['step'])}, " if si >= 0 else "no step, ") + f"replay {replay}"
            msg = (f"context {ctx} {where}: {who} stored outside every registered cache, {len(recs)} store ranges"
                   + (f" ({before} just before a cache: slot -1)" if before else "")
                   + f" (kernel {names.get(int(r['kernel_slot']), '?')!r})")
            out.append(_incident("error", "writes-outside-cache", msg, len(recs), context=ctx,
                                 step=int(w.steps[si]["step"]) if si >= 0 else None, replay=replay))
    return out


def _canary_incidents(res) -> list[dict]:
    from kvconv.check.canary import runs

    groups = defaultdict(list)
    for st in res.steps.flagged():
        groups[(st["context_id"], st["step"], tuple(st["unexpected"]), tuple(st["missing"]))].append(st["buffer"])
    out = []
    nbuf = len({(s["context_id"], s["buffer_id"]) for s in res.steps}) if len(res.steps) < 100_000 else None

    def pages(p):
        return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs(list(p)))

    for (ctx, step, unexpected, missing), bufs in groups.items():
        of = f" of {nbuf}" if nbuf else ""
        for what, pg, code in (("changed outside the expected set", unexpected, "canary-unexpected-write"),
                               ("expected but did not change", missing, "canary-missing-write")):
            if pg:
                msg = (f"context {ctx} step {step}: page{'s' if len(pg) > 1 else ''} {pages(pg)} {what}, in "
                       f"{len(bufs)}{of} buffers "
                       f"({', '.join(repr(b) for b in bufs[:4])}{', ...' if len(bufs) > 4 else ''})")
                out.append(_incident("error", code, msg, len(bufs), context=ctx, step=step, pages=len(pg),
                                     buffers=len(bufs)))
    return out
