"""validate: every problem reported (aggregated, with group, record, byte offset and field), exit codes 0/1/2."""

import json
import subprocess
import sys

import jsonschema
import numpy as np
import pytest

import synth
from conftest import FIXTURES, run_cli
from kvconv.check.validate import ValidateOptions, validate
from kvconv.format import layout

NO_REC = ValidateOptions(reconcile=False)


def write(tmp_path, mutate=None, name="d.kvdump"):
    parts = synth.small_parts()
    if mutate:
        mutate(parts)
    p = tmp_path / name
    synth.write_parts(p, parts)
    return p


def codes(rep):
    return sorted(f.code for f in rep.findings)


def test_valid_small_is_valid(tmp_path):
    rep = validate(write(tmp_path), options=NO_REC)
    assert rep.findings == [] and rep.exit_code == 0


def test_every_problem_is_reported_not_just_the_first(tmp_path):
    def mutate(p):
        ev = p["device_event"]
        ev["sequence"][4] = 3          # duplicate
        ev["sequence"][8] = 12         # gap
        ev["kind"][2] = 9              # bad enum
        ev["kernel_slot"][6] = 99      # not in the kernel table
        p["eager_launch"]["grid_x"][1] = 0
        p["meta"]["counters"]["fatal_count"] = ""
    rep = validate(write(tmp_path, mutate), options=NO_REC)
    assert codes(rep) == sorted(["sequence-duplicate", "sequence-gap", "bad-enum", "unknown-kernel-slot",
                                 "bad-range", "metadata-schema"])
    assert rep.exit_code == 1
    dup = next(f for f in rep.findings if f.code == "sequence-duplicate")
    assert dup.field == "device_event.sequence" and dup.record == 4
    ev_group = next(f for f in rep.findings if f.code == "bad-enum").group
    enum = next(f for f in rep.findings if f.code == "bad-enum")
    assert enum.record == 2 and enum.field == "device_event.kind"
    # The byte offset names the field inside the record inside the file.
    raw = open(rep.path, "rb").read()
    assert raw[enum.offset] == 9
    meta = next(f for f in rep.findings if f.code == "metadata-schema")
    assert meta.field == "metadata.counters.fatal_count" and raw[meta.offset:meta.offset + 13] == b'"fatal_count"'
    assert ev_group is not None


def test_aggregates_many_bad_records_into_one_finding(tmp_path):
    def mutate(p):
        p["device_event"]["kind"][:] = 7
    rep = validate(write(tmp_path, mutate), options=NO_REC)
    f = next(f for f in rep.findings if f.code == "bad-enum")
    assert f.count == 9 and f.record == 0


def test_timer_backwards_is_a_warning(tmp_path):
    def mutate(p):
        p["device_event"]["globaltimer"][5] = 1
    rep = validate(write(tmp_path, mutate), options=NO_REC)
    assert codes(rep) == ["timer-backwards"] and rep.exit_code == 0


def test_drops_are_errors_and_gaps_become_warnings(tmp_path):
    def mutate(p):
        p["device_event"] = p["device_event"][[0, 1, 2, 3, 4, 5, 6, 8]]
        p["drops"] = {"device_event": 1}
    rep = validate(write(tmp_path, mutate), options=NO_REC)
    by = {f.code: f for f in rep.findings}
    assert by["dropped"].severity == "error" and by["dropped"].field == "header.drop_count"
    assert by["sequence-gap"].severity == "warning"


def test_block_outside_grid_exact_by_gridid(tmp_path):
    def mutate(p):
        ev = p["device_event"]
        ev["gridid"] = [10, 10, 10, 11, 11, 20, 21, 20, 21]
        ev["flags"] = layout.ENUMS["event_flags"]["has_gridid"]
        ev["block_x"][3] = 2  # launch 11 has grid 2: block 2 is outside it (but inside the slot's largest grid 3)
    rep = validate(write(tmp_path, mutate), options=NO_REC)
    f = next(f for f in rep.findings if f.code == "block-outside-grid")
    assert f.record == 3 and f.count == 1


def test_kernel_string_reference_out_of_range(tmp_path):
    def mutate(p):
        p["kernel"]["name_len"] = 10_000
    rep = validate(write(tmp_path, mutate), options=NO_REC)
    assert codes(rep) == ["bad-string-ref"]


def test_json_output_lists_all_findings(tmp_path):
    def mutate(p):
        p["device_event"]["kind"][2] = 9
        p["graph_node"]["launch_id"][0] = 0
    p = write(tmp_path, mutate)
    r = run_cli("validate", "--json", "--no-reconcile", p)
    assert r.returncode == 1
    out = json.loads(r.stdout)["dumps"][0]["result"]
    assert out["valid"] is False and out["errors"] == len([f for f in out["findings"] if f["severity"] == "error"])
    assert {f["code"] for f in out["findings"]} >= {"bad-enum", "bad-range"}
    for f in out["findings"]:
        assert set(f) >= {"severity", "code", "group", "record", "offset", "field", "message"}
    jsonschema.validate(out, json.loads((FIXTURES.parent / "schemas/validate.schema.json").read_text()))


@pytest.mark.parametrize("name", ["qwen3-14b/qwen3-14b.kvdump", "bad/valid-small.kvdump"])
def test_fixtures_validate_clean(name):
    rep = validate(FIXTURES / name)
    assert rep.exit_code == 0, [f.line() for f in rep.findings]
    # The Qwen run's first launch ran before patching: a warning that names it, nothing else.
    assert [f.code for f in rep.findings] == (["coverage-late"] if "qwen" in name else [])


