"""One verdict for a whole engine run (issue 48 parts 1-2, issue 51's one judge): a run is every dump it wrote (each
process's tracer dump, each engine plugin's probe dump), found from its ``-o`` path or any of its dumps and judged
as one by record, validate, report and diff; a check asked for and not done is said, never a plain pass.

The runs are the H100 engine runs of fixtures/engine-runs-h100 (README.md there): the vLLM ``wrong-value`` plant
(tracer dump valid, probe dump ``canary-wrong-value``) and the SGLang ``loc-shift`` plant (scheduler dump without a
slot-write group although ``--writes`` was asked, probe dump ``canary-unexpected-write``)."""

from __future__ import annotations

import json
import lzma
import shutil
import sys

import pytest
from test_record import fake_lib  # noqa: F401 - a fixture: record runs a stand-in command, no GPU

from conftest import FIXTURES, run_cli
from kvconv.capture.engines._hooks import probe_metadata, probe_output
from kvconv.check import runs, verdict
from synth import small_parts, write_parts

RUNS = FIXTURES / "engine-runs-h100"
VLLM = RUNS / "plant-wrong-value.kvdump.xz"  # record -o's literal path: the EngineCore's tracer dump
VLLM_PROBE = RUNS / "plant-wrong-value.vllm-3078.probe.kvdump.xz"
SGLANG_O = RUNS / "sglang-plant-loc-shift.kvdump.xz"  # record -o's path: the front wrote none; the scheduler's is .pid
SGLANG_PROBE = RUNS / "sglang-plant-loc-shift.sglang-4855.probe.kvdump.xz"


@pytest.mark.parametrize("verdicts, want", [
    (["nothing-checked", "ok"], "ok"), (["nothing-checked"] * 2, "nothing-checked"), (["ok", "failed"], "failed"),
    (["incomplete", "failed"], "failed"), (["unreadable", "failed"], "unreadable"), (["nothing-checked", "failed"],
                                                                                    "failed"), ([], "ok")])
def test_one_judge_over_verdict_names(verdicts, want):
    assert verdict.of_run(verdicts) == want
    # the exit statuses' front asks the same judge: a caught bug beside a dead process is failed, not incomplete
    assert runs.set_exit([verdict.EXIT_CODES[v] for v in verdicts]) == verdict.EXIT_CODES[want]


def test_a_runs_files_are_found_from_its_o_path_or_any_dump():
    assert runs.find([str(VLLM)]) == [str(VLLM), str(VLLM_PROBE)]
    assert runs.find([str(VLLM_PROBE)]) == [str(VLLM_PROBE), str(VLLM)]
    sched = str(RUNS / "sglang-plant-loc-shift.pid4855.kvdump.xz")
    assert runs.find([str(SGLANG_O)]) == [sched, str(SGLANG_PROBE)]  # no file at -o: its run's files by name
    assert runs.find([sched]) == [sched, str(SGLANG_PROBE)]


@pytest.mark.parametrize("args", [[VLLM, VLLM_PROBE], [VLLM]], ids=["both", "o-path"])
def test_vllm_wrong_value_run_is_invalid_and_names_the_probe_dump(args):
    r = run_cli("validate", "-q", *args)
    assert r.returncode == 1, r.stdout + r.stderr
    last = r.stdout.splitlines()[-1]
    assert last == f"run of 2 dumps: INVALID: {VLLM_PROBE} (canary-wrong-value)", r.stdout
    assert f"{VLLM}: valid" in r.stdout and "request 6's token at slot 999" in r.stdout


def test_vllm_wrong_value_run_in_json_from_its_probe_dump():
    doc = json.loads(run_cli("validate", "--json", str(VLLM_PROBE)).stdout)
    assert doc["exit"] == 1 and doc["run"] == {"verdict": "failed", "exit": 1, "dumps": [str(VLLM_PROBE), str(VLLM)],
                                               "findings": []}


