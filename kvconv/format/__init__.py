"""The dump format: record layouts and record kinds from schemas/ (``layout``), the zero-copy reader (``reader``) and
the writer (``writer``), both used as ``dump.open`` / ``dump.new`` (``dump``), what ``kvconv info`` reports of a dump
(``info``), the finding codes (``codes``, ``findings``) and kvconv's one exception family (``errors``).

    >>> from kvconv.format import dump
    >>> d = dump.open("fixtures/qwen3-14b/qwen3-14b.kvdump")   # doctest: +SKIP
"""
