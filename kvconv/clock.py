"""Device ``%globaltimer`` <-> host CLOCK_MONOTONIC through a dump's own clock-sync pairs (never raw host - device):
one implementation, used by the emitters and by the cross-dump skew.

    >>> import numpy as np
    >>> from kvconv.format import layout
    >>> p = np.zeros(2, layout.DTYPES["clock_sync"])
    >>> p["host_ns"], p["gpu_ns"], p["uncertainty_ns"] = [100, 1100], [5000, 6001], [3, 4]
    >>> c = Clock(p)
    >>> c.to_host(np.array([5500, 7000], np.uint64)).tolist()
    [600, 2099]
    >>> c.bound()["bound_ns"]      # worst uncertainty 4 + drift between the pairs 1
    5
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Clock:
    pairs: np.ndarray  # clock_sync records sorted by gpu_ns

    @property
    def n(self) -> int:
        return len(self.pairs)

    def bound(self) -> dict:
        """Alignment error bound: the worst pair uncertainty plus the worst drift between neighbouring pairs (how
        much the host interval and the device interval between two pairs differ, each measured in its own clock)."""
        p = self.pairs
        if not len(p):
            return {"pairs": 0, "uncertainty_ns": None, "drift_ns": None, "bound_ns": None}
        unc = int(p["uncertainty_ns"].max())
        drift = 0
        if len(p) > 1:
            dh = np.diff(p["host_ns"].astype(np.int64))
            dg = np.diff(p["gpu_ns"].astype(np.int64))
            drift = int(np.abs(dh - dg).max())
        return {"pairs": int(len(p)), "uncertainty_ns": unc, "drift_ns": drift, "bound_ns": unc + drift}

    def to_host(self, gpu_ns: np.ndarray) -> np.ndarray:
        """Device ns -> host CLOCK_MONOTONIC ns through the nearest earlier pair (the first before the first pair),
        as trace_processor converts a clock from its snapshots: host_i + (gpu - gpu_i)."""
        t = np.asarray(gpu_ns, dtype=np.uint64)
        p = self.pairs
        if not len(p):
            return t.astype(np.int64)
        ps = p["gpu_ns"]
        if t.size > 64:  # times between the same two pairs (a chunk's, almost always): one offset for all
            lo, hi = np.clip(np.searchsorted(ps, [t.min(), t.max()], side="right") - 1, 0, len(p) - 1)
            if lo == hi:  # host_i - gpu_i, wrapped as the per-value sum below wraps
                off = (p["host_ns"][lo : lo + 1].astype(np.uint64) - ps[lo : lo + 1].astype(np.uint64)).view(np.int64)
                return t.astype(np.int64) + off
        i = np.searchsorted(ps, t, side="right") - 1
        np.clip(i, 0, len(p) - 1, out=i)
        return p["host_ns"].astype(np.int64)[i] + (t.astype(np.int64) - ps.astype(np.int64)[i])


def of_dump(d, ctx: int) -> Clock:
    """The clock of context ``ctx`` of the open dump ``d`` (its clock-sync pairs sorted by device time)."""
    cs = np.array(d.records("clock_sync", context_id=ctx))
    return Clock(cs[np.argsort(cs["gpu_ns"], kind="stable")] if len(cs) else cs)
