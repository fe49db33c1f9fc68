"""kvconv record: options, environment, output discovery and validation, without a GPU (a stand-in command writes
the dump the tracer would), plus the CLI's error paths."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from kvconv.capture import record
from kvconv.format.errors import OutputError, UsageError

WRITER = r"""
import os, sys
import numpy as np
from kvconv.format import dump, layout
out = os.environ["KVCONV_OUTPUT"].replace("%p", str(os.getpid())).replace("%c", "0")
ev = np.zeros(2, dtype=layout.DTYPES["device_event"])
ev["sequence"] = [0, 1]; ev["gridid"] = 9; ev["block_x"] = [0, 1]; ev["kernel_slot"] = 1; ev["kind"] = 1
ev["flags"] = 1; ev["globaltimer"] = [100, 200]
el = np.zeros(1, dtype=layout.DTYPES["host_launch"])
el["grid_id"] = 9; el["grid_x"] = 2; el["grid_y"] = 1; el["grid_z"] = 1; el["block_dim_x"] = 128
el["block_dim_y"] = 1; el["block_dim_z"] = 1; el["kernel_slot"] = 1; el["flags"] = 2; el["host_ns"] = 5
st = dump.StringTable(); off, n = st.add(os.environ["KVCONV_KERNELS"])
k = np.zeros(1, dtype=layout.DTYPES["kernel"]); k["slot"] = 1; k["flags"] = 1; k["name_off"] = off; k["name_len"] = n
with dump.new(out) as w:
    w.write_metadata({"tool": "stand-in", "tool_version": "0", "counters": {"fatal_count": 0}})
    w.write_strings(st); w.write_records("kernel", k); w.write_records("device_event", ev, capacity=16)
    w.write_records("eager_launch", el, capacity=16)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


@pytest.fixture
def fake_lib(tmp_path, monkeypatch):
    lib = tmp_path / "libkvconv_tracer.so"
    lib.write_bytes(b"not a real library: the stand-in command ignores CUDA_INJECTION64_PATH")
    (tmp_path / "kvconv_patch.fatbin").write_bytes(b"stand-in device patch")
    monkeypatch.setenv("KVCONV_TRACER_LIB", str(lib))
    monkeypatch.delenv("KVCONV_PATCH_FILE", raising=False)
    return lib


def _writer(tmp_path) -> list[str]:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    return [sys.executable, str(script)]


def test_env_has_every_setting():
    o = record.RecordOptions(kernels=("a", "b::c"), output="x-%p-%c.kvdump", device_capacity=10, host_capacity=20,
                             events=("enter", "exit"), clock_sync_ms=0, verbose=2)
    env = record.tracer_env(o, lib="/l.so", base={"KVCONV_CUPTI_LIB": "/x/libcupti.so.13"})
    assert env == {"CUDA_INJECTION64_PATH": "/l.so", "KVCONV_KERNELS": "a,b::c", "KVCONV_OUTPUT": "x-%p-%c.kvdump",
                   "KVCONV_EVENTS": "enter,exit", "KVCONV_DEVICE_CAPACITY": "10", "KVCONV_HOST_CAPACITY": "20",
                   "KVCONV_CLOCK_SYNC_MS": "0", "KVCONV_VERBOSE": "2", "KVCONV_CUPTI_LIB": "/x/libcupti.so.13",
                   "KVCONV_RECORD": "1"}


def test_cupti_is_looked_for_only_for_durations(monkeypatch, tmp_path):
    """Exit events: the tracer's calibration needs CUPTI for its untraced reference, found beside the Python
    packages as torch's CUDA wheels install it (nvidia/cu13/lib); enter-only: no durations, not looked for."""
    lib = tmp_path / "nvidia" / "cu13" / "lib" / "libcupti.so.13"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    both = record.tracer_env(record.RecordOptions(kernels=("a",), events=("enter", "exit")), lib="/l.so", base={})
    assert both["KVCONV_CUPTI_LIB"] == str(lib)
    enter = record.tracer_env(record.RecordOptions(kernels=("a",)), lib="/l.so", base={})
    assert "KVCONV_CUPTI_LIB" not in enter


@pytest.mark.parametrize("kw", [{"kernels": ()}, {"kernels": ("a,b",)}, {"events": ("begin",)}, {"events": ()},
                                {"device_capacity": 0}, {"clock_sync_ms": -1}])
def test_bad_options(kw):
    with pytest.raises(UsageError):
        record.RecordOptions(**kw)


def test_output_glob():
    assert record.output_glob("run-%p-%c.kvdump") == "run-*-*.kvdump"
    assert record.output_glob("a[1]%%.bin") == "a[[]1]%.bin"


def test_unwritable_output_refused_before_running(tmp_path):
    with pytest.raises(OutputError):
        record.record(["true"], options=record.RecordOptions(output=str(tmp_path / "missing" / "x.kvdump")))


def test_record_finds_and_validates(tmp_path, fake_lib):
    out = tmp_path / "run-%p.kvdump"
    res = record.record(_writer(tmp_path), options=record.RecordOptions(output=str(out)))
    assert res.returncode == 0 and len(res.dumps) == 1 and Path(res.dumps[0]).name.startswith("run-")
    assert res.valid, [f.line() for r in res.reports for f in r.findings]


