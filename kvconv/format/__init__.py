"""The dump format: record layouts from schemas/ (``layout``), the zero-copy reader and the writer (``dump``), the
finding codes (``codes``, ``findings``) and kvconv's one exception family (``errors``).

    >>> from kvconv.format import dump
    >>> d = dump.open("fixtures/qwen3-14b/qwen3-14b.kvdump")   # doctest: +SKIP
"""
