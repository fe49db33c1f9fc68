"""One verdict in every command (issue 27): info states it, canary exits with its canary part, the converters end
with one stderr line naming it; kernel names demangled in text, kept as recorded in --json and Arrow; a pattern that
matched nothing is offered the closest loaded kernels."""

from __future__ import annotations

import gzip
import html
import json
import shutil
import struct

import pytest

import synth
from conftest import FIXTURES, run_cli

TYPO = FIXTURES / "h200-typo-pattern" / "typo-pattern.kvdump"
STALE = FIXTURES / "writes-stale-pad" / "writes-stale-pad.kvdump"
SINGLE = FIXTURES / "h200-single" / "single.kvdump"
CHECKSUM = FIXTURES / "bad" / "checksum-mismatch.kvdump"
# nvcc -cubin of vllm::reshape_and_cache_flash_kernel<float>(float*, long): what the tracer records
MANGLED = "_ZN4vllm30reshape_and_cache_flash_kernelIfEEvPT_l"
DEMANGLED = "void vllm::reshape_and_cache_flash_kernel<float>(float*, long)"


def _result(r) -> dict:
    return json.loads(r.stdout)["dumps"][0]["result"]


@pytest.fixture(scope="module")
def sigkill(tmp_path_factory):
    p = tmp_path_factory.mktemp("live") / "sigkill.kvdump"
    with gzip.open(FIXTURES / "h200-death-sigkill" / "h200-death-sigkill.kvdump.gz") as src, open(p, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return p


# ---- info -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,state,code", [
    ("typo", "NOTHING CHECKED", 0), ("stale", "INVALID", 0), ("single", "valid", 0), ("checksum", "INVALID", 1),
    ("sigkill", "INCOMPLETE", 0)])
def test_info_states_the_verdict_and_exits_with_its_own_part(name, state, code, sigkill):
    """info's last line is validate's verdict line; its exit status is its own part's (0 readable and intact, 1 a
    checksum does not match: docs/CLI.md), so that 'kvconv info DUMP | ...' works on the failed runs one looks at."""
    p = {"typo": TYPO, "stale": STALE, "single": SINGLE, "checksum": CHECKSUM, "sigkill": sigkill}[name]
    r = run_cli("info", p)
    assert r.returncode == code, r.stderr
    last = r.stdout.splitlines()[-1]
    assert last.startswith(f"{p}: {state}"), last
    v = run_cli("validate", p)
    assert last == v.stdout.splitlines()[-1]  # the one verdict, told the same way
    js = run_cli("info", "--json", p)
    assert js.returncode == code
    verdict = _result(js)["verdict"]
    assert verdict["verdict"] == _result(run_cli("validate", "--json", p))["verdict"]
    assert verdict["exit_code"] == v.returncode
    if name == "typo":  # was: no verdict, exit 0 saying nothing of it
        assert "warning coverage-none" in r.stdout and "no kernel matched 'reshape_and_cache_flash_kernelX'" \
            in r.stdout
        assert verdict["verdict"] == "nothing-checked" and v.returncode == 4
    if name == "checksum":
        assert r.stdout.count("error payload-checksum") == 1  # said once (info's checksums are the verdict's)


# ---- canary ---------------------------------------------------------------------------------------------------------

def _live(src, dst):
    """``src`` with its last group's header flagged live (as a producer that died leaves it): the dump is
    unfinished, its records as they were."""
    from kvconv.format import reader

    raw = bytearray(src.read_bytes())
    off = synth._mod.group_offsets(bytes(raw))[-1][0]
    f = synth._mod.HDR.field("flags")
    struct.pack_into("<H" if f.size == 2 else "<I", raw, off + f.offset, reader.LIVE)
    struct.pack_into("<I", raw, off + 60, reader._header_crc(bytes(raw[off:off + 60]), live=True))
    dst.write_bytes(bytes(raw))
    return dst


def test_canary_exits_with_the_canary_part_of_the_verdict(tmp_path):
    cases = [(["canary", TYPO], 4, "NOTHING CHECKED"), (["canary", "--writes", TYPO], 4, "NOTHING CHECKED"),
             (["canary", "--writes", STALE], 1, "FAILED"), (["canary", SINGLE], 4, "NOTHING CHECKED"),
             (["canary", FIXTURES / "canary-stale-pad" / "canary-stale-pad.kvdump"], 1, "FAILED"),
             (["canary", FIXTURES / "canary-clean" / "canary-clean.kvdump"], 0, "ok")]
    for args, code, last in cases:
        r = run_cli(*args)
        assert r.returncode == code and r.stdout.splitlines()[-1].startswith(last), (args, r.stdout[-300:])
    # clean canary records of a producer that did not finish: incomplete (5), as validate says (was: ok, 0)
    live = _live(FIXTURES / "canary-clean" / "canary-clean.kvdump", tmp_path / "live.kvdump")
    assert run_cli("validate", live).returncode == 5
    r = run_cli("canary", live)
    assert r.returncode == 5 and r.stdout.splitlines()[-1].startswith("INCOMPLETE"), r.stdout[-300:]
    r = run_cli("canary", live, "--json")
    assert r.returncode == 5 and json.loads(r.stdout)["exit"] == 5