def test_record_cli(tmp_path, fake_lib):
    out = tmp_path / "cli.kvdump"
    r = run_cli("record", "-k", "my_kernel", "-o", str(out), "--", *_writer(tmp_path),
                env={"KVCONV_TRACER_LIB": str(fake_lib)})
    assert r.returncode == 0, r.stderr
    assert f"{out}: valid" in r.stdout
    from kvconv.format import dump

    with dump.open(out) as d:
        assert d.kernel_names() == {1: "my_kernel"}


def test_record_cli_passes_command_exit_code(tmp_path, fake_lib):
    r = run_cli("record", "-o", str(tmp_path / "c.kvdump"), "--", *_writer(tmp_path), "7",
                env={"KVCONV_TRACER_LIB": str(fake_lib)})
    assert r.returncode == 7


def test_record_cli_no_dump(tmp_path, fake_lib):
    r = run_cli("record", "-o", str(tmp_path / "none.kvdump"), "--", sys.executable, "-c", "pass",
                env={"KVCONV_TRACER_LIB": str(fake_lib)})
    assert r.returncode == 1 and "wrote no dump" in r.stderr and "Traceback" not in r.stderr


def test_record_cli_errors(tmp_path):
    r = run_cli("record", "-o", str(tmp_path / "nope" / "x.kvdump"), "--", "true")
    assert r.returncode == 1 and "output folder does not exist" in r.stderr
    r = run_cli("record", "--", env={"KVCONV_TRACER_LIB": os.devnull})
    assert r.returncode == 2 and "no command" in r.stderr
    r = run_cli("record", "--events", "bogus", "--", "true")
    assert r.returncode == 2 and "--events" in r.stderr
    r = run_cli("record", "-o", str(tmp_path / "x.kvdump"), "--", "true", env={"KVCONV_TRACER_LIB": "/nonexistent"})
    assert r.returncode == 1 and "KVCONV_TRACER_LIB" in r.stderr


def test_prebuilt_library_needs_its_patch_beside_it(tmp_path):
    """KVCONV_TRACER_LIB without kvconv_patch.fatbin beside it would trace nothing: refused before the command runs."""
    lib = tmp_path / "lib" / "libkvconv_tracer.so"
    lib.parent.mkdir()
    lib.write_bytes(b"stand-in")
    ran = tmp_path / "ran"
    cmd = ["--", sys.executable, "-c", f"open({str(ran)!r}, 'w')"]
    r = run_cli("record", "-o", str(tmp_path / "x.kvdump"), *cmd, env={"KVCONV_TRACER_LIB": str(lib)})
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "kvconv_patch.fatbin is not beside KVCONV_TRACER_LIB" in r.stderr and not ran.exists()
    patch = tmp_path / "elsewhere.fatbin"
    patch.write_bytes(b"stand-in")
    r = run_cli("record", "-o", str(tmp_path / "x.kvdump"), *cmd,
                env={"KVCONV_TRACER_LIB": str(lib), "KVCONV_PATCH_FILE": str(patch)})
    assert ran.exists() and "wrote no dump" in r.stderr  # the lookup passed; the stand-in command wrote no dump


def test_installed_kvconv_says_how_to_get_the_tracer(tmp_path):
    """An install without native/ (a wheel): one line naming the build command, where the library goes and the
    variable, and exit 1; with the variable set to a prebuilt library, record runs."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "kvconv", site / "kvconv", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "schemas", site / "schemas")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVCONV_")}
    env["PYTHONPATH"] = str(site)
    args = [sys.executable, "-m", "kvconv", "record", "-o", str(tmp_path / "r-%p.kvdump"), "--"]
    p = subprocess.run(args + ["true"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    for part in ("make -C native tracer", "native/build/libkvconv_tracer.so", "kvconv_patch.fatbin",
                 "export KVCONV_TRACER_LIB=/path/to/native/build/libkvconv_tracer.so"):
        assert part in p.stderr, (part, p.stderr)
    lib = tmp_path / "prebuilt" / "libkvconv_tracer.so"
    lib.parent.mkdir()
    lib.write_bytes(b"stand-in")
    (lib.parent / "kvconv_patch.fatbin").write_bytes(b"stand-in")
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    p = subprocess.run(args + [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                       env={**env, "KVCONV_TRACER_LIB": str(lib)})
    assert p.returncode == 0 and ": valid" in p.stdout, p.stdout + p.stderr


def test_record_keeps_an_existing_dump_unless_forced(tmp_path, fake_lib):
    out = tmp_path / "mine.kvdump"
    out.write_bytes(b"a user's earlier dump")
    marker = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    r = run_cli("record", "-o", str(out), "--", *cmd, env={"KVCONV_TRACER_LIB": str(fake_lib)})
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "output exists" in r.stderr and "--force" in r.stderr
    assert out.read_bytes() == b"a user's earlier dump" and not marker.exists()  # refused before running anything
    r = run_cli("record", "--force", "-o", str(out), "--", *_writer(tmp_path),
                env={"KVCONV_TRACER_LIB": str(fake_lib)})
    assert r.returncode == 0, r.stderr
    assert f"{out}: valid" in r.stdout


def test_source_checkout_finds_its_own_tracer(monkeypatch):
    """Without KVCONV_TRACER_LIB, a source checkout's kvconv finds native/ of that checkout (after the package moved
    into folders, record.py looked one level too shallow and reported 'installed without native/')."""
    monkeypatch.delenv(record.ENV_LIB, raising=False)
    assert record.NATIVE == ROOT / "native"
    if (ROOT / "native" / "build" / record.LIB_NAME).is_file():
        assert record.find_library(build=False) == ROOT / "native" / "build" / record.LIB_NAME
