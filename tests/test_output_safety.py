"""The output path, attacked (issue 28): every command that writes (perfetto, chrome, arrow, report, demo) against a
user's file, a user's folder (with and without --force), the input itself, a missing parent, ``-``, kvconv's own
earlier output; SIGTERM / SIGHUP mid-write; a dead process's temporaries; two writers at once; an unreadable input
among several. Each asserts that no byte of the user's changes, no temporary output survives, and the exit status
is the table's (docs/CLI.md: 1 an output refused, 2 unreadable input, 128 + n a signal).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import FIXTURES, ROOT, Result, run_cli

SMALL = FIXTURES / "bad" / "valid-small.kvdump"
FILE_OUT = {"perfetto": "out.pftrace", "chrome": "out.json", "report": "out.html"}
FOLDER_OUT = {"arrow": "tables", "demo": "demo"}
ALL = {**FILE_OUT, **FOLDER_OUT}


_BATCH = r"""
import io, json, sys
from kvconv.cli import main
res = []
for argv in json.loads(sys.argv[1]):
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.StringIO()
    sys.stdout, sys.stderr = out, err
    code = main(argv)
    out.flush()
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    res.append([code, out.buffer.getvalue().decode("utf-8", "replace"), err.getvalue()])
print(json.dumps(res))
"""


def _batch(*argvs, cwd=None) -> list[Result]:
    """Each argv through ``kvconv.cli.main`` (what the ``kvconv`` script runs), in this process (conftest.run_cli)."""
    return [run_cli(*v, cwd=cwd) for v in argvs]


def _argv(cmd: str, out, *extra) -> list:
    return ([cmd] if cmd == "demo" else [cmd, SMALL]) + ["-o", out, *extra]


def _tree(root) -> dict[str, str]:
    """Every entry under ``root`` (hidden ones too): relative path -> content hash ("dir" for folders)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in files:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def _temps(folder) -> list[str]:
    return [n for n in os.listdir(folder) if ".tmp-" in n or ".old-" in n]


def _refused(r, code: int = 1, *words: str) -> None:
    assert r.returncode == code, (r, words)
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "internal error" not in r.stderr and "Usage:" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


# ---- a user's things are never touched -------------------------------------------------------------------------

def test_force_never_deletes_a_users_folder(tmp_path):
    # The reproduction: `kvconv arrow d.kvdump -o keep --force` emptied keep/ (notes.txt gone, exit 0).
    keep = tmp_path / "keep"
    (keep / "sub").mkdir(parents=True)
    (keep / "sub" / "notes.txt").write_text("mine\n")
    own = tmp_path / "own"
    before = _tree(keep)
    runs = _batch(*[["arrow", SMALL, "-o", keep, *flag] for flag in ([], ["--force"], ["--force-overwrite"])],
                  ["arrow", SMALL, "-o", own, "-q"])
    for r in runs[:3]:
        _refused(r, 1, "sub/notes.txt", "kvconv did not write")
    assert _tree(keep) == before and runs[3].returncode == 0
    # a file the user added into kvconv's own output is as safe
    (own / "mine.txt").write_text("mine")
    before = _tree(tmp_path)
    _refused(_batch(["arrow", SMALL, "-o", own, "--force"])[0], 1, "mine.txt")
    assert _tree(tmp_path) == before
    codes = json.loads((ROOT / "schemas" / "codes.json").read_text())["codes"]
    assert "output-foreign" in codes


