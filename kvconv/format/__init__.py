"""The dump format: record layouts and record kinds from schemas/ (``layout``), the zero-copy reader (``reader``) and
the writer (``writer``), both used as ``dump.open`` / ``dump.new`` (``dump``), what ``kvconv info`` reports of a dump
(``info``), the finding codes (``codes``, ``findings``), kvconv's one exception family (``errors``) and the rules
every output is written by (``atomic``: a temporary name renamed into place).

    >>> from kvconv.format import dump
    >>> d = dump.open("fixtures/qwen3-14b/qwen3-14b.kvdump")   # doctest: +SKIP
"""
