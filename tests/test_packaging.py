"""kvconv as a user installs it: a wheel built from this tree, installed into an empty venv, run from another folder.

The demo's input ships as its generator (kvconv/demo/), so ``kvconv demo`` works from any install and writes the
same bytes as the committed fixture.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, run_cli

QWEN = FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump"


def test_demo_writes_the_committed_fixture_from_the_packaged_generator(tmp_path):
    r = run_cli("demo", "-o", tmp_path / "demo")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "demo" / "qwen3-14b.kvdump").read_bytes() == QWEN.read_bytes()
    assert "280 graph-node records = 280 expected executions = 280 device events, 0 drops" in r.stdout
    # A rerun replaces the demo's own folder; one holding a file of the user's is refused, the file kept.
    r = run_cli("demo", "-o", tmp_path / "demo")
    assert r.returncode == 0, r.stdout + r.stderr
    (tmp_path / "demo" / "notes.txt").write_text("mine")
    r = run_cli("demo", "-o", tmp_path / "demo")
    assert r.returncode == 1 and "notes.txt" in r.stderr, r.stdout + r.stderr
    assert (tmp_path / "demo" / "notes.txt").read_text() == "mine"


def _clean_env(venv: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "KVCONV_DEBUG", "KVCONV_TRACER_LIB", "PYTHONHOME")}
    env["PATH"] = str(venv / "bin") + os.pathsep + env.get("PATH", "")
    return env


def _run(args, *, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    # stdin/stdout/stderr are pipes: the commands run without a terminal, as in a script or CI.
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _package_files() -> set[str]:
    want = {str(p.relative_to(ROOT)) for p in (ROOT / "kvconv").rglob("*.py") if "__pycache__" not in p.parts}
    want |= {"kvconv/schemas/" + p.name for p in (ROOT / "schemas").glob("*.json")}
    return want


@pytest.mark.slow
def test_installed_wheel_runs_outside_the_source_tree(tmp_path):
    """CI's check of the install: pip wheel, an empty venv, then every main command and every help Example from a
    folder that is not the source tree (the README's 'embedded fixture' and 'pip install' claims)."""
    # Built from a copy of what the wheel is made of: no build/ or egg-info race with another run in this tree,
    # and proof that nothing else of the checkout is needed.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", *[p.name for p in ROOT.glob("LICENSE*")]):
        shutil.copy2(ROOT / name, src / name)
    for folder in ("kvconv", "schemas"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    whl_dir = tmp_path / "whl"
    p = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check", "-w",
              str(whl_dir), str(src)], cwd=tmp_path, env=dict(os.environ))
    assert p.returncode == 0, p.stdout + p.stderr
    (wheel,) = whl_dir.glob("kvconv-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = _package_files() - names
    assert not missing, f"the wheel lacks {sorted(missing)} (pyproject.toml [tool.setuptools] packages)"
    assert not [n for n in names if n.endswith(".kvdump")], "the wheel ships generators, not dump bytes"
    assert wheel.stat().st_size < 512 * 1024, f"wheel is {wheel.stat().st_size:,} bytes"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = _clean_env(venv)
    py = str(venv / "bin" / "python")
    p = _run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)], cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stdout + p.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    kv = str(venv / "bin" / "kvconv")
    where = _run([py, "-c", "import kvconv; print(kvconv.__file__)"], cwd=elsewhere, env=env)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr

    r = _run([kv, "demo", "-o", "X"], cwd=elsewhere, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (elsewhere / "X" / "qwen3-14b.kvdump").read_bytes() == QWEN.read_bytes()
    assert (elsewhere / "X" / "qwen3-14b.pftrace").stat().st_size > 0
    assert list((elsewhere / "X" / "qwen3-14b-parquet").rglob("*.parquet"))

    single = FIXTURES / "h200-single" / "single.kvdump"
    r = _run([kv, "validate", str(single)], cwd=elsewhere, env=env)
    assert r.returncode == 0 and ": valid (" in r.stdout, r.stdout + r.stderr

    r = _run([kv, "perfetto", str(single), "-o", "single.pftrace"], cwd=elsewhere, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (elsewhere / "single.pftrace").stat().st_size > 0

    # record from a wheel: no native/ to build; the message says how to get the tracer.
    r = _run([kv, "record", "-o", "r.kvdump", "--", "true"], cwd=elsewhere, env=env)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert "make -C native tracer" in r.stderr and "KVCONV_TRACER_LIB=" in r.stderr, r.stderr

    r = _run([kv, "--version"], cwd=elsewhere, env=env)
    assert r.returncode == 0 and "0." in r.stdout, r.stdout + r.stderr

    # Every Example of every command's help, typed as a wheel user types it, from a folder that is not the checkout,
    # against the dump the installed package made (record needs a GPU and open a browser: tests/test_docs_drift.py).
    from test_docs_drift import EXAMPLES, _stage

    ran = 0
    for i, (command, example) in enumerate(EXAMPLES):
        if command in ("record", "open"):
            continue
        example = example.split("   (")[0]
        here = elsewhere / f"example-{i}"
        here.mkdir()
        _stage(here, command, example, elsewhere / "X" / "qwen3-14b.kvdump")
        script = f'kvconv() {{ "{kv}" "$@"; }}\n{example}\n'
        r = _run(["bash", "-c", script], cwd=here, env=env)
        assert r.returncode in ((0, 4) if command == "canary" else (0,)), (example, r.stdout[-2000:], r.stderr)
        assert "Traceback" not in r.stderr and "Error:" not in r.stderr, (example, r.stderr)
        shutil.rmtree(here)
        ran += 1
    assert ran == sum(c not in ("record", "open") for c, _ in EXAMPLES) and ran >= 10, ran
