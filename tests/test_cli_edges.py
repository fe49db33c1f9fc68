"""The CLI's edges (issue 28): ``-`` reads standard input, through a real pipe as well as a redirect, in every command
that takes a dump, with nothing left in the temp folder; Ctrl-C (SIGINT) mid-write cleans up as SIGTERM does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import FIXTURES, ROOT

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


def _run(argv, cwd, tmp) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvconv", *map(str, argv)], cwd=cwd, env=_env(tmp),
                          capture_output=True, text=True, timeout=120)


def test_dash_reads_a_pipe_as_the_file(tmp_path):
    # Before: "-: no such file"; and `cat d | kvconv validate /dev/stdin` said "empty input" about a full pipe.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    data = SMALL.read_bytes()
    ref = json.loads(_run(["validate", SMALL, "--json"], tmp_path, tmp).stdout)
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
    direct = _run(["chrome", SMALL, "-o", "u.json"], tmp_path, tmp)
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


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A dump big enough that its conversion is still writing well after it starts (~24 MB)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gendump

    p = tmp_path_factory.mktemp("big") / "big.kvdump"
    gendump.write(p, gendump.GenOptions(size_bytes=24 << 20))
    return p


@pytest.mark.parametrize("cmd,out", [("perfetto", "out.pftrace"), ("arrow", "tables")])
def test_ctrl_c_mid_write_leaves_no_temporary(cmd, out, big, tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    p = subprocess.Popen([sys.executable, "-m", "kvconv", cmd, big, "-o", out, "-q"], cwd=work, env=_env(tmp_path),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(".tmp-" in n for n in os.listdir(work)):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.005)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGINT, (p.returncode, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert os.listdir(work) == []
