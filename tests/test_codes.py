"""The code registry (schemas/codes.json) names every code kvconv reports, and only those.

Two witnesses of "reports": the source (every string that flows into a ``code``: ``Finding(sev, CODE, ...)``,
``code=CODE``, ``code = CODE`` class attributes and assignments, a function's ``code`` parameter at its call sites,
``for ..., code, ... in ((..., CODE, ...), ...)``), and the output of every committed fixture (validate with its
reconcile and canary checks, read in-process, and every golden output file's finding lines and JSON ``code``s).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, run_cli
from kvconv.check import validate
from kvconv.format import codes

CODE_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


def _consts(node) -> list[str]:
    """The string constants an expression can evaluate to (through conditional and boolean expressions)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _consts(node.body) + _consts(node.orelse)
    if isinstance(node, ast.BoolOp):
        return [c for v in node.values for c in _consts(v)]
    return []


def _name(f) -> str | None:
    return f.id if isinstance(f, ast.Name) else (f.attr if isinstance(f, ast.Attribute) else None)


def _code_params(trees) -> dict[str, set[int]]:
    """Functions with a parameter named ``code``: its positional index at call sites (``self`` not counted), for
    every function of that name (several classes have an ``add``)."""
    out: dict[str, set[int]] = {}
    for tree in trees:
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in n.args.args]
                if "code" in names:
                    out.setdefault(n.name, set()).add(names.index("code") - (names[0] in ("self", "cls")))
    return out


def _values(n, params: dict[str, set[int]]) -> list[str]:
    vals: list[str] = []
    if isinstance(n, ast.Call):
        fn = _name(n.func)
        vals += [c for kw in n.keywords if kw.arg == "code" for c in _consts(kw.value)]
        if fn == "Finding" and len(n.args) > 1:
            vals += _consts(n.args[1])
        else:
            vals += [c for i in params.get(fn, ()) if i < len(n.args) for c in _consts(n.args[i])]
    elif isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
        for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
            if isinstance(t, ast.Name) and t.id == "code":
                vals += _consts(n.value)
            elif isinstance(t, ast.Tuple) and isinstance(n.value, ast.Tuple):
                vals += [c for tt, vv in zip(t.elts, n.value.elts)
                         if isinstance(tt, ast.Name) and tt.id == "code" for c in _consts(vv)]
    elif isinstance(n, ast.For) and isinstance(n.iter, (ast.Tuple, ast.List)):
        if isinstance(n.target, ast.Name) and n.target.id == "code":
            vals += [c for e in n.iter.elts for c in _consts(e)]
        elif isinstance(n.target, ast.Tuple):
            idx = [i for i, t in enumerate(n.target.elts) if isinstance(t, ast.Name) and t.id == "code"]
            for e in n.iter.elts:
                if isinstance(e, ast.Tuple) and idx and idx[0] < len(e.elts):
                    vals += _consts(e.elts[idx[0]])
    return vals


def source_codes(root: Path = ROOT / "kvconv") -> dict[str, str]:
    """Every code the source can report -> one place that reports it."""
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    trees = {p: ast.parse(p.read_text(), str(p)) for p in files}
    params = _code_params(trees.values())
    found: dict[str, str] = {}
    for p, tree in trees.items():
        for n in ast.walk(tree):
            for v in _values(n, params):
                if CODE_RE.match(v):
                    found.setdefault(v, f"{p}:{n.lineno}")
    return found


def _dumps() -> list[Path]:
    return sorted(p for p in FIXTURES.rglob("*.kvdump"))


def fixture_findings() -> list:
    """The findings of validate (structure, schema, semantics, reconcile, canary) on every committed dump, as read
    and as salvaged."""
    out = []
    for p in _dumps():
        for salvage in (False, True):
            out += validate.validate(p, options=validate.ValidateOptions(salvage=salvage)).findings
    return out


_LINE = re.compile(r"^(error|warning|info) ([a-z0-9-]+) ", re.M)


