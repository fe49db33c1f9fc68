"""Report stage: the context's JSON report and tables, its verdict, the text ``kvconv reconcile`` prints.

The verdict is computed once per context (:func:`verdict`): the agreement line, ``agreement.agree``, the blocks
line and, through the findings, the exit status and the status line all come from it.

    >>> lines = context_lines("run.kvdump", report)     # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from kvconv.join.durations import lines as duration_lines
from kvconv.join.exact import Match
from kvconv.join.launches import EAGER, GRAPH_NODE, LaunchTable, kind_name, launch_name
from kvconv.join.notes import plural as _n
from kvconv.join.notes import ranges as _ranges
from kvconv.wording import counted

MATCH_DTYPE = np.dtype([
    ("context_id", "<u4"),
    ("device_index", "<i8"),
    ("host_kind", "<u2"),
    ("host_index", "<i8"),
    ("replay", "<u8"),
    ("node_ordinal", "<i4"),
    ("join", "u1"),
])

LAUNCH_DTYPE = np.dtype([
    ("context_id", "<u4"),
    ("host_kind", "<u2"),
    ("host_index", "<i8"),
    ("kernel_slot", "<u4"),
    ("graph_exec", "<u8"),
    ("replay", "<u8"),
    ("node", "<u8"),
    ("node_ordinal", "<i4"),
    ("grid_id", "<u8"),
    ("stream", "<u8"),
    ("host_ns", "<u8"),
    ("expected_blocks", "<i8"),
    ("recorded_blocks", "<i8"),  # device events matched to this launch (-1: inside an ambiguous ordered run)
    ("distinct_blocks", "<i8"),  # distinct in-grid blocks among them
    ("first_ns", "<u8"),  # earliest matched block entry, %globaltimer ns (0 if none)
    ("duplicate", "?"),  # a repeat of an earlier host record (same gridid / same graph exec, replay and node)
])


def _ms(ns) -> str:
    return f"{float(ns) / 1e6:.2f} ms"


# ---------------------------------------------------------------------------------------------------------------
# the verdict: computed once per context; the agreement line, the JSON and the exit status all come from it


def counts_agree(c: dict) -> bool:
    return (c["graph_node_records"] == c["expected_executions"] and c["expected_blocks"] == c["device_events"]
            and c["drops"] == 0 and c["lost_records"] == 0)


def _dropped(dd: dict) -> str:
    """'12' (dropped by the producer), or '0, 69,243 lost to truncation' for a salvaged, cut-short file."""
    n = dd["effective"] - dd["lost_records"]
    return f"{n:,}" + (f", {dd['lost_records']:,} lost to truncation" if dd["lost_records"] else "")


def agreement_line(c: dict, mismatches: dict) -> str:
    """'280 graph-node records = 280 expected executions = 280 device events, 0 drops'; when those agree but the
    context does not, what else differs (eager launches, events no launch accounts for) and the finding codes."""
    def eq(a, b):
        return "=" if a == b else "!="

    records, exp_exec, exp_blocks, ev = (c["graph_node_records"], c["expected_executions"], c["expected_blocks"],
                                         c["device_events"])
    drops = c["drops"]
    dn = f"{drops:,} drop" + ("" if drops == 1 else "s")
    if drops:
        dn += f" (device {c['device_drops']:,}, host {c['host_drops']:,})"
    if c["lost_records"]:
        dn += f", {_n(c['lost_records'], 'record')} lost to truncation"
    blocks = "" if exp_blocks == exp_exec else f" ({exp_blocks:,} blocks)"
    line = (f"{records:,} graph-node records {eq(records, exp_exec)} {exp_exec:,} expected executions{blocks} "
            f"{eq(exp_blocks, ev)} {ev:,} device events, {dn}")
    if not mismatches or not counts_agree(c):  # a "!=" or a drop already says it
        return line
    if c["eager_expected_blocks"] != c["eager_events"]:
        line += (f"; eager launches: {c['eager_expected_blocks']:,} expected blocks != {c['eager_events']:,} "
                 "device events")
    if c["unattributed"] > 0:
        line += f"; {_n(c['unattributed'], 'device event')} no host launch accounts for"
    return line + f"; does not agree: {', '.join(sorted(mismatches))}"


def verdict(c: dict, mismatches: dict) -> dict:
    """The context's verdict. ``agree``: every count equal, 0 drops and no mismatch finding (one that is an error
    unless --relaxed: when the counts differ, a finding says why, so agree is false exactly when the exit status is
    1, --relaxed aside). ``ReconcileResult.ok`` (the exit status) and the status line follow from the same
    findings."""
    return {"graph_node_records": c["graph_node_records"], "expected_executions": c["expected_executions"],
            "expected_blocks": c["expected_blocks"], "device_events": c["device_events"], "drops": c["drops"],
            "lost_records": c["lost_records"], "agree": not mismatches, "line": agreement_line(c, mismatches)}


def _unknowable(results) -> str:
    """'; 2,880 blocks of 360 launches cannot be matched: the device dropped 10,732,944 events' where contexts whose
    device dropped events miss blocks: whether those ran is unknowable, which is no pass (issue 44)."""
    blocks = launches = dropped = 0
    for r in results:
        for c in r.contexts:
            dd = c["device"]["drops"]
            n = dd["effective"] - dd["lost_records"]
            if n and c["blocks"]["missing"]:
                blocks, launches = blocks + c["blocks"]["missing"], launches + c["blocks"]["launches_with_missing"]
                dropped += n
    if not blocks:
        return ""
    of = f" of {counted(launches, 'launch', 'launches')}" if launches else ""
    return f"; {_n(blocks, 'block')}{of} cannot be matched: the device dropped {_n(dropped, 'event')}"


def status_line(results) -> str:
    """The last line of ``kvconv reconcile``: ok / ok (--relaxed: ...) / FAILED (...), from the contexts' verdicts."""
    from kvconv.check.verdict import STATES, lost_at_end  # the verdict's words, as every command says them

    errors = sum(1 for r in results for f in r.findings if f.severity == "error")
    if errors or not all(r.ok for r in results):
        return f"{STATES['failed']} ({_n(errors, 'error finding')}{_unknowable(results)})"
    lost = lost_at_end(results)
    if lost:  # one verdict with validate's: incomplete, not ok (issue 44)
        return (f"{STATES['incomplete']} ({counted(lost, 'launch', 'launches')} lost blocks at the producer's end: it "
                "did not finish its dump; what it recorded agrees)")
    relaxed = sum(r.mismatches for r in results)
    if relaxed:
        return f"{STATES['ok']} (--relaxed: {_n(relaxed, 'mismatch')} reported as warnings; the counts do not agree)"
    return STATES["ok"]


