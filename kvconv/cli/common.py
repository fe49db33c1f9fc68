"""What the commands share: each option several commands take, declared once; one outcome per input dump; the
``--json`` envelope; former option spellings kept working, hidden from ``--help``.

    @app.command()
    @renamed(relaxed="--relaxed-reconcile")
    def validate(dumps: List[Path] = DUMPS, as_json: bool = JSON, relaxed: bool = RELAXED, salvage: bool = SALVAGE):
        outcomes = each(dumps, lambda p: Outcome(str(p), 0, {"size": 1}))
        finish("validate", outcomes, as_json=as_json, text=lambda o: f"{o.path}: ok")

The envelope (docs/CLI.md), the same for every command and for any number of inputs; ``exit`` is the worst of the
dumps' and the process's exit status::

    {"kvconv": "0.1.0", "command": "validate", "ok": false, "exit": 2,
     "dumps": [{"path": "a.kvdump", "ok": true, "exit": 0, "result": {...the command's report of it...}},
               {"path": "b.kvdump", "ok": false, "exit": 2, "error": {"code": "bad-magic", "offset": 0, ...}}]}

``result`` follows the command's own schema (schemas/reconcile.schema.json, canary.schema.json, ...); the envelope
follows schemas/cli.schema.json.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import sys
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import typer

from kvconv import __version__
from kvconv.format.errors import KvconvError

# ---- options shared by several commands (one declaration each) ----------------------------------------------------

# readable=False: typer's Path check would stop the whole run at the first unreadable dump with click's usage text;
# the command reports each dump instead (one error line each, the exit status the worst)
DUMPS = typer.Argument(..., metavar="DUMP...", readable=False,
                       help="kvconv dump file(s), '-' for standard input; each is reported, the exit status is the "
                            "worst")
JSON = typer.Option(False, "--json", help="print JSON for machines (one envelope for every command: docs/CLI.md)")
SALVAGE = typer.Option(False, "--salvage", help="read a dump cut short up to its last whole record (the loss is "
                                                "reported as lost to truncation)")
RELAXED = typer.Option(False, "--relaxed", help="report reconciliation mismatches as warnings, not errors")
QUIET = typer.Option(False, "--quiet", "-q", help="print only warnings and errors")
FORCE = typer.Option(False, "--force", "--force-overwrite",
                     help="replace an existing output (without it an existing file is kept, and a folder is replaced "
                          "only when it is kvconv's own earlier output of the same command)")
PROGRESS = typer.Option(None, "--progress/--no-progress", help="progress: a bar on a terminal, else a stderr line "
                        "every 2 s (KVCONV_PROGRESS_INTERVAL seconds)")


def output_option(what: str, default=...):
    """``-o/--output`` for every command that writes something (the former ``--out`` still works, hidden)."""
    return typer.Option(default, "-o", "--output", help=what)


# ---- former spellings -----------------------------------------------------------------------------------------------

def renamed(**former: str):
    """Keep the former spelling of an option working, hidden from ``--help``: ``@renamed(output="--out")`` under
    ``@app.command()`` adds a hidden ``--out`` that fills ``output``. A required option becomes satisfied by either
    spelling (the check moves here, same exit status 2)."""

    def deco(fn):
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
        params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()]
        required: dict[str, str] = {}
        for name, spelling in former.items():
            i = next(k for k, p in enumerate(params) if p.name == name)
            p, typ = params[i], hints[name]
            info = p.default
            flag = typ is bool
            if getattr(info, "default", None) is ...:
                info = copy.copy(info)
                info.default = None
                info.help = f"{info.help or ''}  [required]".lstrip()
                params[i] = p.replace(default=info, annotation=typ | None)
                required[name] = "/".join(d for d in info.param_decls)
            params.append(inspect.Parameter(
                f"{name}_as_{spelling.lstrip('-').replace('-', '_')}", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=typer.Option(False if flag else None, spelling, hidden=True),
                annotation=bool if flag else typ | None))

        @functools.wraps(fn)
        def wrapper(**kw):
            for name, spelling in former.items():
                old = kw.pop(f"{name}_as_{spelling.lstrip('-').replace('-', '_')}")
                if old is not None and old is not False:  # given: it wins over the new spelling's default
                    kw[name] = old
            for name, decls in required.items():
                if kw.get(name) is None:
                    from kvconv.format.errors import UsageError

                    raise UsageError(f"missing option {decls}", hint=f"see kvconv {fn.__name__} --help")
            return fn(**kw)

        wrapper.__signature__ = sig.replace(parameters=params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return deco


# ---- one outcome per input, the envelope ----------------------------------------------------------------------------

@dataclass
class Outcome:
    """What a command made of one input dump: its exit status, its JSON-able result, or the error that stopped it."""

    path: str
    exit: int
    result: dict | Callable = field(default_factory=dict)  # or a function streaming it as JSON to a text stream
    error: KvconvError | None = None
    text: str = ""  # what the text output says about it (stdout); an error goes to stderr as one line
    dump: object = None  # the kvconv.run.DumpRun it came from: its process, read from the open dump (worst())


def quiet_text(text: str, *, keep_last: bool) -> str:
    """What ``-q`` leaves of a dump's text: its warning and error lines, and (``keep_last``) its last line, where the
    command states the verdict (info)."""
    lines = text.splitlines()
    kept = [x for x in lines[:-1 if keep_last else None] if x.startswith(("warning ", "error "))]
    return "\n".join(kept + lines[-1:] if keep_last else kept)


def each(paths: Iterable[Path], fn: Callable[[Path], Outcome]) -> list[Outcome]:
    """``fn`` on every path in turn; a :class:`KvconvError` for one dump becomes its outcome and the others go on."""
    out = []
    for p in paths:
        try:
            out.append(fn(p))
        except KvconvError as e:
            out.append(Outcome(str(getattr(p, "path", p)), e.exit_code, error=e))
    return out


def worst(outcomes: Iterable[Outcome]) -> int:
    """The exit status of several dumps: the largest; the dumps of one run's processes (an engine's front end and its
    workers: kvconv.check.runs) as one run, where a process that ran no target kernel does not count."""
    from kvconv.check.runs import of_run

    outcomes = list(outcomes)
    # the metadata of a dump the command opened, from that open dump (kept once closed: DumpRun.metadata_or_none)
    metas = [None if o.dump is None else (o.dump.metadata_or_none() or {}) for o in outcomes]
    return of_run([o.path for o in outcomes], [o.exit for o in outcomes], metas=metas)


def envelope(command: str, outcomes: list[Outcome], *, code: int | None = None, **extra) -> dict:
    """The ``--json`` document of every command (module docstring, docs/CLI.md); ``code``: the exit status when the
    command judged the run itself (:attr:`kvconv.run.Run.exit_code`), else the outcomes' (:func:`worst`)."""
    dumps = []
    for o in outcomes:
        entry = {"path": o.path, "ok": o.exit == 0, "exit": o.exit}
        if o.result:
            entry["result"] = o.result
        if o.error is not None:
            entry["error"] = o.error.to_dict()
        dumps.append(entry)
    code = worst(outcomes) if code is None else code
    return {"kvconv": __version__, "command": command, "ok": code == 0, "exit": code, "dumps": dumps, **extra}


