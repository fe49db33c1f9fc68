"""The verdict a converter computes in its own pass (EmitOptions.verdict: kvconv.check.validate.Validation)
is kvconv validate's:
the same verdict, exit status, findings (in order) and incidents, on every fixture dump and on dumps damaged one
thing at a time, whatever the chunk size the converter walks the events in."""

from __future__ import annotations

import json

import numpy as np
import pytest

import synth
from conftest import FIXTURES, run_cli
from kvconv.emit import EmitOptions, write_arrow, write_chrome, write_perfetto
from kvconv.format import layout
from kvconv.format.errors import KvconvError

DUMPS = sorted(p for p in FIXTURES.rglob("*") if p.name.endswith((".kvdump", ".kvdump.gz")))
WRITERS = {"perfetto": (write_perfetto, "t.pftrace"), "chrome": (write_chrome, "t.json"),
           "arrow": (write_arrow, "tables")}


def _validate(path, *, salvage: bool = False) -> dict:
    r = run_cli("validate", "--json", path, *(["--salvage"] if salvage else []))
    return {**json.loads(r.stdout)["dumps"][0]["result"], "exit": r.returncode}


def _same(report, want: dict) -> None:
    got = report.to_dict()
    assert (got["verdict"], got["exit_code"]) == (want["verdict"], want["exit_code"]), (got, want)
    assert got["findings"] == want["findings"]
    assert got["incidents"] == want["incidents"]
    assert want["exit"] == want["exit_code"]  # (the command's status is its report's)


def _emit(fmt: str, path, tmp_path, **kw):
    write, out = WRITERS[fmt]
    return write([str(path)], tmp_path / out, options=EmitOptions(progress=False, verdict=True, **kw))


@pytest.mark.parametrize("path", DUMPS, ids=[str(p.relative_to(FIXTURES)) for p in DUMPS])
def test_perfetto_verdict_is_validates_on_every_fixture(path, tmp_path):
    """Where the converter refuses a dump (damaged or unreadable: its error, no output), validate's verdict is not
    ok either; with --salvage the converter's verdict is validate --salvage's."""
    want = _validate(path)
    try:
        res = _emit("perfetto", path, tmp_path, chunk=777)  # chunks that end anywhere, unlike validate's
    except KvconvError:
        assert want["verdict"] != "ok"
        try:
            res = _emit("perfetto", path, tmp_path, chunk=777, salvage=True, force=True)
        except KvconvError:
            assert want["verdict"] in ("unreadable", "failed")
            return
        want = _validate(path, salvage=True)
    assert len(res.verdicts) == 1
    _same(res.verdicts[0], want)


SOME = [FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump", FIXTURES / "synthetic-multi" / "rank0.kvdump",
        FIXTURES / "bad" / "valid-small.kvdump"]


@pytest.mark.parametrize("fmt", ["chrome", "arrow"])
@pytest.mark.parametrize("path", SOME, ids=[p.name for p in SOME])
def test_chrome_and_arrow_verdicts_are_validates(fmt, path, tmp_path):
    res = _emit(fmt, path, tmp_path)
    _same(res.verdicts[0], _validate(path))


def _damage(parts: dict, how: str) -> None:
    ev, E = parts["device_event"], layout.ENUMS
    if how == "gap":
        ev["sequence"][5:] += 3
    elif how == "duplicate":
        ev["sequence"][4] = 3
    elif how == "unordered":
        ev["sequence"][[2, 6]] = ev["sequence"][[6, 2]]
    elif how == "slot":
        ev["kernel_slot"][3] = 99
    elif how == "kind":
        ev["kind"][1] = 200
    elif how == "grid":
        ev["block_x"][0] = 40
    elif how == "timer":
        ev["globaltimer"][6] = ev["globaltimer"][2]
    elif how == "host-flags":
        parts["eager_launch"]["flags"][1] = E["launch_flags"]["graph_node"]
    elif how == "host-range":
        parts["graph_node"]["grid_x"][2] = 0
    elif how == "lost-event":
        parts["device_event"] = np.delete(ev, 4)
    elif how == "no-kernel-table":
        parts["kernel"] = parts["kernel"][:0]


DAMAGE = ["gap", "duplicate", "unordered", "slot", "kind", "grid", "timer", "host-flags", "host-range", "lost-event",
          "no-kernel-table"]


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("fmt", ["perfetto", "chrome", "arrow"])
def test_damaged_dumps_get_validates_verdict(fmt, how, tmp_path):
    """Records damaged one at a time (sound checksums): each converter's verdict is validate's, walking the events
    two at a time (a chunk boundary inside every run)."""
    parts = synth.small_parts()
    _damage(parts, how)
    p = tmp_path / f"{how}.kvdump"
    synth.write_parts(p, parts)
    want = _validate(p)
    assert want["findings"], want  # (the damage is seen)
    _same(_emit(fmt, p, tmp_path, chunk=2).verdicts[0], want)


def test_a_damaged_payload_converted_with_salvage_says_validates_verdict(tmp_path):
    """A device event payload whose checksum fails: the converter refuses it; with --salvage it converts, and its
    verdict (from the checksum its own pass summed) is validate --salvage's."""
    p = tmp_path / "crc.kvdump"
    synth.write_parts(p, synth.small_parts())
    from kvconv.format import dump

    with dump.open(p) as d:
        g = d.groups_of("device_event")[0]
        at = g.record_offset(3) + layout.LAYOUTS["device_event"].field("block_x").offset
    raw = bytearray(p.read_bytes())
    raw[at] ^= 1
    p.write_bytes(bytes(raw))
    with pytest.raises(KvconvError):
        _emit("perfetto", p, tmp_path)
    res = _emit("perfetto", p, tmp_path, salvage=True, force=True)
    want = _validate(p, salvage=True)
    assert want["verdict"] == "failed"
    _same(res.verdicts[0], want)


def test_library_callers_do_not_pay_for_the_checks(tmp_path):
    res = write_perfetto([str(SOME[0])], tmp_path / "t.pftrace", options=EmitOptions(progress=False))
    assert res.verdicts == [] and "verdict" not in res.timings


@pytest.mark.parametrize("fed", [False, True], ids=["many-hosts", "few-hosts"])
@pytest.mark.parametrize("how", ["gap", "grid", None])
def test_lazy_contexts(how, fed, tmp_path, monkeypatch):
    """A large dump's contexts, streamed lazily by the emitter (here: every dump counts as large), are fed by the walk
    when they have few host records, else checked after the conversion by validate's own loop: the same report."""
    import kvconv.emit._contexts as ctxs

    monkeypatch.setattr(ctxs, "RELEASE_BYTES", 0)
    monkeypatch.setattr(ctxs, "LAZY_CHECKED_HOSTS", 1 << 40 if fed else 0)
    if how is None:
        p = SOME[0]
    else:
        parts = synth.small_parts()
        _damage(parts, how)
        p = tmp_path / f"{how}.kvdump"
        synth.write_parts(p, parts)
    seen = []
    real = ctxs._attach_checks

    def attach(dumps, cs, options, checks):
        real(dumps, cs, options, checks)
        seen.extend(c.lazy and (c.checks is not None) == fed for c in cs)

    monkeypatch.setattr(ctxs, "_attach_checks", attach)
    res = _emit("perfetto", p, tmp_path, join="exact")
    assert seen and all(seen)  # every context lazy, fed by a walk or not
    _same(res.verdicts[0], _validate(p))
