"""Declarative golden cases: every ``fixtures/<case>/*.case.json`` is a list of CLI runs with expected outputs.

A run is ``{"name", "args", "exit", "stdout"?, "stderr"?, "files"?}``: ``args`` are passed to ``kvconv`` from the
case folder, ``{tmp}`` in an argument is a fresh temporary folder, ``stdout``/``stderr`` name golden files (paths
relative to the case folder), and ``files`` maps an output path (with ``{tmp}``) to a golden file holding its
SHA-256. ``pytest --update-goldens`` rewrites the golden files; a missing golden fails with the case's name.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conftest import FIXTURES, run_cli


def _runs():
    out = []
    for spec in sorted(FIXTURES.glob("*/*.case.json")):
        for run in json.loads(spec.read_text()):
            out.append(pytest.param(spec.parent, run, id=f"{spec.parent.name}/{run['name']}"))
    return out


def _check(case_dir: Path, rel: str, actual: str, name: str, update: bool) -> None:
    golden = case_dir / rel
    if update:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(actual)
        return
    if not golden.exists():
        pytest.fail(f"golden case {case_dir.name}/{name}: missing golden file {rel} (run pytest --update-goldens)")
    expected = golden.read_text()
    assert actual == expected, f"golden case {case_dir.name}/{name}: output differs from {rel}"


@pytest.mark.parametrize("case_dir,run", _runs())
def test_golden(case_dir: Path, run: dict, tmp_path: Path, update_goldens: bool) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in run["args"]]
    r = run_cli(*args, cwd=case_dir)
    name = run["name"]
    assert r.returncode == run["exit"], (
        f"golden case {case_dir.name}/{name}: exit {r.returncode}, expected {run['exit']}\n{r.stderr}")
    assert "Traceback" not in r.stderr, f"golden case {case_dir.name}/{name} printed a traceback"
    if "stdout" in run:
        _check(case_dir, run["stdout"], r.stdout.replace(str(tmp_path), "{tmp}"), name, update_goldens)
    if "stderr" in run:
        _check(case_dir, run["stderr"], r.stderr.replace(str(tmp_path), "{tmp}"), name, update_goldens)
    for out, rel in run.get("files", {}).items():
        p = Path(out.replace("{tmp}", str(tmp_path)))
        if not p.is_absolute():
            p = case_dir / p
        assert p.exists(), f"golden case {case_dir.name}/{name}: {out} was not written"
        digest = hashlib.sha256(p.read_bytes()).hexdigest() + "\n"
        _check(case_dir, rel, digest, name, update_goldens)