def print_json(obj, out=None) -> None:
    """``obj`` as indented JSON; a value that is a function (a result too big to hold as objects) is called with a
    text stream and writes its own JSON there, indented to its place."""
    out = out or sys.stdout
    streams = []

    def mark(o):
        if callable(o):
            streams.append(o)
            return f"\0kvconv-stream-{len(streams) - 1}\0"
        if isinstance(o, dict):
            return {k: mark(v) for k, v in o.items()}
        if isinstance(o, list):
            return [mark(v) for v in o]
        return o

    text = json.dumps(mark(obj), indent=2, sort_keys=True)
    for i, writer in enumerate(streams):
        at = text.index(json.dumps(f"\0kvconv-stream-{i}\0"))
        line = text[text.rfind("\n", 0, at) + 1 : at]  # '    "result": '
        indent = line[: len(line) - len(line.lstrip())]
        out.write(text[:at])
        writer(_Nested(out, indent))
        text = text[at + len(json.dumps(f"\0kvconv-stream-{i}\0")):]
    out.write(text + "\n")


class _Nested:
    """A text stream that indents what is written to it by ``indent`` (after each newline) and drops the final
    newline: a JSON document written at top level, placed inside another."""

    def __init__(self, out, indent: str) -> None:
        self.out, self.indent, self.held = out, indent, ""

    def write(self, s: str) -> None:
        s, self.held = self.held + s, ""
        if s.endswith("\n"):
            s, self.held = s[:-1], "\n"
        self.out.write(s.replace("\n", "\n" + self.indent))


def open_or_finish(command: str, path: Path, options, *, as_json: bool):
    """``dump.open``; when it fails under ``--json``, the envelope reports the error (and the process exits)."""
    from kvconv.format import dump

    try:
        return dump.open(path, options=options)
    except KvconvError as e:
        if as_json:
            finish(command, [Outcome(str(path), e.exit_code, error=e)], as_json=True)
        raise


