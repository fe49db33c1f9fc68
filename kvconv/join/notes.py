"""The findings of one context's reconciliation: a collector the stages add to, in the order they run.

    >>> notes = Notes(d, ctx=0, options=ReconcileOptions())            # doctest: +SKIP
    >>> notes.add("error", "missing-blocks", "eager launch #3: ...", kind="eager_launch", index=3)
    >>> notes.findings(), notes.mismatches                              # doctest: +SKIP

``mismatches`` counts findings by code that are errors before ``--relaxed`` turns them into warnings: the verdict
(``agreement.agree``) is false exactly when there is one.
"""

from __future__ import annotations

from kvconv.format.findings import Finding
from kvconv.wording import counted


def hexs(v) -> str:
    return f"{int(v):#x}"


plural = counted  # '1 device event' / '3 device events': the one counted-noun helper (kvconv.wording)


def ranges(ids) -> str:
    """'1..7' / '1..3, 5, 7..9' for a sorted int list."""
    ids = [int(x) for x in ids]
    if not ids:
        return "none"
    parts, start, prev = [], ids[0], ids[0]
    for x in ids[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        parts.append(f"{start}" if start == prev else f"{start}..{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(parts)


class Notes:
    """Findings of one context; after ``max_listed`` findings of one code, further ones are summed into one."""

    def __init__(self, d, ctx: int, options) -> None:
        from kvconv.format import holds

        self.d, self.ctx, self.o = d, ctx, options
        # a file cut short (--salvage) that lost launch records or all device events: its mismatches are the cut's
        self.cut = holds.cut_launches(d, ctx)
        self.path = str(d.path)
        self._out: list[Finding] = []
        self._listed: dict[str, int] = {}
        self._unlisted: dict[str, list] = {}
        self.mismatches: dict[str, int] = {}

    def _sev(self, severity: str) -> str:
        return "warning" if ((self.o.relaxed or self.cut) and severity == "error") else severity

    def _where(self, kind: str | None, index: int | None) -> dict:
        if kind is None or index is None or index < 0:
            return {}
        off = 0
        for g in self.d.groups_of(kind, context_id=self.ctx):
            n = len(g.records)
            if index < off + n:
                return {"group": g.index, "record": int(index), "offset": g.record_offset(index - off), "field": kind}
            off += n
        return {"record": int(index), "field": kind}

    def add(self, severity: str, code: str, message: str, *, kind: str | None = None, index: int | None = None,
            count: int = 1, listed: bool = True) -> None:
        if severity == "error":
            self.mismatches[code] = self.mismatches.get(code, 0) + 1
        if listed:
            n = self._listed.get(code, 0)
            if n >= self.o.max_listed:
                u = self._unlisted.setdefault(code, [self._sev(severity), 0, 0])
                u[1] += 1
                u[2] += count
                return
            self._listed[code] = n + 1
        if self.cut and severity == "error":
            message += f" (the file was cut short and lost {self.cut}: --salvage; a consequence of the cut)"
        self._out.append(Finding(self._sev(severity), code, f"context {self.ctx}: {message}", path=self.path,
                                 count=count, **self._where(kind, index)))

    def findings(self) -> list[Finding]:
        """The findings, with one summary per code whose findings went past ``max_listed``."""
        out = list(self._out)
        for code, (sev, n, count) in self._unlisted.items():
            out.append(Finding(sev, code, f"context {self.ctx}: {n:,} more {code} findings not listed (see --json)",
                               path=self.path, count=max(count, 1)))
        return out
