"""``kvconv diff A B``: two runs of one workload compared, check by check, against settable thresholds.

    >>> from kvconv.format import dump
    >>> from kvconv.look import diff, profile
    >>> pa, pb = (profile.profile(dump.open(p)) for p in ("a.kvdump", "b.kvdump"))   # doctest: +SKIP
    >>> res = diff.compare(pa, pb, options=diff.DiffOptions(max_median_change=0.05))  # doctest: +SKIP
    >>> res["exit"], [c["check"] for c in res["checks"] if c["exceeds"]]              # doctest: +SKIP

Contexts are paired by position, and within them graph execs by position (as :mod:`kvconv.check.skew` pairs them).
Checks (each ``{"check", "where", "a", "b", "exceeds", "note"}``):

* structure: nodes per graph exec, the node order (kernel of each node ordinal), records per replay, blocks each
  node's grid predicts (any difference exceeds);
* timing: per-replay span, and per node its duration (block-exit events in both) or else its start offset: median
  and p99 (nearest rank) in A and B; a change exceeds when it is beyond ``max_median_change`` / ``max_p99_change``
  (relative to A) *and* beyond ``noise_factor`` times the noise seen within the runs (the larger median absolute
  deviation of A's and B's values, scaled to a standard deviation);
* losses: drops, missing and extra blocks, canary pages (an increase beyond ``max_drops`` / 0 exceeds);
* findings: codes that appear (error or warning: exceeds) or disappear (never exceeds);
* the verdict (kvconv validate's one verdict of each dump, :mod:`kvconv.check.verdict`): B's worse than A's exceeds;
  and the error incidents (validate's incidents of error severity; the warnings are compared as findings above):
  one of B's (its cause, the dump's path aside) that A has not exceeds, one that disappears does not. Where a
  dump's records are damaged (no profile), only these are compared.

Exit status: 0 when no check exceeds, 1 otherwise (2: a dump cannot be read, from the CLI).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

from kvconv.format.errors import UsageError

MAD_TO_SD = 1.4826  # median absolute deviation of a normal sample -> its standard deviation


@dataclass(frozen=True)
class DiffOptions:
    """Thresholds (keyword-only, frozen): relative changes of the median and the p99 (0.10 = 10 %), the factor of
    within-run noise a change must also exceed, and the drops B may add."""

    max_median_change: float = 0.10
    max_p99_change: float = 0.25
    noise_factor: float = 3.0
    max_drops: int = 0

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            if not (v >= 0) or v == float("inf"):
                raise UsageError(f"--{k.replace('_', '-')} must be a finite number >= 0, not {v!r}",
                                 code="bad-threshold")


def _check(check: str, where: str, a, b, exceeds: bool, note: str = "", unit: str | None = None) -> dict:
    """One check; ``unit`` (e.g. "ns") where ``a`` and ``b`` are measures, absent for counts and flags."""
    c = {"check": check, "where": where, "a": a, "b": b, "exceeds": bool(exceeds), "note": note}
    if unit:
        c["unit"] = unit
    return c


def p99(v: np.ndarray) -> float:
    return float(np.percentile(v, 99, method="inverted_cdf"))


def _mad(v: np.ndarray) -> float:
    return float(np.median(np.abs(v - np.median(v)))) * MAD_TO_SD if len(v) else 0.0


def distribution(check: str, where: str, a: np.ndarray, b: np.ndarray, o: DiffOptions) -> list[dict]:
    """Median and p99 of A and B, each change judged against its threshold and the within-run noise."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    if not len(a) or not len(b):
        return [_check(check, where, int(len(a)), int(len(b)), False, "values on one side only: not compared")]
    noise = max(_mad(a), _mad(b))
    out = []
    for stat, fn, limit in (("median", np.median, o.max_median_change), ("p99", p99, o.max_p99_change)):
        va, vb = float(fn(a)), float(fn(b))
        rel = (vb - va) / abs(va) if va else (0.0 if vb == va else float("inf"))
        beyond_noise = abs(vb - va) > o.noise_factor * noise
        out.append(_check(f"{check}.{stat}", where, va, vb, abs(rel) > limit and beyond_noise,
                          f"{rel:+.1%} (limit ±{limit:.0%}); noise {noise:,.0f} ns x {o.noise_factor:g}"
                          + ("" if beyond_noise else ": within noise"), unit="ns"))
    return out


