"""Node x replay durations (first block entry to last block exit) of a context whose device events include block
exits, from :mod:`kvconv.join.durations` (the one computation of a launch's duration): laid out as the
start-offset matrices of :class:`kvconv.look.profile.GraphView` are (replays sorted, node ordinals).

    >>> mats = matrices(d, 0, graphs)       # doctest: +SKIP
    >>> mats[0].shape                       # replays x nodes, ns, NaN where a launch was not timed
"""

from __future__ import annotations

import numpy as np


def matrices(d, ctx: int, graphs: list) -> list[np.ndarray]:
    """One replays x nodes matrix per GraphView of ``graphs`` (a second read of the context's events: only dumps
    with block-exit events pay it)."""
    from kvconv.join.durations import launch_durations
    from kvconv.join.launches import GRAPH_NODE, LaunchTable

    t = LaunchTable.load(d, ctx)
    dur = launch_durations(d, ctx, t=t)
    ns = dur.duration_ns.astype(np.float64)
    live = (t.kind == GRAPH_NODE) & ~t.upload & ~t.dup & dur.timed & (t.node_ordinal >= 0)
    out = []
    for g in graphs:
        m = np.full(g.offsets.shape, np.nan)
        sel = np.flatnonzero(live & (t.graph_exec == int(g.exec, 16)))
        ri = np.searchsorted(g.replays, t.launch_id[sel])
        ok = (ri < len(g.replays)) & (t.node_ordinal[sel] < m.shape[1])
        ok[ok] &= g.replays[ri[ok]] == t.launch_id[sel][ok]
        m[ri[ok], t.node_ordinal[sel][ok]] = ns[sel][ok]
        out.append(m)
    return out