# ---------------------------------------------------------------------------------------------------------------
# the context's report and tables


def agreement_counts(t: LaunchTable, tally, counts, drops, extra_replay_events: int) -> dict:
    """What the verdict compares: graph-node records, expected executions and blocks, the graph-node device events
    (those of a replay the host never recorded included), drops; eager blocks and unattributed events beside."""
    graph = (t.kind == GRAPH_NODE) & ~t.upload
    counted = graph & ~t.dup  # (sums with where=: no copy of the grid column)
    return {"lost_records": drops.device_lost + drops.host_lost, "graph_node_records": int(graph.sum()),
            "expected_executions": int(counted.sum()), "expected_blocks": int(np.sum(t.grid, where=counted)),
            "device_events": tally.graph_events + extra_replay_events,
            "drops": drops.device + drops.host - drops.device_lost - drops.host_lost,
            "eager_expected_blocks": int(np.sum(t.grid, where=(t.kind == EAGER) & ~t.dup & ~t.upload)),
            "eager_events": tally.eager_events,
            "unattributed": int(counts.unattributed - extra_replay_events),
            "device_drops": drops.device - drops.device_lost, "host_drops": drops.host - drops.host_lost}


def _launch_ref(t, names, hh, **more) -> dict:
    return {"host_kind": kind_name(t, hh), "host_index": int(t.index[hh]), **more,
            "description": launch_name(t, names, hh)}


def blocks_section(t: LaunchTable, counts, o, names: dict, n_ev: int) -> dict:
    regions = o.regions if o is not None else []
    counted = ~(t.dup | t.upload)
    extra = counts.tally.outside + counts.tally.dupblk
    first_missing = None
    for hh in t.in_order(counts.missing > 0)[:1]:
        first_missing = {"host_kind": kind_name(t, hh), "host_index": int(t.index[hh]),
                         "expected_blocks": int(t.grid[hh]) if counted[hh] else 0,
                         "recorded_blocks": int(counts.tally.distinct[hh]),
                         "missing_blocks": int(counts.missing[hh]), "description": launch_name(t, names, hh)}
    return {"expected": int(np.sum(t.grid, where=counted)), "recorded": int(n_ev),
            "missing": int(counts.missing.sum()) + sum(max(r["expected_blocks"] - r["device_events"], 0)
                                                       for r in regions),
            "extra": int(extra.sum()) + sum(max(r["device_events"] - r["expected_blocks"], 0) for r in regions)
            + counts.unattributed,
            "launches_with_missing": int((counts.missing > 0).sum()), "launches_with_extra": int((extra > 0).sum()),
            "late_start_blocks": int(o.coverage_late if o is not None else 0), "first_missing": first_missing}


