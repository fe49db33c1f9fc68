"""bench/ holds the scripts; what their runs left (logs, JSON) lives in the results archive docs/results/, whose
INDEX.md has a section for every folder, and the lab notes of each study (dated runs, leases, issue logs) are its
NOTES.md, not the user docs; every docs/results/ and bench/ path that the docs, guides, notes, fixture READMEs and
scripts name exists (bench/out/, where the benches write their dumps, is not committed); the docs name no file
outside the repository."""

from __future__ import annotations

import re

from conftest import ROOT

RESULTS = ROOT / "docs" / "results"
PATH = re.compile(r"(?<![\w/])(?:docs/results|bench)/[\w.\-/{},*\[\]]+")


def test_bench_holds_code_only():
    left = [p.relative_to(ROOT).as_posix() for p in (ROOT / "bench").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.parts[len(ROOT.parts) + 1] != "out"
            and p.suffix != ".py"]
    assert not left, f"run results in bench/ (move them to docs/results/, say what they are in INDEX.md): {left}"


def test_index_has_every_folder():
    index = (RESULTS / "INDEX.md").read_text(encoding="utf-8")
    folders = sorted(p.name for p in RESULTS.iterdir() if p.is_dir())
    assert folders
    missing = [f for f in folders if f"\n## {f}\n" not in index]
    assert not missing, f"docs/results/INDEX.md has no section for {missing}"


def _named_paths():
    texts = [*ROOT.glob("docs/*.md"), *ROOT.glob("fixtures/*/README.md"), *ROOT.glob("bench/*.py"), ROOT / "README.md",
             *ROOT.glob("native/scripts/*.sh"), *ROOT.glob("docs/guides/*.md"), *RESULTS.glob("*/NOTES.md")]
    for t in texts:
        for m in PATH.finditer(t.read_text(encoding="utf-8")):
            yield t.relative_to(ROOT).as_posix(), m.group(0).rstrip(".,")


def test_every_named_result_exists():
    named = list(_named_paths())
    assert named
    missing = []
    for where, path in named:
        if path.startswith("bench/out/"):
            continue
        cut = min((i for i in (path.find(c) for c in ("{", "*", "[", "..")) if i >= 0), default=len(path))
        # a pattern (a brace list, a glob, a range of leases): the folder it stands in must exist
        target = ROOT / (path if cut == len(path) else path[:cut].rsplit("/", 1)[0])
        module = ROOT / (path.split(".")[0] + ".py")  # bench/_timing.quietness: a script's function
        if not target.exists() and not module.exists():
            missing.append(f"{where}: {path}")
    assert not missing, missing


USER_DOCS = ("TRACER.md", "BENCH.md", "CANARY.md")


def test_user_docs_hold_no_lab_notes():
    """Issue 51: docs/TRACER.md was ~60% dated issue logs ("lease" 80 times), BENCH.md ~90%: they moved to the
    studies' NOTES.md; what stays is how, what it means, and the current figures with a link to their study."""
    for name in USER_DOCS:
        text = (ROOT / "docs" / name).read_text(encoding="utf-8")
        assert not re.search(r"\blease", text, re.I), f"docs/{name} holds lease notes: move them to docs/results/"
        dated = re.findall(r"^#+ Issue \d+.*$", text, re.M)
        assert not dated, f"docs/{name} holds issue logs: {dated}"
    bench = (ROOT / "docs/BENCH.md").read_text(encoding="utf-8")
    assert "docs/results/" in bench  # the figures link to their study


def test_docs_name_no_file_outside_the_repository():
    outside = re.compile(r"(?<![\w.])(?:/work/|/tmp/|/root/|/home/|\.\./)[\w./-]*")
    pages = [ROOT / "docs/BENCH.md", ROOT / "native/workloads/sglang_plants/README.md", ROOT / "README.md",
             *ROOT.glob("docs/guides/*.md")]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in pages for m in outside.finditer(p.read_text())
             if not m.group(0).startswith("../shared/tools")]  # README: where CI's fresh clone finds the trace tool
    assert not found, found
