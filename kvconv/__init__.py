"""kvconv: see which CUDA-graph node, replay and block wrote the KV cache.

    >>> import kvconv
    >>> kvconv.__version__
    '0.1.0'

    >>> run = kvconv.open("run.kvdump")          # doctest: +SKIP
    >>> run.verdict, run.table("launch").num_rows  # doctest: +SKIP
    ('ok', 1320)

``kvconv.open`` (:mod:`kvconv.run`) is the centre: every command renders a Run. Below it: ``format`` (the reader and
writer), ``check`` (the passes and the verdict), ``emit`` (perfetto, chrome, arrow), ``capture`` (record, probe).
"""

from kvconv.version import __version__ as __version__


def open(paths, *, options=None, whole_run=True):  # noqa: A001 - kvconv.open, as Perfetto's TraceProcessor(trace)
    """The run of one dump or of several (one engine run's processes): a :class:`kvconv.run.Run`, whose readers,
    checks, verdict, tables and converters are computed when first asked for (README.md, "From Python").
    ``whole_run``: with the run's other dumps found beside the paths (:func:`kvconv.run.open`)."""
    from kvconv.run import RunOptions
    from kvconv.run import open as open_run

    return open_run(paths, options=options if options is not None else RunOptions(), whole_run=whole_run)
