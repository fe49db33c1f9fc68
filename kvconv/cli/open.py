"""``kvconv open TRACE``: show a trace in ui.perfetto.dev, served once from this machine (:mod:`kvconv.serve`).

    $ kvconv open run.pftrace
    opened https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/run.pftrace
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer()


@app.command("open")
def open_cmd(
    trace: Path = typer.Argument(..., metavar="TRACE", help="a .pftrace (kvconv perfetto) or .json (kvconv chrome)"),
    port: int = typer.Option(9001, "--port", help="local port to serve on (ui.perfetto.dev fetches only from 9001; "
                             "another port needs the UI's own allow-listing)"),
    browser: bool = typer.Option(True, "--browser/--no-browser",
                                 help="open the browser (without one, or over ssh, the URL is printed)"),
    timeout: float | None = typer.Option(None, "--timeout", metavar="SECONDS",
                                            help="give up when the trace was not fetched within SECONDS"),
) -> None:
    """Open TRACE in ui.perfetto.dev: serve it once on 127.0.0.1:PORT (with the CORS header the UI needs), open
    the browser at the UI with the file's URL, and exit once the UI fetched it (or on Ctrl-C / --timeout). Over ssh,
    forward the port (ssh -L 9001:127.0.0.1:9001 HOST) and open the printed URL on your side.

    Example: kvconv open run.pftrace
    """
    from kvconv.serve import OpenOptions, serve_once

    serve_once(trace, options=OpenOptions(port=port, browser=browser, timeout=timeout),
               say=lambda line: print(line, flush=True))
