"""The drift and edges issue 51 found, each reproduced through the real command (or the docs it contradicts): -q on
info and reconcile; the tables arrow writes against DATASETS.md's list; record's --device-capacity help; TRACER.md's
record synopsis and its block-exit pairing; a converter given an unreadable dump among good ones; the README's exit
codes and console examples; the finding texts' options; kvconv demo interrupted; the README's Python example then the
demo again; force= on the Run's writers; an empty device; reconcile of a canary dump; plurals of bytes; diff's
incident lines; arrow from stdin; the unfinished-dump warning once; usage errors on one line."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest

import kvconv
from conftest import FIXTURES, ROOT, _cli_env, run_cli
from kvconv.check.verdict import EXIT_CODES

QWEN = FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump"
STALE = FIXTURES / "writes-stale-pad" / "writes-stale-pad.kvdump"
CANARY_STALE = FIXTURES / "canary-stale-pad" / "canary-stale-pad.kvdump"
SIGKILLED = FIXTURES / "h200-death-sigkill" / "h200-death-sigkill.kvdump.gz"
BAD = FIXTURES / "bad"
README = (ROOT / "README.md").read_text()


# ---- -q ----------------------------------------------------------------------------------------------------------

def test_quiet_info_and_reconcile_print_only_the_verdict():
    """-q: "only warnings and errors (and the verdict, where the command states one)" (docs/CLI.md)."""
    info = run_cli("info", QWEN, "-q")
    full = run_cli("info", QWEN).stdout.splitlines()
    assert info.returncode == 0 and info.stdout.splitlines() == [line for line in full if line.startswith(
        "warning ")] + [full[-1]], info.stdout
    assert len(info.stdout.splitlines()) == 2  # the coverage-late warning, the verdict
    rec = run_cli("reconcile", QWEN, "-q")
    full = run_cli("reconcile", QWEN).stdout.splitlines()
    assert rec.returncode == 0 and rec.stdout.splitlines() == [line for line in full if line.startswith("warning ")
                                                               ] + [full[-1]], rec.stdout
    assert len(rec.stdout.splitlines()) < len(full)


# ---- DATASETS.md -------------------------------------------------------------------------------------------------

def test_datasets_md_names_every_table_arrow_writes(tmp_path):
    r = run_cli("arrow", QWEN, CANARY_STALE, STALE, "-o", tmp_path / "t")
    assert r.returncode == 0, r.stderr
    written = sorted(p.name for p in (tmp_path / "t").iterdir() if p.is_dir())
    said = re.search(r"- Tables: (.*?)\(docs/OUTPUTS.md", (ROOT / "docs/DATASETS.md").read_text(), re.S)
    assert said, "docs/DATASETS.md lost its Tables line"
    missing = [t for t in written if f"`{t}`" not in said.group(1)]
    assert not missing, f"kvconv arrow writes tables docs/DATASETS.md does not name: {missing}"


# ---- record's help and TRACER.md -----------------------------------------------------------------------------------

def _record_help() -> str:
    return " ".join(run_cli("record", "--help").stdout.split())


def test_record_help_says_how_the_tracer_sizes_the_device_buffer():
    cpp = (ROOT / "native/src/config.cpp").read_text()
    assert "if (total >= 64 * gib) return 2 * gib / ev;" in cpp  # the rule the help must state
    text = _record_help()
    assert "default 1048576" not in text
    assert "33,554,432" in text and "64 GiB" in text, text


def test_tracer_md_synopsis_lists_every_capture_range_and_record_option():
    tracer = (ROOT / "docs/TRACER.md").read_text()
    synopsis = re.search(r"## Use\n\n```\n(kvconv record.*?)```", tracer, re.S).group(1)
    kinds = re.findall(r"^\| `([a-z:A-Z]+)` \| .* \| .* \|$", tracer.split("### A capture range", 1)[1].split(
        "###", 1)[0], re.M)
    assert "nvtx:NAME" in kinds
    listed = re.search(r"--capture-range ([a-zA-Z:|N]+)\]", synopsis).group(1).split("|")
    assert sorted(listed) == sorted(kinds), (listed, kinds)
    import typer.main

    from kvconv.cli import app

    record = typer.main.get_command(app).commands["record"]
    missing = [p.opts for p in record.params if not getattr(p, "hidden", False) and p.name != "help"
               and not any(re.search(rf"\[{o}\b", synopsis) for o in p.opts)]
    assert not missing, f"docs/TRACER.md's synopsis of kvconv record lacks {missing}"


def test_block_exits_are_paired_as_tracer_md_says(tmp_path):
    out = tmp_path / "ee.json"
    assert run_cli("chrome", FIXTURES / "h200-enter-exit" / "enter-exit.kvdump", "-o", out).returncode == 0
    doc = json.loads(out.read_text())
    blocks = [e for e in doc["traceEvents"] if e.get("cat") == "block"]
    assert any(e["dur"] > 0 for e in blocks), "the Chrome trace pairs no block entry with its exit"
    tracer = (ROOT / "docs/TRACER.md").read_text()
    row = next(line for line in tracer.splitlines() if line.startswith("| `KVCONV_EVENTS`"))
    assert "not yet paired" not in row and "pair each entry with its block's exit" in row, row
    assert "not paired into block durations" not in (ROOT / "kvconv/emit/chrome.py").read_text()


# ---- several inputs to a converter ---------------------------------------------------------------------------------

def test_a_converter_with_an_unreadable_dump_writes_nothing_as_cli_md_says(tmp_path):
    empty = tmp_path / "empty.kvdump"
    empty.write_bytes(b"")
    r = run_cli("perfetto", QWEN, empty, "-o", tmp_path / "x.pftrace")
    assert r.returncode == 2 and not (tmp_path / "x.pftrace").exists(), r.stderr
    cli = " ".join((ROOT / "docs/CLI.md").read_text().split())
    assert "for every readable dump" not in cli
    assert "one dump of several that cannot be read (or is damaged) means no output" in cli


# ---- README and CLI.md ---------------------------------------------------------------------------------------------

def test_readme_has_no_figures_a_fresh_clone_cannot_reproduce():
    assert not re.search(r"\d[\d,]* passed|\d+ skipped|\bmin \d+ s\b|\d+ Dec 2026", README), \
        "README.md states dated test counts or durations"
    assert README.startswith("# kvconv\n\n```sh\npython3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && "
                             ".venv/bin/kvconv demo -o kvconv-demo\n.venv/bin/python -m pytest -q -n auto\n```")
    assert "docs/guides/README.md" in README


def test_readme_report_size_is_what_report_writes(tmp_path):
    said = re.search(r"about (\d+) KB \((\d+) plots\) for the 7.4 MB Qwen fixture", " ".join(README.split()))
    assert said, "README.md no longer states the Qwen report's size"
    r = run_cli("report", QWEN, "-o", tmp_path / "q.html", "--json")
    out = json.loads(r.stdout)["output"]
    assert out["plots"] == int(said.group(2)) and abs(out["bytes"] / 1000 - int(said.group(1))) < 0.1 * out[
        "bytes"] / 1000, out
    page = (tmp_path / "q.html").read_text()
    assert page.index("<h2>Verdict</h2>") < page.index("<h3>Incidents (1)</h3>") < page.index("<h3>Agreement</h3>")


def _exit_words(cell: str) -> set[int]:
    return {int(n) for n in re.findall(r"\b(\d) [a-z]", cell.split("exit", 1)[1])}


def test_readme_exit_codes_are_the_commands():
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `kvconv (\w+)[^|]*\| (.*) \|$", README, re.M)}
    assert _exit_words(rows["canary"]) == {EXIT_CODES[v] for v in
                                           ("ok", "failed", "unreadable", "nothing-checked", "incomplete")}
    assert _exit_words(rows["validate"]) == set(EXIT_CODES.values())


def test_docs_console_exit_lines_give_the_command_status():
    """``cmd | tail -1; echo "exit $?"`` prints tail's status: a console example that shows a status after a pipe
    takes the command's (PIPESTATUS)."""
    for page in [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("docs/guides/*.md")]:
        for line in page.read_text().splitlines():
            if re.search(r"(?<!\|)\|(?!\|)", line.split(";")[0]) and 'echo "exit $?"' in line:  # a pipe, not ||
                pytest.fail(f"{page.name}: {line}")


