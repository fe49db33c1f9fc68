"""The Qwen3-14B reconstruction reproduces every published figure, from the records themselves."""


import numpy as np
import pytest

from conftest import FIXTURES, load_script
from kvconv.format import dump

DUMP = FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump"


def _generator():
    return load_script(FIXTURES / "qwen3-14b" / "generate.py")


@pytest.fixture(scope="module")
def d():
    with dump.open(DUMP) as d:
        yield d


def test_generator_is_deterministic_and_matches_the_committed_dump(tmp_path):
    gen = _generator()
    out = tmp_path / "q.kvdump"
    gen.write(out, gen.build())
    assert out.read_bytes() == DUMP.read_bytes(), "regenerate with python fixtures/qwen3-14b/generate.py"


def test_events_only_file_is_7303232_bytes(tmp_path):
    gen = _generator()
    out = tmp_path / "events.kvdump"
    gen.write_events_only(out, gen.build())
    assert out.stat().st_size == 7_303_232 == 64 + 114_112 * 64


def test_host_side_figures(d):
    eager, graph = d.records("eager_launch"), d.records("graph_node")
    assert len(eager) + len(graph) == 1_320
    blocks = lambda r: int((r["grid_x"].astype(np.int64) * r["grid_y"] * r["grid_z"]).sum())  # noqa: E731
    assert blocks(eager) + blocks(graph) == 115_880
    assert len(np.unique(graph["graph_exec"])) == 1
    assert len(np.unique(graph["node"])) == 40
    assert sorted(np.unique(graph["launch_id"]).tolist()) == list(range(1, 8))
    assert len(graph) == 280
    for r in range(1, 8):
        nodes = graph["node"][graph["launch_id"] == r]
        assert len(nodes) == len(np.unique(nodes)) == 40
        assert nodes.tolist() == graph["node"][graph["launch_id"] == 1].tolist()
    assert int(eager[0]["grid_x"]) == 1_768
    assert d.drops("graph_node") == d.drops("eager_launch") == 0
    assert d.groups_of("graph_node")[0].capacity == 65_536


def test_device_side_figures(d):
    ev = d.records("device_event")
    assert len(ev) == 114_112 and d.drops("device_event") == 0
    assert d.groups_of("device_event")[0].capacity == 1_048_576
    seq = np.sort(ev["sequence"])
    assert seq.tolist() == list(range(114_112))
    order = np.argsort(ev["sequence"])
    assert np.all(np.diff(ev["globaltimer"][order].astype(np.int64)) >= 0), "timer goes backwards"
    replay = ev[order][-280:]
    assert replay["sequence"][0] == 113_832 and replay["sequence"][-1] == 114_111
    assert set(replay["kernel_slot"].tolist()) == {4979}
    assert not replay["block_x"].any() and not replay["block_y"].any() and not replay["block_z"].any()
    assert set(replay["kind"].tolist()) == {1}
    assert not ev["flags"].any() and not ev["gridid"].any() and not ev["tag"].any()
    # 7 consecutive groups of 40: the gap between groups dwarfs the spacing inside one.
    t = replay["globaltimer"].astype(np.int64)
    gaps = np.diff(t)
    big = np.flatnonzero(gaps > 5_000_000)
    assert big.tolist() == [39, 79, 119, 159, 199, 239]
    spans = [(t[i * 40 + 39] - t[i * 40]) / 1e6 for i in range(7)]
    assert 106.85 <= min(spans) and max(spans) <= 108.58
    assert min(spans) == pytest.approx(106.85, abs=1e-6) and max(spans) == pytest.approx(108.58, abs=1e-6)
    inter = [(t[(i + 1) * 40] - t[i * 40 + 39]) / 1e6 for i in range(6)]
    assert 11.38 <= min(inter) and max(inter) <= 11.42
    # The eager events: every launch but the first is complete.
    assert len(ev) == 115_880 - 1_768


def test_metadata_counters_are_integers(d):
    c = d.metadata()["counters"]
    assert c["fatal_count"] == 0 and all(isinstance(v, int) for v in c.values())


def test_device_work_starts_microseconds_after_its_host_record(tmp_path):
    """Through the clock-sync pairs, as the traces draw it: each eager launch's flow (host record -> its first
    blocks) lasts microseconds, as on the real H200 captures; a graph node's lasts at most the replay's span (its
    record comes at cuGraphLaunch). Before: every device event came about 2.76 s after its host record."""
    import json

    from conftest import run_cli

    out = tmp_path / "q.json"
    r = run_cli("chrome", DUMP, "-o", out)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    ends: dict = {}
    for e in doc["traceEvents"] if isinstance(doc, dict) else doc:
        if e.get("ph") in ("s", "f"):
            ends.setdefault(e["id"], {})[e["ph"]] = e["ts"]
    flows = np.array(sorted(v["f"] - v["s"] for v in ends.values()))  # us
    assert len(flows) > 16_000
    eager, graph = flows[flows < 20], flows[flows >= 20]
    assert len(graph) == 280 and len(eager) == len(flows) - 280
    assert 2 <= eager.min() and eager.max() < 10 and 4 < np.median(eager) < 7
    assert 40 <= graph.min() < 60 and graph.max() <= 108.58e3 + 50
