"""Damaged and hostile dumps through every command (issue 7): exit 0, 1 or 2, a one-line ``Error: ...`` where it
fails, no traceback, no output left behind on failure, the input untouched, memory bounded by the file's size.

The mutators and the judge live in tools/fuzz.py (its long run does >= 100,000 cases); here hypothesis drives them,
CI-sized, plus deterministic sweeps: truncation at every group boundary and inside records, hostile header counts,
capacities and record sizes, hostile record fields and garbage metadata. Commands run in-process through
``kvconv.cli.main`` (the real entry point) with captured stdout/stderr.

    KVCONV_FUZZ_EXAMPLES=500 KVCONV_FUZZ_RANDOM=1 .venv/bin/python -m pytest tests/test_fuzz.py   # a longer look
"""

from __future__ import annotations

import os
import random
import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from conftest import ROOT, load_script

fuzz = load_script(ROOT / "tools" / "fuzz.py")
pytestmark = pytest.mark.slow  # the slow tier (issue 30): a few hundred damaged dumps through every command

EXAMPLES = int(os.environ.get("KVCONV_FUZZ_EXAMPLES", "40"))


class HypRand(fuzz.Rand):
    """The mutators' random source, drawn from hypothesis (so failures shrink to a small damage)."""

    def __init__(self, data) -> None:
        super().__init__(None)
        self.data = data

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def bytes(self, n: int) -> bytes:
        return self.data.draw(st.binary(min_size=n, max_size=n))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    restore = fuzz.fast_typer()
    tmp = str(tmp_path_factory.mktemp("fuzz"))
    bases = fuzz.base_dumps()
    cmds = fuzz.commands()
    fuzz.warm_up(cmds, bases, tmp)
    yield bases, cmds, tmp
    restore()


def _run_all(env, data: bytes, *, salvage=(False, True), json_=(False,), trace=False) -> list[str]:
    """Every command on ``data`` (with each flag combination asked for); the problems found."""
    bases, cmds, tmp = env
    plan = [(c, js, sv, False) for c in cmds for js in json_ for sv in salvage if sv is False or c.salvage]
    problems = []
    for _c, o in fuzz.run_file(data, plan, tmp, second=bases[0][1], trace_memory=trace):
        problems += [f"kvconv {' '.join(o.argv)}: {p}" for p in o.problems]
    return problems


def test_commands_discovered(env):
    _, cmds, _ = env
    names = {c.name for c in cmds}
    assert {"info", "validate"} <= names, names
    assert "demo" not in names and "record" not in names


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("KVCONV_FUZZ_RANDOM"),
          report_multiple_bugs=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_dumps_every_command(env, data):
    bases, cmds, tmp = env
    R = HypRand(data)
    base, raw, log, plan = fuzz.case_plan(R, cmds, bases)
    note(f"base {base}, {len(raw)} bytes: " + "; ".join(log))
    problems = []
    tracemalloc.start()
    try:
        for _c, o in fuzz.run_file(raw, plan, tmp, second=bases[0][1], trace_memory=True):
            problems += [f"kvconv {' '.join(o.argv)}: {p}" for p in o.problems]
    finally:
        tracemalloc.stop()
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------------------------
# deterministic sweeps over the synthetic small dump (all record kinds but canary) and a canary fixture


def _base(env, name: str) -> bytes:
    bases = dict(env[0])
    return bases[name]