def problem_launches(t: LaunchTable, counts, names: dict, limit: int = 1000) -> list:
    extra = counts.tally.outside + counts.tally.dupblk
    return [_launch_ref(t, names, hh, expected_blocks=int(t.grid[hh]), recorded_blocks=int(counts.tally.recorded[hh]),
                        distinct_blocks=int(counts.tally.distinct[hh]), missing_blocks=int(counts.missing[hh]),
                        extra_blocks=int(extra[hh]), duplicate_record=bool(t.dup[hh]), replay=int(t.replay_at(hh)),
                        node_ordinal=int(t.node_ordinal[hh]))
            for hh in t.in_order((counts.missing > 0) | (extra > 0) | t.dup)[:limit]]


def ambiguous_runs(t: LaunchTable, o, names: dict) -> list:
    out = []
    for r in (o.regions if o is not None else []):
        d_ = {k: v for k, v in r.items() if k not in ("hosts", "first_event")}
        for end, hh in (("first", int(r["hosts"][0])), ("last", int(r["hosts"][-1]))):
            d_[end] = {"host_kind": kind_name(t, hh), "host_index": int(t.index[hh]),
                       "description": launch_name(t, names, hh)}
        out.append(d_)
    return out


def device_section(n_all: int, tally, agreement: dict, drops) -> dict:
    return {"events": int(n_all), "block_enter_events": int(tally.n), "other_events": int(n_all - tally.n),
            "matched": tally.matched, "replay_only": tally.replay_only, "unmatched": tally.unmatched,
            "graph_node_events": agreement["device_events"], "eager_events": tally.eager_events,
            "drops": drops.by_kind["device_event"]}


def host_section(t: LaunchTable, drops) -> dict:
    return {"eager_launches": int((t.kind == EAGER).sum()),
            "graph_node_records": int(((t.kind == GRAPH_NODE) & ~t.upload).sum()),
            "graph_uploads_ignored": int(t.upload.sum()), "duplicate_records": int(t.dup.sum()),
            "drops": {"graph_node": drops.by_kind["graph_node"], "eager_launch": drops.by_kind["eager_launch"]}}


def match_table(ctx: int, n_all: int, ev, t: LaunchTable, match: Match) -> np.ndarray:
    mt = np.empty(n_all, MATCH_DTYPE)
    b, hi = ev.idx, match.host
    host_index = np.where(hi >= 0, t.index[np.maximum(hi, 0)], -1) if t.n else np.full(len(hi), -1, np.int64)
    mt["context_id"] = ctx
    mt["device_index"] = np.arange(n_all)
    if len(b) == n_all and (n_all < 2 or bool(np.all(b[1:] > b[:-1]))):  # every event a block entry, in order
        b = slice(None)  # whole columns, each written once
    else:
        mt["host_kind"], mt["host_index"], mt["replay"], mt["node_ordinal"], mt["join"] = 0, -1, 0, -1, 0
    mt["host_kind"][b] = match.kind
    mt["host_index"][b] = host_index
    mt["replay"][b] = match.replay
    mt["node_ordinal"][b] = match.ordinal
    mt["join"][b] = match.join
    return mt


def launch_table(ctx: int, t: LaunchTable, counts, o) -> np.ndarray:
    rows = t.in_order(~t.upload)
    in_region = o.in_region[rows] if o is not None else np.zeros(len(rows), bool)
    lt = np.zeros(len(rows), LAUNCH_DTYPE)
    lt["context_id"] = ctx
    for name, col in (("host_kind", t.kind), ("host_index", t.index), ("kernel_slot", t.kernel_slot),
                      ("graph_exec", t.graph_exec), ("replay", t.replay), ("node", t.node),
                      ("node_ordinal", t.node_ordinal), ("grid_id", t.grid_id), ("stream", t.stream),
                      ("host_ns", t.host_ns), ("expected_blocks", t.grid), ("first_ns", counts.tally.first_ns),
                      ("duplicate", t.dup)):
        lt[name] = col[rows]
    lt["recorded_blocks"] = np.where(in_region, -1, counts.tally.recorded[rows])
    lt["distinct_blocks"] = np.where(in_region, -1, counts.tally.distinct[rows])
    return lt


