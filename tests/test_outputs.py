"""Outputs (issue 7): atomic writes (a temporary name, renamed on success, removed on failure), never overwriting or
deleting an input, and identical bytes for identical input."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from conftest import FIXTURES, run_cli
from kvconv.format import dump
from kvconv.format.atomic import MARKER, atomic_output, check_not_input
from kvconv.format.errors import OutputError

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
# kvconv.format.atomic


def test_atomic_file_success_and_failure(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_output(target, force=True) as tmp:
            tmp.write_bytes(b"half-written")
            raise RuntimeError("the writer failed")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]  # no temporary left
    with pytest.raises(OutputError) as e:  # an existing file is kept unless forced
        with atomic_output(target):
            pass
    assert e.value.code == "output-exists" and target.read_bytes() == b"old"
    with atomic_output(target, force=True) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".out.bin.tmp-")
        tmp.write_bytes(b"new")
        assert target.read_bytes() == b"old"  # nothing visible until the rename
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_atomic_folder_success_and_failure(tmp_path):
    target = tmp_path / "tables"
    target.mkdir()
    (target / "old.txt").write_text("old")
    for force in (False, True):  # not kvconv's own folder: kept, even with force
        with pytest.raises(OutputError) as e:
            with atomic_output(target, directory=True, force=force):
                pass
        assert e.value.code == "output-foreign" and "old.txt" in str(e.value)
        assert sorted(os.listdir(target)) == ["old.txt"]
    target = tmp_path / "tables2"
    with atomic_output(target, directory=True, kind="arrow") as tmp:
        (tmp / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_output(target, directory=True, force=True) as tmp:
            (tmp / "part.arrow").write_text("half")
            raise RuntimeError("the writer failed")
    assert sorted(os.listdir(target)) == [MARKER, "old.txt"]
    with atomic_output(target, directory=True, force=True) as tmp:  # kvconv's own of another kind: with force
        (tmp / "new.txt").write_text("new")
    assert sorted(os.listdir(target)) == [MARKER, "new.txt"]
    with atomic_output(target, directory=True) as tmp:  # its own output of the same kind: replaced
        (tmp / "newer.txt").write_text("newer")
    assert sorted(os.listdir(target)) == [MARKER, "newer.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tables", "tables2"]


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

    from kvconv.format import layout

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
    r = run_cli(emitter, bad, "-o", out, "--force")
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
    # Run again over the first output: replaced by identical bytes, nothing else left in the folder (a file needs
    # --force; a folder is kvconv's own earlier output, replaced without it).
    force = ["--force"] if emitter != "arrow" else []
    assert run_cli(emitter, src, "-o", a / name, *force).returncode == 0
    assert _tree(a / name) == ta and sorted(os.listdir(a)) == [name]


@pytest.mark.parametrize("args", [["info", "--json"], ["validate", "--json"], ["reconcile", "--json"],
                                  ["canary", "--json"], ["info"], ["validate"]])
def test_reports_are_deterministic(args):
    cmd = args[0]
    assert cmd in _commands(), f"no `kvconv {cmd}` command"
    src = FIXTURES / "canary-clean" / "canary-clean.kvdump"
    r1, r2 = run_cli(*args, src), run_cli(*args, src)
    assert r1.returncode == r2.returncode and r1.returncode in (0, 1, 4)  # 4: reconcile, canary-only
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


# ---------------------------------------------------------------------------------------------------------------
# issue 12: nothing of the user's is replaced; every -o spelling is a clear error or does what it says


def _one_error(r, code: int = 1) -> None:
    assert r.returncode == code, r
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_arrow_keeps_a_users_folder_and_replaces_only_its_own(tmp_path):
    res = tmp_path / "res"
    res.mkdir()
    (res / "notes.txt").write_text("x")
    r = run_cli("arrow", SMALL, "-o", res)
    _one_error(r)
    assert "--force" in r.stderr
    assert _tree(res) == {"notes.txt": hashlib.sha256(b"x").hexdigest()}
    assert sorted(os.listdir(tmp_path)) == ["res"]  # no temporary left beside it
    # kvconv's own earlier output of the same command is replaced; a file the user added inside it is not lost
    tables = tmp_path / "tables"
    assert run_cli("arrow", SMALL, "-o", tables).returncode == 0
    assert (tables / MARKER).is_file()
    assert run_cli("arrow", SMALL, "-o", tables, "--format", "parquet").returncode == 0
    assert any(p.suffix == ".parquet" for p in tables.rglob("*"))
    (tables / "matches" / "mine.txt").write_text("mine")
    before = _tree(tables)
    _one_error(run_cli("arrow", SMALL, "-o", tables))
    assert _tree(tables) == before
    # --force (and nsys's --force-overwrite) replace kvconv's own output only: a user's folder is kept even so
    for flag in ("--force", "--force-overwrite"):
        _one_error(run_cli("arrow", SMALL, "-o", res, flag))
        assert _tree(res) == {"notes.txt": hashlib.sha256(b"x").hexdigest()}
        (tables / "matches" / "mine.txt").unlink(missing_ok=True)
        assert run_cli("arrow", SMALL, "-o", tables, flag).returncode == 0
        assert (tables / "device_event").is_dir()


@pytest.mark.parametrize("emitter", ["perfetto", "chrome"])
def test_single_file_output_is_kept_unless_forced(emitter, tmp_path):
    out = tmp_path / EMITTERS[emitter]
    out.write_bytes(b"mine")
    _one_error(run_cli(emitter, SMALL, "-o", out))
    assert out.read_bytes() == b"mine" and os.listdir(tmp_path) == [out.name]
    for flag in ("--force", "--force-overwrite"):
        out.write_bytes(b"mine")
        assert run_cli(emitter, SMALL, "-o", out, flag).returncode == 0
        assert out.read_bytes() != b"mine"


@pytest.mark.parametrize("emitter", ["perfetto", "chrome"])
def test_single_file_output_spellings(emitter, tmp_path):
    folder = tmp_path / "adir"
    folder.mkdir()
    r = run_cli(emitter, SMALL, "-o", folder)  # an existing folder: was an internal IsADirectoryError, exit 3
    _one_error(r)
    assert "folder" in r.stderr and os.listdir(folder) == []
    r = run_cli(emitter, SMALL, "-o", "bdir/", cwd=tmp_path)  # a trailing slash: was a file named bdir
    _one_error(r)
    assert sorted(os.listdir(tmp_path)) == ["adir"]
    # -o -: the output on stdout and nothing else there (was a file named "-")
    ref = tmp_path / "ref"
    assert run_cli(emitter, SMALL, "-o", ref).returncode == 0
    p = _run_bytes(emitter, SMALL, "-o", "-", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout == ref.read_bytes()
    assert b"wrote stdout" in p.stderr
    assert sorted(os.listdir(tmp_path)) == ["adir", "ref"]
    if emitter == "chrome":
        import json

        assert json.loads(p.stdout)["traceEvents"]


def _run_bytes(*args, cwd):
    """The CLI with binary stdout."""
    import subprocess
    import sys

    from conftest import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("KVCONV_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "kvconv", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          timeout=300)


def test_arrow_output_spellings(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    inp = tmp_path / "run.kvdump"
    shutil.copy(SMALL, inp)
    (work / "keep.txt").write_text("k")
    before = _tree(tmp_path)
    for out in (".", "..", "-"):  # was: Errno 16 Device or resource busy and a ..old-* folder left behind
        _one_error(run_cli("arrow", inp, "-o", out, cwd=work))
        assert _tree(tmp_path) == before and sorted(os.listdir(work)) == ["keep.txt"]
    # a trailing slash on a folder output is fine
    assert run_cli("arrow", inp, "-o", "tables/", cwd=work).returncode == 0
    assert (work / "tables" / "device_event").is_dir()


# ---------------------------------------------------------------------------------------------------------------
# issue 12: an empty or suspect result is said on stderr


@pytest.mark.parametrize("emitter", ["perfetto", "chrome"])
def test_a_filter_keeping_nothing_warns(emitter, tmp_path):
    src = FIXTURES / "h200-single" / "single.kvdump"  # 1,760 device events of graph replays 1..7
    for i, (flag, value, says) in enumerate([("--replays", "100:200", "graph replays in the input: 1..7"),
                                            ("--window", "5000:6000", "they span 0..")]):
        r = run_cli(emitter, src, "-o", tmp_path / f"{i}.out", flag, value, "-q")
        assert r.returncode == 0, r.stderr
        warn = [ln for ln in r.stderr.splitlines() if ln.startswith(f"Warning: {flag} {value} keeps none")]
        assert len(warn) == 1 and "1,760 device events" in warn[0] and says in warn[0], r.stderr
    r = run_cli(emitter, src, "-o", tmp_path / "some.out", "--replays", "2:3", "-q")
    assert r.returncode == 0 and "keeps none" not in r.stderr, r.stderr


@pytest.mark.parametrize("emitter", sorted(EMITTERS))
def test_a_dump_reconcile_fails_on_says_so(emitter, tmp_path):
    sr = FIXTURES / "synthetic-reconcile"
    # fault-dropped-event: the exact join matches every event (no reconcile ran before); fault-extra-replay:
    # unmatched events, the emitters' join is kvconv reconcile's
    for name, code in (("fault-dropped-event", "missing-blocks"), ("fault-extra-replay", "extra-replay")):
        r = run_cli(emitter, sr / f"{name}.kvdump", "-o", tmp_path / f"{name}.{emitter}", "-q")
        assert r.returncode == 0, r.stderr
        line = [ln for ln in r.stderr.splitlines() if "kvconv reconcile FAILED" in ln]
        assert len(line) == 1 and line[0].startswith("Warning: ") and code in line[0], r.stderr
    for src in (sr / "clean-exact.kvdump", FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump"):  # qwen: coverage late, ok
        r = run_cli(emitter, src, "-o", tmp_path / f"{src.stem}.{emitter}", "-q")
        assert r.returncode == 0 and "FAILED" not in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------------------------
# issue 12: block exits are not durations, and nothing says they are


def test_chrome_block_slices_last_from_entry_to_exit(tmp_path):
    """With exit events, each block is one Chrome X slice whose dur is its exit minus its entry (issue 14; issue 12
    had them as two zero-length events). Checked against the dump's own enter/exit pairs."""
    import json

    import numpy as np

    from kvconv.format import dump, layout

    src = FIXTURES / "h200-enter-exit" / "enter-exit.kvdump"  # 1,760 blocks, each with an enter and an exit event
    out = tmp_path / "ee.json"
    r = run_cli("chrome", src, "-o", out, "-q")
    assert r.returncode == 0, r.stderr
    blocks = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("cat") == "block"]
    assert {e["name"] for e in blocks} == {"reshape_and_cache_flash_kernel"} and len(blocks) == 1760
    assert all(e["ph"] == "X" for e in blocks)
    with dump.open(src) as d:
        ev = d.records("device_event", context_id=0)
        kinds = layout.ENUMS["event_kind"]

        def times(kind):  # block key -> %globaltimer of its event of this kind
            m = ev["kind"] == kinds[kind]
            keys = zip(*(ev[f][m].tolist() for f in ("gridid", "tag", "block_x", "block_y", "block_z")))
            return dict(zip(keys, ev["globaltimer"][m].tolist()))

        enter, leave = times("block_enter"), times("block_exit")
    want = np.sort([(int(leave[k]) - int(enter[k])) / 1000 for k in enter])
    assert len(want) == 1760
    np.testing.assert_allclose(np.sort([e["dur"] for e in blocks]), want, atol=1e-3)
