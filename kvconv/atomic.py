"""Atomic outputs: write to a temporary name beside the target, rename on success, remove on failure.

    >>> from kvconv.atomic import atomic_output
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> with atomic_output(os.path.join(d, "out.txt"), kind="chrome") as tmp:
    ...     _ = open(tmp, "w").write("hello")
    >>> open(os.path.join(d, "out.txt")).read()
    'hello'

What is never removed or replaced (checked by :func:`check_output` before any work, and again at the rename):

- an input (checked by inode, so links and ``./`` spellings are caught too), a folder holding one, the current
  folder or one above it;
- an existing file, unless ``force`` (the CLI's ``--force`` / ``--force-overwrite``);
- an existing folder, unless ``force`` or it is kvconv's own earlier output of the same kind: every output folder
  gets a marker file (:data:`MARKER`, naming tool, kind, version and the files written), and a folder is replaced
  only when its marker names the same kind and it holds no file the marker does not list (nothing of the user's).

``-`` as a single-file output is stdout (as Perfetto's traceconv does): the output is built in a temporary file
and copied to stdout only once complete, so a failed conversion writes nothing there either.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from kvconv.format.errors import OutputError

_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}
MARKER = ".kvconv-output.json"  # in every output folder: {"tool", "kind", "version", "files"}
STDOUT = "-"
_EXAMPLE = {"perfetto": "trace.pftrace", "chrome": "trace.json", "kvdump": "run.kvdump"}
_FORCE_HINT = "choose another -o path, or pass --force to replace it"


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


def is_stdout(path: str | os.PathLike) -> bool:
    return isinstance(path, str) and path == STDOUT


def check_output(path: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = (), directory: bool = False,
                 kind: str = "output", force: bool = False) -> None:
    """Raise :class:`OutputError` unless ``path`` may be written (see the module's docstring); touches nothing.

    ``path`` as the user typed it: a trailing ``/`` on a single-file output is refused, ``-`` is stdout."""
    raw = os.fspath(path)
    inputs = list(inputs)
    if raw == STDOUT:
        if directory:
            raise OutputError(f"-o - (stdout) is for single-file outputs; {kind} writes a folder", path=raw,
                              hint="name a folder with -o", code="output-stdout-folder")
        return
    target = Path(raw)
    if not directory and (raw.endswith(os.sep) or (os.altsep and raw.endswith(os.altsep))):
        raise OutputError("names a folder (ends with /) but the output is one file", path=raw,
                          hint=f"name the file, e.g. -o {raw}{_EXAMPLE.get(kind, 'out')}", code="output-is-folder")
    check_not_input(target, inputs)
    resolved = target.resolve()
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        raise OutputError("output is the current folder or holds it, which kvconv never replaces", path=raw,
                          hint="name a new folder, e.g. -o tables", code="output-holds-cwd")
    if directory and target.is_dir():
        for inp in inputs:
            if resolved in Path(inp).resolve().parents:
                raise OutputError("output folder holds an input, which replacing it would delete", path=raw,
                                  hint="choose another -o folder", code="output-holds-input")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError("output folder does not exist", path=raw, hint=f"create {parent} first",
                          code="output-dir-missing")
    if not directory and target.is_dir():
        raise OutputError("output is a folder", path=raw,
                          hint=f"name a file inside it, e.g. -o {target / _EXAMPLE.get(kind, 'out')}",
                          code="output-is-folder")
    if directory and target.exists() and not target.is_dir():
        raise OutputError("output exists and is not a folder", path=raw, hint="choose another -o path",
                          code="output-not-dir")
    if force or not os.path.lexists(target):
        return
    if not directory:
        raise OutputError("output exists", path=raw, hint=_FORCE_HINT, code="output-exists")
    why = _not_own(target, kind)
    if why:
        raise OutputError(f"output folder exists and {why}", path=raw,
                          hint="choose another -o path, or pass --force to replace it and everything in it",
                          code="output-exists")


def _not_own(folder: Path, kind: str) -> str | None:
    """Why ``folder`` is not kvconv's own earlier output of ``kind`` (None when it is)."""
    try:
        m = json.loads((folder / MARKER).read_text())
        listed = set(m["files"]) if m.get("tool") == "kvconv" else None
        if listed is None:
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError):
        return "is not one kvconv wrote (no readable " + MARKER + ")"
    if m.get("kind") != kind:
        return f"holds kvconv {m.get('kind')} output, not {kind}"
    for f in _files(folder):
        if f != MARKER and f not in listed:
            return f"holds {f}, which kvconv did not write"
    return None


def _files(folder: Path) -> list[str]:
    """Relative paths of the files (and links, and anything else but folders) under ``folder``, sorted."""
    out = []
    for root, dirs, files in os.walk(folder):
        links = [d for d in dirs if os.path.islink(os.path.join(root, d))]  # walked as files, never followed
        out += [os.path.relpath(os.path.join(root, f), folder) for f in files + links]
    return sorted(out)


def _write_marker(folder: Path, kind: str) -> None:
    from kvconv import __version__

    files = [f for f in _files(folder) if f != MARKER]
    (folder / MARKER).write_text(json.dumps({"tool": "kvconv", "kind": kind, "version": __version__,
                                             "files": files}, indent=1) + "\n")


@contextlib.contextmanager
def atomic_output(
    path: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = (), directory: bool = False,
    kind: str = "output", force: bool = False,
) -> Iterator[Path]:
    """Yield a temporary path (a file name, or a fresh folder when ``directory``); rename it to ``path`` on success.

    On any exception the temporary is removed and ``path`` is left as it was. ``kind`` names the output (written into
    a folder's marker); ``force`` allows replacing an existing output. ``-`` (a single file): stdout.
    """
    inputs = list(inputs)
    check_output(path, inputs=inputs, directory=directory, kind=kind, force=force)
    if is_stdout(os.fspath(path)):
        with _to_stdout() as tmp:
            yield tmp
        return
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
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
        # again, just before the rename: something may have appeared there while the output was written
        check_output(path, inputs=inputs, directory=directory, kind=kind, force=force)
        if directory:
            _write_marker(tmp, kind)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the output is an ordinary folder
            if os.path.lexists(target):
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
        _raise_write_error(e, str(target))
        raise


def _raise_write_error(e: BaseException, where: str) -> None:
    if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
        # a full disk or a size limit met while writing: the output's problem, said as one line
        raise OutputError(f"cannot write output: {os.strerror(e.errno)}", path=where,
                          hint="free space on its filesystem or choose another -o path",
                          code="output-write-failed") from None


@contextlib.contextmanager
def _to_stdout() -> Iterator[Path]:
    """A temporary file (in the system's temporary folder), copied to stdout once complete."""
    try:
        fd, name = tempfile.mkstemp(prefix="kvconv-stdout-")
        os.close(fd)
    except OSError as e:
        raise OutputError(f"cannot create a temporary file for stdout: {e.strerror}", path=tempfile.gettempdir(),
                          hint="set TMPDIR to a writable folder", code="output-unwritable") from None
    tmp = Path(name)
    try:
        try:
            yield tmp
        except BaseException as e:
            _raise_write_error(e, f"{tempfile.gettempdir()} (temporary for stdout)")
            raise
        sys.stdout.flush()
        out = sys.stdout.buffer
        try:
            with open(tmp, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
            out.flush()
        except BrokenPipeError:
            # the reader went away (e.g. `| head`): say so once; stdout cannot be flushed again at exit
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise OutputError("stdout was closed before the whole output was written", path=STDOUT,
                              code="output-pipe-closed") from None
        except OSError as e:
            _raise_write_error(e, STDOUT)
            raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
