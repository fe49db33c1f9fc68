"""kvconv record with several CUDA processes (issue 44): each process's dump found, reported with its process, and
one exit status for the run; the capture-range and engine options. Without a GPU: stand-in commands write the dumps
the tracer would, named as native/src/config.cpp names them (a literal path for the first process, <stem>.pid<N><ext>
for the others)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_record import WRITER, fake_lib  # noqa: F401 - fake_lib is a fixture used by the tests below

from conftest import FIXTURES, run_cli
from kvconv.capture import record
from kvconv.check.runs import linked, set_exit
from kvconv.format.errors import UsageError

# The front end: an empty dump (the tracer's when no target kernel ran), then a child (the engine's scheduler) that
# writes the target records under the .pid name, as the tracer does for a process that is not the output's owner.
FRONT = r"""
import os, subprocess, sys
from kvconv.format import dump
out = os.environ["KVCONV_OUTPUT"]
with dump.new(out) as w:
    w.write_metadata({"tool": "stand-in", "tool_version": "0", "pid": os.getpid(), "ppid": os.getppid(),
                      "command": ["front.py"], "counters": {"fatal_count": 0, "target_launches": 0,
                                                            "modules_patched": 0}})
stem, ext = os.path.splitext(out)
env = dict(os.environ, KVCONV_OUTPUT=stem + ".pid%p" + ext)
sys.exit(subprocess.call([sys.executable, sys.argv[1]] + sys.argv[2:], env=env))
"""


def _scripts(tmp_path):
    front, child = tmp_path / "front.py", tmp_path / "child.py"
    front.write_text(FRONT)
    child.write_text(WRITER)
    return [sys.executable, str(front), str(child)]


def test_output_globs_find_the_other_processes_names(tmp_path):
    lit = str(tmp_path / "run.kvdump")
    globs = record.output_globs(lit)
    assert len(globs) == 2 and globs[1].endswith("run.pid[0-9]*.kvdump")
    assert record.output_globs(str(tmp_path / "run-%p.kvdump")) == [record.output_glob(str(tmp_path / "run-%p.kvdump"))]
    assert record.output_globs(str(tmp_path / "run"))[1].endswith("run.pid[0-9]*")


@pytest.mark.parametrize("exits, want", [([4, 0], 0), ([4, 4], 4), ([4, 1], 1), ([0, 5], 5), ([None, 0], 0),
                                         ([None], 0), ([], 0), ([0, 4, 4], 0)])
def test_one_exit_status_over_the_processes(exits, want):
    assert set_exit(exits) == want


def test_processes_linked_into_one_run():
    front = {"pid": 10, "ppid": 1, "hostname": "h"}
    child = {"pid": 11, "ppid": 10, "hostname": "h", "output_owner_pid": "10"}
    grandchild = {"pid": 12, "ppid": 11, "hostname": "h"}
    assert linked([front, child, grandchild]) and linked([grandchild, front, child])
    assert not linked([front, {"pid": 13, "ppid": 2, "hostname": "h"}])
    assert not linked([front, dict(child, hostname="other")]) and not linked([front])


def test_validate_reads_one_runs_dumps_as_one_run():
    """validate on an engine's front (nothing checked) and its child (checked): the run's exit, not 4, whether the
    child is named or found beside the front; an unrelated run's verdict beside them still counts."""
    case = FIXTURES / "h200-engine-procs"
    front, child = case / "range-profiler.kvdump.zst", case / "range-profiler.pid959.kvdump.zst"
    r = run_cli("validate", str(front), str(child))
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_cli("validate", "--json", str(front), str(child))
    assert json.loads(r.stdout)["exit"] == 0
    r = run_cli("validate", str(front))  # the -o path alone: its run's other dumps are found beside it
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "run of 2 dumps: valid", r.stdout
    typo = next((FIXTURES / "h200-typo-pattern").glob("*.kvdump*"))  # another run, nothing checked: it counts
    assert run_cli("validate", str(front), str(typo)).returncode == 4
    other = case / "spawn-sigkill-graph.kvdump.zst"  # another run's front, its child killed: that run is incomplete
    assert run_cli("validate", str(front), str(other)).returncode == 5


