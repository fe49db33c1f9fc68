"""The emitter registry: a new output format is one module plus one registration, and its command (with the options
every format takes) comes from the registry. Checked by adding a toy format the way the registry's docstring says,
then running it through the real ``kvconv`` entry point."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from kvconv.format import dump

ROOT = Path(__file__).resolve().parent.parent
QWEN = ROOT / "fixtures/qwen3-14b/qwen3-14b.kvdump"

TOY = '''
"""A toy output format: one CSV line per device event (context, SM, block, device time)."""
from kvconv.format.atomic import atomic_output
from kvconv.emit._contexts import emit_run


def write_csv(dumps, out, *, options, warn=None, checks=None):
    with emit_run(dumps, out, options, warn, "csv", checks=checks, passes=1) as (res, warn, paths, ctxs, bar):
        with atomic_output(out, inputs=paths, kind="csv", force=options.force) as tmp, open(tmp, "w") as f:
            f.write("context_id,smid,block_x,globaltimer\\n")
            for c in ctxs:
                for first, recs in c.chunks(options.chunk):
                    for r in zip(recs["smid"].tolist(), recs["block_x"].tolist(),
                                 recs["globaltimer"].tolist()):
                        f.write(f"{c.context_id},{r[0]},{r[1]},{r[2]}\\n")
                    res.written_events += len(recs)
                    bar(len(recs))
                res.alignment.append(c.alignment())
        res.bytes_written = __import__("os").path.getsize(out)
    return res
'''

RUN = '''
import contextlib, io, json, sys
from kvconv.emit.registry import Format, register
register(Format(name="csv", writer="toyfmt:write_csv", output="output .csv", summary="One line per device event.",
                example="kvconv csv run.kvdump -o run.csv"))
from kvconv.cli import main
res = []
for argv in json.loads(sys.argv[1]):  # each a run of the kvconv command of this process
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    res.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(res))
'''


def _kvconv_with_toy(tmp_path: Path, *argvs: list[str]) -> list[subprocess.CompletedProcess]:
    """Each argv through the ``kvconv`` entry point of one fresh process that registered the toy format first."""
    (tmp_path / "toyfmt.py").write_text(TOY)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    p = subprocess.run([sys.executable, "-c", RUN, json.dumps(argvs)], cwd=tmp_path, env=env, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    return [subprocess.CompletedProcess(a, *r) for a, r in zip(argvs, json.loads(p.stdout))]


def test_a_registered_format_gets_its_command_and_common_options(tmp_path):
    out = tmp_path / "run.csv"
    h, r, again = _kvconv_with_toy(tmp_path, ["csv", "--help"], ["csv", str(QWEN), "-o", str(out)],
                                   ["csv", str(QWEN), "-o", str(out)])
    assert h.returncode == 0, h.stderr
    for opt in ("--output", "--window", "--replays", "--flows", "--join", "--salvage", "--force", "--quiet"):
        assert opt in h.stdout, opt
    assert "Example: kvconv csv run.kvdump -o run.csv" in " ".join(h.stdout.split())
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(out.open()))
    with dump.open(QWEN) as d:
        ev = np.concatenate([g.records for g in d.groups_of("device_event")])
    assert len(rows) == len(ev) and f"{len(ev):,} device events" in r.stdout
    assert [int(x["globaltimer"]) for x in rows[:5]] == ev["globaltimer"][:5].tolist()
    # the common behaviour comes with it: an existing output is kept without --force
    assert again.returncode != 0 and again.stderr.startswith("Error:")


def test_the_registered_formats_are_the_emit_commands():
    from kvconv.cli import app
    from kvconv.emit.registry import FORMATS

    names = {c.name for c in app.registered_commands}
    assert {"perfetto", "chrome", "arrow"} <= set(FORMATS) and set(FORMATS) <= names
