"""One verdict per dump (issue 27): validate, report and diff tell what canary / canary --writes find; coverage is a
check; findings of one cause are one incident; every command gives the table's exit status on every damaged dump."""

from __future__ import annotations

import gzip
import json
import re
import shutil

import numpy as np
import pytest

import synth
from conftest import FIXTURES, ROOT, run_cli

# (fixture, the clean run of the same workload it is compared with, canary --writes or the location canary)
CASES = [("writes-clean", "writes-clean", "--writes"), ("writes-clean-80", "writes-clean-80", "--writes"),
         ("writes-pad-minus-one", "writes-clean", "--writes"), ("writes-stale-pad", "writes-clean", "--writes"),
         ("writes-wrong-page", "writes-clean", "--writes"), ("writes-wrong-page-80", "writes-clean-80", "--writes"),
         ("canary-clean", "canary-clean", None), ("canary-pad-minus-one", "canary-clean", None),
         ("canary-stale-pad", "canary-clean", None)]


def _dump(name: str) -> str:
    return str(FIXTURES / name / f"{name}.kvdump")


def _json(r) -> dict:
    return json.loads(r.stdout)["dumps"][0]["result"]


@pytest.mark.parametrize("name,clean,flag", CASES, ids=[c[0] for c in CASES])
def test_validate_report_diff_agree_with_the_canary(name, clean, flag, tmp_path):
    can = run_cli("canary", *([flag] if flag else []), _dump(name), "--json")
    expect = can.returncode
    assert expect in (0, 1), can.stderr
    can_errors = {f["code"] for f in _json(can)["findings"] if f["severity"] == "error"}
    val = run_cli("validate", _dump(name), "--json")
    res = _json(val)
    assert val.returncode == expect and res["verdict"] == ("failed" if expect else "ok"), val.stdout[-2000:]
    assert can_errors <= {f["code"] for f in res["findings"]}  # every fault the canary finds, validate finds
    assert sum(f["count"] for f in res["findings"] if f["code"] in can_errors) == \
        sum(f["count"] for f in _json(can)["findings"] if f["code"] in can_errors)
    text = run_cli("validate", _dump(name))
    assert text.returncode == expect
    assert text.stdout.splitlines()[-1].split(": ", 1)[1].startswith("INVALID" if expect else "valid")
    out = tmp_path / "r.html"
    rep = run_cli("report", "-q", _dump(name), "-o", out)
    assert rep.returncode == expect, rep.stderr
    page = out.read_text()
    assert f'data-verdict="{res["verdict"]}"' in page
    for inc in res["incidents"]:  # the report shows every incident
        assert inc["message"].replace(res["path"] + ": ", "").replace("'", "&#x27;") in page
    for code in can_errors:
        assert code in page
    d = run_cli("diff", "-q", _dump(clean), _dump(name))
    assert d.returncode == expect, d.stdout[-2000:]
    assert d.stdout.rstrip().endswith("ok: no change beyond the thresholds") == (not expect)
    if expect:
        assert re.search(r"^! dump: verdict: ok -> failed$", d.stdout, re.M)
        assert run_cli("diff", "-q", _dump(name), _dump(clean)).returncode == 0  # a fault gone is not a change


def test_incidents_stale_page_80_caches():
    """A stale page-table entry in a 40-layer capture: 480 findings (240 unmapped writes, 240 tokens missing), three
    incidents, one per step, each naming the batch row, request, wrong and right slot and 80 of 80 caches."""
    r = run_cli("validate", _dump("writes-wrong-page-80"))
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines[-1].endswith("INVALID (402 errors, 0 warnings; 3 incidents; 11 groups, 232,328 bytes)")
    assert lines[:-1] == [
        "error writes-unmapped-slot: context 0 step 2, replay 2: batch row 1 (request 2) wrote slot 36, a slot no "
        "request had mapped, instead of 28, in 80 of 80 caches (kernel 'reshape_and_cache_flash_kernel') "
        "(80 findings)",
        "error writes-unmapped-slot: context 0 step 3, replay 3: batch row 1 (request 3) wrote slot 53, a slot no "
        "request had mapped, instead of 45, in 80 of 80 caches (kernel 'reshape_and_cache_flash_kernel') "
        "(80 findings)",
        "error writes-unmapped-slot: context 0 step 4, replay 4: batch row 1 (request 3) wrote slot 54, a slot no "
        "request had mapped, instead of 46, in 80 of 80 caches (kernel 'reshape_and_cache_flash_kernel') "
        "(80 findings)"]
    every = run_cli("validate", "--all", _dump("writes-wrong-page-80")).stdout.splitlines()
    assert len(every) == 3 + 402 + 1 and every[:3] == lines[:3]
    res = _json(run_cli("validate", "--json", _dump("writes-wrong-page-80")))
    assert sum(f["count"] for f in res["findings"] if f["severity"] == "error") == 480
    assert [(i["where"]["step"], i["where"]["request"], i["where"]["slot"], i["where"]["caches"])
            for i in res["incidents"]] == [(2, 2, 36, 80), (3, 3, 53, 80), (4, 3, 54, 80)]


