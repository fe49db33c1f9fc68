"""The output formats, one registration each: the ``kvconv <format>`` command, its help and options, and the
``write_<format>`` function come from here (kvconv/cli/emit.py builds the commands of every registered format).

A new format is one module with ``write(dumps, out, *, options, warn, checks) -> EmitResult`` (``dumps``: paths or
open dumps; ``checks``: each dump's :class:`kvconv.check.validate.Validation` to feed, or None: see
:func:`kvconv.emit._contexts.emit_run`) plus one :func:`register` call below::

    register(Format(name="csv", writer="kvconv.emit.csv:write_csv", output="output .csv (- for stdout)",
                    summary="One line per device event.", example="kvconv csv run.kvdump -o run.csv"))

The writer module is imported only when its command runs, so ``kvconv --help`` stays fast.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Format:
    """An output format: its command name, where its writer lives, and what its command says."""

    name: str  # the command: kvconv <name>
    writer: str  # "module:function", imported when the command runs
    output: str  # help of -o/--output
    summary: str  # the command's help, first paragraph
    example: str  # "kvconv <name> ...": the last line of the command's help
    trace: bool = True  # a trace (a timeline): takes --window, --replays and --flows
    tables: bool = False  # tables: takes --format (arrow | parquet) and --compression

    def write(self, dumps, out, *, options, warn=None, checks=None):
        """The format's writer on ``dumps`` (paths, or dumps open already: :meth:`kvconv.run.Run.write`)."""
        import inspect

        module, function = self.writer.split(":")
        fn = getattr(importlib.import_module(module), function)
        if checks is not None and "checks" in inspect.signature(fn).parameters:
            return fn(dumps, out, options=options, warn=warn, checks=checks)
        return fn(dumps, out, options=options, warn=warn)  # (a writer without checks: the dumps checked apart)


FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add an output format (its command appears in ``kvconv --help``).

    Raises:
        UsageError: a format of that name is registered already.
    """
    from kvconv.format.errors import UsageError

    if fmt.name in FORMATS:
        raise UsageError(f"output format {fmt.name!r} registered twice", code="format-twice")
    FORMATS[fmt.name] = fmt
    return fmt


def format_of(name: str) -> Format:
    """The registered format ``name``.

    Raises:
        UsageError: no such format (the message names those there are).
    """
    from kvconv.format.errors import UsageError

    if name not in FORMATS:
        raise UsageError(f"no output format {name!r}: {', '.join(FORMATS)}", code="no-format")
    return FORMATS[name]


register(Format(
    name="perfetto", writer="kvconv.emit.perfetto:write_perfetto", output="output .pftrace (- for stdout)",
    summary="Perfetto trace (TrackEvent protobuf): open in ui.perfetto.dev or trace_processor.",
    example="kvconv perfetto rank0.kvdump rank1.kvdump -o tp.pftrace"))
register(Format(
    name="chrome", writer="kvconv.emit.chrome:write_chrome", output="output .json (- for stdout)",
    summary="Chrome JSON trace events (chrome://tracing, Perfetto UI); device times aligned via clock-sync pairs.",
    example="kvconv chrome run.kvdump -o run.json --replays 1:3"))
register(Format(
    name="arrow", writer="kvconv.emit.arrow:write_arrow", output="output folder (a partitioned dataset)",
    summary="Arrow IPC / Parquet tables: one per record kind plus the reconciled matches, partitioned by run and "
            "device.",
    example="kvconv arrow runs/*.kvdump -o tables/ --format parquet", trace=False, tables=True))