def test_canary_writes_text_leads_with_incidents():
    """A stale page-table entry in a 40-layer capture: 480 findings, 3 incident lines (was 402 finding lines between
    the summary and the verdict); --all and --json keep every finding; the same lines as validate's."""
    p = FIXTURES / "writes-wrong-page-80" / "writes-wrong-page-80.kvdump"
    r = run_cli("canary", "--writes", p)
    lines = r.stdout.splitlines()
    assert r.returncode == 1 and len(lines) == 5 and lines[-1] == "FAILED", r.stdout
    assert lines[1:4] == run_cli("validate", p).stdout.splitlines()[:3]
    assert all(x.startswith("error writes-unmapped-slot: ") and x.endswith("in 80 of 80 caches (kernel "
                                                                            "'reshape_and_cache_flash_kernel') "
                                                                            "(80 findings)") for x in lines[1:4])
    every = run_cli("canary", "--writes", "--all", p).stdout.splitlines()
    assert len(every) == 404 and every[0] == lines[0] and every[-1] == "FAILED"
    res = _result(run_cli("canary", "--writes", "--json", p))
    assert sum(f["count"] for f in res["findings"] if f["severity"] == "error") == 480


# ---- the converters -------------------------------------------------------------------------------------------------

CONVERTERS = [("perfetto", "t.pftrace"), ("chrome", "t.json"), ("arrow", "tables")]


@pytest.mark.parametrize("cmd,out", CONVERTERS, ids=[c for c, _ in CONVERTERS])
def test_converters_write_and_end_with_the_verdict(cmd, out, tmp_path, sigkill):
    """A readable dump is converted whatever its verdict (exit 0: the output is written); a verdict that is not ok
    is one last stderr line; an ok one adds nothing."""
    for p, state, incidents in ((STALE, "FAILED", 2), (TYPO, "NOTHING CHECKED", 1), (sigkill, "INCOMPLETE", None),
                                (SINGLE, None, 0)):
        o = tmp_path / p.stem / out
        o.parent.mkdir()
        r = run_cli(cmd, p, "-o", o)
        assert r.returncode == 0 and o.exists(), (p, r.stderr)
        lines = r.stderr.splitlines()
        said = [ln for ln in lines if "verdict" in ln]
        if state is None:
            assert said == [], r.stderr
            continue
        assert len(said) == 1 and lines[-1] == said[0], r.stderr
        n = incidents if incidents is not None else len(_result(run_cli("validate", "--json", p))["incidents"])
        assert said[0] == (f"Warning: {p}: verdict {state} ({n} incident{'s' * (n != 1)}): run `kvconv validate "
                           f"{p}` (the output was written)"), said[0]
        q = run_cli(cmd, p, "-o", o, "--force", "-q")  # -q: only warnings and errors, the verdict one of them
        assert q.returncode == 0 and q.stderr.splitlines()[-1] == said[0] and q.stderr.count("verdict") == 1, q.stderr
    # damaged records: nothing written, exit 1, the error alone; with --salvage converted, the verdict said
    o = tmp_path / "damaged" / out
    o.parent.mkdir()
    r = run_cli(cmd, CHECKSUM, "-o", o, "-q")
    assert r.returncode == 1 and not o.exists() and "verdict" not in r.stderr, r.stderr
    r = run_cli(cmd, CHECKSUM, "-o", o, "-q", "--salvage")
    assert r.returncode == 0 and o.exists(), r.stderr
    assert r.stderr.splitlines()[-1].startswith(f"Warning: {CHECKSUM}: verdict FAILED (1 incident)"), r.stderr


# ---- names a person reads -------------------------------------------------------------------------------------------

def _mangled_dump(path, *, lose_event: bool = True):
    """valid-small with its kernel recorded as nvcc names it (mangled) and, with ``lose_event``, one device event of
    a graph node missing (a missing-blocks error naming the kernel)."""
    from kvconv.format import dump

    parts = synth.small_parts()
    st = dump.StringTable()
    parts["kernel"]["name_off"], parts["kernel"]["name_len"] = st.add(MANGLED)
    parts["kernel"]["module_off"], parts["kernel"]["module_len"] = st.add("small.cubin")
    parts["strings"] = st
    if lose_event:  # graph replay 1's node 0xd0 (block 0): not recorded
        ev = parts["device_event"]
        parts["device_event"] = ev[[i for i in range(len(ev)) if i != 5]]
        parts["device_event"]["sequence"] = range(len(ev) - 1)
    synth.write_parts(path, parts)
    return path