def test_every_process_kept_and_reported(tmp_path, fake_lib):  # noqa: F811
    out = tmp_path / "run.kvdump"
    r = run_cli("record", "-k", "store_kvcache", "-o", str(out), "--", *_scripts(tmp_path),
                env={"KVCONV_TRACER_LIB": str(fake_lib)})
    lines = r.stdout.splitlines()
    assert r.returncode == 0, r.stdout + r.stderr
    front = [ln for ln in lines if ln.startswith(f"{out} (pid ")]
    child = [ln for ln in lines if ".pid" in ln and ln.endswith(": valid")]
    assert len(front) == 1 and "NOTHING CHECKED (no target kernel ran here)" in front[0], lines
    assert "front.py" in front[0] and len(child) == 1, lines
    assert len(list(tmp_path.glob("run.pid*.kvdump"))) == 1


def test_a_run_where_no_process_ran_a_target_is_nothing_checked(tmp_path, fake_lib):  # noqa: F811
    out = tmp_path / "run.kvdump"
    child = tmp_path / "nothing.py"
    child.write_text("pass\n")
    front = tmp_path / "front.py"
    front.write_text(FRONT)
    r = run_cli("record", "-o", str(out), "--", sys.executable, str(front), str(child),
                env={"KVCONV_TRACER_LIB": str(fake_lib)})
    assert r.returncode == 4, r.stdout + r.stderr


def test_capture_range_and_engine_reach_the_tracer(monkeypatch):
    monkeypatch.setenv("KVCONV_OUTPUT_OWNER", "12345")  # an outer traced process's: must not leak into this run
    env = record.tracer_env(record.RecordOptions(capture_range="launches:100", capture_range_end="repeat",
                                                 engine="vllm"), lib="/x/lib.so")
    assert env["KVCONV_CAPTURE_RANGE"] == "launches:100" and env["KVCONV_CAPTURE_RANGE_END"] == "repeat"
    assert env["KVCONV_ENGINE"] == "vllm" and "KVCONV_OUTPUT_OWNER" not in env
    plain = record.tracer_env(record.RecordOptions(), lib="/x/lib.so")
    assert not {"KVCONV_CAPTURE_RANGE", "KVCONV_CAPTURE_RANGE_END", "KVCONV_ENGINE"} & set(plain)
    nv = record.tracer_env(record.RecordOptions(capture_range="nvtx:decode step"), lib="/x/lib.so")
    assert nv["NVTX_INJECTION64_PATH"] == "/x/lib.so" and nv["KVCONV_CAPTURE_RANGE"] == "nvtx:decode step"
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/opt/nsys/libToolsInjection64.so")
    with pytest.raises(UsageError, match="NVTX_INJECTION64_PATH"):
        record.tracer_env(record.RecordOptions(capture_range="nvtx:decode"), lib="/x/lib.so")


@pytest.mark.parametrize("kw", [{"capture_range": "launches:"}, {"capture_range": "nvtx"}, {"capture_range": "nvtx:"},
                                {"capture_range_end": "never"}, {"engine": "trt"}])
def test_bad_range_or_engine_refused(kw):
    with pytest.raises(UsageError):
        record.RecordOptions(**kw)


def test_bad_range_is_a_usage_error_before_anything_runs(tmp_path, fake_lib):  # noqa: F811
    marker = tmp_path / "ran"
    r = run_cli("record", "--capture-range", "sometimes", "-o", str(tmp_path / "r.kvdump"), "--",
                sys.executable, "-c", f"open({str(marker)!r}, 'w')", env={"KVCONV_TRACER_LIB": str(fake_lib)})
    assert r.returncode == 2 and "--capture-range" in r.stderr and not marker.exists()
    assert "Traceback" not in r.stderr


def test_record_waits_for_a_child_still_writing(tmp_path):
    """A live dump whose process still runs is waited for (bounded), so that record validates what it ends with."""
    from kvconv.format import dump

    p = tmp_path / "late.kvdump"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with dump.new(str(p)) as w:
            w.write_metadata({"tool": "stand-in", "pid": sleeper.pid, "written_at": "live"})
        import time

        t0 = time.monotonic()
        record._wait_for_writers([str(p)], timeout_s=0.5)
        assert 0.4 < time.monotonic() - t0 < 5
    finally:
        sleeper.kill()
        sleeper.wait()
    t0 = time.monotonic()
    record._wait_for_writers([str(p)], timeout_s=5)  # the process is gone: no wait
    assert time.monotonic() - t0 < 1
