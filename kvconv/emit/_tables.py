"""One table of ``kvconv arrow``'s dataset built in memory from open dumps (:meth:`kvconv.run.Run.table`), by the
Arrow converter's own code (:func:`kvconv.emit.arrow.context_tables`): the same columns, rows and schema metadata
as the files ``kvconv arrow`` writes, with the ``run`` and ``device`` columns a Hive-partitioned read of those files
adds, in the order such a read gives (the parts' paths sorted). Only the table asked for reads the device events
(device_event, matches, launch); nothing is written to disk.

    >>> from kvconv.emit._tables import read_table                              # doctest: +SKIP
    >>> read_table([d], "launch", options=EmitOptions(progress=False)).num_rows  # doctest: +SKIP
    1320
"""

from __future__ import annotations

from kvconv.emit.options import EmitOptions, EmitResult


class _Kept:
    """A table part kept in memory (what :class:`kvconv.emit.arrow._Sink` writes to a file), or dropped."""

    def __init__(self, pa, schema, keep: bool) -> None:
        self.pa, self.schema, self.keep, self.batches = pa, schema, keep, []

    def write(self, cols: dict) -> None:
        if self.keep:
            from kvconv.emit.arrow import record_batch

            self.batches.append(record_batch(self.pa, self.schema, cols))

    def close(self) -> None:
        pass


def _build(dumps, options: EmitOptions, want: set, keep) -> dict[str, tuple]:
    """The parts of every table the dumps' contexts have (``part path -> (table, _Kept)``); the device events are read
    for the tables of ``want`` only, and ``keep(table)`` says whose rows are kept."""
    from kvconv.emit import arrow
    from kvconv.emit._contexts import open_contexts

    pa = arrow._pa()
    parts: dict[str, tuple] = {}

    def make(table: str, part: str, schema, expect: int) -> _Kept:
        parts[part] = (table, _Kept(pa, schema, keep(table)))
        return parts[part][1]

    res = EmitResult(output="")
    opened, ctxs = open_contexts(dumps, options, res.warnings.append, checks=None)
    try:
        for c in ctxs:
            arrow.context_tables(pa, c, arrow.sinks(pa, c, make, res), options, lambda n: None, res, want)
            for name, has in arrow.BIG.items():  # not read, but there: named (Run.tables)
                if name not in want and has(c):
                    parts[f"{name}/{c.serial}"] = (name, None)
        arrow._contextless(pa, opened.dumps, ctxs, make, options)
    finally:
        opened.close()
    return parts


def table_names(dumps, *, options: EmitOptions) -> list[str]:
    """The tables ``kvconv arrow`` writes of ``dumps`` (paths or open dumps), sorted; no device event is read."""
    from dataclasses import replace

    parts = _build(dumps, replace(options, join="exact"), set(), lambda table: False)
    return sorted({table for table, _ in parts.values()})


def read_table(dumps, name: str, *, options: EmitOptions):
    """The table ``name`` of ``kvconv arrow``'s dataset of ``dumps`` (paths or open dumps), as one ``pyarrow.Table``
    (module docstring).

    Raises:
        UsageError: no such table (the message lists those there are).
    """
    import pyarrow as pa

    from kvconv.format.errors import UsageError

    parts = _build(dumps, options, {name}, lambda table: table == name)
    mine = sorted((p, kept) for p, (table, kept) in parts.items() if table == name and kept is not None)
    if not mine:
        have = sorted({table for table, _ in parts.values()})
        raise UsageError(f"no table {name!r}: the run has {', '.join(have)}", code="no-table")
    tables = []
    for part, kept in mine:
        run = part.split("/run=", 1)[1].split("/device=", 1)[0]
        device = int(part.split("/device=", 1)[1].split("/", 1)[0])
        t = pa.Table.from_batches(kept.batches, schema=kept.schema)
        t = t.append_column("run", pa.array([run] * t.num_rows, pa.string()))
        tables.append(t.append_column("device", pa.array([device] * t.num_rows, pa.int32())))
    meta = tables[0].schema.metadata
    return pa.concat_tables([t.replace_schema_metadata(None) for t in tables]).replace_schema_metadata(meta)
