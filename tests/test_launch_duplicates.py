"""Duplicated host records: which records repeat one another, and the record each repeats (the one counted), against
the rule written out record by record (graph nodes: same graph exec, replay and node; eager launches: same gridid;
the first in record order is counted)."""

from __future__ import annotations

import numpy as np
import pytest

from kvconv.join.launches import EAGER, GRAPH_NODE, LaunchTable, _duplicates, first_records, node_ordinals


def _table(gn: list, eager_gids: list) -> LaunchTable:
    """Graph-node rows (graph exec, replay, node), then eager rows (gridid); the other columns are plain."""
    n_gn, n = len(gn), len(gn) + len(eager_gids)
    kind = np.r_[np.full(n_gn, GRAPH_NODE), np.full(len(eager_gids), EAGER)].astype(np.uint8)
    index = np.r_[np.arange(n_gn), np.arange(len(eager_gids))].astype(np.int32)
    g = np.array(gn, np.uint64).reshape(-1, 3)
    c = {"graph_exec": np.r_[g[:, 0], np.zeros(len(eager_gids), np.uint64)],
         "launch_id": np.r_[g[:, 1], np.zeros(len(eager_gids), np.uint64)],
         "node": np.r_[g[:, 2], np.zeros(len(eager_gids), np.uint64)],
         "grid_id": np.r_[np.arange(1, n_gn + 1, dtype=np.uint64), np.array(eager_gids, np.uint64)],
         "flags": np.zeros(n, np.uint8)}
    upload = np.zeros(n, bool)
    ordn = np.full(n, -1, np.int32)
    ordn[:n_gn] = node_ordinals({f: c[f][:n_gn] for f in ("flags", "graph_exec", "launch_id", "node")})
    dup = _duplicates(kind, index, upload, c, ordn)
    one = np.ones(n, np.uint32)
    return LaunchTable(n_gn=n_gn, kind=kind, index=index, host_ns=np.arange(n, dtype=np.uint64),
                       stream=np.zeros(n, np.uint64), kernel_slot=np.zeros(n, np.uint32), tag=np.zeros(n, np.uint64),
                       gx=one, gy=one, gz=one, grid=np.ones(n, np.int64), upload=upload, dup=dup, node_ordinal=ordn,
                       **c)


def _by_rule(t: LaunchTable) -> tuple[np.ndarray, dict]:
    dup, first = np.zeros(t.n, bool), {}
    for h in range(t.n):
        if t.kind[h] == GRAPH_NODE:
            same = np.flatnonzero((t.kind == GRAPH_NODE) & (t.graph_exec == t.graph_exec[h])
                                  & (t.launch_id == t.launch_id[h]) & (t.node == t.node[h]))
        else:
            same = np.flatnonzero((t.kind == EAGER) & (t.grid_id == t.grid_id[h]))
        if same[0] != h:
            dup[h], first[h] = True, int(same[0])
    return dup, first


def test_repeats_name_the_first_record_not_a_neighbour():
    t = _table([(1, 1, 10), (1, 1, 11), (1, 2, 10), (1, 1, 10), (1, 1, 11), (1, 1, 10)], [100, 200, 100, 100])
    assert t.dup.tolist() == [False, False, False, True, True, True, False, False, True, True]
    rows = t.in_order(t.dup)
    assert rows.tolist() == [8, 9, 3, 4, 5]  # eager launches first (report order)
    assert first_records(t, rows).tolist() == [6, 6, 0, 1, 0]


@pytest.mark.parametrize("seed", range(6))
def test_repeats_follow_the_rule_on_random_tables(seed):
    rng = np.random.default_rng(seed)
    n_gn, n_el = int(rng.integers(1, 400)), int(rng.integers(0, 200))
    gn = [tuple(int(x) for x in r) for r in rng.integers(1, [3, 6, 5], size=(n_gn, 3))]
    t = _table(gn, rng.integers(1, 40, size=n_el).tolist())
    dup, first = _by_rule(t)
    assert t.dup.tolist() == dup.tolist()
    rows = t.in_order(t.dup)
    assert dict(zip(rows.tolist(), first_records(t, rows).tolist())) == first
