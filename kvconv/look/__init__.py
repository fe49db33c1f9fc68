"""Look rather than read: ``kvconv report`` (one self-contained HTML page of plots) and ``kvconv diff`` (two runs
compared, exit 1 beyond thresholds), both built on one read of each dump (:mod:`kvconv.look.profile`).

    $ kvconv report fixtures/qwen3-14b/qwen3-14b.kvdump -o report.html
    $ kvconv diff fixtures/h200-single/single.kvdump fixtures/h200-twostream/twostream.kvdump --json

Modules: ``profile`` (the read), ``bins`` (bounded aggregation), ``plots`` (matplotlib figures as SVG), ``report``
(the page), ``diff`` (the comparison).
"""
