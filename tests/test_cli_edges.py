"""The CLI's edges (issue 28): ``-`` reads standard input, through a real pipe as well as a redirect, in every command
that takes a dump, with nothing left in the temp folder; --json and -q on every command that reads a dump; a
read-only output folder and an unwritable HOME. (Ctrl-C mid-write: tests/test_output_safety.py's signal cases.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import FIXTURES, ROOT, run_cli

SMALL = FIXTURES / "bad" / "valid-small.kvdump"


def _env(tmp) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), KVCONV_PROGRESS_INTERVAL="3600", TMPDIR=str(tmp))
    env.pop("KVCONV_DEBUG", None)
    return env


def _piped(argv, data: bytes, cwd, tmp) -> subprocess.CompletedProcess:
    """``cat FILE | kvconv ARGV``: standard input a real pipe (not a file a shell redirected), as users pipe."""
    cat = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    p = subprocess.Popen([sys.executable, "-m", "kvconv", *map(str, argv)], stdin=cat.stdout, cwd=cwd, env=_env(tmp),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cat.stdout.close()
    cat.stdin.write(data)
    cat.stdin.close()
    out, err = p.communicate(timeout=120)
    cat.wait()
    return subprocess.CompletedProcess(argv, p.returncode, out.decode(), err.decode())


def _here(argv, cwd, tmp):
    """The same run in this process (conftest.run_cli): for what is not about the process boundary."""
    return run_cli(*argv, cwd=cwd, env={"TMPDIR": str(tmp)})


def _run(argv, cwd, tmp) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvconv", *map(str, argv)], cwd=cwd, env=_env(tmp),
                          capture_output=True, text=True, timeout=120)


def test_dash_reads_a_pipe_as_the_file(tmp_path):
    # Before: "-: no such file"; and `cat d | kvconv validate /dev/stdin` said "empty input" about a full pipe.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    data = SMALL.read_bytes()
    ref = json.loads(_here(["validate", SMALL, "--json"], tmp_path, tmp).stdout)
    for name in ("-", "/dev/stdin"):
        r = _piped(["validate", name, "--json"], data, tmp_path, tmp)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["dumps"][0]["path"] == name
        assert doc["dumps"][0]["result"]["size"] == ref["dumps"][0]["result"]["size"] == len(data)
        assert doc["dumps"][0]["result"]["groups"] == ref["dumps"][0]["result"]["groups"]
    # report and diff read their dump more than once: standard input is copied once and read again from the copy
    r = _piped(["report", "-", "-o", "r.html"], data, tmp_path, tmp)
    assert r.returncode == 0 and (tmp_path / "r.html").stat().st_size > 10_000, r.stderr
    r = _piped(["diff", "-", SMALL], data, tmp_path, tmp)
    assert r.returncode == 0 and "no change" in r.stdout, (r.stdout, r.stderr)
    r = _piped(["chrome", "-", "-o", "t.json"], data, tmp_path, tmp)
    assert r.returncode == 0, r.stderr
    direct = _here(["chrome", SMALL, "-o", "u.json"], tmp_path, tmp)
    assert direct.returncode == 0
    events = [len(json.loads((tmp_path / n).read_text())["traceEvents"]) for n in ("t.json", "u.json")]
    assert events[0] == events[1] > 0
    assert os.listdir(tmp) == []  # the copy of the pipe is an unlinked file: nothing left in TMPDIR


def test_dash_redirected_and_empty(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with open(SMALL, "rb") as f:  # a redirect: standard input is the file itself, mapped without a copy
        p = subprocess.run([sys.executable, "-m", "kvconv", "info", "-"], stdin=f, env=_env(tmp),
                           capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("-: kvconv dump"), (p.stdout, p.stderr)
    r = _piped(["validate", "-"], b"", tmp_path, tmp)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "empty input" in r.stderr, r.stderr
    r = _run(["validate", "missing.kvdump"], tmp_path, tmp)
    assert r.returncode == 2 and r.stderr == "Error: missing.kvdump: no such file (check the path)\n", r.stderr
    assert os.listdir(tmp) == []


# ---- --json and -q on every command that reads a dump --------------------------------------------------------

def _dump_commands() -> dict:
    import typer.main

    from kvconv import cli

    grp = typer.main.get_command(cli.app)
    out = {}
    for name, cmd in grp.commands.items():
        args = [p for p in cmd.params if p.param_type_name == "argument"]
        if args and "DUMP" in (args[0].metavar or "") or name == "diff":
            out[name] = {o for p in cmd.params for o in getattr(p, "opts", [])}
    return out


def test_every_dump_command_has_json_and_quiet():
    # Before: perfetto, chrome, arrow and report had no --json; canary had no -q.
    cmds = _dump_commands()
    assert {"info", "validate", "reconcile", "canary", "perfetto", "chrome", "arrow", "report", "diff"} <= set(cmds)
    for name, opts in cmds.items():
        assert "--json" in opts and "-q" in opts, (name, sorted(opts))


@pytest.mark.parametrize("cmd,out", [("perfetto", "t.pftrace"), ("chrome", "t.json"), ("arrow", "tables"),
                                     ("report", "r.html")])
def test_json_envelope_of_the_writers(cmd, out, tmp_path):
    import jsonschema

    from kvconv.format import layout

    schema = layout.load_json_schema("cli.schema.json")
    stale = FIXTURES / "writes-stale-pad" / "writes-stale-pad.kvdump"
    r = _here([cmd, stale, "-o", out, "--json"], tmp_path, tmp_path)
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, schema)
    assert doc["command"] == cmd and doc["dumps"][0]["result"] == {"verdict": "failed", "incidents": 2}
    target = tmp_path / out
    size = target.stat().st_size if target.is_file() else sum(p.stat().st_size for p in target.rglob("*")
                                                                if p.is_file())
    assert doc["output"]["bytes"] == size > 0
    assert r.returncode == (1 if cmd == "report" else 0), r.stderr  # report's status is the verdict's
    bad = FIXTURES / "bad" / "bad-magic.kvdump"
    r = _here([cmd, bad, "-o", "x-" + out, "--json"], tmp_path, tmp_path)
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, schema)
    assert r.returncode == 2 and doc["exit"] == 2 and doc["dumps"][0]["error"]["code"] == "bad-magic"
    assert not (tmp_path / ("x-" + out)).exists()
    if cmd != "arrow":
        r = _here([cmd, SMALL, "-o", "-", "--json"], tmp_path, tmp_path)
        assert r.returncode == 2 and "--json prints its document on stdout" in r.stderr, r.stderr


def test_canary_quiet_prints_findings_and_verdict_only(tmp_path):
    stale = FIXTURES / "writes-stale-pad" / "writes-stale-pad.kvdump"
    full = _here(["canary", stale, "--writes"], tmp_path, tmp_path)
    quiet = _here(["canary", stale, "--writes", "-q"], tmp_path, tmp_path)
    assert full.returncode == quiet.returncode == 1
    assert quiet.stdout.splitlines() == full.stdout.splitlines()[1:]
    assert all(ln.startswith("error ") for ln in quiet.stdout.splitlines()[:-1])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to drop to nobody")
@pytest.mark.parametrize("cmd,out", [("perfetto", "t.pftrace"), ("chrome", "t.json"), ("arrow", "tables"),
                                     ("report", "r.html")])
def test_a_read_only_folder_is_refused_in_one_line(cmd, out):
    # A folder the user cannot write (root writes anywhere: the run drops to nobody): exit 1, one line, nothing in it.
    d = tempfile.mkdtemp(prefix="kvconv-readonly-", dir="/tmp")
    try:
        src = os.path.join(d, "d.kvdump")
        shutil.copy(SMALL, src)
        os.chmod(src, 0o644)
        ro = os.path.join(d, "ro")
        os.mkdir(ro)
        os.chmod(d, 0o755)
        os.chmod(ro, 0o555)
        env = dict(os.environ, PYTHONPATH=str(ROOT), KVCONV_PROGRESS_INTERVAL="3600", HOME=d)
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                            "kvconv", cmd, src, "-o", os.path.join(ro, out)], cwd=d, env=env, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 1, (p.returncode, p.stderr)
        assert p.stderr.startswith("Error: ") and p.stderr.count("\n") == 1, p.stderr
        assert "Permission denied" in p.stderr and "internal error" not in p.stderr, p.stderr
        assert os.listdir(ro) == []
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to drop to nobody")
def test_report_with_an_unwritable_home_says_nothing_of_matplotlib():
    # Before: matplotlib's multi-line 'mkdir -p failed for path .../.config/matplotlib' warning on stderr.
    d = tempfile.mkdtemp(prefix="kvconv-home-", dir="/tmp")
    try:
        out = os.path.join(d, "out")
        os.mkdir(out)
        os.chmod(d, 0o755)  # HOME=d: not writable by nobody
        os.chmod(out, 0o777)
        env = dict(os.environ, PYTHONPATH=str(ROOT), KVCONV_PROGRESS_INTERVAL="3600", HOME=d)
        env.pop("MPLCONFIGDIR", None)
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                            "kvconv", "report", str(FIXTURES / "h200-single" / "single.kvdump"), "-o",
                            os.path.join(out, "r.html"), "-q"], cwd=out, env=env, capture_output=True, text=True,
                           timeout=180)
        assert p.returncode == 0 and p.stderr == "", p.stderr
        assert os.path.getsize(os.path.join(out, "r.html")) > 10_000
    finally:
        shutil.rmtree(d, ignore_errors=True)
