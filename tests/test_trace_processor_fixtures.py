"""Every committed fixture dump, converted by ``kvconv perfetto`` and ``kvconv chrome`` through the real CLI, loads in
Perfetto's own trace processor (the reader behind ui.perfetto.dev) and holds what the dump holds (issue 30).

Dumps: fixtures/*/*.kvdump, the .kvdump.gz ones gunzipped into a temp folder, except the malformed ones under
fixtures/bad/ that no command reads (those whose cases.json exit is not 0). For each trace, in trace processor:

- no stat of severity error or data_loss;
- block slices (Perfetto: on the ``SM n`` tracks; Chrome: category ``block``) = the dump's block_enter events (one
  slice per entry, exits close it);
- host launch slices (``host node launches`` / ``eager launches`` tracks; Chrome: category ``host``) = the dump's
  graph_node + eager_launch records;
- SM tracks (Chrome: threads named ``SM n``) = distinct SMs of the block entries, summed over the dump's contexts;
- flows = the count the CLI printed, each from a host launch slice to a block slice;
- args: Perfetto's ``debug.block_x`` / Chrome's ``args.block[0]`` and ``args.seq`` of the block slices sum to the dump's
  block_x and sequence of the block entries.

Skipped, with the reason, where no trace_processor binary is at hand (KVCONV_TRACE_PROCESSOR or
../shared/tools/trace_processor_shell beside the checkout, as in CI).
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES, NO_TRACE_PROCESSOR, ROOT, run_cli, trace_processor, trace_processor_bin
from kvconv.format import dump

BLOCK_ENTER = 1
_BAD_EXIT = json.loads((FIXTURES / "bad" / "cases.json").read_text())
DUMPS = sorted(p.relative_to(ROOT).as_posix() for p in [*FIXTURES.glob("*/*.kvdump"), *FIXTURES.glob("*/*.kvdump.gz")]
               if not (p.parent.name == "bad" and _BAD_EXIT.get(p.name.split(".")[0], {}).get("exit", 0) != 0))
FORMATS = {"perfetto": ".pftrace", "chrome": ".json"}
# the fast tier's sample (one of each kind: an H200 capture, a live death dump from .gz, two contexts, write records);
# every other dump in the slow tier (all 43 dumps x 2 formats: ~4 min on 2 busy cores)
FAST = {"fixtures/h200-single/single.kvdump", "fixtures/h200-death-sigkill/h200-death-sigkill.kvdump.gz",
        "fixtures/synthetic-reconcile/two-contexts.kvdump", "fixtures/writes-stale-pad/writes-stale-pad.kvdump"}


@pytest.fixture(scope="module")
def binary() -> str:
    b = trace_processor_bin()
    if not b:
        pytest.skip(NO_TRACE_PROCESSOR)
    return b


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("tp-fixtures")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _source(rel: str, folder: Path) -> Path:
    p = ROOT / rel
    if p.suffix != ".gz":
        return p
    out = folder / p.name[:-3]
    if not out.exists():
        out.write_bytes(gzip.decompress(p.read_bytes()))
    return out


def _expected(path: Path) -> dict:
    """What the emitters draw of the dump, from kvconv's own reader."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # live (unfinished) and newer-minor dumps warn; their records read the same
        with dump.open(path) as d:
            enters = d.records("device_event")
            enters = enters[enters["kind"] == BLOCK_ENTER]
            sms = sum(len(np.unique(ev["smid"][ev["kind"] == BLOCK_ENTER]))
                      for ev in (d.records("device_event", context_id=c) for c, _ in d.contexts()))
            return {"blocks": len(enters), "host": len(d.records("graph_node")) + len(d.records("eager_launch")),
                    "sms": sms, "block_x": int(enters["block_x"].astype(np.int64).sum()),
                    "seq": int(enters["sequence"].astype(np.int64).sum())}


