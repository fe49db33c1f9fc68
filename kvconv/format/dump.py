"""Read and write kvconv dumps: ``open()`` (mmap + numpy views, no copies) and its pair ``new()``, as pyarrow pairs
``open_file`` and ``new_file``. The reader lives in :mod:`kvconv.format.reader`, the writer in
:mod:`kvconv.format.writer`; this module is the one name both are used by.

A dump is a sequence of record groups, each a 64-byte header (``schemas/layouts.json``, layout ``header``) followed by
``record_count * record_size`` payload bytes, zero-padded to a multiple of 8. See docs/FORMAT.md.

    >>> import numpy as np, tempfile, os
    >>> from kvconv.format import dump, layout
    >>> path = os.path.join(tempfile.mkdtemp(), "d.bin")
    >>> with dump.new(path) as w:
    ...     w.write_records("graph_node", np.zeros(2, dtype=layout.DTYPES["host_launch"]))
    >>> with dump.open(path) as d:
    ...     len(d.records("graph_node"))
    2
"""

from __future__ import annotations

from kvconv.format.reader import (
    DEFAULT_CHUNK,
    LIVE,
    RELEASE_AFTER_CRC,
    Dump,
    DumpWarning,
    Group,
    ReadOptions,
    loads_metadata,
    open,  # noqa: A004 - the pair of new(), as in pyarrow
    open_many,
    release_pages,
    scan,
)
from kvconv.format.writer import DumpWriter, StringTable, make_header, new

__all__ = [
    "DEFAULT_CHUNK", "LIVE", "RELEASE_AFTER_CRC", "Dump", "DumpWarning", "DumpWriter", "Group", "ReadOptions",
    "StringTable", "loads_metadata", "make_header", "new", "open", "open_many", "release_pages", "scan",
]