def test_unreadable_is_exit_2_with_one_line(tmp_path):
    p = tmp_path / "x.kvdump"
    p.write_bytes(b"not a dump at all, just text" * 4)
    r = run_cli("validate", p)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("Error: ") and "byte 0" in r.stderr
    assert "header.magic" in r.stderr


def _ticks(p, steps):
    """Device timestamps on a 32 ns timer (as on H200), 1 µs apart, then moved by ``steps`` (ns) per event."""
    ev = p["device_event"]
    ev["globaltimer"] = 5_000_000_000 + 1024 * np.arange(len(ev), dtype=np.uint64)
    for i, d in steps.items():
        ev["globaltimer"][i] = int(ev["globaltimer"][i - 1]) - d


def test_timer_steps_back_within_the_timer_race_do_not_warn(tmp_path):
    """Real H200 captures step back by one to four 32 ns ticks between blocks on different SMs: no warning."""
    p = write(tmp_path, lambda p: _ticks(p, {2: 32, 4: 64, 6: 128}))
    r = run_cli("validate", "--no-reconcile", p)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "timer-backwards" not in r.stdout and "0 warnings" in r.stdout


def test_timer_jump_back_beyond_the_race_warns(tmp_path):
    p = write(tmp_path, lambda p: _ticks(p, {2: 32, 5: 16_384}))
    r = run_cli("validate", "--no-reconcile", p)
    assert r.returncode == 0
    line = next(ln for ln in r.stdout.splitlines() if "timer-backwards" in ln)
    assert "group 6 record 5" in line and "16,384 ns" in line and "32 ns" in line, line
    assert "records)" not in line  # one step beyond the tolerance, the 32 ns one is not counted



def _on_sms(p, sms, steps, *, launches=None):
    """As :func:`_ticks`, with the events on the SMs ``sms`` (one per event, in sequence order) and, ``launches``,
    of the launches (%gridid) named."""
    p["device_event"]["smid"] = sms
    if launches is not None:
        p["device_event"]["gridid"] = launches
    _ticks(p, steps)


def test_a_descheduled_warp_across_sms_does_not_warn(tmp_path):
    """Clean vLLM decode runs on an H200 (issue 39): a block sequenced earlier reads the timer ~3 us later than the
    next block, on another SM."""
    p = write(tmp_path, lambda p: _on_sms(p, [0, 1, 2, 3, 4, 5, 6, 7, 8], {5: 2976 + 1024}))
    r = run_cli("validate", "--no-reconcile", p)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "timer-backwards" not in r.stdout and "0 warnings" in r.stdout


def test_a_step_back_within_one_sm_between_launches_warns(tmp_path):
    """SM 1's block of the next launch 544 ns before SM 1's block of the previous one: no race explains it (a
    stream's kernels run one after the other). The same step between two blocks of one launch is a race."""
    sms = [0, 1, 2, 3, 4, 1, 6, 7, 8]
    p = write(tmp_path, lambda p: _on_sms(p, sms, {5: 3 * 1024 + 544}, launches=[1, 1, 1, 1, 1, 2, 2, 2, 2]))
    r = run_cli("validate", "--no-reconcile", p)
    line = next(ln for ln in r.stdout.splitlines() if "timer-backwards" in ln)
    assert r.returncode == 0 and "record 5" in line and "within one SM, between launches, by up to 544 ns" in line
    assert "may race" not in line, line
    p = write(tmp_path, lambda p: _on_sms(p, sms, {5: 3 * 1024 + 544}, launches=[1] * 9), name="one.kvdump")
    assert "timer-backwards" not in run_cli("validate", "--no-reconcile", p).stdout


def test_a_large_step_back_across_sms_warns(tmp_path):
    p = write(tmp_path, lambda p: _on_sms(p, [0, 1, 2, 3, 4, 5, 6, 7, 8], {5: 20_000}))
    r = run_cli("validate", "--no-reconcile", p)
    line = next(ln for ln in r.stdout.splitlines() if "timer-backwards" in ln)
    assert "by up to 20,000 ns (allowed between blocks that may race: a descheduled warp's 8,192)" in line, line
    assert "within one SM" not in line, line


# h200-typo-pattern is a capture that traced nothing on purpose (nothing-checked: tests/test_verdict.py), and
# h200-paged-plants holds planted bugs on purpose (their verdicts: tests/test_paged_plants_h200.py)
@pytest.mark.parametrize("dump_path", sorted(p for p in FIXTURES.glob("h200-*/*.kvdump")
                                             if p.parent.name not in ("h200-typo-pattern", "h200-paged-plants")),
                         ids=lambda p: p.parent.name)
def test_clean_h200_captures_validate_without_warnings(dump_path):
    r = run_cli("validate", "--json", dump_path)
    assert r.returncode == 0, r.stderr
    assert "timer-backwards" not in r.stdout


def test_validate_does_not_import_the_iri_grammar():
    """jsonschema imports rfc3987_syntax when installed (HTA's dependencies install it), which builds a lark grammar:
    3.3 s of CPU per `kvconv validate`. validate checks no formats, so it keeps jsonschema from loading it."""
    pytest.importorskip("rfc3987_syntax")
    code = ("import sys; from kvconv.check import validate; "
            "r = validate.validate(sys.argv[1]); "
            "print('rfc3987_syntax' in sys.modules, 'jsonschema' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code, str(FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["False", "True"]
