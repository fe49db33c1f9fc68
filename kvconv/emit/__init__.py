"""Emitters: Perfetto (.pftrace), Chrome JSON trace events, Arrow IPC / Parquet tables.

    >>> from kvconv.emit import EmitOptions, write_perfetto          # doctest: +SKIP
    >>> write_perfetto(["rank0.kvdump", "rank1.kvdump"], "tp.pftrace", options=EmitOptions(flows=4))  # doctest: +SKIP

Every ``write_*(dumps, out, options=EmitOptions())`` streams the dumps in bounded chunks, writes ``out`` atomically
(never over an input), gives identical bytes for identical input, and returns an :class:`EmitResult` with counts,
the join used per context and each context's clock alignment error bound. pyarrow and perfetto's protos are
imported only by the emitter that needs them. Each sets glibc's heap for streaming, for the rest of the process
(:func:`kvconv.memory.stream_heap`: chunk temporaries kept in the heap, large arrays mapped apart).
"""

from __future__ import annotations

from kvconv.emit.options import EmitOptions, EmitResult


def write_perfetto(dumps, out, *, options: EmitOptions = EmitOptions(), warn=None, checks=None) -> EmitResult:
    """:func:`kvconv.emit.perfetto.write_perfetto` (imported when called)."""
    from kvconv.emit.perfetto import write_perfetto as f

    return f(dumps, out, options=options, warn=warn, checks=checks)


def write_chrome(dumps, out, *, options: EmitOptions = EmitOptions(), warn=None, checks=None) -> EmitResult:
    """:func:`kvconv.emit.chrome.write_chrome` (imported when called)."""
    from kvconv.emit.chrome import write_chrome as f

    return f(dumps, out, options=options, warn=warn, checks=checks)


def write_arrow(dumps, out, *, options: EmitOptions = EmitOptions(), warn=None, checks=None) -> EmitResult:
    """:func:`kvconv.emit.arrow.write_arrow` (imported when called)."""
    from kvconv.emit.arrow import write_arrow as f

    return f(dumps, out, options=options, warn=warn, checks=checks)


__all__ = ["EmitOptions", "EmitResult", "write_perfetto", "write_chrome", "write_arrow"]
