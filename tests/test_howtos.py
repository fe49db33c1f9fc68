"""docs/DEVELOPING.md's "How to add ..." lists, each followed once, step by step, in a copy of the tree (kvconv/ and
schemas/ under tmp_path): a toy output format, a toy record kind, a toy validate check. Each is then run through the
copy's real ``kvconv`` entry point and read back with the readers the outputs are for (pyarrow for Arrow)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest

ROOT = Path(__file__).resolve().parent.parent
QWEN = ROOT / "fixtures/qwen3-14b/qwen3-14b.kvdump"
DEVELOPING = (ROOT / "docs/DEVELOPING.md").read_text()


def howto(title: str) -> str:
    """The steps of one "How to add ..." section of docs/DEVELOPING.md."""
    m = re.search(rf"^### \.\.\. {re.escape(title)}[^\n]*\n(.*?)(?=^##)", DEVELOPING, re.S | re.M)
    assert m, f"docs/DEVELOPING.md lacks the how-to '{title}'"
    return m.group(1)


@pytest.fixture
def tree(tmp_path):
    """A copy of kvconv/ and schemas/ whose ``python -m kvconv`` is the copy's own."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "kvconv", tmp_path / "kvconv", ignore=ignore)
    shutil.copytree(ROOT / "schemas", tmp_path / "schemas", ignore=ignore)
    return tmp_path


def run(tree: Path, *args: str, code: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(tree), KVCONV_PROGRESS="0")
    argv = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "kvconv", *args]
    return subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=300)


def edit_json(path: Path, fn) -> None:
    spec = json.loads(path.read_text())
    fn(spec)
    path.write_text(json.dumps(spec, indent=1))


def test_the_copy_is_what_runs(tree):
    r = run(tree, code="import kvconv, kvconv.format.layout as l; print(kvconv.__file__, l.schema_dir())")
    assert r.stdout.split() == [str(tree / "kvconv" / "__init__.py"), str(tree / "schemas")], r.stderr


# ---- an output format -------------------------------------------------------------------------------------------

TOY_FORMAT = '''
"""A toy output format: one line per context, its device events counted by streaming them."""
import os

from kvconv.format.atomic import atomic_output
from kvconv.emit._contexts import emit_run


def write_lines(dumps, out, *, options, warn=None, checks=None):
    with emit_run(dumps, out, options, warn, "lines", checks=checks, passes=1) as (res, warn, paths, ctxs, bar):
        with atomic_output(out, inputs=paths, kind="lines", force=options.force) as tmp, open(tmp, "w") as f:
            for c in ctxs:
                n = 0
                for _first, recs in c.chunks(options.chunk):
                    n += len(recs)
                    bar(len(recs))
                f.write(f"{c.label} context {c.context_id}: {n} device events\\n")
                res.written_events += n
    res.bytes_written = os.path.getsize(out)
    return res
'''