@pytest.mark.slow  # two profiles of a 30 MB engine dump: ~25 s
def test_report_and_diff_judge_the_run(tmp_path):
    r = run_cli("report", str(VLLM), "-o", str(tmp_path / "r.html"))
    assert r.returncode == 1 and (tmp_path / "r.html").is_file(), r.stdout + r.stderr
    assert r.stdout.splitlines()[-1] == f"run of 2 dumps: INVALID: {VLLM_PROBE} (canary-wrong-value)", r.stdout
    # diff compares the tracer dumps, each judged as its run: the probe's caught bug is in A's and B's verdict
    doc = json.loads(run_cli("diff", "--json", str(VLLM), str(VLLM)).stdout)
    assert [c["a"] for c in doc["diff"]["checks"] if c["check"] == "verdict"] == ["failed"]


# The stand-in command record runs: the EngineCore's tracer dump at -o, and the plugin's probe dump where the plugin
# puts it (kvconv.capture.engines._hooks.probe_output: beside -o under record, whatever KVCONV_PROBE_OUTPUT says).
ENGINE = r"""
import lzma, os, shutil, sys
from kvconv.capture.engines._hooks import probe_output
tracer, probe, engine = sys.argv[1:4]
for src_path, dst_path in ((tracer, os.environ["KVCONV_OUTPUT"]), (probe, probe_output(engine)[0])):
    with (lzma.open if src_path.endswith(".xz") else open)(src_path, "rb") as src, open(dst_path, "wb") as dst:
        shutil.copyfileobj(src, dst)
print(f"kvconv {engine} plugin: probe dump {probe_output(engine)[0]} ({probe_output(engine)[1]})", file=sys.stderr)
"""


def test_record_judges_the_probe_dump_with_the_tracers(tmp_path, fake_lib):  # noqa: F811
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    out = tmp_path / "run.kvdump"
    harness = tmp_path / "elsewhere" / "probe.kvdump"  # a harness's --probe-out: applies only outside record
    r = run_cli("record", "--writes", "--engine", "vllm", "-o", str(out), "--", sys.executable, str(script),
                str(VLLM), str(VLLM_PROBE), "vllm", env={"KVCONV_PROBE_OUTPUT": str(harness)},
                subprocess_=True)  # the plugin's log line is the child's stderr
    assert r.returncode == 1, r.stdout + r.stderr
    probe = next(tmp_path.glob("run.vllm-*.probe.kvdump"))
    assert not harness.exists() and "applies only outside kvconv record" in r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == f"run of 2 dumps: INVALID: {probe} (canary-wrong-value)", lines
    assert any(ln.startswith(f"{out} (pid 3078") and ln.endswith(": valid") for ln in lines), lines
    assert f"{probe}: INVALID" in lines and any("canary-wrong-value" in ln for ln in lines[:-1]), lines
    # the command's own failure still comes first
    r = run_cli("record", "--force", "-o", str(out), "--", sys.executable, "-c", "import sys; sys.exit(7)")
    assert r.returncode == 7


def _asked_dump(path, asked: dict, *, pid: int = 4855) -> None:
    """The tracer's dump of a process that asked for ``asked`` and recorded launches but no slot write: what the
    SGLang scheduler wrote under --writes, with the ``asked`` the tracer now records."""
    parts = small_parts()
    parts["meta"] = dict(parts["meta"], tool="kvconv-tracer", pid=pid, ppid=4801, hostname="vm", asked=asked)
    write_parts(path, parts)


def test_writes_asked_and_not_recorded_is_never_plain_valid(tmp_path):
    alone = tmp_path / "sched.kvdump"
    _asked_dump(alone, {"writes": True, "value": False, "engine": "sglang", "capture_range": "profiler"})
    r = run_cli("validate", str(alone))
    assert r.returncode == 4, r.stdout + r.stderr
    assert "asked-nothing-checked" in r.stdout and "--writes (the write-address canary) was asked" in r.stdout
    assert "NOTHING CHECKED" in r.stdout
    plain = tmp_path / "plain.kvdump"  # what was not asked is not missing
    _asked_dump(plain, {"writes": False, "value": False})
    assert run_cli("validate", str(plain)).returncode == 0


