"""Page lists as text: runs of consecutive pages, and the page and slot ranges a finding names.

    >>> runs([1, 2, 3, 7, 9, 10])
    [(1, 3), (7, 7), (9, 10)]
    >>> describe_pages([3, 4, 5, 9], 256)
    'pages 3-5, 9 (slots 768-1535, 2304-2559)'
"""

from __future__ import annotations

import numpy as np

MAX_LISTED = 16  # runs named in one finding message before "... and N more"


def runs(pages) -> list[tuple[int, int]]:
    """Sorted pages -> inclusive ``(first, last)`` runs."""
    p = np.asarray(pages, dtype=np.int64).reshape(-1)
    if not len(p):
        return []
    cut = np.flatnonzero(p[1:] != p[:-1] + 1) + 1
    return list(zip(p[np.concatenate([[0], cut])].tolist(), p[np.concatenate([cut - 1, [len(p) - 1]])].tolist()))


def describe_pages(pages, slots_per_page: int) -> str:
    """``page 9 (slots 2304-2559)``, ``pages 3-5, 9 (slots 768-1535, 2304-2559)``; long lists are cut short."""
    rs = runs(pages)
    shown, rest = rs[:MAX_LISTED], rs[MAX_LISTED:]
    word = "page" if len(pages) == 1 else "pages"
    ptxt = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in shown)
    stxt = ", ".join(f"{a * slots_per_page}-{(b + 1) * slots_per_page - 1}" for a, b in shown)
    more = f" ... and {sum(b - a + 1 for a, b in rest)} more" if rest else ""
    return f"{word} {ptxt}{more} (slots {stxt}{', ...' if rest else ''})"


CODES = ("canary-unexpected-write", "canary-missing-write")  # the codes :func:`incidents` groups


def incidents(res) -> list[dict]:
    """The location canary's findings by cause: the same pages of one step, unexpected or missing, in several
    buffers, one incident (``res``: a CanaryResult)."""
    from collections import defaultdict

    from kvconv.check.verdict import incident

    groups = defaultdict(list)
    for st in res.steps.flagged():
        groups[(st["context_id"], st["step"], tuple(st["unexpected"]), tuple(st["missing"]))].append(st["buffer"])
    out = []
    nbuf = len({(s["context_id"], s["buffer_id"]) for s in res.steps}) if len(res.steps) < 100_000 else None
    of = f" of {nbuf}" if nbuf else ""
    for (ctx, step, unexpected, missing), bufs in groups.items():
        for what, pg, code in (("changed outside the expected set", unexpected, "canary-unexpected-write"),
                               ("expected but did not change", missing, "canary-missing-write")):
            if pg:
                ranges = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs(list(pg)))
                msg = (f"context {ctx} step {step}: page{'s' if len(pg) > 1 else ''} {ranges} {what}, in "
                       f"{len(bufs)}{of} buffers "
                       f"({', '.join(repr(b) for b in bufs[:4])}{', ...' if len(bufs) > 4 else ''})")
                out.append(incident("error", code, msg, len(bufs), context=ctx, step=step, pages=len(pg),
                                    buffers=len(bufs)))
    return out
