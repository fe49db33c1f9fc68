"""The ``kvconv`` command line: a thin typer app. It parses, calls the library, and prints.

Errors: every :class:`kvconv.format.errors.KvconvError` is caught here, in one place, printed as one ``Error: ...``
line on stderr, and turned into exit code 1 (2 for unreadable input and usage errors). Nothing else prints tracebacks;
set ``KVCONV_DEBUG=1`` to see one for an internal error.

    $ kvconv validate fixtures/qwen3-14b/qwen3-14b.kvdump
    $ kvconv info fixtures/qwen3-14b/qwen3-14b.kvdump --json

One way to define a command (every module in COMMAND_MODULES): a module-level ``app = typer.Typer()`` and its
commands as module-level functions under ``@app.command()``, their options the shared declarations of
:mod:`kvconv.cli.common` (``DUMPS``, ``JSON``, ``SALVAGE``, ``QUIET``, ``FORCE``, ``PROGRESS``, ``output_option``;
former spellings through ``@renamed``), the docstring ending in ``Example: kvconv <command> ...`` (tests/test_cli.py
checks it). Heavy imports (numpy, pyarrow, protos) go inside the command's body, so ``kvconv --help`` stays fast::

    # kvconv/cli/hello.py, then listed in COMMAND_MODULES
    app = typer.Typer()

    @app.command()
    def hello(dumps: list[Path] = DUMPS, as_json: bool = JSON, salvage: bool = SALVAGE) -> None:
        '''Say hello to each dump.

        Example: kvconv hello run.kvdump
        '''
        from kvconv.format import dump  # numpy: imported when the command runs, not for --help
        ...

The commands of every module's ``app`` join the one ``kvconv`` app below (:func:`_add_commands`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import warnings

import typer
import typer.core
import typer.main

from kvconv.format.errors import KvconvError

# Plain click help (rich_markup_mode=None below): typer still escapes "[default: ...]" as "\\[default: ...]" for
# rich whenever rich is importable; tell it rich is not in use.
typer.core.HAS_RICH = False

COMMAND_MODULES = (
    "kvconv.cli.core",
    "kvconv.cli.canary",
    "kvconv.cli.emit",
    "kvconv.cli.reconcile",
    "kvconv.cli.record",
    "kvconv.cli.report",
    "kvconv.cli.open",
)

# typer >= 0.22 carries its own click (typer._click); earlier ones use click's
_click = getattr(typer.core, "_click", None) or importlib.import_module("click")


class _OneLineUsageError(_click.exceptions.ClickException):
    """A usage error as every kvconv error reads: one ``Error: ...`` line on stderr, exit 2 (click prints the usage,
    a hint and the error on three lines)."""

    exit_code = 2

    def show(self, file=None) -> None:
        err(f"Error: {self.format_message()}")


@contextlib.contextmanager
def _one_line_usage():
    try:
        yield
    except _click.exceptions.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # `kvconv` alone: the help, as asked for
            raise
        where = e.ctx.command_path if e.ctx is not None else "kvconv"
        raise _OneLineUsageError(f"{where}: {e.format_message().rstrip('.')} (see {where} --help)") from None


class _Group(typer.core.TyperGroup):
    """The kvconv group: usage errors of the group and of every command (both raised inside these two) on one line."""

    def make_context(self, *args, **kwargs):
        with _one_line_usage():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _one_line_usage():
            return super().invoke(ctx)


app = typer.Typer(
    name="kvconv",
    cls=_Group,
    help="Trace, check and convert KV-cache write dumps from CUDA-graph replays.\n\n"
    "Example: kvconv validate run.kvdump && kvconv perfetto run.kvdump -o run.pftrace",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: rich would add ~150 ms to every --help
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from kvconv import __version__

        sys.stdout.write(f"kvconv {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _kvconv(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="print kvconv's version and exit"),
) -> None:
    pass


def _add_commands(module: str) -> None:
    """The commands of ``module``'s ``app`` become commands of the ``kvconv`` app (the same names and help)."""
    app.registered_commands.extend(importlib.import_module(module).app.registered_commands)


for _mod in COMMAND_MODULES:
    _add_commands(_mod)


def err(message: str) -> None:
    """Print one line to stderr (no rich markup interpretation, no wrapping)."""
    sys.stderr.write(message.rstrip("\n").replace("\n", " ") + "\n")
    sys.stderr.flush()


_SAID: set[str] = set()  # the warnings this command printed: a dump opened by two of its steps warns once


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings (e.g. a salvaged dump's loss) as one ``Warning: ...`` line, without Python's source echo; each one
    once per command (Python's own filter tells warnings apart by the line that raised them)."""
    text = str(message)
    if text.startswith("warning "):  # Finding.line() of a warning-level finding
        text = text[len("warning "):]
    if text not in _SAID:
        _SAID.add(text)
        err(f"Warning: {text}")


def main(argv: list[str] | None = None) -> int:
    """Run the app; typer handles usage errors (exit 2) and ``typer.Exit``; kvconv errors are printed here."""
    # A hostile dump can carry lone surrogates (metadata JSON "\ud800"): print them escaped rather than fail.
    out = sys.stdout
    errors = getattr(out, "errors", None)
    if errors in ("strict", "surrogateescape") and hasattr(out, "reconfigure"):
        try:
            out.reconfigure(errors="backslashreplace")
        except (ValueError, OSError):
            errors = None
    else:
        errors = None
    from kvconv.cli import interrupt

    try:
        # the program itself (not a caller's main([...])): its end is not interrupted
        with warnings.catch_warnings(), interrupt.handled(program=argv is None):
            warnings.showwarning = _one_line_warning
            _SAID.clear()
            return _main(argv)
    finally:
        if errors is not None:
            try:
                out.reconfigure(errors=errors)
            except (ValueError, OSError):
                pass


# a Ctrl-C that reached the command as KeyboardInterrupt (kvconv.cli.interrupt's handler not installed: the process
# was given its own): kvconv.format.atomic removed an output still being written, and kept one already in place
_INTERRUPTED = "Error: interrupted (SIGINT): an unfinished output is removed, a written one kept"


def _interrupted(e: BaseException) -> bool:
    """Whether a KeyboardInterrupt is in the exception's chain (typer re-raises Ctrl-C as ``Exit(130)``)."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, KeyboardInterrupt):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def _main(argv: list[str] | None) -> int:
    from kvconv.cli._parse import plain_conversion

    try:
        group = typer.main.get_command(app)
        plain_conversion(group)  # no pydantic per option value (typer 0.29: 0.15-0.25 s of every command)
        rv = group(args=argv, prog_name="kvconv")
    except SystemExit as e:
        if _interrupted(e):  # typer turns Ctrl-C into a silent exit 130: say it, as SIGTERM's handler does
            err(_INTERRUPTED)
            return 130
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KvconvError as e:
        err(f"Error: {e}")
        return e.exit_code
    except BrokenPipeError:
        # Output piped into head etc.: not an error worth a traceback.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 1
    except KeyboardInterrupt:
        err(_INTERRUPTED)
        return 130
    except MemoryError:
        err("Error: out of memory (try a smaller --window or a machine with more memory)")
        return 1
    except Exception as e:  # noqa: BLE001 - last resort: one line, never a traceback unless asked for
        if os.environ.get("KVCONV_DEBUG"):
            raise
        err(f"Error: internal error ({type(e).__name__}: {e}); please report it, rerun with KVCONV_DEBUG=1 for details")
        return 3
    return rv if isinstance(rv, int) else 0
