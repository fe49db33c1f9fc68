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
    """The run of one dump or of several (one engine run's processes): a :class:`kvconv.run.Run`, which opens each
    dump once and computes its checks, verdict, tables and converters' outputs when first asked for (README.md,
    "From Python").

        >>> with kvconv.open("run.kvdump") as run:      # doctest: +SKIP
        ...     run.verdict, run.exit_code
        ('ok', 0)

    Args:
        paths: one dump path, or several (a path '-': standard input; ``.gz``/``.zst`` dumps are read as the dump).
        options: a :class:`kvconv.run.RunOptions` (default: every check, the auto join).
        whole_run: with the run's other files found beside the paths (the other processes' dumps, the engine
            plugins' probe dumps: :func:`kvconv.run.open`); False: the paths as given.

    Returns:
        A :class:`kvconv.run.Run` (a context manager: ``with`` closes its dumps).

    Raises:
        UsageError: no path given, or options that do not fit (a ``join`` outside auto, exact, ordered). A dump
        that cannot be read raises its :class:`kvconv.format.errors.KvconvError` when it is first read, never here.
    """
    from kvconv.run import RunOptions
    from kvconv.run import open as open_run

    return open_run(paths, options=options if options is not None else RunOptions(), whole_run=whole_run)
