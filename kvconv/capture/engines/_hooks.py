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


def probe_output(engine: str) -> tuple[str, str]:
    """Where a plugin writes its probe dump, and how it came to be there (said in the plugin's log line). Under
    ``kvconv record`` (``KVCONV_RECORD=1``): beside the tracer's ``-o``, named after it
    (:func:`kvconv.check.runs.probe_path`), whatever ``KVCONV_PROBE_OUTPUT`` says, so that record finds and judges
    it with the run; elsewhere ``KVCONV_PROBE_OUTPUT`` (a harness's; ``%p``: the process id), else the same name.

        >>> probe_output("vllm")   # doctest: +SKIP - under record -o o/run.kvdump, a harness's KVCONV_PROBE_OUTPUT=x
        ('o/run.vllm-4242.probe.kvdump', "beside kvconv record's -o; KVCONV_PROBE_OUTPUT=x applies only outside ...")
    """
    import os

    from kvconv.check.runs import probe_path

    pid = os.getpid()
    beside = probe_path(os.environ.get("KVCONV_OUTPUT"), pid, engine=engine)
    named = os.environ.get("KVCONV_PROBE_OUTPUT", "").replace("%p", str(pid))
    if os.environ.get("KVCONV_RECORD") == "1":
        why = "beside kvconv record's -o"
        return beside, why + (f"; KVCONV_PROBE_OUTPUT={named} applies only outside kvconv record" if named else "")
    return (named, "KVCONV_PROBE_OUTPUT") if named else (beside, "beside KVCONV_OUTPUT")


def probe_metadata(engine: str) -> dict:
    """What a probe dump's metadata says of its process (pid, ppid, hostname: kvconv.check.runs links it to the
    tracer's dumps of the run) and of what its plugin was asked (``asked``: kvconv.check.asked)."""
    import os
    import socket

    env = os.environ
    asked = {"engine": engine, "writes": env.get("KVCONV_WRITES") == "1", "value": env.get("KVCONV_VALUE") == "1",
             "canary": env.get("KVCONV_CANARY") == "1", "capture_range": env.get("KVCONV_CAPTURE_RANGE") or None}
    return {"pid": os.getpid(), "ppid": os.getppid(), "hostname": socket.gethostname(), "command": list(sys.argv),
            "asked": asked}
