"""kvconv/join/ (the launch table and the joins it stands on) lies below both kvconv.check and kvconv.emit: none of
its modules imports either, at the top or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import kvconv.join

JOIN = Path(kvconv.join.__file__).parent


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module)
    return out


def test_join_imports_neither_check_nor_emit():
    files = sorted(JOIN.glob("*.py"))
    assert len(files) > 1
    above = {f.name: m for f in files for m in _imports(f)
             if m.split(".")[:2] in (["kvconv", "check"], ["kvconv", "emit"])}
    assert not above, f"kvconv/join imports from above it: {above}"