def golden_codes() -> dict[str, str]:
    """Codes in the committed golden outputs: finding lines (``error CODE path: ...``) and JSON ``"code"`` values."""
    found = {}
    for p in sorted(FIXTURES.rglob("expected/*")) + sorted(FIXTURES.glob("*/*.stdout")) + sorted(
            FIXTURES.glob("*/canary*.json")):
        if not p.is_file() or p.suffix == ".sha256":
            continue
        text = p.read_text(errors="replace")
        for m in _LINE.finditer(text):
            found.setdefault(m.group(2), str(p.relative_to(ROOT)))
        for m in re.finditer(r'"code": "([a-z0-9-]+)"', text):
            found.setdefault(m.group(1), str(p.relative_to(ROOT)))
    return found


@pytest.fixture(scope="module")
def findings():
    return fixture_findings()


@pytest.fixture(scope="module")
def kvconv_codes() -> dict[str, str]:
    """source_codes() of kvconv/, parsed once for the tests that read it (~3 s a scan)."""
    return source_codes()


def test_every_code_in_the_source_is_registered(kvconv_codes):
    missing = {c: where for c, where in kvconv_codes.items() if c not in codes.CODES}
    assert not missing, f"add these to schemas/codes.json (then python -m kvconv.formatdoc findings): {missing}"


def test_every_code_fixtures_produce_is_registered_with_its_severity(findings):
    assert len(findings) > 50
    unknown = sorted({f.code for f in findings} - set(codes.CODES))
    assert not unknown, f"fixtures produce codes schemas/codes.json lacks: {unknown}"
    wrong = sorted({(f.code, f.severity) for f in findings if f.severity not in codes.CODES[f.code].severity})
    assert not wrong, f"severities schemas/codes.json does not list: {wrong}"
    golden = {c: p for c, p in golden_codes().items() if c not in codes.CODES}
    assert not golden, f"golden outputs hold codes schemas/codes.json lacks: {golden}"


def test_every_registered_code_is_used(findings, kvconv_codes):
    used = set(kvconv_codes) | {f.code for f in findings} | set(golden_codes())
    unused = sorted(set(codes.CODES) - used)
    assert not unused, f"schemas/codes.json lists codes nothing reports: {unused}"


def test_the_scan_sees_each_way_a_code_is_written(tmp_path):
    """The scanner is what keeps the registry honest: each spelling of a code it must see, in a toy package."""
    (tmp_path / "m.py").write_text('''
class E(Exception):
    code = "class-attr"
def helper(sev, code, msg): pass
class O:
    def helper(self, i, order, sev, code, msg): pass
def f(x):
    O().helper(1, 2, "error", "method-param", "m")
    Finding("error", "positional", "m")
    raise E("m", code="keyword")
    code, msg = "tuple-assign", "m"
    helper("error", "param-call" if x else "param-other", "m")
    for which, code in (("a", "loop-tuple"), ("b", "loop-other")):
        pass
    other("error", "not-a-code", "m")
''')
    assert set(source_codes(tmp_path)) == {"class-attr", "positional", "keyword", "tuple-assign", "param-call",
                                           "param-other", "loop-tuple", "loop-other", "method-param"}


def test_unreadable_is_the_registry_and_decides_exit_2(tmp_path):
    assert validate.UNREADABLE == frozenset(c for c, e in codes.CODES.items() if e.unreadable)
    r = run_cli("validate", FIXTURES / "bad" / "bad-magic.kvdump")
    assert r.returncode == 2 and "bad-magic" in codes.UNREADABLE


def test_registry_entries_are_complete():
    raw = json.loads((ROOT / "schemas" / "codes.json").read_text())["codes"]
    for name, c in raw.items():
        assert CODE_RE.match(name), name
        assert set(c) - {"incomplete"} == {"severity", "unreadable", "area", "means", "do"}, name
        assert isinstance(c.get("incomplete", False), bool), name  # makes the verdict incomplete (no error)
        assert c["severity"] and set(c["severity"]) <= {"error", "warning", "info"}, name
        assert c["means"].endswith(".") and c["do"].endswith("."), name
        assert not c["unreadable"] or c["severity"] == ["error"], name


def test_findings_page_is_generated_from_the_registry():
    from kvconv import formatdoc

    page = formatdoc.render_findings()
    assert (ROOT / "docs/FINDINGS.md").read_text() == page, (
        "docs/FINDINGS.md is stale: run python -m kvconv.formatdoc findings > docs/FINDINGS.md")
    for name in codes.CODES:
        assert f"`{name}`" in page
