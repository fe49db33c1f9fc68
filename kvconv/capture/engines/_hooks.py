"""Run a function on a module once it is imported, without importing it: how the engine plugin and the plant harness
patch an engine's classes in the processes that load them, and only there.

    >>> import sys
    >>> seen = []
    >>> after_import("json", seen.append)        # json is imported already: runs now
    >>> [m.__name__ for m in seen]
    ['json']
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading

_pending: dict[str, list] = {}
_lock = threading.Lock()


class _Finder(importlib.abc.MetaPathFinder):
    """Asks the other finders for a watched module's spec and wraps its loader's ``exec_module``."""

    def find_spec(self, name, path, target=None):
        if name not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Loader(spec.loader)
                return spec
            if spec is not None:
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        with _lock:
            todo = _pending.pop(module.__name__, [])
        for fn in todo:
            _call(fn, module)

    def __getattr__(self, name):  # get_source, get_filename ... of the loader it stands for
        return getattr(self.inner, name)


_finder = _Finder()


def _call(fn, module) -> None:
    """A patch that fails is reported and skipped: the engine's own import must go on."""
    try:
        fn(module)
    except Exception as e:  # noqa: BLE001 - whatever a patch trips on, the import it rides on must succeed
        print(f"kvconv: patching {module.__name__} failed ({type(e).__name__}: {e}); left as it is", file=sys.stderr,
              flush=True)


def after_import(name: str, fn) -> None:
    """Call ``fn(module)`` once module ``name`` has been executed: now if it is imported already, else right after
    its import (in whichever thread imports it). An exception in ``fn`` is printed, never raised."""
    module = sys.modules.get(name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        _call(fn, module)
        return
    with _lock:
        _pending.setdefault(name, []).append(fn)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def version_of(module: str) -> str:
    """The engine's version for the probe dump's metadata ("?" where it cannot be read)."""
    try:
        return str(getattr(importlib.import_module(module), "__version__", "?"))
    except Exception:  # noqa: BLE001 - metadata only
        return "?"


def guarded(session, what: str, fn, *args) -> None:
    """Run a probe action of a plugin's session; an error stops the probe (``session.fail``), never the engine."""
    if session is None or session.broken:
        return
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - whatever fails in the probe, the engine must go on
        session.fail(what, e)


def stop_probe(session, engine: str, what: str, exc: BaseException) -> str | None:
    """A plugin session's failure (``session.fail``): recording stops, said once on stderr and noted in the probe
    dump's metadata; what was recorded before goes into the dump if it can (``session.end``, ``session.close``).
    The engine goes on. Returns the line said, or None when the session had stopped already."""
    if session.broken:
        return None
    session.broken = True
    text = f"{what}: {type(exc).__name__}: {exc}"
    print(f"kvconv {engine} plugin: {text}; recording stops, the engine goes on", file=sys.stderr, flush=True)
    if session.recorder is not None:
        session.recorder.metadata.setdefault("plugin_errors", []).append(text[:1000])
    for finish in (session.end, session.close):
        try:
            finish()
        except Exception as e:  # noqa: BLE001 - nothing more can be saved; the engine goes on
            print(f"kvconv {engine} plugin: {e!r} while stopping", file=sys.stderr, flush=True)
    return text
