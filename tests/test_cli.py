"""The CLI as a user meets it: help with examples, exit codes, one-line errors, fast start."""

import re

import pytest

from conftest import FIXTURES, run_cli
from kvconv.cli import app

QWEN = FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump"


def commands():
    import typer.main

    return sorted(typer.main.get_command(app).commands)


@pytest.mark.parametrize("name", commands())
def test_every_command_help_has_an_example(name):
    r = run_cli(name, "--help")
    assert r.returncode == 0
    assert re.search(r"Example:\s+kvconv " + name, r.stdout), r.stdout


@pytest.mark.parametrize("flag", ["--progress", "--salvage", "--force", "--quiet", "--json"])
def test_a_shared_option_reads_the_same_in_every_command(flag):
    """An option several commands take is declared once (kvconv.cli.common): the same spellings, default and help in
    every command that has it, as the CLI builds them for --help."""
    import typer.main

    variants = {}
    for name, cmd in typer.main.get_command(app).commands.items():
        for p in cmd.params:
            if flag in p.opts:
                variants.setdefault((*p.opts, *p.secondary_opts, p.default, p.help), []).append(name)
    assert len(variants) == 1, variants


def test_top_level_help_and_python_m():
    r = run_cli("--help")
    assert r.returncode == 0 and "Example:" in r.stdout
    for c in commands():
        assert c in r.stdout


def test_usage_error_exit_2():
    r = run_cli("info", "--no-such-option", str(QWEN))
    assert r.returncode == 2 and "No such option" in r.stderr
    r = run_cli("no-such-command")
    assert r.returncode == 2


def test_missing_file_one_line():
    r = run_cli("info", "/nonexistent/x.kvdump")
    assert r.returncode == 2
    assert r.stderr == "Error: /nonexistent/x.kvdump: no such file (check the path)\n"


def test_info_shows_published_counts():
    r = run_cli("info", QWEN)
    assert r.returncode == 0
    assert "device_event 114,112 (0 dropped)" in r.stdout
    assert "graph_node 280 (0 dropped)" in r.stdout
    assert "eager_launch 1,040 (0 dropped)" in r.stdout
    assert "1,048,576" in r.stdout


def test_folder_given_as_dump():
    r = run_cli("validate", FIXTURES)
    assert r.returncode == 2 and r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1


def test_demo_runs_the_whole_chain(tmp_path):
    r = run_cli("demo", "-o", tmp_path / "demo")
    assert r.returncode == 0, r.stderr
    for step in ("info", "validate", "reconcile", "perfetto", "chrome", "arrow"):
        assert f"$ kvconv {step} " in r.stdout
    assert "280 graph-node records = 280 expected executions = 280 device events, 0 drops" in r.stdout
    assert (tmp_path / "demo" / "qwen3-14b.pftrace").stat().st_size > 0
    assert (tmp_path / "demo" / "qwen3-14b.json").stat().st_size > 0
    assert list((tmp_path / "demo" / "qwen3-14b-parquet").rglob("*.parquet"))


HEAVY = ("numpy", "pyarrow", "perfetto", "google.protobuf", "jsonschema", "torch")


@pytest.fixture(scope="module")
def help_imports() -> dict:
    """Each command's --help (and kvconv's own, key None) through kvconv.cli.main in one fresh process, in turn: the
    heavy modules each one imported (those not imported before it). One process for all: a heavy import shows at
    the first --help that makes it."""
    import json
    import subprocess
    import sys

    names = [None, *commands()]
    code = ("import sys, contextlib, io, json\nout, before = [], set()\n"
            f"heavy = {sorted({h.split('.')[0] for h in HEAVY})!r}\n"
            "def loaded(): return {m for m in sys.modules if m.split('.')[0] in heavy}\n"
            "from kvconv.cli import main\n"
            "for name in json.loads(sys.argv[1]):\n"
            "    with contextlib.redirect_stdout(io.StringIO()): main(([name] if name else []) + ['--help'])\n"
            "    out.append(sorted(loaded() - before))\n"
            "    before = loaded()\n"
            "print(json.dumps(out))")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(names)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return dict(zip(names, json.loads(r.stdout)))


@pytest.mark.parametrize("name", [None, *commands()])
def test_help_imports_nothing_heavy(name, help_imports):
    """--help stays fast: the command modules keep numpy, pyarrow, protos and jsonschema inside the commands."""
    assert help_imports[name] == [], help_imports