def test_a_users_file_and_folder_are_kept(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    src = tmp_path / "run.kvdump"
    shutil.copy(SMALL, src)
    runs, expect = [], []
    for cmd, name in ALL.items():
        f = tmp_path / name
        f.write_bytes(b"mine")
        runs.append(_argv(cmd, f)), expect.append((cmd, "exists"))  # an existing file, no --force
        for flag in ([], ["--force"]):  # a user's folder, with or without --force
            runs.append(_argv(cmd, user, *flag)), expect.append((cmd, "user/"))
        runs.append(_argv(cmd, tmp_path / "missing" / name)), expect.append((cmd, "does not exist"))
        if cmd in FOLDER_OUT:  # a folder output never replaces a file, even with --force; nor goes to stdout
            runs.append(_argv(cmd, f, "--force")), expect.append((cmd, "not a folder"))
            runs.append(_argv(cmd, "-")), expect.append((cmd, "stdout"))
        else:
            for flag in ([], ["--force"]):  # the input itself
                runs.append([cmd, src, "-o", src, *flag]), expect.append((cmd, "input"))
    runs.append(["arrow", src, "-o", src, "--force"]), expect.append(("arrow", "input"))
    before = _tree(tmp_path)
    for r, (cmd, word) in zip(_batch(*runs, cwd=tmp_path), expect):
        _refused(r, 1, word if word != "user/" else ("notes.txt" if cmd in FOLDER_OUT else "is a folder"))
    assert _tree(tmp_path) == before and not _temps(tmp_path)


def test_kvconvs_own_output_is_replaced_and_dash_is_stdout(tmp_path):
    runs = []
    for cmd, name in FILE_OUT.items():
        runs += [_argv(cmd, tmp_path / name, "-q"), _argv(cmd, tmp_path / name, "--force", "-q"), _argv(cmd, "-")]
    runs += [_argv("arrow", tmp_path / "tables", "-q")] * 2  # kvconv's own folder: replaced without --force
    results = _batch(*runs, cwd=tmp_path)
    for r, argv in zip(results, runs):
        assert r.returncode == 0, (argv, r)
    for i in range(len(FILE_OUT)):
        assert results[3 * i + 2].stdout  # -o -: the output on stdout
    assert sorted(os.listdir(tmp_path)) == sorted([*FILE_OUT.values(), "tables"])
    tables = tmp_path / "tables"
    marker = json.loads((tables / ".kvconv-output.json").read_text())
    files = {k for k, v in _tree(tables).items() if v != "dir"} - {".kvconv-output.json"}
    assert marker["kind"] == "arrow" and set(marker["files"]) == files


def test_demo_follows_the_output_rules(tmp_path):
    # It silently replaced a user's qwen3-14b.json; `--force` was "No such option"; -o FILE gave internal error.
    user = tmp_path / "mine"
    user.mkdir()
    (user / "qwen3-14b.json").write_text("{}")
    demo = tmp_path / "demo"
    before = _tree(user)
    runs = _batch(["demo", "-o", user], ["demo", "-o", user, "--force"], ["demo", "-o", demo],
                  ["demo", "-o", demo])
    for r in runs[:2]:
        _refused(r, 1, "qwen3-14b.json")
    assert _tree(user) == before
    assert runs[2].returncode == 0 and runs[3].returncode == 0, runs[2:]  # its own earlier demo is replaced
    assert (demo / "qwen3-14b.pftrace").stat().st_size > 0 and not _temps(tmp_path)
    (demo / "notes.txt").write_text("mine")  # a file added to it makes it the user's
    before = _tree(tmp_path)
    _refused(_batch(["demo", "-o", demo, "--force"])[0], 1, "notes.txt")
    assert _tree(tmp_path) == before


# ---- signals and leftovers -------------------------------------------------------------------------------------

def _generated(tmp_path_factory, name: str, mib: int):
    """A generated dump of ``mib`` MiB (bench/gendump.py), removed when the module's tests are done (not left in
    pytest's base temp folder to the session's end)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gendump

    p = tmp_path_factory.mktemp(name) / f"{name}.kvdump"
    gendump.write(p, gendump.GenOptions(size_bytes=mib << 20))
    yield p
    shutil.rmtree(p.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A dump big enough that its conversion is still writing a second after it starts (~24 MB)."""
    yield from _generated(tmp_path_factory, "big", 24)


def _signals(ignored=()):
    """The child's dispositions: SIGINT, SIGTERM and SIGHUP as a terminal gives them, whatever this process inherited
    (a suite started under nohup, or as a background job of a script, ignores SIGHUP / SIGINT, and a child inherits
    that), except those named ``ignored``."""
    def set_them():
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN if s in ignored else signal.SIG_DFL)
    return set_them


