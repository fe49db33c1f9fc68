"""kvconv.join.runs.rows_by_value: the rows of each value, the same whether it compares per value (a few graph
execs) or sorts once (many), against a plain per-value search."""

from __future__ import annotations

import numpy as np
import pytest

from kvconv.join.runs import SCAN_GROUPS, rows_by_value


@pytest.mark.parametrize("n_values", [3, SCAN_GROUPS, SCAN_GROUPS + 1, 5000])
def test_rows_by_value_equals_a_search_per_value(n_values):
    rng = np.random.default_rng(n_values)
    col = rng.integers(0, 2 * n_values, 20_000).astype(np.uint64) * np.uint64(0x10001)  # handles, some absent
    live = rng.random(len(col)) < 0.8
    values = np.unique(col)[: n_values]
    got = list(rows_by_value(col, values, live))
    assert [int(v) for v, _ in got] == values.tolist()
    for v, rows in got:
        assert rows.tolist() == np.flatnonzero((col == v) & live).tolist()
    assert [r.tolist() for _, r in rows_by_value(col, values)] == [np.flatnonzero(col == v).tolist() for v in values]
