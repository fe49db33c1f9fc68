"""A dump knows what it should hold (issue 48, part 3): every committed fixture dump cut at every group boundary (and
inside a header and a payload), read with and without --salvage, is never "valid", and its reconciliation never
"ok"; a finished dump missing a group is unreadable (a one-line error naming the end of the file), with --salvage
incomplete with the loss counted, and a salvaged prefix that kept nothing is nothing checked.

Each dump is unpacked once (compressed fixtures too, sparse where a live dump reserves its capacity) into one file
that is cut shorter and shorter in place (truncate: no copies). The fast tier cuts a sample; the slow tier every
fixture. Old real captures written before ``holds`` whose cut leaves nothing to tell it from a dump recorded
without the lost groups are :func:`undetectable`, named and counted; dumps with ``holds`` never are.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import warnings

import numpy as np
import pytest

from conftest import FIXTURES, Result, run_cli
from kvconv.check.validate import ValidateOptions, validate
from kvconv.format import dump, layout

PACKED = (".gz", ".xz", ".zst")
DUMPS = sorted(p for p in FIXTURES.rglob("*.kvdump*") if p.parent.name != "bad"
               and (p.suffix == ".kvdump" or p.suffix in PACKED))
IDS = [str(p.relative_to(FIXTURES)) for p in DUMPS]
SAMPLE = {"qwen3-14b/qwen3-14b.kvdump", "h200-single/single.kvdump", "writes-clean/writes-clean.kvdump",
          "synthetic-reconcile/two-contexts.kvdump", "h200-paged-plants/paged-clean.kvdump",
          "canary-clean/canary-clean.kvdump", "h200-death-sigkill/h200-death-sigkill.kvdump.gz"}


def unpack(src, dst) -> None:
    """``src`` decompressed into ``dst``, runs of zeros left as holes (a live dump reserves its whole capacity)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a live fixture's "unfinished": the cuts' checks say it
        d = dump.open(src, options=dump.ReadOptions(verify_checksums=False, salvage=True))
    with d, open(dst, "wb") as out:
        mm, step = d._mm, 1 << 20
        for at in range(0, d.size, step):
            chunk = mm[at: at + step]
            if chunk.count(0) == len(chunk):
                out.seek(len(chunk), os.SEEK_CUR)
            else:
                out.write(chunk)
        out.truncate(d.size)