def test_kernel_names_demangled_in_text_kept_in_json_and_arrow(tmp_path):
    p = _mangled_dump(tmp_path / "m.kvdump")
    v = run_cli("validate", p)
    assert v.returncode == 1 and "missing-blocks" in v.stdout
    assert DEMANGLED in v.stdout and MANGLED not in v.stdout, v.stdout
    js = json.dumps(_result(run_cli("validate", "--json", p))["findings"])
    assert MANGLED in js and DEMANGLED not in js
    i = run_cli("info", p)
    assert f"kernels: 1 kernel in the table: {DEMANGLED} (slot 7)" in i.stdout and MANGLED not in i.stdout, i.stdout
    assert _result(run_cli("info", "--json", p))["kernels"] == [{"slot": 7, "name": MANGLED, "context_id": 0}]
    rc = run_cli("reconcile", p)
    assert DEMANGLED in rc.stdout and MANGLED not in rc.stdout, rc.stdout
    assert MANGLED in run_cli("reconcile", "--json", p).stdout
    d = run_cli("diff", "-q", _mangled_dump(tmp_path / "clean.kvdump", lose_event=False), p)
    assert d.returncode == 1 and DEMANGLED in d.stdout and MANGLED not in d.stdout, d.stdout
    page = tmp_path / "r.html"
    assert run_cli("report", "-q", p, "-o", page).returncode == 1
    assert html.escape(DEMANGLED) in page.read_text()
    pa_ds = pytest.importorskip("pyarrow.dataset")
    assert run_cli("arrow", "-q", p, "-o", tmp_path / "t").returncode == 0
    names = pa_ds.dataset(tmp_path / "t" / "kernel", format="arrow").to_table().column("name").to_pylist()
    assert names == [MANGLED]


def test_names_a_demangler_cannot_read_stay_as_they_are():
    from kvconv.names import demangle, demangle_text

    assert demangle(MANGLED) == DEMANGLED
    assert demangle("_Znot_a_symbol") == "_Znot_a_symbol" and demangle("plain_kernel") == "plain_kernel"
    assert demangle_text(f"kernel '{MANGLED}' and x{MANGLED}") == f"kernel '{DEMANGLED}' and x{MANGLED}"


# ---- the closest loaded kernels -------------------------------------------------------------------------------------

def _nothing(path, loaded, dropped=None):
    parts = synth.small_parts({"target_launches": 0, "modules_patched": 0})
    for k in ("eager_launch", "graph_node", "device_event"):
        parts[k] = parts[k][:0]
    parts["meta"]["target_kernels"] = ["reshape_and_cache_flash_kernelX"]
    parts["meta"]["loaded_kernels"] = loaded
    if dropped is not None:
        parts["meta"]["loaded_kernels_dropped"] = dropped
    synth.write_parts(path, parts)
    return path


LOADED = [MANGLED, "_ZN2at6native22index_copy_kernel_implIfEEvPT_l", "plain_kernel",
          "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"]


def test_nothing_checked_offers_the_closest_loaded_kernels(tmp_path):
    """The tracer records loaded kernels as the driver names them (mangled): the message offers the function name
    a -k pattern matches (was: the closest raw mangled name, or none)."""
    p = _nothing(tmp_path / "n.kvdump", LOADED)
    for cmd in ("validate", "info"):
        r = run_cli(cmd, p)
        assert ("no kernel matched 'reshape_and_cache_flash_kernelX'; loaded kernels close to it: "
                "reshape_and_cache_flash_kernel" in r.stdout), r.stdout
        line = next(x for x in r.stdout.splitlines() if "coverage-none" in x)
        assert line.endswith("close to it: reshape_and_cache_flash_kernel") and "_ZN" not in line, line
    assert run_cli("validate", p).returncode == 4 and run_cli("info", p).returncode == 0
    # none close: the count includes the names the tracer saw and did not list
    q = _nothing(tmp_path / "q.kvdump", LOADED[1:], dropped=4_096)
    r = run_cli("validate", q)
    assert "; none of the 4,099 loaded kernels is close to it" in r.stdout, r.stdout


def test_loaded_kernels_follow_the_metadata_schema(tmp_path):
    p = _nothing(tmp_path / "bad.kvdump", "reshape_and_cache_flash_kernel")  # a string, not a list
    r = run_cli("validate", "--json", p)
    bad = [f for f in _result(r)["findings"] if f["severity"] == "error"]
    assert bad and "loaded_kernels" in json.dumps(bad), bad
