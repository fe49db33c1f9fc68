"""Numbers in words, the same way in every message: thousands separators and counted nouns.

    >>> from kvconv.wording import counted
    >>> counted(1, "error"), counted(17400921, "record"), counted(2, "context")
    ('1 error', '17,400,921 records', '2 contexts')
    >>> counted(1, "match", "matches"), counted(3, "match", "matches")
    ('1 match', '3 matches')
"""

from __future__ import annotations


def counted(n, noun: str, plural: str | None = None) -> str:
    """``n`` with thousands separators and ``noun`` in the number it takes (``plural`` when not ``noun + "s"``)."""
    n = int(n)
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"
