"""Progress of a long command: a rich bar on a terminal, one stderr line every ~2 s elsewhere, nothing with ``-q``.

On a non-terminal (CI logs, ``| tee``) a ticker thread writes, every ``interval`` seconds until the work ends,

    kvconv: validate big.kvdump: 41% (4.1/10.0 GiB, 3.2 s)

so a log shows that a long run is alive even while the work sits in one long numpy call. Work that ends within the
first interval prints nothing. Lines go to stderr only: stdout stays exactly what the command prints.

How a command uses it (the CLI owns the display; library functions take a plain callback):

    >>> from kvconv.progress import Progress, ProgressOptions
    >>> opts = ProgressOptions(enabled=False)                # what -q / --no-progress give
    >>> with Progress("validate run.kvdump", total=1000, size_bytes=64_000, options=opts) as bar:
    ...     bar(250)                                         # advance by 250 units of total
    ...     bar.update(500, 1000)                            # or set the position: done of total
    >>> bar.fraction
    0.5

How a library function reports progress (validate, reconcile, canary, the emitters): accept a keyword
``progress=None`` and, when it is not None, call ``progress(done, total)`` with its own units (records, bytes,
contexts) as often as is cheap (once per chunk): ``done`` only grows, ``total`` may be re-stated. A function made of
several stages maps them onto one scale itself (stage 1 reports ``(done, 2 * total)``, stage 2 ``(total + done, 2 *
total)``). Pass ``bar.update`` as the callback. Nothing else is needed: no globals, no printing in the library.

Options come from the CLI flags (:meth:`ProgressOptions.from_cli`); ``KVCONV_PROGRESS_INTERVAL`` (seconds) sets
the line interval, for tests and for logs that want more or fewer lines.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass

DEFAULT_INTERVAL = 2.0


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@dataclass(frozen=True)
class ProgressOptions:
    """How progress is shown (keyword-only, frozen).

    enabled: None: shown (a bar on a terminal, lines elsewhere); True: the same, asked for explicitly; False: nothing
      (``-q``, ``--no-progress``).
    interval: seconds between lines on a non-terminal (and before the first one).
    terminal: force the terminal (rich bar) or line mode; None asks whether stderr is a terminal.
    """

    enabled: bool | None = None
    interval: float = DEFAULT_INTERVAL
    terminal: bool | None = None

    @classmethod
    def from_cli(cls, *, progress: bool | None = None, quiet: bool = False) -> ProgressOptions:
        """Options of a command: ``-q`` silences, ``--no-progress`` too; the interval from the environment."""
        raw = os.environ.get("KVCONV_PROGRESS_INTERVAL", "")
        try:
            interval = float(raw) if raw else DEFAULT_INTERVAL
        except ValueError:
            interval = DEFAULT_INTERVAL
        if not interval > 0:  # also NaN
            interval = DEFAULT_INTERVAL
        return cls(enabled=False if quiet else progress, interval=interval)


def _size(n: float) -> tuple[float, str]:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return n / div, unit
    return n, "B"


def human_size(n: float) -> str:
    """``n`` bytes as a person reads them: ``'39.1 GiB'``, ``'22.4 MiB'``."""
    v, unit = _size(n)
    return f"{v:.1f} {unit}"


class Progress:
    """One task's progress. ``bar(n)`` advances by n units of ``total``; ``bar.update(done, total)`` sets the
    position; ``close()`` (or leaving ``with``) ends the display. ``size_bytes``: the input's size, shown as the
    amount done (``4.1/10.0 GiB``); without it, the units themselves are shown."""

    def __init__(self, label: str, *, total: int, size_bytes: int | None = None,
                 options: ProgressOptions = ProgressOptions(), stream=None) -> None:
        self.label = label
        self.total = max(int(total), 0)
        self.done = 0
        self.size_bytes = size_bytes
        self.options = options
        self._stream = stream if stream is not None else sys.stderr
        self._t0 = time.monotonic()
        self._rich = None
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        self._lines = 0
        if options.enabled is False:
            return
        terminal = _isatty(self._stream) if options.terminal is None else options.terminal
        if terminal:
            from rich.console import Console
            from rich.progress import Progress as RichProgress

            self._rich = RichProgress(transient=True, console=Console(file=self._stream))
            self._rich.start()
            self._task = self._rich.add_task(label, total=self.total or None)
        else:
            self._ticker = threading.Thread(target=self._tick, name="kvconv-progress", daemon=True)
            self._ticker.start()

    @property
    def fraction(self) -> float:
        return min(self.done / self.total, 1.0) if self.total else 0.0

    def __call__(self, n: int = 1) -> None:
        self.update(self.done + int(n))

    def update(self, done: int, total: int | None = None) -> None:
        if total is not None and int(total) != self.total:
            self.total = max(int(total), 0)
            if self._rich is not None:
                self._rich.update(self._task, total=self.total or None)
        self.done = int(done)
        if self._rich is not None:
            self._rich.update(self._task, completed=self.done)

    def line(self) -> str:
        """The one-line form: ``kvconv: LABEL: 41% (4.1/10.0 GiB, 3.2 s)``."""
        f = self.fraction
        if self.size_bytes:
            tot, unit = _size(self.size_bytes)
            div = self.size_bytes / tot if tot else 1
            amount = f"{f * self.size_bytes / div:.1f}/{tot:.1f} {unit}"
        else:
            amount = f"{self.done:,}/{self.total:,}"
        return f"kvconv: {self.label}: {f * 100:.0f}% ({amount}, {time.monotonic() - self._t0:.1f} s)"

    def _write_line(self) -> bool:
        try:
            self._stream.write(self.line() + "\n")
            self._stream.flush()
        except (OSError, ValueError):  # stderr closed or a broken pipe: stop showing, keep working
            return False
        self._lines += 1
        return True

    def _tick(self) -> None:
        while not self._stop.wait(self.options.interval):
            if not self._write_line():
                return

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
            # A busy process may starve the ticker thread of the GIL for a whole interval: work that outlived the
            # interval still leaves its one line, so a log always shows it ran.
            if self._lines == 0 and time.monotonic() - self._t0 >= self.options.interval:
                self._write_line()
        if self._rich is not None:
            self._rich.stop()
            self._rich = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
