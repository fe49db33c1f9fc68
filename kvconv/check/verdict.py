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

from kvconv.format.findings import Finding
from kvconv.format.layout import load_json_schema

_TABLE = {k: v for k, v in load_json_schema("codes.json")["verdicts"].items() if not k.startswith("$")}
VERDICTS: tuple[str, ...] = tuple(_TABLE)
EXIT_CODES: dict[str, int] = {k: int(v["exit"]) for k, v in _TABLE.items()}
# the codes folded into incidents built from the joins (all of their findings, named or counted)
# how each verdict is said: ``label`` by the commands that judge the whole dump (validate, info, record), ``state`` by
# those that judge a part of it or state it beside their own job (canary, the converters' warning, report)
LABELS: dict[str, str] = {k: v["label"] for k, v in _TABLE.items()}
LABEL_CUT = _TABLE["incomplete"]["label_cut"]  # incomplete for a cut: a file cut short, read with --salvage
STATES: dict[str, str] = {k: v["state"] for k, v in _TABLE.items()}
# how bad a verdict is (kvconv diff: "B's verdict is worse than A's"; the report's colour)
RANK: dict[str, int] = {k: int(v["rank"]) for k, v in _TABLE.items()}
MEANS: dict[str, str] = {k: v["means"] for k, v in _TABLE.items()}


def exit_table() -> str:
    """docs/CLI.md's table of verdicts, their words and exit statuses (python -m kvconv.formatdoc cli)."""
    rows = ["| verdict | exit | validate says | canary, report and the converters say | means |",
            "| --- | --- | --- | --- | --- |"]
    rows += [f"| `{k}` | {v['exit']} | {v['label']} | {v['state']} | {v['means']}"
             + (f" Validate says of a cut file read with --salvage: {v['label_cut']}." if "label_cut" in v else "")
             + " |" for k, v in _TABLE.items()]
    note = load_json_schema("codes.json")["verdicts"].get("$comment", "")
    return "\n".join(rows) + "\n\n" + note + "\n"


def label(verdict: str, findings: list[Finding]) -> str:
    """How validate says the verdict of ``findings``: its label, incomplete told as a cut when the file was cut
    short (read with --salvage) rather than left unfinished by its producer."""
    from kvconv.format import holds

    cut = verdict == "incomplete" and not any(f.code == "unfinished" for f in findings) and any(
        f.code in holds.CUT_CODES + ("lost-at-cut",) for f in findings)
    return LABEL_CUT if cut else LABELS[verdict]


def exit_code(verdict: str) -> int:
    """The exit status of a verdict, the same for every command that exits with one."""
    return EXIT_CODES[verdict]


# the findings that say nothing was verified: no target launch traced, or none of the checks the user asked for ran
NOTHING = frozenset({"coverage-none", "asked-nothing-checked"})


def judge(findings: list[Finding]) -> str:
    """The verdict of a dump's findings (every check's, ``coverage-none`` and ``unfinished`` included)."""
    from kvconv.format import codes

    errors = [f for f in findings if f.severity == "error"]
    if any(f.code in codes.UNREADABLE for f in errors):
        return "unreadable"
    if errors:
        return "failed"
    found = {f.code for f in findings}
    if found & NOTHING:
        return "nothing-checked"
    if found & codes.INCOMPLETE:  # unfinished, or cut short and salvaged (schemas/codes.json "incomplete")
        return "incomplete"
    return "ok"


def worst(verdicts) -> str:
    """The worst of some verdicts by their rank (schemas/codes.json: unreadable, failed, nothing-checked, incomplete,
    ok); ok for none.

        >>> worst(["ok", "incomplete", "failed"]), worst([])
        ('failed', 'ok')
    """
    return max(verdicts, key=RANK.__getitem__, default="ok")


def of_run(verdicts: list[str], findings: list[Finding] = ()) -> str:
    """The one verdict of a run: its dumps' verdicts (each process's tracer dump, each engine plugin's probe dump)
    and the run's own findings (:func:`kvconv.check.asked.of_run`: what was asked and ran in none of its dumps).

    The worst of the dumps that checked something: a dump that checked nothing (a front end that ran no target
    kernel, a tracer dump whose asked checks ran in the probe dump) does not make a checked run nothing-checked; the
    run is nothing-checked when none of its dumps checked anything or when nothing it was asked for ran anywhere.

        >>> of_run(["nothing-checked", "ok"]), of_run(["nothing-checked", "nothing-checked"])
        ('ok', 'nothing-checked')
        >>> of_run(["ok", "failed", "incomplete"]), of_run(["nothing-checked", "failed"]), of_run([])
        ('failed', 'failed', 'ok')
    """
    checked = [v for v in verdicts if v != "nothing-checked"]
    return worst([*(checked or verdicts), judge(list(findings))])


# ---------------------------------------------------------------------------------------------------- coverage

