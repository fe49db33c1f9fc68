"""``kvconv canary --writes DUMP [--json]``: the write-address canary's text (kvconv.check.canary.writes;
docs/CANARY.md).

Exit status as for the page canary (the canary part of the dump's verdict, kvconv.check.verdict.part): 0 clean, 1
findings, 2 unreadable dump, 4 nothing to check (no slot_write records or no recorded step), 5 clean but the producer
did not finish. The text leads with incidents, as kvconv validate's (findings of one cause on one line: one stale
page-table entry in a 40-layer capture is one line "in 80 of 80 caches", not 160); --all and --json keep every
finding. Kernel names demangled in the text, kept as they are in --json.
"""

from __future__ import annotations


def writes_text(part, *, all_findings: bool = False, quiet: bool = False) -> str:
    """The text of ``kvconv canary --writes`` for the writes part of a dump's verdict (:meth:`kvconv.run.DumpRun.part`):
    the summary (not with -q), one line per incident (every finding with --all), the verdict line."""
    from kvconv.check import verdict
    from kvconv.check.canary import writes
    from kvconv.names import demangle_text

    res = part.results["writes"]
    lines = [] if quiet else [writes.summary_line(res)]
    lines += [f.line() for f in part.findings] if all_findings else [verdict.line(i) for i in part.incidents]
    lines.append(verdict.part_line(part.verdict, nothing="no slot_write records or steps; see docs/CANARY.md"))
    return "\n".join(demangle_text(x) for x in lines)