def test_incidents_stale_pad_names_the_owner():
    r = run_cli("validate", _dump("writes-stale-pad"))
    assert r.stdout.splitlines()[0] == (
        "error writes-unmapped-slot: context 0 step 3, replay 3: batch row 3 (a padding row) wrote slot 60, a slot of "
        "request 4 since step 2, instead of 0, in 4 of 4 caches (kernel 'reshape_and_cache_flash_kernel') "
        "(4 findings)")
    c = run_cli("validate", _dump("canary-stale-pad")).stdout.splitlines()
    assert len(c) == 7 and c[0].startswith("error canary-unexpected-write: context 0 step 1: pages 1112, 1821, 1898 "
                                           "changed outside the expected set, in 3 of 3 buffers")


def _nothing(tmp_path, loaded):
    parts = synth.small_parts({"target_launches": 0, "modules_patched": 0})
    for k in ("eager_launch", "graph_node", "device_event"):
        parts[k] = parts[k][:0]
    parts["meta"]["target_kernels"] = ["index_copy_kernel_implX"]
    if loaded is not None:
        parts["meta"]["loaded_kernels"] = loaded
    p = tmp_path / "none.kvdump"
    synth.write_parts(p, parts)
    return p


def test_nothing_traced_is_nothing_checked(tmp_path):
    p = _nothing(tmp_path, ["index_copy_kernel_impl", "reshape_and_cache_flash_kernel", "vectorized_elementwise"])
    r = run_cli("validate", p)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "coverage-none" in r.stdout and "0 target launches, 0 patched modules" in r.stdout
    assert "no kernel matched 'index_copy_kernel_implX'; loaded kernels close to it: index_copy_kernel_impl" \
        in r.stdout
    assert r.stdout.splitlines()[-1].split(": ", 1)[1].startswith("NOTHING CHECKED")
    assert _json(run_cli("validate", "--json", p))["verdict"] == "nothing-checked"
    assert run_cli("report", "-q", p, "-o", tmp_path / "r.html").returncode == 4
    # without the loaded names: the pattern is still named
    (tmp_path / "b").mkdir()
    q = _nothing(tmp_path / "b", None)
    assert "no kernel matched 'index_copy_kernel_implX'" in run_cli("validate", q).stdout
    # a traced run is not: valid-small holds its launches
    assert run_cli("validate", FIXTURES / "bad" / "valid-small.kvdump").returncode == 0


def test_producer_death_is_incomplete(tmp_path):
    p = tmp_path / "s.kvdump"
    with gzip.open(FIXTURES / "h200-death-sigkill" / "h200-death-sigkill.kvdump.gz") as src, open(p, "wb") as dst:
        shutil.copyfileobj(src, dst)
    r = run_cli("validate", p)
    assert r.returncode == 5 and "INCOMPLETE" in r.stdout.splitlines()[-1], r.stdout
    assert _json(run_cli("validate", "--json", p))["verdict"] == "incomplete"
    assert run_cli("report", "-q", p, "-o", tmp_path / "r.html").returncode == 5
    # a finished run of the same workload is ok
    assert run_cli("validate", FIXTURES / "h200-death-normal" / "h200-death-normal.kvdump").returncode == 0


def _table() -> dict[str, int]:
    return {k: v["exit"] for k, v in json.loads((ROOT / "schemas" / "codes.json").read_text())["verdicts"].items()
            if not k.startswith("$")}


def _verdict_of(name: str) -> str:
    # fixtures/bad/cases.json: what each damage is (unreadable: exit 2; a finding at error level: 1; else ok)
    case = json.loads((FIXTURES / "bad" / "cases.json").read_text())[name]
    return {2: "unreadable", 1: "failed", 0: "ok"}[case["exit"]]


BAD = sorted(p.stem for p in (FIXTURES / "bad").glob("*.kvdump"))


