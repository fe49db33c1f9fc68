"""Node ordinals find a graph exec's node ids among the distinct handles of its first records
(kvconv.join.launches._node_ids): a node first seen after those records must still get the ordinal the
full sort gives it (the fallback), in the launch table every reconcile and emitter reads."""

from __future__ import annotations

import numpy as np

from kvconv.format import layout
from kvconv.join.launches import _node_ids, node_ordinals


def _records(n_replays: int, nodes: int, late_node_at: int | None) -> dict:
    n = n_replays * nodes
    g = {"flags": np.full(n, layout.ENUMS["launch_flags"]["graph_node"], np.uint8),
         "graph_exec": np.full(n, 0xE0, np.uint64), "launch_id": np.arange(n, dtype=np.uint64) // nodes + 1,
         "node": (0x1000 + (np.arange(n) % nodes) * 0x10).astype(np.uint64)}
    if late_node_at is not None:
        g["node"][late_node_at] = 0x5  # a handle below every other: its id shifts every other node's id
    return g


def _reference(g: dict) -> np.ndarray:
    nodes, nid = np.unique(g["node"], return_inverse=True)
    return nodes, nid.reshape(-1)


def test_node_ids_equal_the_sort_with_a_node_first_seen_late():
    g = _records(400, 64, late_node_at=300 * 64 + 7)  # beyond the first 4,096 records
    nodes, nid = _node_ids(g["node"])
    ref_nodes, ref_nid = _reference(g)
    assert np.array_equal(nodes, ref_nodes) and np.array_equal(nid, ref_nid)
    assert 0x5 in nodes


def test_node_ordinals_with_a_late_node():
    g = _records(400, 64, late_node_at=300 * 64 + 7)
    ords = node_ordinals(g)
    # the reference replay (the first holding the most nodes: replay 1) orders nodes 0..63; the late node comes last
    assert ords[300 * 64 + 7] == 64
    assert np.array_equal(ords[:64], np.arange(64))
    assert sorted(set(ords.tolist())) == list(range(65))