def test_sglang_run_whose_scheduler_recorded_no_write_is_judged_by_its_probe(tmp_path):
    """The scheduler asked --writes --engine sglang and holds neither; the probe dump holds the steps and caught the
    plant: the run is checked (not nothing-checked), INVALID by the probe, and says --writes did not run."""
    _asked_dump(tmp_path / "run.pid4855.kvdump", {"writes": True, "value": False, "engine": "sglang"})
    with lzma.open(SGLANG_PROBE) as src, open(tmp_path / "run.sglang-4855.probe.kvdump", "wb") as dst:
        shutil.copyfileobj(src, dst)
    r = run_cli("validate", "-q", str(tmp_path / "run.kvdump"))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "NOTHING CHECKED" in lines[0] or any("asked-nothing-checked" in ln for ln in lines)
    assert any(ln.startswith("warning asked-unchecked --writes") and "any of its 2 dumps" in ln for ln in lines)
    assert lines[-1].startswith("run of 2 dumps: INVALID: ") and "canary-unexpected-write" in lines[-1], lines


def test_engine_checked_in_the_probe_dump_makes_the_run_checked(tmp_path):
    """A clean probe dump beside a tracer dump that asked --writes --engine and recorded neither: the run is valid
    with a warning naming --writes, not nothing-checked and not plain valid."""
    _asked_dump(tmp_path / "run.kvdump", {"writes": True, "value": False, "engine": "vllm"}, pid=770)
    import zstandard

    with open(FIXTURES / "h200-vllm-0.26" / "plant-clean.probe.kvdump.zst", "rb") as src, \
            open(tmp_path / "run.vllm-770.probe.kvdump", "wb") as dst:
        zstandard.ZstdDecompressor().copy_stream(src, dst)
    r = run_cli("validate", "-q", str(tmp_path / "run.kvdump"))
    lines = r.stdout.splitlines()
    assert r.returncode == 0, r.stdout + r.stderr
    assert lines[-1] == "run of 2 dumps: valid; 1 warning of the run", lines
    assert any(ln.startswith("warning asked-unchecked --writes") for ln in lines), lines


def test_plugins_write_beside_o_under_record_whatever_a_harness_says(monkeypatch):
    monkeypatch.setenv("KVCONV_OUTPUT", "o/run-%p.kvdump")
    monkeypatch.setenv("KVCONV_PROBE_OUTPUT", "/h/probe-%p.kvdump")
    pid = __import__("os").getpid()
    assert probe_output("sglang") == (f"/h/probe-{pid}.kvdump", "KVCONV_PROBE_OUTPUT")  # outside record: the harness
    monkeypatch.setenv("KVCONV_RECORD", "1")
    path, why = probe_output("sglang")
    assert path == f"o/run-{pid}.sglang-{pid}.probe.kvdump" and "applies only outside kvconv record" in why
    assert runs.find([path]) == [path]  # named so that the run finds it: its -o path is o/run-<pid>.kvdump
    assert runs.output_of(path) == f"o/run-{pid}.kvdump"
    monkeypatch.setenv("KVCONV_VALUE", "1")
    meta = probe_metadata("sglang")
    assert meta["pid"] == pid and meta["asked"]["engine"] == "sglang" and meta["asked"]["value"] is True


def test_record_of_the_sglang_run_is_invalid_by_its_probe_and_says_writes_did_not_run(tmp_path, fake_lib):  # noqa: F811
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    sched = tmp_path / "sched.kvdump"
    _asked_dump(sched, {"writes": True, "value": False, "engine": "sglang", "capture_range": "profiler"})
    out = tmp_path / "run.kvdump"
    r = run_cli("record", "-k", "store_kvcache", "--writes", "--engine", "sglang", "--capture-range", "profiler",
                "-o", str(out), "--", sys.executable, str(script), str(sched), str(SGLANG_PROBE), "sglang")
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    probe = next(tmp_path.glob("run.sglang-*.probe.kvdump"))
    assert f"{out} (pid 4855, parent 4801: ): NOTHING CHECKED (nothing of what was asked ran here)" in lines, lines
    assert any(ln.startswith("warning asked-unchecked --writes") for ln in lines), lines
    assert lines[-1] == (f"run of 2 dumps: INVALID: {probe} (canary-unexpected-write, canary-missing-write); "
                         "1 warning of the run"), lines
