"""The checks users run on a dump: ``validate`` (structure, schema, semantics), ``reconcile`` (host records, expected
executions and device events joined and counted), ``canary`` (pages written outside the expected set) and ``skew``
(replay alignment across the dumps of one run).

    >>> from kvconv.format import dump
    >>> from kvconv.check import reconcile
    >>> r = reconcile.reconcile(dump.open("fixtures/qwen3-14b/qwen3-14b.kvdump"))   # doctest: +SKIP
"""