def coverage(d, *, canary_steps: int, write_steps: int) -> Finding | None:
    """``coverage-none`` when nothing was traced: the tracer's counters say 0 target launches or 0 patched modules
    (or, without counters, the dump holds no host launch record and no device event), and no canary or write step
    was checked. Names the target pattern(s) of the metadata and, where it lists the kernels it saw loaded
    (``loaded_kernels``), the closest ones."""
    if canary_steps or write_steps or any(len(g.records) for g in d.groups_of("value_digest")):  # value canary
        return None
    from kvconv.format import holds

    if holds.salvaged(d) and holds.kept_nothing(d):  # a prefix of metadata and tables: no record to check
        return Finding("warning", "coverage-none", "nothing was checked: the salvaged prefix of the cut file kept "
                       f"no launch, device-event, canary, slot-write or value record ({d.size:,} bytes)",
                       path=d.path, offset=d.size, field="header")
    meta = _metadata(d)
    counters = meta.get("counters") if isinstance(meta.get("counters"), dict) else {}
    launches, patched = counters.get("target_launches"), counters.get("modules_patched")
    if launches is not None or patched is not None:
        empty = launches == 0 or patched == 0
    else:
        empty = not any(len(g.records) for k in ("graph_node", "eager_launch", "device_event") for g in d.groups_of(k))
    if not empty:
        return None
    what = [f"{n:,} {noun}" for n, noun in ((launches, "target launches"), (patched, "patched modules"))
            if n is not None] or ["no host launch record and no device event"]
    msg = f"nothing was checked: {', '.join(what)}, no canary or write step" + _unmatched(meta)
    mg = d.groups_of("metadata")
    return Finding("warning", "coverage-none", msg, path=d.path, group=mg[0].index if mg else None,
                   offset=mg[0].payload_offset if mg else None, field="metadata.counters" if counters else None)


def _metadata(d) -> dict:
    try:
        meta = d.metadata()
    except Exception:  # noqa: BLE001 - unreadable metadata is validate's own finding
        return {}
    return meta if isinstance(meta, dict) else {}


def _unmatched(meta: dict) -> str:
    """What the coverage finding says of the ``-k`` patterns: none matched, and the loaded kernels close to them."""
    pats = [str(p) for p in meta.get("target_kernels") or []]
    if not pats:
        return ""
    msg = "; no kernel matched " + " or ".join(repr(p) for p in pats)
    loaded = [str(k) for k in meta.get("loaded_kernels") or [] if isinstance(k, str)]
    dropped = meta.get("loaded_kernels_dropped")
    seen = len(loaded) + (dropped if isinstance(dropped, int) and dropped > 0 else 0)
    close = closest(pats, loaded)
    if close:
        return msg + "; loaded kernels close to it: " + ", ".join(close)
    return msg + (f"; none of the {seen:,} loaded kernels is close to it" if loaded else "")


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


def lost_at_end(results) -> int:
    """Launches of unfinished dumps whose last blocks ran after the tracer's last copy (``unflushed-blocks``): what the
    producer's end made unknowable. validate calls such a dump incomplete; so does reconcile."""
    return sum(int(f.count or 1) for r in results for f in r.findings
               if f.code == "unflushed-blocks")


def of_reconciliation(result, cov: Finding | None, *, cut: bool = False) -> str:
    """``kvconv reconcile``'s verdict of a dump, on validate's scale: failed (an error finding), incomplete (blocks
    lost at the producer's end, or ``cut``: a file cut short read with --salvage), nothing-checked (``cov``: the dump
    traced nothing, or its salvaged prefix kept nothing), else ok."""
    if not result.ok:
        return "failed"
    if cov is not None and cut:
        return "nothing-checked"
    if lost_at_end([result]) or cut or any(f.code == "lost-at-cut" for f in result.findings):
        return "incomplete"
    return "nothing-checked" if cov is not None else "ok"


def part_line(verdict: str, *, nothing: str = "") -> str:
    """The last line of a part's text (``kvconv canary``): the verdict's state, and why where it needs one
    (``nothing``: what was missing, for nothing-checked)."""
    why = {"nothing-checked": nothing,
           "incomplete": "the producer did not finish: the records it published are clean, the rest unknown"}
    return STATES[verdict] + (f" ({why[verdict]})" if why.get(verdict) else "")


def part(findings: list[Finding], *, checked: bool) -> str:
    """The verdict of one part of the checks (``kvconv canary``'s: its records' findings and the dump's own state),
    judged as the whole is (:func:`judge`): a part with nothing to check and no error is ``nothing-checked``."""
    if not checked and not any(f.severity == "error" for f in findings):
        return "nothing-checked"
    return judge(findings)


# ---------------------------------------------------------------------------------------------------- incidents

def incident(severity: str, code: str, message: str, findings: int, **where) -> dict:
    """An incident: ``findings`` findings of one cause, told as one line (``where``: what names it)."""
    return {"severity": severity, "code": code, "message": message, "findings": findings, "where": where}


def incidents(findings: list[Finding], results: dict | None = None) -> list[dict]:
    """The incidents of a dump's findings: each pass's grouped ones (``results``: name -> PassResult, whose
    ``build`` groups the codes it ``folds``; None: not grouped here), placed at their first finding; every other
    finding but the informative ones an incident of its own."""
    have = {f.code for f in findings}
    grouped: dict[str, list[dict]] = {}  # a folded code -> the incidents of its family
    for r in (results or {}).values():
        if r.build is not None and have & set(r.folds):
            fam = r.build(findings)
            if fam is not None:
                grouped.update(dict.fromkeys(r.folds, fam))
    out: list[dict] = []
    placed: set[int] = set()
    for f in findings:
        if f.code in grouped:
            fam = grouped[f.code]
            if id(fam) not in placed:
                placed.add(id(fam))
                out += fam
        elif f.severity != "info":
            out.append(incident(f.severity, f.code, f.line(), 1))
    return out


def line(incident: dict) -> str:
    """An incident's text line: a finding's own line, or the cause of several with their count."""
    if not incident["where"]:
        return incident["message"]
    n = incident["findings"]
    return f"{incident['severity']} {incident['code']}: {incident['message']}" + (f" ({n:,} findings)" if n > 1 else "")