_PERFETTO_SQL = """
select
  (select count(*) from slice s join track t on s.track_id = t.id where t.name glob 'SM *') blocks,
  (select count(*) from slice s join track t on s.track_id = t.id
     where t.name = 'host node launches' or t.name glob 'eager launches*') host,
  (select count(distinct s.track_id) from slice s join track t on s.track_id = t.id where t.name glob 'SM *') sms,
  (select count(*) from flow) flows,
  (select count(*) from flow f join slice a on f.slice_out = a.id join track ta on a.track_id = ta.id
     join slice b on f.slice_in = b.id join track tb on b.track_id = tb.id
     where (ta.name = 'host node launches' or ta.name glob 'eager launches*') and tb.name glob 'SM *') host_to_block,
  (select coalesce(sum(a.int_value), 0) from slice s join track t on s.track_id = t.id
     join args a on a.arg_set_id = s.arg_set_id where t.name glob 'SM *' and a.key = 'debug.block_x') block_x,
  null seq
"""
_CHROME_SQL = """
select
  (select count(*) from slice where category = 'block') blocks,
  (select count(*) from slice where category = 'host') host,
  (select count(distinct utid) from slice s join thread_track tt on s.track_id = tt.id join thread using (utid)
     where thread.name glob 'SM *' and s.category = 'block') sms,
  (select count(*) from flow) flows,
  (select count(*) from flow f join slice a on f.slice_out = a.id join slice b on f.slice_in = b.id
     where a.category = 'host' and b.category = 'block') host_to_block,
  (select coalesce(sum(a.int_value), 0) from slice s join args a on a.arg_set_id = s.arg_set_id
     where s.category = 'block' and a.key = 'args.block[0]') block_x,
  (select coalesce(sum(a.int_value), 0) from slice s join args a on a.arg_set_id = s.arg_set_id
     where s.category = 'block' and a.key = 'args.seq') seq
"""


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("rel", [d if d in FAST else pytest.param(d, marks=pytest.mark.slow) for d in DUMPS])
def test_fixture_trace_in_trace_processor(binary, folder, rel, fmt):
    src = _source(rel, folder)
    out = folder / (rel.replace("/", "_") + FORMATS[fmt])
    out.unlink(missing_ok=True)
    r = run_cli(fmt, src, "-o", out)
    assert r.returncode == 0, r.stderr
    printed = re.search(r"([\d,]+) device events, ([\d,]+) host records, ([\d,]+) flows", r.stdout)
    assert printed, r.stdout
    want = _expected(src)
    try:
        with trace_processor(out, binary) as tp:
            bad = tp.query("select name, idx, severity, source, value from stats "
                           "where severity in ('error', 'data_loss') and value > 0").as_pandas_dataframe()
            assert bad.empty, bad.to_string()
            got = tp.query(_PERFETTO_SQL if fmt == "perfetto" else _CHROME_SQL).as_pandas_dataframe().iloc[0]
    finally:
        out.unlink(missing_ok=True)
    flows = int(printed.group(3).replace(",", ""))
    assert int(got.blocks) == want["blocks"]
    assert int(got.host) == want["host"] == int(printed.group(2).replace(",", ""))
    assert int(got.sms) == want["sms"]
    assert int(got.flows) == int(got.host_to_block) == flows
    assert flows <= want["blocks"] and (flows > 0) == (want["blocks"] > 0 and want["host"] > 0)
    assert int(got.block_x) == want["block_x"]
    if fmt == "chrome":
        assert int(got.seq) == want["seq"]


def test_every_fixture_dump_is_checked():
    """The list holds the fixtures issue 30 names: Qwen, H200 captures, tp2, death dumps (gz too), write fixtures."""
    names = " ".join(DUMPS)
    for part in ("qwen3-14b/", "h200-single/", "h200-tp2/rank1", "h200-death-sigkill/h200-death-sigkill.kvdump.gz",
                 "h200-death-normal/", "writes-stale-pad/", "bad/valid-small"):
        assert part in names, part
    assert "bad/bad-magic" not in names
    assert FAST <= set(DUMPS)
