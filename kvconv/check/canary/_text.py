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
