"""Atomic outputs: write to a temporary name beside the target, rename on success, remove on failure.

    >>> from kvconv.atomic import atomic_output
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> with atomic_output(os.path.join(d, "out.txt")) as tmp:
    ...     _ = open(tmp, "w").write("hello")
    >>> open(os.path.join(d, "out.txt")).read()
    'hello'

Outputs never replace one of the inputs (checked by inode, so links and ``./`` spellings are caught too).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from .errors import OutputError

_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def check_not_input(output: str | os.PathLike, inputs: Iterable[str | os.PathLike]) -> None:
    out = Path(output)
    for inp in inputs:
        inp = Path(inp)
        same = False
        try:
            same = out.exists() and inp.exists() and os.path.samefile(out, inp)
        except OSError:
            same = False
        if same or out.resolve() == inp.resolve():
            raise OutputError(
                "output would overwrite an input",
                path=str(output),
                hint="choose another -o path",
                code="output-is-input",
            )


@contextlib.contextmanager
def atomic_output(
    path: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = (), directory: bool = False
) -> Iterator[Path]:
    """Yield a temporary path (a file name, or a fresh folder when ``directory``); rename it to ``path`` on success.

    On any exception the temporary is removed and ``path`` is left as it was.
    """
    target = Path(path)
    inputs = list(inputs)
    check_not_input(target, inputs)
    if directory and target.is_dir():
        # Replacing the folder would delete what is in it: never an input (kvconv arrow run.kvdump -o .).
        t = target.resolve()
        for inp in inputs:
            if t in Path(inp).resolve().parents:
                raise OutputError("output folder holds an input, which replacing it would delete", path=str(target),
                                  hint="choose another -o folder", code="output-holds-input")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError("output folder does not exist", path=str(target), hint=f"create {parent} first",
                          code="output-dir-missing")
    if directory and target.exists() and not target.is_dir():
        raise OutputError("output exists and is not a folder", path=str(target), code="output-not-dir")
    prefix = f".{target.name}.tmp-"
    try:
        if directory:
            tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        else:
            fd, name = tempfile.mkstemp(prefix=prefix, dir=parent)
            os.close(fd)
            tmp = Path(name)
    except OSError as e:
        raise OutputError(f"cannot create output: {e.strerror}", path=str(target), code="output-unwritable") from None
    try:
        yield tmp
        if directory:
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the output is an ordinary folder
            if target.exists():
                # Replace the old folder only once the new one is complete.
                old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=parent))
                os.rename(target, old / "x")
                os.rename(tmp, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, target)
        else:
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
    except BaseException as e:
        if directory:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
            # a full disk or a size limit met while writing: the output's problem, said as one line
            raise OutputError(f"cannot write output: {os.strerror(e.errno)}", path=str(target),
                              hint="free space on its filesystem or choose another -o path",
                              code="output-write-failed") from None
        raise
