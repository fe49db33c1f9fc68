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


def open(paths, *, options=None):  # noqa: A001 - kvconv.open, as Perfetto's TraceProcessor(trace) opens a trace
    """The run of one dump or of several (one engine run's processes): a :class:`kvconv.run.Run`, which opens each
    dump once and computes its checks, verdict, tables and converters' outputs when first asked for (README.md,
    "From Python").

        >>> with kvconv.open("run.kvdump") as run:      # doctest: +SKIP
        ...     run.verdict, run.exit_code
        ('ok', 0)

    Args:
        paths: one dump path, or several (a path '-': standard input; ``.gz``/``.zst`` dumps are read as the dump).
        options: a :class:`kvconv.run.RunOptions` (default: every check, the auto join).

    Returns:
        A :class:`kvconv.run.Run` (a context manager: ``with`` closes its dumps).

    Raises:
        UsageError: no path given, or options that do not fit (a ``join`` outside auto, exact, ordered). A dump
        that cannot be read raises its :class:`kvconv.format.errors.KvconvError` when it is first read, never here.
    """
    from kvconv.run import Run, RunOptions

    return Run(paths, options=options if options is not None else RunOptions())
