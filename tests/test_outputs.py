"""Outputs (issue 7): atomic writes (a temporary name, renamed on success, removed on failure), never overwriting or
deleting an input, and identical bytes for identical input."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from conftest import FIXTURES, run_cli
from kvconv import dump
from kvconv.atomic import atomic_output, check_not_input
from kvconv.errors import OutputError

SMALL = FIXTURES / "bad" / "valid-small.kvdump"
EMITTERS = {"perfetto": "out.pftrace", "chrome": "out.json", "arrow": "tables"}


def _commands() -> set[str]:
    import typer.main

    from kvconv.cli import app

    return set(typer.main.get_command(app).commands)


def _emitter(name: str) -> None:
    assert name in _commands(), f"no `kvconv {name}` command"


def _tree(p) -> dict[str, str]:
    """Relative path -> content hash of a file or of every file under a folder."""
    p = str(p)
    if os.path.isfile(p):
        return {".": hashlib.sha256(open(p, "rb").read()).hexdigest()}
    out = {}
    for root, _, files in os.walk(p):
        for f in files:
            q = os.path.join(root, f)
            out[os.path.relpath(q, p)] = hashlib.sha256(open(q, "rb").read()).hexdigest()
    return out


# ---------------------------------------------------------------------------------------------------------------
# kvconv.atomic


def test_atomic_file_success_and_failure(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_output(target) as tmp:
            tmp.write_bytes(b"half-written")
            raise RuntimeError("the writer failed")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]  # no temporary left
    with atomic_output(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".out.bin.tmp-")
        tmp.write_bytes(b"new")
        assert target.read_bytes() == b"old"  # nothing visible until the rename
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_atomic_folder_success_and_failure(tmp_path):
    target = tmp_path / "tables"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_output(target, directory=True) as tmp:
            (tmp / "part.arrow").write_text("half")
            raise RuntimeError("the writer failed")
    assert sorted(os.listdir(target)) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tables"]
    with atomic_output(target, directory=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(os.listdir(target)) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tables"]


def test_never_overwrites_an_input(tmp_path, monkeypatch):
    inp = tmp_path / "run.kvdump"
    shutil.copy(SMALL, inp)
    (tmp_path / "link.kvdump").symlink_to(inp)
    os.link(inp, tmp_path / "hard.kvdump")
    monkeypatch.chdir(tmp_path)
    for out in (inp, "run.kvdump", "./run.kvdump", tmp_path / "sub" / ".." / "run.kvdump", "link.kvdump",
                "hard.kvdump"):
        with pytest.raises(OutputError) as e:
            check_not_input(out, [inp])
        assert e.value.code == "output-is-input"
    check_not_input(tmp_path / "other.kvdump", [inp])


def test_never_replaces_a_folder_holding_an_input(tmp_path):
    folder = tmp_path / "tables"
    folder.mkdir()
    inp = folder / "run.kvdump"
    shutil.copy(SMALL, inp)
    with pytest.raises(OutputError) as e:
        with atomic_output(folder, inputs=[inp], directory=True):
            pass
    assert e.value.code == "output-holds-input"
    assert inp.read_bytes() == SMALL.read_bytes()


def test_dump_writer_is_atomic(tmp_path):
    import numpy as np

    from kvconv import layout

    path = tmp_path / "d.kvdump"
    with pytest.raises(RuntimeError):
        with dump.new(path) as w:
            w.write_records("device_event", np.zeros(3, dtype=layout.DTYPES["device_event"]))
            raise RuntimeError("the producer died")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------------------
# the emitters through the CLI


@pytest.mark.parametrize("emitter", sorted(EMITTERS))
def test_emitter_refuses_to_overwrite_its_input(emitter, tmp_path):
    _emitter(emitter)
    inp = tmp_path / "run.kvdump"
    shutil.copy(SMALL, inp)
    (tmp_path / "link.kvdump").symlink_to(inp)
    before = _tree(tmp_path)
    for out in (inp, tmp_path / "link.kvdump"):
        r = run_cli(emitter, inp, "-o", out)
        assert r.returncode in (1, 2), r
        assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
        assert _tree(tmp_path) == before


@pytest.mark.parametrize("emitter", sorted(EMITTERS))
def test_emitter_failure_leaves_nothing_and_keeps_an_old_output(emitter, tmp_path):
    _emitter(emitter)
    bad = tmp_path / "in" / "bad.kvdump"
    bad.parent.mkdir()
    shutil.copy(FIXTURES / "bad" / "bad-magic.kvdump", bad)
    outdir = tmp_path / "out"
    outdir.mkdir()
    out = outdir / EMITTERS[emitter]
    r = run_cli(emitter, bad, "-o", out)
    assert r.returncode == 2 and r.stderr.startswith("Error: "), r
    assert list(outdir.iterdir()) == []  # neither the output nor a temporary
    # An output from an earlier run survives a failed run untouched.
    r = run_cli(emitter, SMALL, "-o", out)
    assert r.returncode == 0, r.stderr
    before = _tree(outdir)
    r = run_cli(emitter, bad, "-o", out)
    assert r.returncode == 2
    assert _tree(outdir) == before


@pytest.mark.parametrize("emitter", sorted(EMITTERS))
def test_emitter_bytes_are_deterministic(emitter, tmp_path):
    _emitter(emitter)
    src = FIXTURES / "synthetic-reconcile" / "two-contexts.kvdump"
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    name = EMITTERS[emitter]
    assert run_cli(emitter, src, "-o", a / name).returncode == 0
    assert run_cli(emitter, src, "-o", b / name).returncode == 0
    ta, tb = _tree(a / name), _tree(b / name)
    assert ta and ta == tb
    # Run again over the first output: replaced by identical bytes, nothing else left in the folder.
    assert run_cli(emitter, src, "-o", a / name).returncode == 0
    assert _tree(a / name) == ta and sorted(os.listdir(a)) == [name]


@pytest.mark.parametrize("args", [["info", "--json"], ["validate", "--json"], ["reconcile", "--json"],
                                  ["canary", "--json"], ["info"], ["validate"]])
def test_reports_are_deterministic(args):
    cmd = args[0]
    assert cmd in _commands(), f"no `kvconv {cmd}` command"
    src = FIXTURES / "canary-clean" / "canary-clean.kvdump"
    r1, r2 = run_cli(*args, src), run_cli(*args, src)
    assert r1.returncode == r2.returncode and r1.returncode in (0, 1)
    assert r1.stdout == r2.stdout and r1.stdout


@pytest.mark.parametrize("emitter", sorted(EMITTERS))
def test_emitter_on_a_full_disk_says_so_and_leaves_nothing(emitter, tmp_path):
    """A write that fails (here a 1 MiB file-size limit: EFBIG, as ENOSPC would on a full disk) is one line naming
    the output, exit 1, and no partial output or temporary left behind."""
    import resource
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    src = FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump"
    out = tmp_path / EMITTERS[emitter]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("KVCONV_DEBUG", None)
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    p = subprocess.run([sys.executable, "-m", "kvconv", emitter, str(src), "-o", str(out), "-q"], env=env,
                       capture_output=True, text=True, preexec_fn=limit, timeout=300)
    assert p.returncode == 1, p
    assert p.stderr == f"Error: {out}: cannot write output: File too large (free space on its filesystem or choose " \
                       "another -o path)\n"
    assert os.listdir(tmp_path) == []
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before