@pytest.mark.parametrize("name", BAD)
def test_one_exit_code_per_command_and_damage(name, tmp_path):
    """As schemas/codes.json's verdicts table says: validate, report and diff the dump's verdict; the others their
    own part's status on the same scale (a schema finding, fatal-count-empty's metadata, is validate's only;
    canary has nothing to check without canary records: 4)."""
    table = _table()
    verdict = _verdict_of(name)
    schema_only = name == "fatal-count-empty"  # its one fault is in the metadata's schema
    out = tmp_path / "o"
    runs = {
        "validate": ["validate", FIXTURES / "bad" / f"{name}.kvdump"],
        "report": ["report", "-q", FIXTURES / "bad" / f"{name}.kvdump", "-o", tmp_path / "r.html"],
        "diff": ["diff", "-q", FIXTURES / "bad" / "valid-small.kvdump", FIXTURES / "bad" / f"{name}.kvdump"],
        "info": ["info", FIXTURES / "bad" / f"{name}.kvdump"],
        "reconcile": ["reconcile", FIXTURES / "bad" / f"{name}.kvdump"],
        "canary": ["canary", FIXTURES / "bad" / f"{name}.kvdump"],
        "perfetto": ["perfetto", "-q", FIXTURES / "bad" / f"{name}.kvdump", "-o", out.with_suffix(".pftrace")],
        "chrome": ["chrome", "-q", FIXTURES / "bad" / f"{name}.kvdump", "-o", out.with_suffix(".json")],
        "arrow": ["arrow", "-q", FIXTURES / "bad" / f"{name}.kvdump", "-o", out.with_suffix(".arrow")],
    }
    got = {cmd: run_cli(*args).returncode for cmd, args in runs.items()}
    want = {}
    for cmd in runs:
        if cmd in ("validate", "report", "diff"):
            want[cmd] = table[verdict]
        elif verdict == "unreadable":
            want[cmd] = table["unreadable"]
        elif cmd == "canary":
            want[cmd] = 1 if verdict == "failed" and not schema_only else table["nothing-checked"]
        else:
            want[cmd] = table["failed"] if verdict == "failed" and not schema_only else table["ok"]
    assert got == want


def test_cli_page_exit_table_is_generated():
    from kvconv import formatdoc

    assert (ROOT / "docs" / "CLI.md").read_text() == formatdoc.render_cli(), (
        "docs/CLI.md is stale: python -m kvconv.formatdoc cli > /tmp/CLI.md && mv /tmp/CLI.md docs/CLI.md")
    page = (ROOT / "docs" / "CLI.md").read_text()
    for verdict, code in _table().items():
        assert f"| `{verdict}` | {code} |" in page


def test_verdict_table_has_one_exit_each():
    from kvconv.check import verdict

    codes = list(verdict.EXIT_CODES.values())
    assert len(set(codes)) == len(codes) and 3 not in codes  # 3: kvconv's internal error
    assert set(verdict.VERDICTS) == {"ok", "failed", "incomplete", "nothing-checked", "unreadable"}
    assert np.all(np.diff([verdict.EXIT_CODES[v] for v in ("ok", "failed", "unreadable")]) > 0)


EMPTY_WRITER = r"""
import os
from kvconv.format import dump
out = os.environ["KVCONV_OUTPUT"].replace("%p", str(os.getpid())).replace("%c", "0")
with dump.new(out) as w:  # what the tracer writes when no kernel matched its pattern
    w.write_metadata({"tool": "stand-in", "tool_version": "0", "target_kernels": [os.environ["KVCONV_KERNELS"]],
                      "counters": {"fatal_count": 0, "target_launches": 0, "modules_patched": 0}})
"""


def test_record_of_nothing_exits_nothing_checked(tmp_path):
    lib = tmp_path / "libkvconv_tracer.so"
    lib.write_bytes(b"not a real library: the stand-in command ignores CUDA_INJECTION64_PATH")
    (tmp_path / "kvconv_patch.fatbin").write_bytes(b"stand-in device patch")
    script = tmp_path / "writer.py"
    script.write_text(EMPTY_WRITER)
    out = tmp_path / "d.kvdump"
    import sys

    r = run_cli("record", "-k", "index_copy_kernel_implX", "-o", out, "--", sys.executable, script,
                env={"KVCONV_TRACER_LIB": str(lib), "KVCONV_PATCH_FILE": ""})
    assert r.returncode == _table()["nothing-checked"] == 4, r.stdout + r.stderr
    assert f"{out}: NOTHING CHECKED" in r.stdout
    assert "no kernel matched 'index_copy_kernel_implX'" in r.stdout


def test_mistyped_pattern_on_the_h200_is_nothing_checked(tmp_path):
    """fixtures/h200-typo-pattern: -k reshape_and_cache_flash_kernelX on a real run (0 target launches, 0 patched
    modules): validate, report and diff say nothing-checked, never valid (all three exited 0 before)."""
    p = FIXTURES / "h200-typo-pattern" / "typo-pattern.kvdump"
    r = run_cli("validate", p)
    assert r.returncode == 4 and "no kernel matched 'reshape_and_cache_flash_kernelX'" in r.stdout, r.stdout
    assert run_cli("report", "-q", p, "-o", tmp_path / "r.html").returncode == 4
    assert 'data-verdict="nothing-checked"' in (tmp_path / "r.html").read_text()
    d = run_cli("diff", "-q", FIXTURES / "h200-single" / "single.kvdump", p)
    assert d.returncode == 1 and "! dump: verdict: ok -> nothing-checked" in d.stdout
    rc = run_cli("reconcile", p)  # 0 = 0 = 0 agrees trivially: was 'ok', exit 0
    assert rc.returncode == 4 and "coverage-none" in rc.stdout and "NOTHING CHECKED" in rc.stdout, rc.stdout