def _graph(ga, gb, ra: dict, rb: dict, where: str, o: DiffOptions) -> list[dict]:
    out = [_check("nodes", where, int(ra["nodes"]), int(rb["nodes"]), ra["nodes"] != rb["nodes"])]
    n = min(len(ga.kernels), len(gb.kernels))
    first = next((i for i in range(n) if ga.kernels[i] != gb.kernels[i]), None)
    same = first is None and len(ga.kernels) == len(gb.kernels)
    out.append(_check("node-order", where, bool(ra["stable_order"]), bool(rb["stable_order"]),
                      not same or ra["stable_order"] != rb["stable_order"],
                      "kernel of every node ordinal the same" if same else
                      f"node #{first if first is not None else n} differs"))
    out.append(_device_order(ga, gb, where))
    rpa, rpb = ra["records_per_replay"] or {}, rb["records_per_replay"] or {}
    out.append(_check("records-per-replay", where, [rpa.get("min"), rpa.get("max")],
                      [rpb.get("min"), rpb.get("max")], rpa.get("min") != rpb.get("min")
                      or rpa.get("max") != rpb.get("max")))
    out.append(_check("replays", where, int(ra["replay_count"]), int(rb["replay_count"]), False,
                      "the number of replays may differ between runs: not judged"))
    diff_blocks = [i for i in range(min(len(ga.expected), len(gb.expected))) if ga.expected[i] != gb.expected[i]]
    out.append(_check("blocks-per-launch", where, int(ga.expected.sum()), int(gb.expected.sum()),
                      bool(diff_blocks) or len(ga.expected) != len(gb.expected),
                      f"blocks per node differ at node(s) {diff_blocks[:8]}" if diff_blocks else
                      "blocks each node's grid predicts, summed over the nodes"))
    spans = [np.array([r["span_ns"] for r in g.per_replay], np.float64) for g in (ga, gb)]
    out += distribution("span", where, spans[0], spans[1], o)
    out += _nodes(ga, gb, where, o)
    return out


def device_order(offsets: np.ndarray) -> tuple[list[int], float]:
    """Node ordinals in the order their first blocks entered on the device (by median start offset over the
    replays), and the share of replays that entered in exactly that order (1.0: the same order in every replay)."""
    has = ~np.isnan(offsets).all(axis=0)
    if not offsets.size or not has.any():
        return [], 1.0
    cols = np.flatnonzero(has)
    med = np.nanmedian(offsets[:, cols], axis=0)
    order = cols[np.argsort(med, kind="stable")]
    full = ~np.isnan(offsets[:, order]).any(axis=1)
    same = np.all(np.diff(offsets[full][:, order], axis=1) >= 0, axis=1) if full.any() else np.zeros(0, bool)
    return [int(k) for k in order], float(same.mean()) if len(same) else 1.0


def _device_order(ga, gb, where: str) -> dict:
    """The order in which nodes started on the device (multi-stream graphs: not the host's node order). Judged
    only when A keeps one order in every replay: a run whose own replays disagree has no order to keep."""
    (oa, sa), (ob, sb) = device_order(ga.offsets), device_order(gb.offsets)
    moved = sum(x != y for x, y in zip(oa, ob)) + abs(len(oa) - len(ob))
    note = (f"{moved} node position(s) differ; replays in that order: A {sa:.0%}, B {sb:.0%}" if moved
            else f"same order; replays in that order: A {sa:.0%}, B {sb:.0%}")
    if moved and sa < 1.0:
        note += "; A's own replays disagree: not judged"
    return _check("device-node-order", where, oa == sorted(oa), ob == sorted(ob), bool(moved) and sa == 1.0, note)