def _start(argv, cwd, ignored=()):
    env = dict(os.environ, PYTHONPATH=str(ROOT), KVCONV_PROGRESS_INTERVAL="3600")
    env.pop("KVCONV_DEBUG", None)
    return subprocess.Popen([sys.executable, "-m", "kvconv", *map(str, argv)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_signals(ignored))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["INT", "TERM", "HUP"])
@pytest.mark.parametrize("cmd", ["perfetto", "chrome", "arrow"])
def test_a_signal_mid_write_leaves_no_temporary(cmd, sig, big, tmp_path):
    # Before: SIGTERM / SIGHUP killed the process (exit -15 / -1) and left .out.*.tmp-* (hundreds of MB at 1 GiB).
    out = tmp_path / ALL[cmd]
    p = _start([cmd, big, "-o", out, "-q"], tmp_path)
    deadline = time.monotonic() + 60
    while not _temps(tmp_path):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.005)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, (p.returncode, err)
    assert err.count("\n") == 1 and "terminated by" in err, err
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


def test_nohup_is_respected(big, tmp_path):
    """Under nohup (SIGHUP ignored when kvconv starts) a hang-up changes nothing: the output is written, exit 0."""
    out = tmp_path / "t.pftrace"
    p = _start(["perfetto", big, "-o", out, "-q"], tmp_path, ignored=(signal.SIGHUP,))
    deadline = time.monotonic() + 60
    while not _temps(tmp_path):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.005)
    p.send_signal(signal.SIGHUP)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0 and err == "", (p.returncode, err)
    assert os.listdir(tmp_path) == ["t.pftrace"] and out.stat().st_size > 0


