"""A user's own ending of SGLang, made to leave complete dumps (issue 49): the parent's half of kvconv's SGLang plugin.

SGLang ends its scheduler children with SIGKILL (``kill_process_tree``): ``Engine.shutdown()`` does, and so does
``python -m sglang.launch_server`` once its HTTP server returns (SIGINT). Nothing runs in a SIGKILLed scheduler: the
tracer's dump stays live and the plugin's probe dump is never written. SGLang 0.5.17 has a graceful path of its own,
used only on a server's SIGTERM (``TokenizerManager.sigterm_watchdog``): a ``ShutdownReq`` to the schedulers, whose
event loop then returns (``Scheduler.handle_shutdown``), so the child exits normally and its exit handlers (the
tracer's finished dump, the plugin's probe dump) run. The plugin, loaded by ``load_plugins()`` in the engine's own
process too (``Engine.__init__``, ``launch_server.py``), takes that path before the kill:

- ``Engine.shutdown`` (AROUND): the user's ``llm.shutdown()``, a ``with`` block's end, or SGLang's atexit;
- ``http_server.launch_server`` (AROUND): after the HTTP server returned (SIGINT), before ``launch_server.py``'s
  ``kill_process_tree``. A server's SIGTERM already takes SGLang's own graceful path.

:func:`end_children`: SGLang's subprocess watchdog stopped (a child's exit would SIGQUIT the engine), then the
``ShutdownReq``, then a wait (``KVCONV_SGLANG_END_S``, 60 s) for the schedulers to exit. SGLang without
``ShutdownReq`` (0.5.12): an idle scheduler (``Engine.flush_cache``, where the probe dump is written) and SIGTERM to
the children (the tracer's handler finishes its dump). Once per process; an error is printed, never raised: the
engine's own shutdown goes on.

    >>> ended_by({"ShutdownReq": True}), ended_by({})
    ('ShutdownReq', 'SIGTERM')
"""

from __future__ import annotations

import os
import signal
import sys
import time

SHUTDOWN = "sglang.srt.entrypoints.engine.Engine.shutdown"
SERVER = "sglang.srt.entrypoints.http_server.launch_server"
_done = False


def ended_by(found: dict) -> str:
    """How the children are asked to end: SGLang's ``ShutdownReq`` where it has one, else SIGTERM."""
    return "ShutdownReq" if found.get("ShutdownReq") else "SIGTERM"


def _say(text: str) -> None:
    print(f"kvconv sglang plugin: {text}", file=sys.stderr, flush=True)


def _schedulers(kids):
    """The scheduler children (SGLang names them ``sglang::scheduler...``), else all children."""
    named = []
    for p in kids:
        try:
            if "scheduler" in " ".join(p.cmdline() or [p.name()]).lower():
                named.append(p)
        except Exception:  # noqa: BLE001 - a child that ended while asked is simply gone
            continue
    return named or kids


def _shutdown_req():
    try:
        from sglang.srt.managers.io_struct import ShutdownReq
    except ImportError:
        return None
    return ShutdownReq


def end_children(tokenizer_manager, engine=None, *, timeout_s: float | None = None) -> dict | None:
    """Ask the schedulers of this process to exit on their own, then wait for them; what happened (or None the
    second time, or without a tokenizer manager)."""
    global _done
    if _done or tokenizer_manager is None:
        return None
    _done = True
    import psutil  # SGLang's own dependency

    timeout_s = float(os.environ.get("KVCONV_SGLANG_END_S", "60")) if timeout_s is None else timeout_s
    dog = getattr(tokenizer_manager, "_subprocess_watchdog", None)
    if dog is not None:
        dog.stop()
    kids = psutil.Process().children(recursive=True)
    scheds = _schedulers(kids)
    req = _shutdown_req()
    t0 = time.monotonic()
    if req is not None:
        tokenizer_manager._dispatch_to_scheduler(req())
    else:
        _idle(engine, timeout_s)
        for p in scheds:
            _signal(p, signal.SIGTERM)
    gone, alive = psutil.wait_procs(scheds, timeout=timeout_s)
    seen = {"by": ended_by({"ShutdownReq": req is not None}), "schedulers": len(scheds), "exited": len(gone),
            "exit_codes": sorted(int(p.returncode) for p in gone if p.returncode is not None), "left": len(alive),
            "s": round(time.monotonic() - t0, 2)}
    _say(f"engine end: {seen['exited']} of {seen['schedulers']} scheduler(s) exited after {seen['by']} in "
         f"{seen['s']} s (exit codes {seen['exit_codes']}); {seen['left']} left to SGLang's kill")
    return seen


def _signal(p, sig) -> None:
    try:
        p.send_signal(sig)
    except Exception:  # noqa: BLE001 - gone already
        pass


def _idle(engine, timeout_s: float) -> None:
    """SGLang without ShutdownReq: wait for an idle scheduler (flush_cache succeeds only then)."""
    if engine is None:
        return
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        out = engine.flush_cache()
        if getattr(out, "success", out):
            return
        time.sleep(0.1)


def _guarded(fn, *a, **kw) -> None:
    try:
        fn(*a, **kw)
    except Exception as e:  # noqa: BLE001 - the engine's own shutdown must go on
        _say(f"ending the schedulers failed ({type(e).__name__}: {e}); SGLang's kill ends them")


def around_shutdown(original, engine, *a, **kw):
    """``Engine.shutdown``: the schedulers end on their own first."""
    _guarded(end_children, getattr(engine, "tokenizer_manager", None), engine)
    return original(engine, *a, **kw)


def around_server(original, *a, **kw):
    """``http_server.launch_server``: once the HTTP server returned (SIGINT; a KeyboardInterrupt re-raised by
    uvicorn too), the schedulers end on their own before ``launch_server.py`` kills them."""
    try:
        return original(*a, **kw)
    finally:
        from sglang.srt.entrypoints import http_server

        state = getattr(http_server, "_global_state", None)
        _guarded(end_children, getattr(state, "tokenizer_manager", None))


def register(registry, hook_type) -> None:
    """The engine-process hooks (in every process the plugin loads in: they act only where an engine ends)."""
    registry.register(SHUTDOWN, around_shutdown, hook_type.AROUND)
    registry.register(SERVER, around_server, hook_type.AROUND)