def _nodes(ga, gb, where: str, o: DiffOptions) -> list[dict]:
    """Per node: durations when both runs have them, else start offsets; one check per statistic, naming the
    nodes beyond the thresholds."""
    use_dur = ga.durations is not None and gb.durations is not None
    ma, mb = (ga.durations, gb.durations) if use_dur else (ga.offsets, gb.offsets)
    what = "node-duration" if use_dur else "node-offset"
    n = min(ma.shape[1], mb.shape[1])
    out = []
    for stat in ("median", "p99"):
        worst, over = None, []
        for k in range(n):
            c = [x for x in distribution(what, where, ma[:, k], mb[:, k], o) if x["check"].endswith(stat)]
            if not c or not isinstance(c[0]["a"], float):
                continue
            rel = abs(c[0]["b"] - c[0]["a"]) / abs(c[0]["a"]) if c[0]["a"] else 0.0
            if worst is None or rel > worst[0]:
                worst = (rel, k, c[0])
            if c[0]["exceeds"]:
                over.append(k)
        if worst is None:
            continue
        rel, k, c = worst
        out.append(_check(f"{what}.{stat}", where, c["a"], c["b"], bool(over),
                          f"{len(over)} of {n} nodes beyond thresholds{': ' + str(over[:8]) if over else ''}; "
                          f"largest change node #{k}: {c['note']}", unit=c.get("unit")))
    return out


def _context(ca, cb, ra: dict, rb: dict, o: DiffOptions) -> list[dict]:
    where = f"context {ra['context_id']}" + ("" if ra["context_id"] == rb["context_id"]
                                             else f" / {rb['context_id']}")
    aa, ab = ra["agreement"], rb["agreement"]
    out = [_check("agreement", where, aa["line"], ab["line"], aa["agree"] and not ab["agree"]),
           _check("drops", where, int(aa["drops"]), int(ab["drops"]), ab["drops"] - aa["drops"] > o.max_drops)]
    for k in ("missing", "extra"):
        va, vb = int(ra["blocks"][k]), int(rb["blocks"][k])
        out.append(_check(f"blocks-{k}", where, va, vb, vb > va))
    # launch counts differ by design between runs of other lengths or capture ranges: shown, never a regression
    out.append(_check("eager-launches", where, int(ra["host"]["eager_launches"]), int(rb["host"]["eager_launches"]),
                      False))
    out.append(_check("graph-execs", where, len(ra["graph_execs"]), len(rb["graph_execs"]),
                      len(ra["graph_execs"]) != len(rb["graph_execs"])))
    for i, (ga, gb, xa, xb) in enumerate(zip(ca.graphs, cb.graphs, ra["graph_execs"], rb["graph_execs"])):
        out += _graph(ga, gb, xa, xb, f"{where} graph exec #{i + 1}", o)
    return out


def _findings(pa, pb) -> list[dict]:
    def codes(p):
        fs = p.reconcile["findings"] + ((p.canary or {}).get("findings") or [])
        return Counter((f["severity"], f["code"]) for f in fs for _ in range(int(f.get("count", 1))))

    a, b = codes(pa), codes(pb)
    out = []
    for sev, code in sorted(set(a) | set(b)):
        na, nb = a.get((sev, code), 0), b.get((sev, code), 0)
        if na == nb:
            continue
        state = "appears" if not na else ("disappears" if not nb else "count changes")
        bad = sev in ("error", "warning") and (state == "appears" or (sev == "error" and nb > na))
        out.append(_check(f"finding:{code}", sev, na, nb, bad, state))
    return out