def test_howto_add_an_output_format(tree, tmp_path):
    steps = howto("an output format")
    assert "kvconv/emit/<name>.py" in steps and "kvconv/emit/registry.py" in steps
    # 1. the module
    (tree / "kvconv/emit/lines.py").write_text(TOY_FORMAT)
    # 2. one registration
    with open(tree / "kvconv/emit/registry.py", "a") as f:
        f.write('register(Format(name="lines", writer="kvconv.emit.lines:write_lines", output="output .txt", '
                'summary="One line per context.", example="kvconv lines run.kvdump -o run.txt", trace=False))\n')
    h = run(tree, "lines", "--help")
    assert h.returncode == 0 and "Example: kvconv lines run.kvdump -o run.txt" in " ".join(h.stdout.split())
    assert "--salvage" in h.stdout and "--force" in h.stdout
    out = tmp_path / "qwen.txt"
    r = run(tree, "lines", str(QWEN), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_text() == "qwen3-14b.kvdump context 0: 114112 device events\n"  # info: device_event 114,112
    again = run(tree, "lines", str(QWEN), "-o", str(out))  # the common behaviour: an output is kept without --force
    assert again.returncode != 0 and again.stderr.startswith("Error:") and again.stderr.count("\n") == 1


# ---- a record kind ----------------------------------------------------------------------------------------------

TOY_CHECK = '''
"""Checks of toy_note records: a note's value is never 0."""


def check(d, c):
    for g in d.groups_of("toy_note"):
        c.mask("error", "toy-note-zero", "a toy note's value is 0", g, g.records["value"] == 0, "value")
'''

WRITE_TOY_DUMP = '''
import sys
import numpy as np
from kvconv.format import dump, layout

sys.path.insert(0, sys.argv[2])
import runpy
gen = runpy.run_path(sys.argv[2] + "/fixtures/bad/generate.py")
parts = gen["small_parts"]()
notes = np.zeros(2, dtype=layout.DTYPES["toy_note"])
notes["value"] = [5, 0]
with dump.new(sys.argv[1]) as w:
    w.write_metadata(parts["meta"])
    w.write_strings(parts["strings"])
    for kind in ("kernel", "clock_sync", "eager_launch", "graph_node", "device_event"):
        w.write_records(kind, parts[kind], capacity=64)
    w.write_records("toy_note", notes)
'''


def add_toy_code(tree: Path, code: str, means: str) -> None:
    """The check how-to's step 1: the code registered, docs/FINDINGS.md regenerated."""
    edit_json(tree / "schemas/codes.json", lambda s: s["codes"].__setitem__(code, {
        "severity": ["error"], "unreadable": False, "area": "validate", "means": means, "do": "Nothing: a toy."}))
    r = run(tree, "findings", code="import sys, runpy; sys.argv[1:] = ['findings']; "
                                   "runpy.run_module('kvconv.formatdoc', run_name='__main__')")
    assert r.returncode == 0 and means in r.stdout, r.stderr


def test_howto_add_a_record_kind(tree, tmp_path):
    steps = howto("a record kind")
    facts = json.loads((ROOT / "schemas/layouts.json").read_text())["record_kind_facts"]
    assert all(f"`{f}`" in steps for f in facts)  # the how-to names every fact a kind must state

    # 1. the kind and its layout, every fact stated
    def add_kind(spec):
        spec["record_kinds"]["toy_note"] = {"id": 99, "layout": "toy_note", "record_size": 16,
                                            "clock": "host_monotonic", "per_context": False,
                                            "validate": "kvconv.check.toy_note:check", "arrow": "one row per note",
                                            "doc": "a toy kind"}
        spec["layouts"]["toy_note"] = {"size": 16, "doc": "a toy note", "fields": [
            {"name": "value", "type": "u64", "offset": 0, "doc": "never 0"},
            {"name": "flags", "type": "u32", "offset": 8, "doc": "0"}]}

    edit_json(tree / "schemas/layouts.json", add_kind)
    # 2. generated files
    header = run(tree, code="from kvconv.format import layout; print(layout.c_header())").stdout
    assert "#define KVCONV_KIND_TOY_NOTE 99" in header and "kvconv_toy_note_t" in header
    assert "case 99: return 1; /* toy_note: host_monotonic */" in header  # kvconv_kind_clock(), for the tracer
    fmt = run(tree, code="from kvconv import formatdoc; print(formatdoc.render())").stdout
    assert "| `toy_note` | host_monotonic | no | `kvconv.check.toy_note:check` | one row per note |" in fmt
    # 3. its check, with its code registered
    (tree / "kvconv/check/toy_note.py").write_text(TOY_CHECK)
    add_toy_code(tree, "toy-note-zero", "A toy note's value is 0.")
    # 5. a Python writer: the clock comes from the schema
    p = tmp_path / "toy.kvdump"
    w = run(tree, str(p), str(ROOT), code=WRITE_TOY_DUMP)
    assert w.returncode == 0, w.stderr

    # read: kvconv info names the kind and its clock
    info = run(tree, "info", str(p), "--json")
    assert info.returncode == 0, info.stderr
    (g,) = [g for g in json.loads(info.stdout)["dumps"][0]["result"]["groups"] if g["kind"] == "toy_note"]
    assert (g["record_count"], g["clock_domain"]) == (2, "host_monotonic")
    # validated: its hook runs and reports record 1
    v = run(tree, "validate", str(p), "--json")
    assert v.returncode == 1, v.stdout + v.stderr
    found = [f for f in json.loads(v.stdout)["dumps"][0]["result"]["findings"] if f["code"] == "toy-note-zero"]
    assert [(f["record"], f["field"]) for f in found] == [(1, "toy_note.value")]
    # exported: its Arrow table, read back as a dataset
    a = run(tree, "arrow", str(p), "-o", str(tmp_path / "tables"))
    assert a.returncode == 0, a.stderr
    t = ds.dataset(tmp_path / "tables/toy_note", format="ipc", partitioning="hive").to_table()
    assert t.column("value").to_pylist() == [5, 0] and "flags" in t.column_names
    # and without the hook's module, the kind would not go unchecked silently: validate fails loudly
    (tree / "kvconv/check/toy_note.py").unlink()
    assert run(tree, "validate", str(p)).returncode == 3


# ---- a validate check -------------------------------------------------------------------------------------------

TOY_CACHE_CHECK = '''
"""Checks of cache records: a registered cache is not empty."""


def check(d, c):
    for g in d.groups_of("cache"):
        c.mask("error", "toy-cache-empty", "a registered cache has size 0", g, g.records["size"] == 0, "size")
'''

WRITE_CACHE_DUMP = '''
import sys
import numpy as np
from kvconv.format import dump, layout

caches = np.zeros(2, dtype=layout.DTYPES["cache"])
caches["size"] = [1 << 20, 0]
caches["slot_bytes"], caches["page_size"], caches["cache_id"] = 256, 16, [0, 1]
with dump.new(sys.argv[1]) as w:
    w.write_metadata({"tool": "howto", "tool_version": "0"})
    w.write_records("cache", caches)
'''


def test_howto_add_a_validate_check(tree, tmp_path):
    steps = howto("a validate check")
    assert "schemas/codes.json" in steps and "kvconv/check/validate.py" in steps
    p = tmp_path / "caches.kvdump"
    assert run(tree, str(p), code=WRITE_CACHE_DUMP).returncode == 0
    before = run(tree, "validate", str(p), "--json")
    assert "toy-cache-empty" not in before.stdout
    # 1. the code; 2. the check, about one kind's records: the function the kind's "validate" names
    add_toy_code(tree, "toy-cache-empty", "A registered cache is empty.")
    (tree / "kvconv/check/toy_cache.py").write_text(TOY_CACHE_CHECK)
    edit_json(tree / "schemas/layouts.json",
              lambda s: s["record_kinds"]["cache"].__setitem__("validate", "kvconv.check.toy_cache:check"))
    # 3. through the real CLI: the exit status and the code
    r = run(tree, "validate", str(p), "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    found = [f for f in json.loads(r.stdout)["dumps"][0]["result"]["findings"] if f["code"] == "toy-cache-empty"]
    assert [(f["severity"], f["record"], f["count"]) for f in found] == [("error", 1, 1)]
    text = run(tree, "validate", str(p))
    assert "toy-cache-empty" in text.stdout and "INVALID" in text.stdout