def cuts(path) -> list[tuple[int, str]]:
    """Where to cut: after each group but the last (its kind named), inside the first and last headers, and
    halfway into the payload of the largest group; descending."""
    raw = open(path, "rb")
    size, out, pos = os.fstat(raw.fileno()).st_size, [], 0
    spans = []
    while pos + layout.HEADER_SIZE <= size:
        h = np.frombuffer(os.pread(raw.fileno(), layout.HEADER_SIZE, pos), dtype=layout.HEADER_DTYPE)[0]
        n = int(h["record_count"]) * int(h["record_size"])
        live = int(h["flags"]) & layout.ENUMS["header_flags"]["live"]  # a live group reserves its capacity
        reserved = int(h["capacity"]) * int(h["record_size"]) if live else 0
        end = pos + layout.HEADER_SIZE + layout.padded(max(n, reserved))
        kind = layout.KINDS_BY_ID.get(int(h["record_kind"]))
        spans.append((pos, n, end, kind.name if kind else "unknown"))
        pos = end
    raw.close()
    out = [(end, f"after {kind}") for _, _, end, kind in spans[:-1] if end < size]
    out += [(spans[0][0] + 30, "inside the first header"), (spans[-1][0] + 30, "inside the last header")]
    big = max(spans, key=lambda s: s[1])
    if big[1] > 16:
        out.append((big[0] + layout.HEADER_SIZE + big[1] // 2 + 1, f"inside the {big[3]} payload"))
    return sorted({c: w for c, w in out if 0 < c < size}.items(), reverse=True)


def undetectable(meta: dict, kinds: list[str], where: str) -> str | None:
    """Why a cut of an old real capture (no ``holds``) leaves nothing that tells it: the groups lost are the write
    canary's or value canary's, which such a dump's metadata never promised (None: the cut must be caught)."""
    if "holds" in meta or not where.startswith("after "):
        return None
    last = where.removeprefix("after ")
    if meta.get("tool") == "kvconv-tracer" and last in ("eager_launch", "slot_write") and "cache" in kinds:
        return "a tracer dump from before holds, cut before its write groups"
    if meta.get("tool") == "kvconv.capture.probe" and last in ("canary_pages", "cache", "slot_map"):
        return "a probe dump from before holds, cut before its write or value groups"
    return None


def cli_inprocess(*args) -> Result:
    from kvconv import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = cli.main([str(a) for a in args])
    return Result(rc, out.getvalue(), err.getvalue())


def _meta_kinds(path) -> tuple[dict, list[str]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with dump.open(path, options=dump.ReadOptions(verify_checksums=False)) as d:
            return d.metadata(), [g.kind_name for g in d.groups]


@pytest.mark.parametrize("src", [p if i in SAMPLE else pytest.param(p, marks=pytest.mark.slow)
                                 for p, i in zip(DUMPS, IDS)], ids=IDS)
def test_no_cut_is_valid_or_ok(src, tmp_path):
    path = tmp_path / "cut.kvdump"
    unpack(src, path)
    meta, kinds = _meta_kinds(path)
    seen, passed = [], []
    for at, where in cuts(path):
        os.truncate(path, at)
        why = undetectable(meta, kinds, where)
        for salvage in (False, True):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rep = validate(path, options=ValidateOptions(salvage=salvage))
            if why is not None:
                passed.append((at, where, rep.verdict))
                continue
            seen.append((at, where, salvage, rep.verdict))
            assert rep.verdict != "ok" and rep.exit_code != 0, (at, where, salvage, [f.line() for f in rep.findings])
            if not salvage and rep.verdict == "unreadable":
                assert any(f.severity == "error" and f.offset is not None for f in rep.findings)
        if why is None:
            args = ["reconcile", "--json", path]
            for salvage in ([], ["--salvage"]):
                r = cli_inprocess(*args[:1], *salvage, *args[1:])
                assert r.returncode != 0, (at, where, salvage, r.stdout[-2000:], r.stderr)
                if r.stdout:
                    body = json.loads(r.stdout)
                    assert all(x["exit"] != 0 for x in body["dumps"]), (at, where, salvage)
    assert seen or passed
    assert all(v != "unreadable" or w.startswith("inside") for _, w, v in passed)  # named: read, not refused


WRITTEN = [p for p, i in zip(DUMPS, IDS) if i.startswith("synthetic-reconcile/")]


@pytest.mark.parametrize("src", WRITTEN, ids=[p.name for p in WRITTEN])
def test_a_dump_with_holds_is_never_exempt(src):
    meta, kinds = _meta_kinds(src)
    assert meta["holds"]["groups"] == len(kinds) - 1
    assert all(undetectable(meta, kinds, f"after {k}") is None for k in kinds)
    assert sum(v["records"] for v in meta["holds"]["kinds"].values()) > 0


# ---------------------------------------------------------------------------------------------------- the issue's
QWEN = FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump"
SINGLE = FIXTURES / "h200-single" / "single.kvdump"


def _after(src, k: int) -> int:
    """The byte where group ``k`` of ``src`` ends (the issue's offsets in qwen3-14b, 784 ... 1,408, are its groups
    0..3 before it carried holds)."""
    with dump.open(src) as d:
        return d.groups[k + 1].offset


@pytest.mark.parametrize("src,k", [(QWEN, 0), (QWEN, 1), (QWEN, 2), (QWEN, 3), (QWEN, 4), (QWEN, 5),
                                   (SINGLE, 0), (SINGLE, 2), (SINGLE, 3), (SINGLE, 4), (SINGLE, 5)])
def test_the_issues_cuts_are_unreadable_then_counted(src, k, tmp_path):
    at = _after(src, k)  # h200-single: 1,512, 1,720, 1,848, 114,552 as in the issue
    path = tmp_path / "cut.kvdump"
    path.write_bytes(src.read_bytes()[:at])
    r = run_cli("validate", path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"Error: {path}: byte ") and ": metadata." in r.stderr or "record_count" in r.stderr
    r = run_cli("reconcile", path)
    assert r.returncode == 2 and "ok" not in r.stdout.splitlines()[-1:], r.stdout
    import kvconv

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert kvconv.open(path).verdict == "unreadable"
        r = run_cli("validate", "--salvage", "--json", path)
    rep = json.loads(r.stdout)["dumps"][0]["result"]
    assert rep["verdict"] in ("incomplete", "nothing-checked", "failed") and r.returncode in (1, 4, 5), rep
    assert {"cut-short", "salvaged"} & {f["code"] for f in rep["findings"]}


def test_a_group_boundary_cut_says_what_was_lost(tmp_path):
    path = tmp_path / "cut.kvdump"
    path.write_bytes(SINGLE.read_bytes()[:1848])
    r = run_cli("validate", path)
    assert f"{path}: byte 1848: metadata.contexts: cut short: the file lacks" in r.stderr
    assert "1 device_event group of context 0 (1,760 records)" in r.stderr
    assert "1 graph_node group of context 0 (280 records)" in r.stderr, r.stderr
    r = run_cli("validate", "--salvage", path)
    assert r.returncode == 4 and "NOTHING CHECKED" in r.stdout, r.stdout  # kept no launch or event record
    path.write_bytes(SINGLE.read_bytes()[:141496])  # every group but the eager launches
    r = run_cli("validate", "--salvage", "--json", path)
    found = json.loads(r.stdout)["dumps"][0]["result"]["findings"]
    cut = [f for f in found if f["code"] == "cut-short"]
    assert len(cut) == 1 and cut[0]["severity"] == "warning" and "1 eager_launch group of context 0 (40 records)" \
        in cut[0]["message"], cut


def test_a_salvaged_prefix_that_kept_nothing_is_nothing_checked(tmp_path):
    path = tmp_path / "p1000.kvdump"
    path.write_bytes(QWEN.read_bytes()[:1000])  # inside the metadata: no group at all
    r = run_cli("validate", "--salvage", path)
    assert r.returncode == 2 and "nothing to check" in r.stderr, r.stderr
    path.write_bytes(QWEN.read_bytes()[:_after(QWEN, 0) + 100])  # the metadata, and the strings cut short
    r = run_cli("validate", "--salvage", path)
    assert r.returncode == 4 and "NOTHING CHECKED" in r.stdout, r.stdout
    r = run_cli("reconcile", "--salvage", path)
    assert r.returncode == 4 and r.stdout.splitlines()[-1].startswith("NOTHING CHECKED"), r.stdout
    r = run_cli("report", "--salvage", path, "-o", tmp_path / "r.html")
    assert r.returncode == 4, r.stderr
    (tmp_path / "out").mkdir()
    for emitter, out in (("perfetto", "t.pftrace"), ("chrome", "t.json"), ("arrow", "t-tables")):
        r = run_cli(emitter, "--salvage", path, "-o", tmp_path / "out" / out)
        assert r.returncode == 2 and "nothing to convert" in r.stderr, (emitter, r.stderr)
        assert list((tmp_path / "out").iterdir()) == []  # no output, no temporary left


def test_a_tail_cut_says_which_events_were_lost(tmp_path):
    path = tmp_path / "last1.kvdump"
    raw = QWEN.read_bytes()
    path.write_bytes(raw[:-1])
    r = run_cli("validate", "--salvage", path)
    assert r.returncode == 5 and "cut short (read with --salvage)" in r.stdout, r.stdout
    assert "lost-at-cut" in r.stdout and "the last 1 device events (sequence 114,111..114,111)" in r.stdout
    assert "graph exec 0x55813d402e10 replay 7 node #39" in r.stdout
    assert "missing-blocks" not in r.stdout and "cannot tell" not in r.stdout, r.stdout
    r = run_cli("reconcile", "--salvage", path)
    assert r.returncode == 5 and r.stdout.splitlines()[-1].startswith("INCOMPLETE"), r.stdout
    path.write_bytes(raw[:-64 * 100 - 1])  # 101 events: the last launches lost theirs
    r = run_cli("validate", "--salvage", "--json", path)
    rep = json.loads(r.stdout)["dumps"][0]["result"]
    assert rep["verdict"] == "incomplete", [f["message"] for f in rep["findings"] if f["severity"] == "error"]
    lost = [f for f in rep["findings"] if f["code"] == "lost-at-cut"]
    assert lost and "sequence 114,011..114,111" in lost[0]["message"]


def test_a_cut_in_the_last_padding_is_cut_short(tmp_path):
    path = tmp_path / "pad.kvdump"
    with dump.new(path) as w:
        w.write_metadata({"tool": "test", "tool_version": "0"})
        w.write_strings(b"abc")  # 3 bytes and 5 of padding
    raw = path.read_bytes()
    assert len(raw) % 8 == 0
    path.write_bytes(raw[:-2])
    r = run_cli("validate", path)
    assert r.returncode == 2 and "2 bytes into its last group's 8-byte padding" in r.stderr, r.stderr
    r = run_cli("validate", "--salvage", path)
    assert r.returncode != 0


def test_dump_new_writes_holds_first(tmp_path):
    path = tmp_path / "d.kvdump"
    ev = np.zeros(3, dtype=layout.DTYPES["device_event"])
    with dump.new(path) as w:
        w.write_metadata({"tool": "test", "tool_version": "0", "holds": {"groups": 99, "kinds": {}}})
        w.write_records("device_event", ev)
        w.write_stream("graph_node", [np.zeros(2, dtype=layout.DTYPES["host_launch"])] * 2)
        w.write_records("device_event", ev[:1], context_id=1)
    with dump.open(path) as d:
        assert [g.kind_name for g in d.groups] == ["metadata", "device_event", "graph_node", "device_event"]
        assert d.metadata()["holds"] == {"groups": 3, "kinds": {"device_event": {"groups": 2, "records": 4},
                                                                "graph_node": {"groups": 1, "records": 4}}}
    assert sorted(os.listdir(tmp_path)) == ["d.kvdump"]  # the groups' temporary file is gone
    old = tmp_path / "old.kvdump"
    with dump.new(old) as w:
        w.write_metadata({"tool": "test", "tool_version": "0"}, holds=False)
        w.write_records("device_event", ev)
    with dump.open(old) as d:
        assert "holds" not in d.metadata()


def test_the_probe_recorder_writes_holds(tmp_path):
    from kvconv.capture.probe.writer import CanaryRecorder

    path = tmp_path / "probe.kvdump"
    rec = CanaryRecorder(str(path), metadata={"tool": "kvconv.capture.probe", "tool_version": "0"})
    rec.close()
    with dump.open(path) as d:
        holds = d.metadata()["holds"]
        assert holds["groups"] == len(d.groups) - 1 >= 2
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - layout.HEADER_SIZE])  # the last group's header and (empty) payload
    r = run_cli("validate", path)
    assert r.returncode == 2 and "metadata.holds" in r.stderr, r.stderr