def finish(command: str, outcomes: list[Outcome], *, as_json: bool, trailer: str = "", code: int | None = None,
           **extra) -> None:
    """Print every outcome (the JSON envelope, or each dump's text then ``trailer``), each error as one ``Error:``
    line on stderr, and exit with the worst status (``code``: the run's, where the command judged it)."""
    for o in outcomes:
        if o.error is not None:
            sys.stderr.write(f"Error: {o.error}\n")
    sys.stderr.flush()
    if as_json:
        print_json(envelope(command, outcomes, code=code, **extra))
    else:
        parts = [o.text for o in outcomes if o.error is None and o.text]
        if trailer:
            parts.append(trailer)
        if parts:
            sys.stdout.write("\n".join(parts) + "\n")
    sys.stdout.flush()
    raise typer.Exit(worst(outcomes) if code is None else code)


def run_lines(run, *, always: bool = False) -> list[str]:
    """The runs' own lines, after their dumps' (validate, report, record): for each run of several dumps or with
    findings of its own (what was asked and ran in none of its dumps; ``always``: every run), those findings and its
    one verdict, naming the dump that decided it and its findings' codes. Lone dumps that say it all: none."""
    from kvconv.check import verdict
    from kvconv.wording import counted

    out = []
    for j in run.judged:
        if len({run.dumps[i].path for i in j.dumps}) < 2 and not j.findings and not always:
            continue
        dumps = [run.dumps[i] for i in j.dumps]
        worst = [d for d in dumps if d.verdict == j.verdict] if j.verdict != "ok" else []
        why = ""
        if worst:
            sev = "error" if j.verdict in ("failed", "unreadable") else "warning"
            codes = list(dict.fromkeys(i["code"] for i in worst[0].incidents if i["severity"] == sev))
            named = f" ({', '.join(codes[:3])}{', ...' if len(codes) > 3 else ''})" if codes else ""
            why = f": {worst[0].path}{named}" + (f" and {len(worst) - 1:,} more" if len(worst) > 1 else "")
        warn = sum(f.severity == "warning" for f in j.findings)
        more = f"; {counted(warn, 'warning')} of the run" if warn else ""
        out += [f.line() for f in j.findings]
        out.append(f"run of {counted(len(dumps), 'dump')}: {verdict.LABELS[j.verdict]}{why}{more}")
    return out


def run_json(run) -> dict:
    """The envelope's ``run`` entry (schemas/cli.schema.json) of a run of several dumps or with findings of its own:
    its one verdict, exit status, dumps and findings as a whole; nothing for a lone dump that says it all."""
    if not any(len({run.dumps[i].path for i in j.dumps}) > 1 or j.findings for j in run.judged):
        return {}
    return {"run": {"verdict": run.verdict, "exit": run.exit_code, "dumps": run.paths,
                    "findings": [f.to_dict() for f in run.run_findings]}}


# ---- the verdict, where a command states it beside its own job ------------------------------------------------------

def judged(dump_run):
    """``(validate's report, None)`` of a :class:`kvconv.run.DumpRun`, or ``(None, "Type: message")`` when the checks
    fail on a bug of theirs: the command's own job stands and the verdict is not claimed (KVCONV_DEBUG=1 raises).
    A :class:`KvconvError` (the dump cannot be read) is the command's to report."""
    import os

    try:
        return dump_run.validation, None
    except KvconvError:
        raise
    except Exception as e:  # noqa: BLE001 - an internal error of the checks, said in one line
        if os.environ.get("KVCONV_DEBUG"):
            raise
        return None, f"{type(e).__name__}: {e}"


def internal_error(failure: str) -> str:
    """What a command says when the checks failed on a bug (:func:`judged`)."""
    return f"internal error in the checks: {failure}; please report it, KVCONV_DEBUG=1 shows where"


def verdict_warnings(run, *, done: str = "the output was written") -> list[dict]:
    """Each dump's verdict (kvconv validate's), one ``Warning:`` line on stderr for a dump whose verdict is not ok,
    saying ``done`` (the converters: the output was written; kvconv canary: its own part is clean). The exit status
    stays the command's (docs/CLI.md)."""
    from kvconv.check.verdict import STATES
    from kvconv.wording import counted

    out = []
    for dr in run.dumps:
        rep, failure = judged(dr)
        if rep is None:
            _warn(f"{dr.path}: verdict not computed ({internal_error(failure)})")
            out.append({"path": dr.path, "verdict": None, "incidents": None})
            continue
        out.append({"path": dr.path, "verdict": rep.verdict, "incidents": len(rep.incidents)})
        if rep.verdict != "ok":
            _warn(f"{dr.path}: verdict {STATES[rep.verdict]} ({counted(len(rep.incidents), 'incident')}): "
                  f"run `kvconv validate {dr.path}` ({done})")
    return out


def _warn(message: str) -> None:
    sys.stderr.write(f"Warning: {message}\n")
    sys.stderr.flush()
