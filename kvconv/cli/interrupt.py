"""What Ctrl-C (SIGINT), SIGTERM and SIGHUP do to a command, said truthfully.

While a command runs (:func:`handled`, around :func:`kvconv.cli.main`), such a signal ends it at once (nothing is
unwound: a worker thread may hold a lock), and what it says is what happened to the output
(:mod:`kvconv.format.atomic`):

- an output still being written: its temporary is removed, ``Error: terminated by SIGTERM: the unfinished output is
  removed``, exit 128 + n;
- the output already renamed into place (the signal came while the command stated the verdict, say): the output is
  kept, ``SIGTERM after DUMP's output was written: it is kept``, exit 0;
- no output: ``Error: interrupted by SIGINT``, exit 128 + n.

A signal the process ignores when it starts stays ignored (``nohup``). Once the command is over, the program's own
end is not interrupted: SIGINT is ignored while Python shuts down (no ``Exception ignored ... KeyboardInterrupt``).

    with interrupt.handled():
        interrupt.output("run.pftrace")     # the command's -o: kept, and said so, once renamed into place
        ...
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator

_HANDLED = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
_state = {"outputs": []}  # (path, what was there when declared)


def output(path) -> None:
    """The output the command writes (its ``-o``); ``-`` (stdout) is not one to keep or remove. What is there now
    (an earlier output, replaced with --force) is told apart from what this command puts there."""
    if str(path) != "-":
        where = os.path.abspath(os.fspath(path))
        _state["outputs"].append((where, _identity(where)))


def _identity(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


@contextlib.contextmanager
def handled(*, program: bool = False) -> Iterator[None]:
    """The handlers above while inside (main thread only; a disposition the process was given is kept). ``program``:
    the command is the whole program, whose end follows: a signal once the command is over (threads joined, files
    closed, outputs in place) changes nothing, and the process exits with the command's status."""
    _state["outputs"] = []
    from kvconv.format import atomic

    with atomic.signals_handled(_on_signal, then_ignore=program):
        yield


def _unfinished() -> list:
    """The temporaries of outputs being written now (kvconv.format.atomic's), removed."""
    from kvconv.format import atomic

    found = [p for p in list(atomic._ACTIVE) if os.path.lexists(p)]
    for parent, prefix in list(atomic._PREFIXES):
        with contextlib.suppress(OSError):
            found += [parent / n for n in os.listdir(parent) if n.startswith(prefix)]
    for p in found:
        atomic._remove(p)
    return found


def _written() -> list[str]:
    """The command's outputs that are in place, renamed there since it declared them (:func:`output`)."""
    return [p for p, before in _state["outputs"] if _identity(p) not in (None, before)]


def _on_signal(signum, frame) -> None:
    for s in _HANDLED:
        with contextlib.suppress(OSError, ValueError):
            signal.signal(s, signal.SIG_IGN)  # a second one while cleaning up: the cleanup runs to its end
    name = signal.Signals(signum).name
    code = 128 + signum
    if _unfinished():
        line = f"Error: terminated by {name}: the unfinished output is removed"
    elif written := _written():
        line, code = f"{name} after the output was written: {', '.join(written)} is kept", 0
    else:
        line = f"Error: interrupted by {name}"
    with contextlib.suppress(Exception):  # what the command printed so far (a signal may land inside a write)
        sys.stdout.flush()
    with contextlib.suppress(OSError):  # unbuffered: safe wherever the signal arrived
        os.write(2, (line + "\n").encode())
    os._exit(code)