def _canary(pa, pb) -> list[dict]:
    if pa.canary is None and pb.canary is None:
        return []
    sa, sb = ((p.canary or {}).get("summary") or {} for p in (pa, pb))
    return [_check(f"canary-{k.replace('_', '-')}", "canary", int(sa.get(k, 0)), int(sb.get(k, 0)),
                   sb.get(k, 0) > sa.get(k, 0)) for k in ("unexpected_pages", "missing_pages")]


def _where(incident: dict, path: str) -> str:
    """An incident's line without its severity, code and dump ("error CODE PATH: byte N: ..." -> "byte N: ..."),
    so that the same incident of two dumps reads the same."""
    msg, head = incident["message"], f"{incident['severity']} {incident['code']} {path}: "
    return msg[len(head):] if msg.startswith(head) else msg.replace(f"{path}: ", "").replace(path, "")


def _verdicts(va: dict, vb: dict) -> list[dict]:
    def keys(v):
        return Counter(f"{i['code']}: {_where(i, v['path'])}" for i in v["incidents"] if i["severity"] == "error")

    from kvconv.check.verdict import RANK  # how bad a verdict is (schemas/codes.json verdicts)

    out = [_check("verdict", "dump", va["verdict"], vb["verdict"], RANK[vb["verdict"]] > RANK[va["verdict"]])]
    ka, kb = keys(va), keys(vb)
    new, gone = list(kb - ka), list(ka - kb)  # in the dumps' order
    # error-level only, and named so: "incidents: 0 -> 0" beside validate's "2 incidents" (warnings) read as a
    # contradiction
    out.append(_check("error-incidents", "dump", sum(ka.values()), sum(kb.values()), bool(new),
                      (f"{len(new)} new in B: {new[0]}" + (f"; and {len(new) - 1} more" if len(new) > 1 else "")
                       if new else "") + ("; " if new and gone else "") + (f"{len(gone)} of A's gone" if gone else "")))
    return out


def compare(pa, pb, *, options: DiffOptions = DiffOptions(), verdicts: tuple[dict, dict] | None = None) -> dict:
    """Every check of B against A (profiles of :mod:`kvconv.look.profile`; None where a dump's records are damaged),
    the thresholds and the exit status. ``verdicts``: each dump's kvconv validate report (``Report.to_dict()``)."""
    checks = _verdicts(*verdicts) if verdicts is not None else []
    if pa is not None and pb is not None:
        checks.append(_check("contexts", "dump", len(pa.contexts), len(pb.contexts),
                             len(pa.contexts) != len(pb.contexts)))
        for ca, cb, ra, rb in zip(pa.contexts, pb.contexts, pa.reconcile["contexts"], pb.reconcile["contexts"]):
            checks += _context(ca, cb, ra, rb, options)
        checks += _canary(pa, pb) + _findings(pa, pb)
    n = sum(c["exceeds"] for c in checks)
    a, b = (p.path if p is not None else verdicts[i]["path"] for i, p in enumerate((pa, pb)))
    return {"a": a, "b": b, "thresholds": asdict(options), "checks": checks, "exceeding": n,
            "exit": 1 if n else 0}


def lines(res: dict, *, quiet: bool = False) -> list[str]:
    """The text report: one line per check (``!`` where it exceeds), then the verdict; ``quiet`` (``-q``): only
    the checks beyond their thresholds, then the verdict."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.0f}" if v.is_integer() else f"{v:,.1f}"
        return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)

    out = [] if quiet else [f"diff {res['a']} -> {res['b']}"]
    for c in (c for c in res["checks"] if c["exceeds"] or not quiet):
        mark = "!" if c["exceeds"] else " "
        note = f" ({c['note']})" if c["note"] else ""
        unit = f" {c['unit']}" if c.get("unit") else ""
        out.append(f"{mark} {c['where']}: {c['check']}: {fmt(c['a'])}{unit} -> {fmt(c['b'])}{unit}{note}")
    out.append("ok: no change beyond the thresholds" if not res["exceeding"]
               else f"CHANGED: {res['exceeding']} check{'s' if res['exceeding'] != 1 else ''} beyond the thresholds")
    return out