def _cuts(raw: bytes) -> dict[str, int]:
    """Every group boundary, and points inside headers and records."""
    cuts = {}
    for k, g in enumerate(fuzz.walk(raw)):
        cuts[f"g{k}-start"] = g.off
        cuts[f"g{k}-in-header"] = g.off + 17
        cuts[f"g{k}-payload"] = g.payload
        if g.rsize > 1 and g.count > 1:
            cuts[f"g{k}-record-boundary"] = g.payload + g.rsize * (g.count // 2)
            cuts[f"g{k}-in-record"] = g.payload + g.rsize * (g.count // 2) + g.rsize // 2 + 1
        elif g.count > 1:
            cuts[f"g{k}-mid-bytes"] = g.payload + g.count // 2
        cuts[f"g{k}-end"] = g.end
    return cuts


SMALL = "synth-small"
CANARY = "canary-clean/canary-clean.kvdump"


@pytest.mark.parametrize("base", [SMALL, CANARY])
def test_truncation_at_every_boundary(env, base):
    raw = _base(env, base)
    problems = []
    for what, at in _cuts(raw).items():
        problems += [f"{what} (byte {at}): {p}" for p in _run_all(env, raw[:at])]
    assert not problems, "\n".join(problems)


def _set(raw: bytes, off: int, fmt: str, value: int) -> bytearray:
    b = bytearray(raw)
    struct.pack_into(fmt, b, off, value)
    return b


HOSTILE_HEADER = [(f, v) for f in ("record_count", "capacity", "record_size", "drop_count")
                  for v in (0, 1, (1 << 32) - 1, (1 << 63), (1 << 64) - 1)] + [
    ("record_kind", 0), ("record_kind", 0xFFFF), ("clock_domain", 0xFFFF), ("context_id", 0xFFFFFFFF),
    ("minor", 0xFFFF), ("header_size", 0), ("flags", 0xFFFFFFFF)]


@pytest.mark.parametrize("kind", ["metadata", "kernel", "graph_node", "device_event"])
@pytest.mark.parametrize("field,value", HOSTILE_HEADER, ids=[f"{f}={v:#x}" for f, v in HOSTILE_HEADER])
def test_hostile_header_values(env, kind, field, value):
    raw = _base(env, SMALL)
    g = next(g for g in fuzz.walk(raw) if g.kind == fuzz.layout.KINDS[kind].id)
    b = bytearray(raw)
    fuzz.set_header_field(b, g.off, field, value)  # header checksum re-fixed: the value itself is the damage
    assert not (p := _run_all(env, bytes(b), salvage=(False,))), "\n".join(p)


def _records_set(raw: bytes, kind: str, fld: str, value: int, which="all") -> bytes:
    b = bytearray(raw)
    lay = fuzz.layout.LAYOUTS[fuzz.layout.KINDS[kind].layout]
    f = lay.field(fld)
    for g in fuzz.walk(raw):
        if g.kind != fuzz.layout.KINDS[kind].id:
            continue
        recs = range(g.count) if which == "all" else [g.count - 1]
        for r in recs:
            at = g.payload + r * g.rsize + f.offset
            b[at : at + f.size] = (value & ((1 << (8 * f.size)) - 1)).to_bytes(f.size, "little")
    fuzz.fix_crcs(b)  # checksums re-fixed: the damage reaches the record checks, reconciler and emitters
    return bytes(b)


U32, U64 = (1 << 32) - 1, (1 << 64) - 1
HOSTILE_RECORDS = [
    (SMALL, "graph_node", "grid_x", 0), (SMALL, "graph_node", "grid_x", U32), (SMALL, "eager_launch", "grid_y", U32),
    (SMALL, "eager_launch", "grid_z", U32), (SMALL, "graph_node", "block_dim_x", U32),
    (SMALL, "graph_node", "launch_id", U64), (SMALL, "graph_node", "launch_id", 0),
    (SMALL, "graph_node", "node", U64), (SMALL, "graph_node", "grid_id", U64),
    (SMALL, "graph_node", "kernel_slot", U32), (SMALL, "eager_launch", "host_ns", U64),
    (SMALL, "device_event", "sequence", 1 << 63), (SMALL, "device_event", "sequence", U64),
    (SMALL, "device_event", "globaltimer", U64),
    (SMALL, "device_event", "block_x", U32), (SMALL, "device_event", "kernel_slot", U32),
    (SMALL, "device_event", "gridid", U64), (SMALL, "device_event", "flags", 0xFF), (SMALL, "device_event", "kind", 0),
    (SMALL, "kernel", "name_off", U32), (SMALL, "kernel", "name_len", U32), (SMALL, "kernel", "slot", U32),
    (SMALL, "clock_sync", "gpu_ns", U64), (SMALL, "clock_sync", "host_ns", 0),
    (CANARY, "canary", "expected_first", U32), (CANARY, "canary", "expected_count", U32),
    (CANARY, "canary", "changed_count", U32), (CANARY, "canary", "excluded_first", U32),
    (CANARY, "canary", "num_pages", U32), (CANARY, "canary", "num_pages", 0), (CANARY, "canary", "page_size", 0),
    (CANARY, "canary", "name_off", U32), (CANARY, "canary", "step", U64), (CANARY, "canary_pages", "page", U32),
]


@pytest.mark.parametrize("which", ["all", "last"])
@pytest.mark.parametrize("base,kind,fld,value", HOSTILE_RECORDS,
                         ids=[f"{k}.{f}={v:#x}" for _, k, f, v in HOSTILE_RECORDS])
def test_hostile_record_fields(env, base, kind, fld, value, which):
    data = _records_set(_base(env, base), kind, fld, value, which)
    assert not (p := _run_all(env, data, salvage=(False,), json_=(False, True))), "\n".join(p)


@pytest.mark.parametrize("variant", range(16))
def test_garbage_metadata(env, variant):
    class Fixed(fuzz.Rand):
        def int(self, lo, hi):  # the first draw picks the variant, the rest are seeded
            if not hasattr(self, "_first"):
                self._first = True
                return variant
            return random.Random(variant).randint(lo, hi)

    payload = fuzz.garbage_json(Fixed())
    raw = _base(env, SMALL)
    g = fuzz.walk(raw)[0]
    meta = fuzz.layout.KINDS["metadata"]
    assert g.kind == meta.id
    new = fuzz.dump.make_header(meta, record_count=len(payload), payload_crc32=fuzz.zlib.crc32(payload))
    data = new + payload + b"\0" * (fuzz.layout.padded(len(payload)) - len(payload)) + raw[g.end :]
    assert not (p := _run_all(env, data, salvage=(False,), json_=(False, True))), "\n".join(p)
