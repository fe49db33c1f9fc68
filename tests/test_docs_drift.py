"""Docs that cannot drift from the code: every ``Example:`` of every command's help runs against a dump the package
makes (``kvconv demo``), in a folder of its own; docs/CLI.md's tables and console examples and docs/REPORT.md's exit
statement against what the commands do; every file docs/DEVELOPING.md names exists."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import typer.main

from conftest import ROOT, _cli_env, run_cli
from kvconv.cli import app

STALE = ROOT / "fixtures" / "writes-stale-pad" / "writes-stale-pad.kvdump"


def _commands():
    return typer.main.get_command(app).commands


def _examples() -> list[tuple[str, str]]:
    """(command, example) for every ``Example:`` line of the app's and each command's help."""
    out = [("kvconv", m) for m in re.findall(r"Example: (.+)", app.info.help or "")]
    for name, cmd in _commands().items():
        out += [(name, m.strip()) for m in re.findall(r"Example: (.+)", cmd.help or "")]
    return out


EXAMPLES = _examples()


def test_every_command_has_an_example_and_none_uses_the_repositorys_fixtures():
    named = {c for c, _ in EXAMPLES}
    assert set(_commands()) <= named, f"commands without an Example: {set(_commands()) - named}"
    assert not [e for _, e in EXAMPLES if "fixtures/" in e], "a wheel user has no fixtures/ folder"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The dump ``kvconv demo`` makes, run from a folder of its own (not the checkout)."""
    where = tmp_path_factory.mktemp("demo")
    r = run_cli("demo", "-o", "kvconv-demo", cwd=where)
    assert r.returncode == 0, r.stderr
    yield where / "kvconv-demo" / "qwen3-14b.kvdump"
    shutil.rmtree(where, ignore_errors=True)  # the suite's temporary space is bounded (conftest)