def test_a_dead_processs_temporaries_are_removed_a_live_ones_kept(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = "out.pftrace"
    stale_file = tmp_path / f".{name}.tmp-{dead.pid}-abc123"
    stale_file.write_bytes(b"x" * 1000)
    stale_dir = tmp_path / f".tables.tmp-{dead.pid}-def456"
    (stale_dir / "sub").mkdir(parents=True)
    live = tmp_path / f".{name}.tmp-{os.getpid()}-ghi789"  # this process: alive
    live.write_bytes(b"y")
    old_style = tmp_path / f".{name}.tmp-q1w2e3r4"  # no pid: whose it is cannot be told, so it stays
    old_style.write_bytes(b"z")
    assert run_cli("perfetto", SMALL, "-o", tmp_path / name, "-q").returncode == 0
    assert run_cli("arrow", SMALL, "-o", tmp_path / "tables", "-q").returncode == 0
    assert sorted(os.listdir(tmp_path)) == sorted([name, "tables", live.name, old_style.name])


@pytest.fixture(scope="module")
def medium(tmp_path_factory):
    """A dump whose conversion outlasts a second process's start (~6 MB): what two writers at once need."""
    yield from _generated(tmp_path_factory, "medium", 6)


def test_two_writers_at_once(medium, tmp_path):
    # Both --force to one file: each writes its own temporary, the renames are atomic: one whole trace either way.
    big = medium
    ref = tmp_path / "ref.pftrace"
    assert run_cli("perfetto", big, "-o", ref, "-q").returncode == 0
    out = tmp_path / "out.pftrace"
    ps = [_start(["perfetto", big, "-o", out, "--force", "-q"], tmp_path) for _ in range(2)]
    for p in ps:
        p.communicate(timeout=120)
        assert p.returncode == 0
    assert out.read_bytes() == ref.read_bytes()
    # Two arrow writers to one new folder: one wins whole, the other replaces it whole (its own kind) or refuses.
    tables = tmp_path / "tables"
    ps = [_start(["arrow", big, "-o", tables, "-q"], tmp_path) for _ in range(2)]
    codes = []
    for p in ps:
        _, err = p.communicate(timeout=120)
        codes.append(p.returncode)
        assert p.returncode in (0, 1) and "internal error" not in err, err
    assert 0 in codes
    marker = json.loads((tables / ".kvconv-output.json").read_text())
    files = {k for k, v in _tree(tables).items() if v != "dir"} - {".kvconv-output.json"}
    assert set(marker["files"]) == files
    assert sorted(os.listdir(tmp_path)) == ["out.pftrace", "ref.pftrace", "tables"]


# ---- several inputs, one unreadable ----------------------------------------------------------------------------

UNREADABLE_CMDS = ["info", "validate", "reconcile", "perfetto", "report", "canary", "diff"]


def _unreadable_argv(cmd: str) -> list[str]:
    argv = [cmd, "b.kvdump"] if cmd == "canary" else [cmd, "a.kvdump", "b.kvdump"]
    return argv + (["-o", f"out-{cmd}"] if cmd in ("perfetto", "report") else [] if cmd == "diff" else ["--json"])


@pytest.fixture(scope="module")
def unreadable_runs() -> dict[str, Result]:
    """Each command of UNREADABLE_CMDS on a readable a.kvdump and an unreadable b.kvdump, run as nobody (root reads
    any file) through ``kvconv.cli.main``, all in one child process (one start-up instead of seven)."""
    d = tempfile.mkdtemp(prefix="kvconv-unreadable-", dir="/tmp")
    try:
        os.chmod(d, 0o777)
        a, b = os.path.join(d, "a.kvdump"), os.path.join(d, "b.kvdump")
        shutil.copy(SMALL, a)
        shutil.copy(SMALL, b)
        os.chmod(a, 0o644)
        os.chmod(b, 0o000)
        env = dict(os.environ, PYTHONPATH=str(ROOT), KVCONV_PROGRESS_INTERVAL="3600")
        env.pop("KVCONV_DEBUG", None)
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                            _BATCH, json.dumps([_unreadable_argv(c) for c in UNREADABLE_CMDS])], cwd=d, env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        return dict(zip(UNREADABLE_CMDS, (Result(*r) for r in json.loads(p.stdout))))
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to drop to nobody")
@pytest.mark.parametrize("cmd", UNREADABLE_CMDS)
def test_an_unreadable_input_is_reported_with_the_others(cmd, unreadable_runs):
    # Before: typer's readable check on DUMPS stopped the run with click's usage text; the readable dump was not
    # reported and --json printed nothing. (Root reads any file, so the run drops to nobody.)
    argv, p = _unreadable_argv(cmd), unreadable_runs[cmd]
    assert p.returncode == 2, p
    assert "Usage:" not in p.stderr and "b.kvdump" in p.stderr and "Permission denied" in p.stderr, p.stderr
    if "--json" in argv:
        doc = json.loads(p.stdout)
        paths = ["b.kvdump"] if cmd == "canary" else ["a.kvdump", "b.kvdump"]
        assert [x["path"] for x in doc["dumps"]] == paths and doc["exit"] == 2
        assert doc["dumps"][-1]["exit"] == 2


def test_a_piped_empty_input_says_empty_input(tmp_path):
    # Before: "empty file (the producer wrote nothing)", about a pipe nothing was written into.
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "kvconv", "validate", "/dev/stdin"], input=b"", env=env,
                       capture_output=True, timeout=120)
    err = p.stderr.decode()
    assert p.returncode == 2 and err.count("\n") == 1 and "empty input" in err and "piped" in err, err
    empty = tmp_path / "empty.kvdump"
    empty.write_bytes(b"")
    r = run_cli("validate", empty)
    assert r.returncode == 2 and "empty file" in r.stderr, r.stderr
