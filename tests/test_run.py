"""``kvconv.open()``, the centre (kvconv/run.py), and the registry of passes it runs (kvconv/check/passes.py): the
README's notebook example runs against ``kvconv demo``'s dump; the Run agrees with the commands; every kind's
``validate`` hook is a pass of the registry and validate runs exactly the registry."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import tempfile

import pytest

import kvconv
from conftest import FIXTURES, ROOT, run_cli
from kvconv.check import passes
from kvconv.format import layout
from kvconv.format.errors import UsageError

STALE = FIXTURES / "writes-stale-pad" / "writes-stale-pad.kvdump"
QWEN = FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """``kvconv demo -o demo`` run in a fresh folder: the dump a notebook user has."""
    where = tmp_path_factory.mktemp("notebook")
    r = run_cli("demo", "-o", "demo", cwd=where)
    assert r.returncode == 0, r.stderr
    yield where
    shutil.rmtree(where, ignore_errors=True)  # the suite's temporary space is bounded (conftest)


def test_readme_notebook_example_runs_against_the_demo(demo, capsys):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"## From Python\n.*?```python\n(.*?)```", text, re.S).group(1)
    here = os.getcwd()
    os.chdir(demo)
    try:
        exec(compile(code, "README.md", "exec"), {})
    finally:
        os.chdir(here)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "ok 0"
    assert out[1] == "280 graph-node records = 280 expected executions = 280 device events, 0 drops"
    assert (demo / "from-python.pftrace").stat().st_size > 1000  # beside demo/, which stays kvconv's own


def test_run_states_what_validate_and_reconcile_say():
    for path in (QWEN, STALE):
        v = run_cli("validate", path, "--json")
        with kvconv.open(path) as run:
            assert run.exit_code == v.returncode
            got = json.loads(v.stdout)["dumps"][0]["result"]
            assert run.verdict == got["verdict"]
            assert [i["message"] for i in run.incidents] == [i["message"] for i in got["incidents"]]
    with kvconv.open(QWEN) as run:
        r = json.loads(run_cli("reconcile", QWEN, "--json").stdout)["dumps"][0]["result"]
        assert run.reconciliation.agreement_line() == r["contexts"][0]["agreement"]["line"]
        assert run.reconciliation.matches is not None  # the notebook's has its tables


def test_each_pass_reports_what_it_checked_and_the_canaries_are_the_passes_results():
    with kvconv.open(STALE) as run:
        ps = run.passes
        assert list(ps)[0] == "structure" and "writes" in ps
        assert ps["writes"].checked["steps"] == 5 and ps["writes"].verified
        assert run.writes is ps["writes"].result and run.canary is None
        assert sum(len(p.findings) for p in ps.values()) + (1 if any(
            f.code == "coverage-none" for f in run.findings) else 0) == len(run.findings)


def test_tables_are_kvconv_arrows(demo):
    with kvconv.open(demo / "demo" / "qwen3-14b.kvdump") as run:
        assert {"launch", "matches", "device_event", "metadata"} <= set(run.tables)
        assert run.table("device_event").num_rows == 114_112
        assert len(run.to_pandas("launch")) == 1_320
        with pytest.raises(UsageError, match="no table 'nope'"):  # the one exception family, not a KeyError
            run.table("nope")


def test_several_dumps_are_one_run_and_one_dump_questions_are_refused():
    with kvconv.open([QWEN, STALE]) as run:
        assert run.exit_code == 1 and run.verdict == "failed"
        assert [d.verdict for d in run.dumps] == ["ok", "failed"]
        with pytest.raises(UsageError, match="run.dumps"):
            run.reconciliation  # noqa: B018 - the property refuses


def test_registry_is_derived_from_the_kinds_hooks():
    reg = passes.registry()
    hooks = {k.validate for k in layout.KINDS.values() if k.validate}
    assert {f"kvconv.check.passes:{p.name}" for p in reg[1:]} == hooks
    for p in reg[1:]:
        assert set(p.kinds) == {k.name for k in layout.KINDS.values() if k.validate == f"kvconv.check.passes:{p.name}"}
    # validate runs the registry through its one driver (Validation), not a list of its own; no second driver
    src = (ROOT / "kvconv" / "check" / "validate.py").read_text()
    assert "passes.run_all" in src and "_OWN_HOOKS" not in src and "def _check_" not in src
    assert not (ROOT / "kvconv" / "emit" / "_checks.py").exists()
    assert not any("kvconv.check." in line and " import _" in line  # no private name of check/ outside it
                   for py in (ROOT / "kvconv" / "emit").glob("*.py") for line in py.read_text().splitlines())


def test_only_the_verdict_module_judges_and_maps_exit_codes():
    """No verdict-to-text or verdict-to-exit table outside kvconv/check/verdict.py (and schemas/codes.json)."""
    words = {"valid", "INVALID", "FAILED", "NOTHING CHECKED", "INCOMPLETE", "UNREADABLE"}
    offenders = []
    for py in (ROOT / "kvconv").rglob("*.py"):
        if py.name == "verdict.py":
            continue
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.Dict) and len(node.keys) >= 3:
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if {"ok", "failed"} <= keys or {"nothing-checked", "incomplete"} <= keys:
                    offenders.append(f"{py.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "EXIT_CODES" for t in node.targets):
                offenders.append(f"{py.relative_to(ROOT)}:{node.lineno} EXIT_CODES")
    assert not offenders, f"a verdict table outside kvconv/check/verdict.py: {offenders} ({sorted(words)})"


def test_the_canary_commands_do_not_import_each_other():
    """cli/canary.py renders the page canary and calls cli/canary_writes.py for --writes; never the other way."""
    src = (ROOT / "kvconv" / "cli" / "canary_writes.py").read_text()
    assert not re.search(r"kvconv\.cli(\.canary\b(?!_writes)| import canary\b)", src)
    assert not re.search(r"lines\[-?\d*:?-?\d*\] =", src + (ROOT / "kvconv" / "cli" / "canary.py").read_text())


def test_every_command_renders_a_run():
    """Every command module that reads dumps goes through kvconv.open (kvconv/run.py)."""
    for mod in ("core", "canary", "emit", "reconcile", "report"):
        src = (ROOT / "kvconv" / "cli" / f"{mod}.py").read_text()
        assert "kvconv.open(" in src, mod
        assert "from kvconv.check.validate import" not in src, mod
    assert "kvconv.open(" in (ROOT / "kvconv" / "capture" / "record.py").read_text()


def test_the_join_is_loaded_once_per_context():
    with kvconv.open(QWEN) as run:
        t, xj = run.dumps[0].launches(0)
        assert run.dumps[0].launches(0)[0] is t
        assert t.n == 1_320


def test_the_verdicts_words_are_written_only_in_the_table():
    """No command spells a verdict's word itself (docstrings aside): they say schemas/codes.json's, through
    kvconv.check.verdict."""
    import re as re_

    words = re_.compile(r"\b(FAILED|INCOMPLETE|NOTHING CHECKED|INVALID|UNREADABLE)\b")
    found = []
    for py in (ROOT / "kvconv").rglob("*.py"):
        if py.relative_to(ROOT).as_posix() == "kvconv/check/verdict.py":
            continue
        tree = ast.parse(py.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        found += [f"{py.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                  and words.search(n.value) and n.value != "UNREADABLE"]
    assert not found, found


def test_a_converter_computes_the_dumps_own_validation_once():
    """The Run's dump owns its checks: a converter that states the verdict feeds them (one pass), and the dump's
    validation is that report, not a second one; asked first, validate's report is the one the converter's line
    states (no climb back through an adopt)."""
    from kvconv.emit import EmitOptions

    with tempfile.TemporaryDirectory() as tmp, kvconv.open(STALE) as run:
        dr = run.dumps[0]
        res = run.to_perfetto(os.path.join(tmp, "t.pftrace"), options=EmitOptions(verdict=True, progress=False))
        assert res.verdicts[0] is dr.validation is dr.checking().finish()
        assert run.exit_code == 1
    with tempfile.TemporaryDirectory() as tmp, kvconv.open(STALE) as run:
        rep = run.validation
        res = run.to_chrome(os.path.join(tmp, "t.json"), options=EmitOptions(verdict=True, progress=False))
        assert res.verdicts[0] is rep


def test_validate_takes_an_open_dump_and_a_path_alike():
    from kvconv.check.validate import validate
    from kvconv.format import dump

    with dump.scan(STALE, options=dump.ReadOptions(verify_checksums=False)) as d:
        a = validate(d).to_dict()
        assert d.groups  # left open: the caller's
    assert a == validate(STALE).to_dict()
