"""``kvconv demo``: the whole chain on the embedded Qwen3-14B fixture, into one output folder.

The folder follows the output rules of every command (:mod:`kvconv.format.atomic`): it is built as a temporary folder
beside the target (``.NAME.tmp-PID-*``) and renamed into place once every step is done; an existing folder is
replaced only when it is kvconv's own earlier demo (its ``.kvconv-output.json`` marker lists every file in it), or
kvconv's own output of another command with ``--force``; a folder holding anything of the user's is refused, even
with ``--force``. The steps run inside the temporary folder, so the commands it prints can be rerun as shown from
inside the finished one.

    >>> from kvconv.cli import main              # doctest: +SKIP
    >>> from kvconv.demo.run import run          # doctest: +SKIP
    >>> run("kvconv-demo", main=main)            # the exit status: the worst step's

The steps are run by ``main`` (a command line -> its exit status), which the CLI hands over: the demo stands below
the CLI and never imports it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from kvconv.format.atomic import atomic_output

DUMP = "qwen3-14b.kvdump"
STEPS = (["info", DUMP], ["validate", DUMP], ["reconcile", DUMP],
         ["perfetto", DUMP, "-o", "qwen3-14b.pftrace"],
         ["chrome", DUMP, "-o", "qwen3-14b.json"],
         ["arrow", DUMP, "-o", "qwen3-14b-parquet", "--format", "parquet"])


def run(out: str | os.PathLike, *, main: Callable[[list[str]], int], force: bool = False) -> int:
    """Write the demo's folder ``out``, each step run by ``main`` (``kvconv.cli.main``); return the worst step's
    exit status. A step stopped by a signal (exit 128 + n) stops the demo, and the unfinished folder is removed."""
    from kvconv.demo import qwen3_14b

    worst = 0
    here = os.getcwd()
    with atomic_output(out, directory=True, kind="demo", force=force) as tmp:
        sys.stdout.write(f"demo in {out}/ (built beside it, in place once complete; the commands run inside it)\n")
        os.chdir(tmp)
        try:
            qwen3_14b.write(Path(DUMP), qwen3_14b.build())
            sys.stdout.write(f"wrote {DUMP} ({Path(DUMP).stat().st_size:,} bytes: the Qwen3-14B run reconstructed "
                             "from its published figures)\n")
            for step in STEPS:
                sys.stdout.write(f"\n$ kvconv {' '.join(step)}\n")
                sys.stdout.flush()
                code = main(list(step))
                if code >= 128:  # the step was interrupted or terminated (and said so): stop, clean up
                    raise SystemExit(code)
                worst = max(worst, code)
        finally:
            os.chdir(here)
    sys.stdout.write(f"\noutputs in {out}/: open {Path(out) / 'qwen3-14b.pftrace'} in https://ui.perfetto.dev\n")
    return worst
