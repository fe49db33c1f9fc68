"""No import runs back up the house: a room imports only rooms below it, at the top of a module or inside a
function. Read from the code's own imports (ast), so a lazy import inside a function counts as much as one at the
top.

    format/                   the ground of the dump: imports no other kvconv room
    check/, emit/, capture/   stand below the CLI; check/ also below capture/ (it reads dumps, it records none)
    capture/probe/            digest (the maths) <- fused (the GPU path) <- values (the API): never the other way
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kvconv

KVCONV = Path(kvconv.__file__).parent
# the rooms a module of format/ may import besides format/ itself: the ground floor (the version included; never
# the package's face, kvconv/__init__.py, which stands above everything)
GROUND = ("kvconv._workers", "kvconv.clock", "kvconv.memory", "kvconv.names", "kvconv.progress", "kvconv.version",
          "kvconv.wording")


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return [m for m in out if m == "kvconv" or m.startswith("kvconv.")]


def _under(room: str, module: str) -> bool:
    return module == room or module.startswith(room + ".")


def _offending(folder: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    files = sorted((KVCONV / folder).rglob("*.py"))
    assert files, folder
    bad = {}
    for f in files:
        hit = sorted({m for m in _imports(f) if any(_under(r, m) for r in forbidden)})
        if hit:
            bad[str(f.relative_to(KVCONV.parent))] = hit
    return bad


@pytest.mark.parametrize("folder, forbidden", [
    ("emit", ("kvconv.cli",)),
    ("check", ("kvconv.cli", "kvconv.capture", "kvconv.emit")),
    ("capture", ("kvconv.cli", "kvconv.emit")),
    ("join", ("kvconv.cli", "kvconv.check", "kvconv.emit", "kvconv.capture")),
], ids=["emit", "check", "capture", "join"])
def test_room_imports_nothing_above_it(folder, forbidden):
    assert not _offending(folder, forbidden), f"kvconv/{folder} imports from above it"


@pytest.mark.parametrize("folder", ["format", "join", "check", "emit", "look", "demo"])
def test_room_never_imports_the_package_face(folder):
    # kvconv/__init__.py opens runs (kvconv.open), so it stands above these rooms: the version is kvconv.version's
    files = sorted((KVCONV / folder).rglob("*.py"))
    face = {str(f.relative_to(KVCONV.parent)) for f in files if "kvconv" in _imports(f)}
    assert not face, f"import the package's face (from kvconv import ...): {sorted(face)}"


def test_format_stands_on_the_ground():
    above = {}
    for f in sorted((KVCONV / "format").glob("*.py")):
        hit = sorted({m for m in _imports(f) if not any(_under(r, m) for r in ("kvconv.format", *GROUND))})
        if hit:
            above[f.name] = hit
    assert not above, f"kvconv/format imports from above it: {above}"


def test_value_probe_rooms_one_way():
    probe = KVCONV / "capture" / "probe"
    for name, forbidden in (("digest.py", ("kvconv.capture.probe.fused", "kvconv.capture.probe.values",
                                           "kvconv.capture.probe._digest_triton")),
                            ("_digest_triton.py", ("kvconv.capture.probe.fused", "kvconv.capture.probe.values")),
                            ("fused.py", ("kvconv.capture.probe.values",))):
        hit = [m for m in _imports(probe / name) if any(_under(r, m) for r in forbidden)]
        assert not hit, f"{name} imports {hit}"