def test_finding_texts_name_options_of_the_commands_they_name():
    """``coverage-late`` is a warning of validate too: the option that makes it an error is named with the command
    that has it; every ``kvconv CMD --option`` a code's text names exists."""
    import typer.main

    from kvconv.cli import app

    commands = typer.main.get_command(app).commands
    codes = json.loads((ROOT / "schemas/codes.json").read_text())["codes"]
    late = codes["coverage-late"]["means"]
    assert "`kvconv reconcile --strict-coverage`" in late or "--strict-coverage" in [
        o for p in commands["validate"].params for o in p.opts], late
    bad = [f"{code}: kvconv {cmd} has no {opt}" for code, c in codes.items() for text in (c["means"], c["do"])
           for cmd, opt in re.findall(r"`kvconv (\w+) (--[a-z-]+)", text)
           if opt not in [o for p in commands[cmd].params for o in p.opts]]
    assert not bad, bad


# ---- kvconv demo interrupted ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("delay", [0.0, 0.3, 0.7, 1.05])
def test_demo_interrupted_leaves_nothing_behind(tmp_path, delay):
    p = subprocess.Popen([sys.executable, "-m", "kvconv", "demo", "-o", "d"], cwd=tmp_path, env=_cli_env(None),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline()  # "demo in d/ ...": the folder's temporary exists from here on
    assert first.startswith("demo in d/"), first
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    left = sorted(x.name for x in tmp_path.iterdir())
    if p.returncode == 0:  # finished before the signal came: the folder is whole
        assert left == ["d"]
        return
    assert p.returncode == 130, (p.returncode, err)
    assert left == [], (left, err)
    assert "Traceback" not in err and err.splitlines()[-1].startswith("Error: "), err


# ---- From Python ---------------------------------------------------------------------------------------------------

def test_readme_python_example_then_the_demo_again(tmp_path, capsys, monkeypatch):
    assert run_cli("demo", "-o", "demo", cwd=tmp_path).returncode == 0
    code = re.search(r"## From Python\n.*?```python\n(.*?)```", README, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    capsys.readouterr()
    again = run_cli("demo", "-o", "demo", cwd=tmp_path)
    assert again.returncode == 0, again.stderr


def test_run_writers_take_force(tmp_path):
    out = tmp_path / "t.pftrace"
    with kvconv.open(QWEN) as run:
        run.to_perfetto(out)
        with pytest.raises(kvconv.format.errors.KvconvError, match="output exists"):
            run.to_perfetto(out)
        before = out.stat().st_mtime_ns
        run.to_perfetto(out, force=True)
        run.to_chrome(tmp_path / "t.json")
        run.to_chrome(tmp_path / "t.json", force=True)
        run.to_arrow(tmp_path / "tabs")
        run.to_arrow(tmp_path / "tabs", force=True)
    assert out.stat().st_mtime_ns != before


# ---- the edges -----------------------------------------------------------------------------------------------------

def test_an_empty_device_is_not_said_to_be_an_empty_pipe():
    r = run_cli("validate", "/dev/null")
    assert r.returncode == 2 and "piped" not in r.stderr and "/dev/null" in r.stderr, r.stderr
    piped = subprocess.run([sys.executable, "-m", "kvconv", "validate", "-"], input=b"", capture_output=True,
                           env=_cli_env(None))
    assert b"nothing was piped in" in piped.stderr


def test_reconcile_of_a_canary_dump_does_not_deny_its_canary_steps():
    r = run_cli("reconcile", CANARY_STALE)
    assert r.returncode == EXIT_CODES["nothing-checked"], r.stdout  # reconcile itself had nothing to match
    assert "no canary or write step" not in r.stdout, r.stdout
    assert "36 canary steps" in r.stdout and "kvconv canary" in r.stdout, r.stdout


def test_one_byte_is_singular(tmp_path):
    one = tmp_path / "one.kvdump"
    one.write_bytes(QWEN.read_bytes()[:1])
    r = run_cli("validate", one)
    assert r.returncode == 2 and "1 bytes" not in r.stderr and "1 byte into" in r.stderr, r.stderr


def test_diff_names_a_new_incident_by_its_code_and_place():
    r = run_cli("diff", BAD / "valid-small.kvdump", BAD / "checksum-mismatch.kvdump")
    assert r.returncode == 1
    line = next(x for x in r.stdout.splitlines() if "error-incidents" in x)
    assert " : " not in line and "error payload-checksum" not in line, line
    assert "1 new in B: payload-checksum: byte 1552: group 6:" in line, line


def test_arrow_from_stdin_names_its_run_stdin(tmp_path):
    with open(QWEN, "rb") as f:
        p = subprocess.run([sys.executable, "-m", "kvconv", "arrow", "-", "-o", "t"], stdin=f, cwd=tmp_path,
                           capture_output=True, text=True, env=_cli_env(None))
    assert p.returncode == 0, p.stderr
    assert [x.name for x in (tmp_path / "t" / "launch").iterdir()] == ["run=stdin"]


def test_the_unfinished_warning_is_said_once_per_dump(tmp_path):
    two = [SIGKILLED, FIXTURES / "h200-death-abort" / "h200-death-abort.kvdump.gz"]
    for args in (["report", *two, "-o", tmp_path / "r.html"], ["perfetto", *two, "-o", tmp_path / "t"],
                 ["diff", *two]):
        r = run_cli(*args, subprocess_=True)  # Python's warning registry is the process's
        assert [r.stderr.count(f"Warning: unfinished {d}") for d in two] == [1, 1], (args[0], r.stderr)


@pytest.mark.parametrize("args", [["validate", "--bogus", "x"], ["bogus"], ["validate"], ["diff", "a.kvdump"],
])
def test_usage_errors_are_one_line(args):
    r = run_cli(*args)
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("Error: "), r.stderr
    assert "--help" in r.stderr or "-h" in r.stderr  # where to look next


def test_no_args_still_prints_the_help():
    r = run_cli()
    assert "Usage: kvconv" in r.stdout + r.stderr and "Commands" in r.stdout + r.stderr


def test_quiet_diff_prints_what_changed_and_the_verdict():
    r = run_cli("diff", BAD / "valid-small.kvdump", BAD / "checksum-mismatch.kvdump", "-q")
    lines = r.stdout.splitlines()
    assert r.returncode == 1 and [x[0] for x in lines[:-1]] == ["!", "!"] and lines[-1].startswith("CHANGED")
