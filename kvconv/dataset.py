"""Grow one hive-partitioned dataset (``kvconv arrow``'s folder) run by run: ``kvconv arrow NEW.kvdump -o DATASET
--append`` converts the new dumps into a folder beside DATASET, checks it against what DATASET holds, then moves its
files in. The files already there are never rewritten or touched; readers (DuckDB, pyarrow.dataset, Spark) see the
new ``run=`` partitions on their next scan.

Refused, with nothing changed: a DATASET that is not kvconv arrow output, a run partition that DATASET already holds
(the run is the dump's file name: rename the dump, e.g. ``2026-11-30-rank0.kvdump``), another file format than
DATASET's, or a table whose columns differ from DATASET's (an older kvconv's tables: convert all dumps again).

    >>> from kvconv.dataset import append
    >>> append("staging/", "dataset/")  # doctest: +SKIP
    ['device_event/run=rank2/device=2/part-ctx0.parquet', ...]
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from kvconv.format.errors import OutputError

MARKER = ".kvconv-output.json"


def _listed(folder: Path) -> list[str]:
    try:
        m = json.loads((folder / MARKER).read_text())
        if m.get("tool") != "kvconv" or m.get("kind") != "arrow":
            raise ValueError
        return list(m["files"])
    except (OSError, ValueError, KeyError, TypeError):
        raise OutputError(f"not a dataset kvconv arrow wrote (no readable {MARKER} of kind arrow)", path=str(folder),
                          hint="--append adds to a folder that kvconv arrow wrote; choose one, or leave out --append",
                          code="output-exists") from None


def _columns(path: Path) -> list[tuple[str, str]]:
    import pyarrow.dataset as ds

    fmt = "parquet" if path.suffix == ".parquet" else "ipc"
    return [(f.name, str(f.type)) for f in ds.dataset(path, format=fmt).schema]


def _check(new: list[str], old: list[str], staging: Path, dataset: Path) -> None:
    runs = {"/".join(f.split("/")[:2]) for f in old}
    for f in new:
        run = "/".join(f.split("/")[:2])
        if run in runs:
            raise OutputError(f"the dataset already holds {run}", path=str(dataset),
                              hint="a run is named after its dump file: rename the new dump (e.g. with its date) "
                                   "and append again", code="output-exists")
    exts = {Path(f).suffix for f in old}
    for f in new:
        if exts and Path(f).suffix not in exts:
            raise OutputError(f"the dataset's files are {', '.join(sorted(exts))}, the new ones {Path(f).suffix}",
                              path=str(dataset), hint="append with the dataset's --format", code="output-exists")
    first = {}
    for f in old:
        first.setdefault(f.split("/")[0], f)
    for f in new:
        table = f.split("/")[0]
        if first.get(table) and _columns(staging / f) != _columns(dataset / first[table]):
            raise OutputError(f"table {table}'s columns differ from the dataset's ({first[table]})",
                              path=str(dataset), hint="convert every dump again into a new dataset",
                              code="output-exists")
        first.setdefault(table, None)


def append(staging: str | os.PathLike, dataset: str | os.PathLike) -> list[str]:
    """Move the files of ``staging`` (a complete kvconv arrow folder) into ``dataset``; return them (relative).
    Everything is checked before the first file moves."""
    staging, dataset = Path(staging), Path(dataset)
    new, old = _listed(staging), _listed(dataset)
    _check(new, old, staging, dataset)
    for f in new:
        (dataset / f).parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging / f, dataset / f)  # same filesystem (staging is made beside the dataset): no copy
    files = sorted(set(old) | set(new))
    from kvconv.version import __version__

    tmp = dataset / (MARKER + ".tmp")
    tmp.write_text(json.dumps({"tool": "kvconv", "kind": "arrow", "version": __version__, "files": files},
                              indent=1) + "\n")
    os.replace(tmp, dataset / MARKER)
    return new


def write_appending(write, dumps, out: str, *, options):
    """``write(dumps, folder, options=...)`` (kvconv arrow's writer) into a fresh folder beside ``out``, then
    :func:`append` it to ``out``; a plain write where ``out`` does not exist yet. Returns the writer's result."""
    import tempfile

    target = Path(out)
    if not target.exists():
        return write(dumps, out, options=options)
    _listed(target)  # before converting anything
    parent = target.parent if str(target.parent) else Path(".")
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.append-", dir=parent))
    try:
        res = write(dumps, tmp / "new", options=options)
        append(tmp / "new", target)
        res.output = str(out)
        return res
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