@pytest.fixture
def folder(tmp_path):
    """An example's folder, emptied after it (each holds copies of the demo's dump and what the example wrote)."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


def _stage(folder, command: str, example: str, dump) -> None:
    """Every dump an example names (``run.kvdump``, ``rank0.kvdump``, ``runs/*.kvdump``) is the demo's dump there, and
    the trace ``kvconv open`` opens is the demo's trace."""
    for word in shlex.split(example):
        if word.endswith(".kvdump"):
            target = folder / word.replace("*", "a")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(dump, target)
        elif command == "open" and word.endswith(".pftrace"):
            shutil.copyfile(dump.parent / "qwen3-14b.pftrace", folder / word)


def _shell(example: str, cwd, *, timeout: float = 300) -> subprocess.CompletedProcess:
    """An example as a person types it, ``kvconv`` the package's entry point (python -m kvconv)."""
    script = f'kvconv() {{ "{sys.executable}" -m kvconv "$@"; }}\n{example}\n'
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=_cli_env(None), capture_output=True, text=True,
                          timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command,example", EXAMPLES, ids=[f"{c}:{e[:40]}" for c, e in EXAMPLES])
def test_help_example_runs(command, example, demo, folder):
    tmp_path = folder
    example = example.split("   (")[0]  # "kvconv demo -o DIR   (then open ...)": the command, not the remark
    assert example.startswith("kvconv ")
    _stage(tmp_path, command, example, demo)
    if command == "record":  # runs a CUDA program under the tracer: here its command line is parsed, not run
        args = shlex.split(example)[2:]
        with _commands()["record"].make_context("record", args) as ctx:
            assert ctx.params["output"] and ctx.args, example
        return
    if command == "open":  # serves once and waits for the UI's fetch: fetched here, on a free port
        port = _free_port()
        p = subprocess.Popen([sys.executable, "-m", "kvconv", *shlex.split(example)[1:], "--port", str(port),
                              "--no-browser", "--timeout", "60"], cwd=tmp_path, env=_cli_env(None),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            for _ in range(200):
                try:
                    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/run.pftrace", timeout=5).read()
                    break
                except OSError:
                    time.sleep(0.05)
            assert body == (tmp_path / "run.pftrace").read_bytes()
            assert p.wait(timeout=30) == 0
        finally:
            p.kill()
        return
    r = _shell(example, tmp_path)
    # the demo's dump has no canary records: kvconv canary says nothing was checked (4), which is its answer
    assert r.returncode in ((0, 4) if command == "canary" else (0,)), (example, r.stdout[-2000:], r.stderr)
    assert "Traceback" not in r.stderr and "Error:" not in r.stderr, (example, r.stderr)


# ---- docs/CLI.md -------------------------------------------------------------------------------------------------

CLI_MD = (ROOT / "docs" / "CLI.md").read_text()


def test_cli_md_exit_table_is_the_codes():
    from kvconv import formatdoc
    from kvconv.check import verdict

    assert CLI_MD == formatdoc.render_cli(), "docs/CLI.md is stale: python -m kvconv.formatdoc cli"
    rows = re.findall(r"^\| `([a-z-]+)` \| (\d) \| ([^|]+) \| ([^|]+) \|", CLI_MD, re.M)
    assert {v: int(e) for v, e, _, _ in rows} == verdict.EXIT_CODES
    assert {v: w.strip() for v, _, w, _ in rows} == verdict.LABELS
    assert {v: w.strip() for v, _, _, w in rows} == verdict.STATES


def test_cli_md_option_table_names_the_commands_that_take_each_option():
    have: dict[str, list[str]] = {}
    for name, cmd in _commands().items():
        for p in cmd.params:
            if not getattr(p, "hidden", False):
                for o in p.opts:
                    have.setdefault(o, []).append(name)
    rows = {}
    for line in CLI_MD.split("## One vocabulary", 1)[1].split("\n## ", 1)[0].splitlines():
        cells = re.split(r"(?<!\\)\|", line)[1:-1]
        if len(cells) == 3 and cells[0].strip().startswith("`"):
            rows[cells[0].strip().strip("`")] = re.sub(r"`[^`]*`", "", cells[1])
    for spelled, option in (("-o/--output PATH", "-o"), ("--json", "--json"), ("--salvage", "--salvage"),
                            ("--relaxed", "--relaxed"), ("-q/--quiet", "-q"), ("--join", "--join")):
        named = set(re.findall(r"[a-z]+", rows[spelled])) & set(_commands())
        assert named == set(have[option]), f"docs/CLI.md's {spelled} row: {sorted(named)} != {sorted(have[option])}"


def test_cli_md_console_examples_print_what_they_say(tmp_path):
    """Each ``$ command`` of docs/CLI.md's console blocks, run in a folder holding the repository's fixtures, prints
    the lines below it."""
    os.symlink(ROOT / "fixtures", tmp_path / "fixtures")
    blocks = re.findall(r"```console\n(.*?)```", CLI_MD, re.S)
    assert blocks
    for block in blocks:
        for cmd, expected in re.findall(r"^\$ (.+)\n((?:(?!\$ ).*\n)*)", block, re.M):
            r = _shell(cmd, tmp_path)
            assert (r.stdout + r.stderr).splitlines() == expected.splitlines() or \
                sorted((r.stdout + r.stderr).splitlines()) == sorted(expected.splitlines()), (cmd, r.stdout, r.stderr)


# ---- docs/guides --------------------------------------------------------------------------------------------------

GUIDES = ROOT / "docs" / "guides"
_BLOCK = re.compile(r"(<!-- gpu -->\n)?```(sh|console)\n(.*?)```", re.S)


def _guide_blocks() -> list[tuple[str, bool, str, str]]:
    """(guide, marked gpu, sh|console, the block) for every shell block of docs/guides/*.md."""
    return [(g.name, bool(m.group(1)), m.group(2), m.group(3)) for g in sorted(GUIDES.glob("*.md"))
            for m in _BLOCK.finditer(g.read_text())]


GUIDE_BLOCKS = _guide_blocks()


def test_guides_exist_and_hold_commands():
    names = {g for g, *_ in GUIDE_BLOCKS}
    assert {"README.md", "pytorch.md", "options.md", "verdict.md"} <= names, names
    assert any(gpu for _, gpu, _, _ in GUIDE_BLOCKS) and any(not gpu for _, gpu, _, _ in GUIDE_BLOCKS)


@pytest.mark.parametrize("guide,gpu,kind,block", GUIDE_BLOCKS,
                         ids=[f"{g}:{i}" for i, (g, *_) in enumerate(GUIDE_BLOCKS)])
def test_guide_block_runs(guide, gpu, kind, block, demo, folder):
    """Each shell block of a guide, as a user types it, in a folder where every ``*.kvdump`` it names is the demo's
    dump and the repository's fixtures/ are at hand: exit 0, no traceback. A block marked ``<!-- gpu -->`` needs a
    GPU: its ``kvconv record`` lines are parsed (options and command real), nothing is run."""
    if gpu:
        for line in block.replace("\\\n", " ").splitlines():  # a command continued over lines is one line
            if line.startswith("kvconv record "):
                args = shlex.split(line)[2:]
                with _commands()["record"].make_context("record", args) as ctx:
                    assert ctx.params["output"] and ctx.args, line
        return
    os.symlink(ROOT / "fixtures", folder / "fixtures")
    if kind == "console":  # $ command, then what it prints
        for cmd, expected in re.findall(r"^\$ (.+)\n((?:(?!\$ ).*\n)*)", block, re.M):
            _stage(folder, "guide", cmd, demo)
            r = _shell(cmd, folder)
            assert (r.stdout + r.stderr).splitlines() == expected.splitlines(), (guide, cmd, r.stdout, r.stderr)
        return
    words = [w for line in block.splitlines() if not line.lstrip().startswith("#") for w in line.split()]
    _stage(folder, "guide", " ".join(w for w in words if "/" not in w), demo)  # not what the block makes
    r = _shell("set -e\n" + block, folder)  # a pipeline's status is its last command's, as in a user's shell
    assert r.returncode == 0 and "Traceback" not in r.stderr, (guide, block, r.stdout[-2000:], r.stderr[-2000:])


def test_guides_link_what_exists_and_verdict_codes_are_current():
    from kvconv import formatdoc

    assert (GUIDES / "verdict.md").read_text() == formatdoc.render_verdict_guide(), (
        "docs/guides/verdict.md is stale: python -m kvconv.formatdoc verdict > /tmp/v.md && cp /tmp/v.md "
        "docs/guides/verdict.md")
    written_elsewhere = {"vllm.md", "sglang.md"}  # the engine guides: their own branches (issue 51)
    missing = []
    for g in sorted(GUIDES.glob("*.md")):
        text = g.read_text()
        for target in re.findall(r"\]\(([^)#:]+)\)", text):
            if not (g.parent / target).exists() and target not in written_elsewhere:
                missing.append(f"{g.name}: {target}")
        for ref in re.findall(r"(?<![\w/])((?:docs|native|kvconv|schemas|fixtures|tests|bench)/[\w./-]+\w)", text):
            if not (ROOT / ref).exists() and not any(c in ref for c in "*%") and not ref.startswith("native/build"):
                missing.append(f"{g.name}: {ref}")
    assert not missing, missing


# ---- docs/REPORT.md ----------------------------------------------------------------------------------------------

def test_report_md_exit_statement_is_what_report_does(tmp_path):
    text = (ROOT / "docs" / "REPORT.md").read_text()
    stated = re.search(r"Exit status: once the page is written, the worst dump's verdict \(([^)]*)\)", text)
    assert stated, "docs/REPORT.md no longer says report's exit status is the verdict's"
    from kvconv.check.verdict import EXIT_CODES

    for code, word in re.findall(r"(\d) ([a-z ]+?)(?:,|:)", stated.group(1)):
        assert EXIT_CODES[word.strip().replace(" ", "-")] == int(code), (code, word)
    r = run_cli("report", STALE, "-o", tmp_path / "r.html", "-q")
    assert r.returncode == EXIT_CODES["failed"] and (tmp_path / "r.html").stat().st_size > 0
    assert r.stderr.startswith(f"Warning: {STALE}: verdict FAILED (2 incidents)"), r.stderr


# ---- docs/DEVELOPING.md ------------------------------------------------------------------------------------------

def test_developing_md_names_only_files_that_exist():
    text = (ROOT / "docs" / "DEVELOPING.md").read_text()
    named = set(re.findall(r"`?((?:kvconv|schemas|native|tests|docs|bench|tools|fixtures)/[A-Za-z0-9_./-]+)", text))
    missing = []
    for ref in sorted(named):
        ref = ref.rstrip(".,:;)`")
        path = ROOT / ref.split("::")[0]
        if "<" in ref or "*" in ref:
            continue
        if not path.exists():
            missing.append(ref)
    assert not missing, f"docs/DEVELOPING.md names files that do not exist: {missing}"
    # module.attribute references: kvconv.x.y names a module (or a module's attribute) that imports
    import importlib

    bad = []
    for ref in sorted(set(re.findall(r"`(kvconv(?:\.[a-z_]+)+)", text))):
        parts = ref.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                bad.append(ref)
            break
    assert not bad, f"docs/DEVELOPING.md names what does not exist: {bad}"


def test_report_md_diff_checks_and_defaults_are_the_codes():
    """docs/REPORT.md's diff table names every check kvconv diff makes, with its options' defaults; two identical
    failed dumps exit 0, as it says."""
    text = (ROOT / "docs" / "REPORT.md").read_text().split("## `kvconv diff", 1)[1]
    diff = _commands()["diff"]
    for p in diff.params:
        for o in p.opts:
            if o.startswith("--max-") or o == "--noise-factor":
                said = re.search(rf"`{o}` \(([\d.]+)\)", text)
                assert said and float(said.group(1)) == p.default, (o, p.default)
    r = run_cli("diff", STALE, STALE, "--json")
    checks = {c["check"].split(".")[0].split(":")[0] for c in json.loads(r.stdout)["diff"]["checks"]}
    assert r.returncode == 0 and "two identical failed dumps exit 0" in text
    missing = [c for c in checks if f"`{c}" not in text]
    assert not missing, f"docs/REPORT.md's diff table lacks {missing}"
