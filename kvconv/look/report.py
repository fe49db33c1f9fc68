"""``kvconv report``'s page: one self-contained HTML file (inline CSS, plots as inline SVG, no script, no link to
fetch) from the profiles of one or more dumps (:mod:`kvconv.look.profile`).

    >>> from kvconv.format import dump
    >>> from kvconv.look import profile, report
    >>> with dump.open("fixtures/h200-single/single.kvdump") as d:     # doctest: +SKIP
    ...     page = report.page([profile.profile(d)])
    >>> page.html.startswith("<!DOCTYPE html>"), page.plots             # doctest: +SKIP
    (True, 6)

Sections: for several dumps, one row per dump and context (GPU / rank) and the cross-dump replay skew
(:mod:`kvconv.check.skew`); then per dump its one verdict (kvconv validate's, :mod:`kvconv.check.verdict`) and its
incidents (findings of one cause on one line), the agreement headline, the counts, the findings with their codes'
meaning and advice (``schemas/codes.json``), and the plots. Every plot is a ``<figure class="plot">`` (the browser test
finds them there). Sizes: a plot has a bounded number of marks, the findings list at most ``MAX_FINDINGS`` lines.
"""

from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvconv.look import bins, plots
from kvconv.wording import counted

MAX_FINDINGS = 200  # findings listed one per line; the rest counted per code

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1000px;color:#1d1d1f;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
h3{font-size:15px;margin:20px 0 6px} .sub{color:#666} code{font:12px ui-monospace,monospace}
.agree{padding:8px 12px;border-radius:6px;font-weight:600;margin:6px 0}
.ok{background:#e6f4ea;color:#137333} .bad{background:#fce8e6;color:#a50e0e} .warn{background:#fef7e0;color:#7a5a00}
table{border-collapse:collapse;margin:6px 0;font-size:13px} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f5f5f7} td.n{text-align:right;font-variant-numeric:tabular-nums}
figure.plot{margin:10px 0;border:1px solid #eee;padding:4px} figure.plot svg{width:100%;height:auto}
figcaption{color:#555;font-size:12px} .error{color:#a50e0e} .warning{color:#7a5a00} .info{color:#555}
"""


@dataclass(frozen=True)
class Page:
    html: str
    plots: int  # figures in it


def _e(s) -> str:
    from kvconv.names import demangle_text  # the page is read by people: kernel names demangled (kvconv/names.py)

    return html.escape(demangle_text(str(s)), quote=True)


class _Doc:
    """The page being built: a list of HTML parts and a count of its figures."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.plots = 0

    def add(self, *parts: str) -> None:
        self.parts.extend(parts)

    def figure(self, name: str, svg: str, caption: str) -> None:
        self.plots += 1
        self.add(f'<figure class="plot" data-plot="{_e(name)}">{svg}<figcaption>{_e(caption)}</figcaption></figure>')

    def table(self, head: list[str], rows: list[list]) -> None:
        def cell(v):
            return f'<td class="n">{v:,}</td>' if isinstance(v, (int, np.integer)) else f"<td>{_e(v)}</td>"

        self.add("<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"
                 + "".join("<tr>" + "".join(cell(v) for v in r) + "</tr>" for r in rows) + "</table>")


def page(profiles: list, *, cross: dict | None = None, title: str = "kvconv report",
         verdicts: list[dict] | None = None) -> Page:
    """The HTML page of ``profiles`` (one per dump, in order; None where a dump's records are damaged);
    ``cross``: kvconv.check.skew.cross_dump of them; ``verdicts``: each dump's kvconv validate report
    (``Report.to_dict()``: its verdict, incidents and every finding)."""
    from kvconv.version import __version__

    doc = _Doc()
    doc.add("<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width,initial-scale=1">',
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
            f"<h1>{_e(title)}</h1><p class=\"sub\">kvconv {_e(__version__)}: "
            + ", ".join(f"<code>{_e(v['path'] if p is None else p.path)}</code> "
                        f"({(v['size'] if p is None else p.size):,} bytes)"
                        for p, v in zip(profiles, verdicts or [None] * len(profiles))) + "</p>")
    if len(profiles) > 1:
        _ranks(doc, [p for p in profiles if p is not None], cross)
    for p, v in zip(profiles, verdicts or [None] * len(profiles)):
        _dump(doc, p, several=len(profiles) > 1, verdict=v)
    doc.add("</body></html>\n")
    return Page(html="\n".join(doc.parts), plots=doc.plots)


def _median_span(c: dict) -> str:
    spans = [r["span_ns"] for g in c["graph_execs"] for r in (g.get("timing") or {}).get("per_replay") or []]
    return f"{np.median(spans) / 1e6:.3f} ms" if spans else "-"


def _ranks(doc: _Doc, profiles: list, cross: dict | None) -> None:
    """One row per dump and context, then the cross-dump skew."""
    doc.add("<h2>Dumps side by side</h2>")
    rows = []
    for p in profiles:
        s = p.reconcile["summary"]
        for c in p.reconcile["contexts"]:
            replays = sum(g["replay_count"] for g in c["graph_execs"])
            rows.append([Path(p.path).name, c["context_id"], c["device_id"], c["agreement"]["line"],
                         int(c["agreement"]["drops"]), int(s["error"]), int(s["warning"]), int(replays),
                         _median_span(c)])
    doc.table(["dump", "context", "GPU", "agreement", "drops", "errors", "warnings", "replays", "median span"], rows)
    if not cross:
        return
    doc.add("<h3>Cross-dump replay skew</h3>", f"<p class=\"sub\">{_e(cross['pairing'])}; host clock via each "
            "context's clock-sync pairs (kvconv.check.skew). Grey band: the alignment bound.</p>")
    for i, e in enumerate(cross["graph_execs"]):
        if e["note"]:
            doc.add(f"<p>graph exec #{i + 1}: {_e(e['note'])}</p>")
            continue
        members = [Path(m["path"]).name for m in e["members"]]
        series = [(f"{members[j]} - {members[0]}", np.array([r["skew_ns"][j] for r in e["per_replay"]], np.float64))
                  for j in range(1, len(members))]
        doc.figure("skew", plots.skew(series, e["bound_ns"], title=f"graph exec #{i + 1}: replay start skew"),
                   f"start of each replay against {members[0]}'s")
        doc.table(["dump", "replays", "start skew min / median / max (µs)", "last node skew median (µs)", "bound (µs)"],
                  [[members[j], int(st["count"]), f"{st['min'] / 1e3:+.2f} / {st['median'] / 1e3:+.2f} / "
                    f"{st['max'] / 1e3:+.2f}", f"{sl['median'] / 1e3:+.2f}", f"±{b / 1e3:.2f}"]
                   for j, (st, sl, b) in enumerate(zip(e["skew_ns"], e["last_node_skew_ns"], e["bound_ns"]), 1)])


def _verdict_head(verdict: str) -> tuple[str, str]:
    """The style and the headline of a verdict (kvconv.check.verdict's words and meaning)."""
    from kvconv.check.verdict import MEANS, RANK, STATES

    style = "ok" if RANK[verdict] == 0 else "bad" if RANK[verdict] >= RANK["failed"] else "warn"
    return style, f"{STATES[verdict]}: {MEANS[verdict]}"


def _verdict(doc: _Doc, v: dict) -> None:
    """The dump's one verdict and its incidents (request, step, slot, caches where the cause names them)."""
    cls, text = _verdict_head(v["verdict"])
    doc.add(f'<div class="agree {cls}" data-verdict="{_e(v["verdict"])}">verdict: {_e(text)} '
            f'({counted(v["errors"], "error")}, {counted(v["warnings"], "warning")}; exit {v["exit_code"]})</div>')
    inc = v["incidents"]
    doc.add(f"<h3>Incidents ({len(inc):,})</h3>")
    if not inc:
        doc.add("<p>none</p>")
        return
    rows = [[i["severity"], i["code"], int(i["findings"]), i["message"].replace(v["path"] + ": ", "")]
            for i in inc[:MAX_FINDINGS]]
    doc.table(["severity", "code", "findings", "incident"], rows)
    if len(inc) > MAX_FINDINGS:
        doc.add(f"<p>{len(inc) - MAX_FINDINGS:,} more incidents not listed</p>")


def _dump(doc: _Doc, p, *, several: bool, verdict: dict | None = None) -> None:
    name = Path(p.path if p is not None else verdict["path"]).name
    if verdict is not None:
        doc.add(f"<h2>{_e(name)}</h2>" if several else "<h2>Verdict</h2>")
        _verdict(doc, verdict)
        if p is None:  # damaged records: the verdict and the findings are all there is
            _findings(doc, verdict["findings"])
            return
        doc.add("<h3>Agreement</h3>")
    else:
        doc.add(f"<h2>{_e(name)}</h2>" if several else "<h2>Agreement</h2>")
    rep = p.reconcile
    for c in rep["contexts"]:
        ag = c["agreement"]
        cls = "ok" if ag["agree"] else "bad"
        doc.add(f'<div class="agree {cls}">context {c["context_id"]} (GPU {c["device_id"]}, {_e(c["join"])} '
                f'join): {_e(ag["line"])}</div>')
    if not rep["contexts"]:
        doc.add('<div class="agree warn">no host launch record and no device event: nothing to reconcile</div>')
    _counts(doc, rep)
    findings = (verdict["findings"] if verdict is not None
                else rep["findings"] + ((p.canary or {}).get("findings") or []))
    _findings(doc, findings)
    for cv, c in zip(p.contexts, rep["contexts"]):
        _context_plots(doc, cv, c)
    if p.canary is not None:
        _canary(doc, p.canary)


def _counts(doc: _Doc, rep: dict) -> None:
    rows = []
    for c in rep["contexts"]:
        b, h, dv = c["blocks"], c["host"], c["device"]
        rows.append([c["context_id"], int(h["graph_node_records"]), int(h["eager_launches"]),
                     int(c["agreement"]["expected_executions"]), int(dv["events"]), int(b["expected"]),
                     int(b["recorded"]), int(b["missing"]), int(b["extra"]), int(c["agreement"]["drops"])])
    if rows:
        doc.table(["context", "graph-node records", "eager launches", "expected executions", "device events",
                   "blocks expected", "recorded", "missing", "extra", "drops"], rows)


def _findings(doc: _Doc, findings: list[dict]) -> None:
    """Findings one per line (at most MAX_FINDINGS), then each code's meaning and what to do."""
    from kvconv.format.codes import CODES

    doc.add(f"<h3>Findings ({len(findings):,})</h3>")
    if not findings:
        doc.add("<p>none</p>")
        return
    rows = [[f["severity"], f["code"], int(f.get("count", 1)), f["message"]] for f in findings[:MAX_FINDINGS]]
    doc.table(["severity", "code", "records", "message"], rows)
    if len(findings) > MAX_FINDINGS:
        rest = Counter(f["code"] for f in findings[MAX_FINDINGS:])
        doc.add("<p>not listed: " + ", ".join(f"{n:,} {_e(k)}" for k, n in sorted(rest.items())) + "</p>")
    doc.add("<h3>What the codes mean</h3><table><tr><th>code</th><th>means</th><th>what to do</th></tr>")
    for code in sorted({f["code"] for f in findings}):
        c = CODES.get(code)
        doc.add(f"<tr><td><code>{_e(code)}</code></td><td>{_e(c.means if c else '')}</td>"
                f"<td>{_e(c.do if c else '')}</td></tr>")
    doc.add("</table>")


def _context_plots(doc: _Doc, cv, c: dict) -> None:
    label = f"context {cv.context_id} (GPU {cv.device_id})"
    doc.add(f"<h3>{_e(label)}: blocks</h3>")
    if len(cv.sm_blocks):
        doc.figure("sm", plots.sm_blocks(cv.sm_blocks, title=f"{label}: block entries per SM"),
                   f"{int(cv.sm_blocks.sum()):,} block-enter events on {int(np.count_nonzero(cv.sm_blocks))} SMs")
    if len(cv.expected):
        missing = int(((cv.expected > cv.recorded) & (cv.recorded >= 0)).sum())
        doc.figure("launch-blocks", plots.launch_blocks(cv.expected, cv.recorded,
                                                        title=f"{label}: blocks per launch"),
                   f"{len(cv.expected):,} launches in host order; {missing:,} with missing blocks")
    cal = (c.get("durations") or {}).get("calibration")
    for gv, g in zip(cv.graphs, c["graph_execs"]):
        _graph_plots(doc, gv, g, label, cal)


def _graph_plots(doc: _Doc, gv, g: dict, label: str, cal: dict | None = None) -> None:
    name = f"graph exec {g['graph_exec']}"
    doc.add(f"<h3>{_e(label)}: {_e(name)}</h3><p>{counted(g['nodes'], 'node')}, "
            f"{counted(g['replay_count'], 'replay')}, "
            f"{'stable node order' if g['stable_order'] else 'node order changes'}, "
            f"{counted(len(g['streams']), 'stream')}; "
            f"kernels: {_e(', '.join(g['kernels'][:8]))}</p>")
    per = gv.per_replay
    if per:
        spans = np.array([r["span_ns"] for r in per], np.float64)
        gaps = np.array([r["gap_to_next_ns"] for r in per[:-1]], np.float64)
        doc.figure("replay-timing", plots.replay_timing(spans, gaps, title=name),
                   "device %globaltimer: first to last node entry per replay, and the gap to the next replay")
    if gv.offsets.size and not np.isnan(gv.offsets).all():
        m, first = bins.columns(gv.offsets)
        doc.figure("offsets", plots.heatmap(m, first, title=f"{name}: node start offset within its replay",
                                            label="start offset (µs)"),
                   "first block entry of each node minus the replay's first, per replay")
    if gv.durations is not None and not np.isnan(gv.durations).all():
        m, first = bins.columns(gv.durations)
        doc.figure("durations", plots.heatmap(m, first, title=f"{name}: node duration (first entry to last exit)",
                                              label="duration (µs)"),
                   "from block-enter and block-exit events (kvconv.join.durations), raw: "
                   + (f"each includes the tracer's own {cal['bias_ns'] / 1e3:.2f} µs, as it measured it at start-up "
                      "(kvconv reconcile gives the corrected medians)" if cal else
                      "each includes the tracer's own enter/exit cost (this dump records no calibration)"))


def _canary(doc: _Doc, can: dict) -> None:
    s = can["summary"]
    doc.add("<h3>Location canary</h3>",
            f"<p>{counted(s['records'], 'canary record')}, {counted(s['steps_checked'], 'step')} checked: "
            f"{counted(s['unexpected_pages'], 'unexpected page')} in {counted(s['steps_with_unexpected'], 'step')}, "
            f"{counted(s['missing_pages'], 'missing page')} in {counted(s['steps_with_missing'], 'step')}: "
            f"<b>{_e(can['verdict'])}</b></p>")
    for what, g in sorted(can["grids"].items()):
        doc.figure(f"canary-{what}", plots.canary_grid(g, title=f"canary: {what} pages by step and page"),
                   counted(int(np.asarray(g["counts"]).sum()), f"{what} page"))
