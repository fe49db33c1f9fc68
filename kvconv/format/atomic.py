"""Atomic outputs: write to a temporary name beside the target, rename on success, remove on failure.

    >>> from kvconv.format.atomic import atomic_output
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> with atomic_output(os.path.join(d, "out.txt"), kind="chrome") as tmp:
    ...     _ = open(tmp, "w").write("hello")
    >>> open(os.path.join(d, "out.txt")).read()
    'hello'

What is never removed or replaced (checked by :func:`check_output` before any work, and again at the rename):

- an input (checked by inode, so links and ``./`` spellings are caught too), a folder holding one, the current
  folder or one above it;
- an existing file, unless ``force`` (the CLI's ``--force`` / ``--force-overwrite``); never a device, fifo or socket;
- an existing folder that is not kvconv's own output, even with ``force``: every output folder gets a marker file
  (:data:`MARKER`, naming tool, kind, version and the files written); a folder with no readable marker, or holding
  any file the marker does not list (the user's), is refused, naming the first such file. kvconv's own folder is
  replaced when its marker names the same kind, or any kind with ``force``; the old one's listed files are removed
  only once the new one is in place, and nothing it does not list is ever deleted.

Temporary outputs are named ``.NAME.tmp-PID-XXXX`` beside the target (``.NAME.old-PID-XXXX`` for a replaced
folder on its way out). SIGINT, SIGTERM and SIGHUP remove them (exit 130 for SIGINT, 128 + n for SIGTERM / SIGHUP:
:func:`cleanup_on_signals`; a SIGHUP ignored by ``nohup`` stays ignored); SIGKILL cannot be handled and leaves
them, and the next run to the same target removes those whose process is gone (never a live one's).

``-`` as a single-file output is stdout (as Perfetto's traceconv does): the output is built in a temporary file
and copied to stdout only once complete, so a failed conversion writes nothing there either.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
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
    if not os.access(parent, os.W_OK | os.X_OK):  # said before any work (a report's plots took seconds first)
        raise OutputError("cannot write into the output folder: Permission denied", path=raw,
                          hint="choose an -o path in a folder you can write", code="output")
    if not directory and target.is_dir():
        raise OutputError("output is a folder", path=raw,
                          hint=f"name a file inside it, e.g. -o {target / _EXAMPLE.get(kind, 'out')}",
                          code="output-is-folder")
    if directory and target.exists() and not target.is_dir():
        raise OutputError("output exists and is not a folder", path=raw, hint="choose another -o path",
                          code="output-not-dir")
    if not os.path.lexists(target):
        return
    if not directory:
        if not target.is_symlink() and not target.is_file():
            raise OutputError("output exists and is not a regular file (a device, fifo or socket), which kvconv "
                              "never replaces", path=raw, hint="choose another -o path (-o - writes to stdout)",
                              code="output-not-regular")
        if force:
            return
        raise OutputError("output exists", path=raw, hint=_FORCE_HINT, code="output-exists")
    why, foreign = _not_own(target, kind, any_kind=force)
    if foreign:
        raise OutputError(f"output folder exists and {why}", path=raw,
                          hint="kvconv replaces only a folder it wrote, even with --force: choose another -o path, "
                               "or move that folder away yourself", code="output-foreign")
    if why:
        raise OutputError(f"output folder exists and {why}", path=raw,
                          hint="choose another -o path, or pass --force to replace kvconv's own output",
                          code="output-exists")


def _marker_files(folder: Path) -> set[str] | None:
    """The files ``folder``'s marker lists (None: no readable kvconv marker)."""
    try:
        m = json.loads((folder / MARKER).read_text())
        if m.get("tool") != "kvconv" or not isinstance(m.get("files"), list):
            return None
        return {str(f) for f in m["files"]}
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def _not_own(folder: Path, kind: str, *, any_kind: bool = False) -> tuple[str | None, bool]:
    """Why ``folder`` may not be replaced by an output of ``kind`` (None when it may), and whether the reason is
    something of the user's in it (refused even with ``--force``)."""
    listed = _marker_files(folder)
    if listed is None:
        first = next(iter(_files(folder)), None)
        if first:
            return f"holds {first}, which kvconv did not write (no readable {MARKER})", True
        return f"is not one kvconv wrote (empty, no {MARKER})", True
    for f in _files(folder):
        if f != MARKER and f not in listed:
            return f"holds {f}, which kvconv did not write", True
    try:
        m_kind = json.loads((folder / MARKER).read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        m_kind = None
    if m_kind != kind and not any_kind:
        return f"holds kvconv {m_kind} output, not {kind}", False
    return None, False


def _remove_own(folder: Path) -> None:
    """Remove the files ``folder``'s marker lists, the marker, then the folders left empty: nothing else."""
    listed = _marker_files(folder)
    for f in sorted(listed or ()):
        p = folder / f
        if ".." in Path(f).parts or Path(f).is_absolute():
            continue
        with contextlib.suppress(OSError):
            if p.is_symlink() or not p.is_dir():
                os.unlink(p)
    if listed is not None:
        with contextlib.suppress(OSError):
            os.unlink(folder / MARKER)
    for root, _dirs, _names in os.walk(folder, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(root)  # only when empty


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's: alive
    return True


def remove_stale(parent: Path, name: str) -> list[str]:
    """Remove the temporary outputs for ``name`` in ``parent`` left by processes that are gone (SIGKILL, a crash):
    ``.NAME.tmp-PID-*`` wholly (kvconv made them), ``.NAME.old-PID-*`` only as far as their markers list. Names
    without a pid, and a live process's, are left alone. Returns the names removed."""
    removed = []
    pat = re.compile(r"\." + re.escape(name) + r"\.(tmp|old)-(\d+)-")
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for e in entries:
        m = pat.match(e.name)
        if not m or int(m.group(2)) == os.getpid() or _alive(int(m.group(2))):
            continue
        p = Path(e.path)
        if m.group(1) == "tmp":
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(p)
        else:
            for inner in p.iterdir() if p.is_dir() and not p.is_symlink() else ():
                if inner.is_dir() and not inner.is_symlink():
                    _remove_own(inner)
            with contextlib.suppress(OSError):
                os.rmdir(p)
        if not os.path.lexists(p):
            removed.append(e.name)
    return removed


def _files(folder: Path) -> list[str]:
    """Relative paths of the files (and links, and anything else but folders) under ``folder``, sorted."""
    out = []
    for root, dirs, files in os.walk(folder):
        links = [d for d in dirs if os.path.islink(os.path.join(root, d))]  # walked as files, never followed
        out += [os.path.relpath(os.path.join(root, f), folder) for f in files + links]
    return sorted(out)


def _write_marker(folder: Path, kind: str) -> None:
    from kvconv.version import __version__

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
    with cleanup_on_signals():
        if is_stdout(os.fspath(path)):
            with _to_stdout() as tmp:
                yield tmp
            return
        target = Path(path)
        # absolute: a signal's cleanup must find the temporary from any working folder (kvconv demo works inside its
        # own; a relative one was looked for there, and the 33 MB folder stayed behind)
        parent = Path(os.path.abspath(target.parent if str(target.parent) else "."))
        remove_stale(parent, target.name)
        prefix = f".{target.name}.tmp-{os.getpid()}-"
        # registered before the temporary exists: a signal between its creation and _ACTIVE.append still finds it
        _PREFIXES.append((parent, prefix))
        try:
            if directory:
                tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            else:
                fd, name = tempfile.mkstemp(prefix=prefix, dir=parent)
                os.close(fd)
                tmp = Path(name)
        except OSError as e:
            _PREFIXES.remove((parent, prefix))
            raise OutputError(f"cannot create output: {e.strerror}", path=str(target),
                              code="output-unwritable") from None
        _ACTIVE.append(tmp)
        _PREFIXES.remove((parent, prefix))
        try:
            yield tmp
            # again, just before the rename: something may have appeared there while the output was written
            check_output(path, inputs=inputs, directory=directory, kind=kind, force=force)
            if directory:
                _write_marker(tmp, kind)
                os.chmod(tmp, 0o755)  # mkdtemp makes it private; the output is an ordinary folder
                _rename_folder(tmp, target, kind=kind, force=force)
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
        finally:
            with contextlib.suppress(ValueError):
                _ACTIVE.remove(tmp)


def _rename_folder(tmp: Path, target: Path, *, kind: str, force: bool) -> None:
    """``tmp`` becomes ``target``; an old ``target`` (kvconv's own, checked again once moved aside) goes only once the
    new one is in place, and only its listed files."""
    parent = target.parent if str(target.parent) else Path(".")
    appeared = OutputError("output appeared while this one was written (another kvconv writing the same -o?); it "
                           "is kept", path=str(target), hint="run one writer per -o path", code="output-exists")
    if not os.path.lexists(target):
        try:
            os.rename(tmp, target)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise appeared from None
            raise
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-{os.getpid()}-", dir=parent))
    try:
        os.rename(target, old / "x")
    except FileNotFoundError:  # another writer moved it: ours goes in its place
        os.rmdir(old)
        return _rename_folder(tmp, target, kind=kind, force=force)
    why, foreign = _not_own(old / "x", kind, any_kind=force)
    if why:  # something of the user's arrived after the check: put it back as it was
        os.rename(old / "x", target)
        os.rmdir(old)
        raise OutputError(f"output folder exists and {why}", path=str(target),
                          hint="kvconv replaces only a folder it wrote: choose another -o path",
                          code="output-foreign" if foreign else "output-exists")
    try:
        os.rename(tmp, target)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            _remove_own(old / "x")  # replaced by another writer meanwhile: the old one is gone either way
            with contextlib.suppress(OSError):
                os.rmdir(old)
            raise appeared from None
        os.rename(old / "x", target)
        os.rmdir(old)
        raise
    _remove_own(old / "x")
    with contextlib.suppress(OSError):
        os.rmdir(old)


# SIGINT too: a KeyboardInterrupt unwinds the main thread while arrow's writer threads still create files in the
# temporary folder (Ctrl-C left `.tables.tmp-*` behind, 1 run in 2); handled here, nothing is unwound
_HANDLED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,
                                                                                           signal.SIGINT)
_ACTIVE: list[Path] = []  # the temporary outputs being written now (innermost last)
_PREFIXES: list[tuple[Path, str]] = []  # (folder, name prefix) of a temporary being created right now


def _remove(p: Path) -> None:
    for _ in range(50):  # a writer thread may still add a file while the folder goes (never the folder itself)
        if not os.path.lexists(p):
            return
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(p)


def _on_signal(signum, frame) -> None:
    """SIGTERM / SIGHUP while writing: remove every temporary output, say so in one line, exit 128 + n at once.
    Nothing is unwound (an exception raised at an arbitrary point could leave a lock held and the exit waiting on a
    worker thread forever): the outputs' temporaries are all there is to clean up."""
    for s in _HANDLED:
        with contextlib.suppress(OSError, ValueError):
            signal.signal(s, signal.SIG_IGN)  # a second one while cleaning up: the cleanup runs to its end
    for p in reversed(list(_ACTIVE)):
        _remove(p)
    for parent, prefix in list(_PREFIXES):
        with contextlib.suppress(OSError):
            for name in os.listdir(parent):
                if name.startswith(prefix):
                    _remove(parent / name)
    with contextlib.suppress(OSError):  # unbuffered: safe wherever the signal arrived
        os.write(2, f"Error: terminated by {signal.Signals(signum).name}: the unfinished output is removed\n"
                 .encode())
    os._exit(128 + signum)


def cleanup_on_signals():
    """While inside, SIGINT, SIGTERM and SIGHUP remove the temporary outputs and exit 128 + n, unless the process
    already handles or ignores them (``nohup``: SIGHUP stays ignored; an embedding program's own SIGINT handler is
    kept). Main thread only; nests."""
    return signals_handled(_on_signal)


@contextlib.contextmanager
def signals_handled(_on_signal, *, then_ignore: bool = False) -> Iterator[None]:
    """``_on_signal`` handles SIGINT, SIGTERM and SIGHUP while inside, where the process has its default disposition
    for them (one it was given, such as nohup's ignored SIGHUP, is kept); main thread only. ``then_ignore``: the
    program ends when this does, so those signals are ignored from then on instead of killing a finished command."""
    installed = {}
    if threading.current_thread() is threading.main_thread():
        for s in _HANDLED:
            default = signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL
            if signal.getsignal(s) is default:
                installed[s] = signal.signal(s, _on_signal)
    try:
        yield
    finally:
        for s, h in installed.items():
            signal.signal(s, signal.SIG_IGN if then_ignore else h)


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
        remove_stale(Path(tempfile.gettempdir()), "kvconv-stdout")
        fd, name = tempfile.mkstemp(prefix=f".kvconv-stdout.tmp-{os.getpid()}-")
        os.close(fd)
    except OSError as e:
        raise OutputError(f"cannot create a temporary file for stdout: {e.strerror}", path=tempfile.gettempdir(),
                          hint="set TMPDIR to a writable folder", code="output-unwritable") from None
    tmp = Path(name)
    _ACTIVE.append(tmp)
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
        with contextlib.suppress(ValueError):
            _ACTIVE.remove(tmp)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