# ---------------------------------------------------------------------------------------------------------------
# text


def context_lines(path: str, c: dict) -> list[str]:
    out = []
    ag = c["agreement"]
    out.append(f"{path}: context {c['context_id']} (device {c['device_id']}): {c['join']} join")
    out.append(f"  join: {c['join_note']}")
    h, dv, b = c["host"], c["device"], c["blocks"]
    hd = h["drops"]
    out.append(f"  host: {h['eager_launches']:,} eager launches + {h['graph_node_records']:,} graph-node records"
               + (f" ({h['graph_uploads_ignored']:,} graph uploads ignored)" if h["graph_uploads_ignored"] else "")
               + f"; drops: graph_node {_dropped(hd['graph_node'])}, eager_launch {_dropped(hd['eager_launch'])}")
    ro = f"{dv['replay_only']:,} to a replay or window only, " if dv["replay_only"] else ""
    out.append(f"  device: {dv['block_enter_events']:,} block events ({dv['matched']:,} matched to a launch, {ro}"
               f"{dv['unmatched']:,} unmatched); drops {_dropped(dv['drops'])}")
    out.append(f"  blocks: {b['expected']:,} expected from launch geometry, {b['recorded']:,} recorded, "
               f"{b['missing']:,} missing, {b['extra']:,} extra")
    fm = b.get("first_missing")
    if fm:
        more = b["launches_with_missing"] - 1
        out.append(f"  missing: {fm['description']}: {fm['recorded_blocks']:,} of {fm['expected_blocks']:,} blocks "
                   f"recorded" + (f" (+{more:,} more launches)" if more > 0 else "")
                   + (" - ran before coverage began" if b["late_start_blocks"] else ""))
    amb = c["ambiguous_runs"]
    if len(amb) > 5:
        out.append(f"  ambiguous runs: {len(amb):,} (first 5 listed; all in --json)")
    for r in amb[:5]:
        out.append(f"  ambiguous ({r['reason']}): launches {r['first_launch']:,}..{r['last_launch']:,} in host order: "
                   f"{r['expected_blocks']:,} expected blocks, {r['device_events']:,} device events, "
                   f"{r['unattributed_events']:,} events not attributed to one launch")
    for g in c["graph_execs"]:
        rp = g["records_per_replay"] or {}
        out.append(f"  graph exec {g['graph_exec']}: {g['nodes']} nodes, replays {_ranges(g['replays'])}, "
                   f"{g['records']:,} records ({rp.get('min', 0)}..{rp.get('max', 0)} per replay), "
                   f"{'no repeated nodes' if not g['repeated_nodes'] else str(len(g['repeated_nodes'])) + ' repeated'}"
                   f", {'no missing nodes' if not g['missing_nodes'] else str(len(g['missing_nodes'])) + ' missing'}"
                   f", {'stable node order' if g['stable_order'] else 'node order changes'}, "
                   f"{len(g['streams'])} stream{'s' if len(g['streams']) != 1 else ''}")
        out.extend(_exec_timing_lines(g))
    if c.get("durations"):
        out.extend(duration_lines(c["durations"]))
    out.append(f"  {ag['line']}")
    return out


def _between(d: dict, median: bool = False) -> str:
    """'min .. max' of a timing summary, with its median when asked."""
    return f"{_ms(d['min'])} .. {_ms(d['max'])}" + (f" (median {_ms(d['median'])})" if median else "")


def _exec_timing_lines(g: dict) -> list[str]:
    """A graph exec's device timing line (replay spans, inter-replay gaps) and host timing line (callback spans)."""
    out = []
    t, ht = g["timing"], g["host_timing"]
    if t.get("span_ns"):
        line = ("    device timing (gpu_globaltimer): first-to-last node entry per replay "
                + _between(t["span_ns"], median=True))
        if t.get("gap_ns"):
            line += "; inter-replay gap " + _between(t["gap_ns"], median=True)
        if not g.get("node_attribution", True):
            line += " [nodes not attributed: spans from replay first/last events]"
        out.append(line)
    if ht.get("callback_span_ns"):
        line = ("    host timing (host_monotonic, own domain): node callbacks per replay span "
                + _between(ht["callback_span_ns"]))
        if ht.get("replay_start_interval_ns"):
            line += "; replay start to next " + _between(ht["replay_start_interval_ns"])
        out.append(line)
    return out
