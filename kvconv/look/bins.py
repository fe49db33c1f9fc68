"""Fixed numbers of bins for pictures of any size: a picture holds at most ``MAX_BINS`` marks along an axis, whatever
the number of replays, launches, steps or pages behind it.

    >>> import numpy as np
    >>> from kvconv.look.bins import series, Grid2D
    >>> b = series(np.arange(10_000, dtype=float), nbins=4)
    >>> b["x"].tolist(), b["median"].tolist()
    ([1249.5, 3749.5, 6249.5, 8749.5], [1249.5, 3749.5, 6249.5, 8749.5])
    >>> g = Grid2D.spanning(0, 99, 0, 9, nx=10, ny=10)
    >>> g.add(5, np.array([1, 2, 2])); int(g.counts.sum())
    3
"""

from __future__ import annotations

import numpy as np

MAX_BINS = 400  # marks along one axis of a picture
HEAT_BINS = 160  # columns of a heatmap


def edges(n: int, nbins: int) -> np.ndarray:
    """Bin edges splitting ``n`` items in order into at most ``nbins`` runs of (nearly) equal length."""
    k = max(1, min(n, nbins))
    return np.linspace(0, n, k + 1).round().astype(np.int64)


def series(v: np.ndarray, *, nbins: int = MAX_BINS) -> dict:
    """Values in order (per replay, per launch) as at most ``nbins`` bins: position (mean index), min, median, max.
    Each bin holds whole items; with no more items than bins every item is its own bin (nothing is averaged)."""
    v = np.asarray(v, np.float64)
    e = edges(len(v), nbins)
    out = {k: np.empty(len(e) - 1) for k in ("x", "min", "median", "max")}
    for i, (a, b) in enumerate(zip(e[:-1], e[1:])):
        part = v[a:b]
        out["x"][i] = (a + b - 1) / 2
        good = part[~np.isnan(part)]
        out["min"][i], out["median"][i], out["max"][i] = ((good.min(), np.median(good), good.max()) if len(good)
                                                           else (np.nan, np.nan, np.nan))
    out["per_bin"] = int(e[1] - e[0]) if len(e) > 1 else 0
    return out


def sums(v: np.ndarray, *, nbins: int = MAX_BINS) -> tuple[np.ndarray, np.ndarray]:
    """Sums of consecutive runs of ``v`` (at most ``nbins``) and each run's first index."""
    v = np.asarray(v)
    e = edges(len(v), nbins)
    if not len(v):
        return np.zeros(0, v.dtype), e[:-1]
    return np.add.reduceat(v, e[:-1]), e[:-1]


def columns(m: np.ndarray, *, nbins: int = HEAT_BINS) -> tuple[np.ndarray, np.ndarray]:
    """A rows x cols matrix (replays x nodes) with its rows grouped into at most ``nbins`` runs, each the median of
    its rows (NaN ignored); returns the grouped matrix and each run's first row."""
    e = edges(m.shape[0], nbins)
    if m.shape[0] <= nbins:
        return m, e[:-1]
    out = np.full((len(e) - 1, m.shape[1]), np.nan)
    for i, (a, b) in enumerate(zip(e[:-1], e[1:])):
        part = m[a:b]
        has = ~np.isnan(part).all(axis=0)
        if has.any():
            out[i, has] = np.nanmedian(part[:, has], axis=0)
    return out, e[:-1]


class Grid2D:
    """Counts on a fixed nx x ny grid over [x0, x1] x [y0, y1] (integers: steps x pages)."""

    def __init__(self, x0: int, x1: int, y0: int, y1: int, nx: int, ny: int) -> None:
        self.x0, self.x1, self.y0, self.y1 = x0, x1, y0, y1
        self.wx = max(1, -(-(x1 - x0 + 1) // nx))  # ceiling: whole integers per bin
        self.wy = max(1, -(-(y1 - y0 + 1) // ny))
        self.counts = np.zeros(((y1 - y0) // self.wy + 1, (x1 - x0) // self.wx + 1), np.int64)

    @classmethod
    def spanning(cls, x0: int, x1: int, y0: int, y1: int, *, nx: int = HEAT_BINS, ny: int = 128) -> Grid2D:
        return cls(x0, x1, y0, y1, nx, ny)

    def add(self, x: int, ys: np.ndarray) -> None:
        col = (x - self.x0) // self.wx
        rows = (np.asarray(ys, np.int64) - self.y0) // self.wy
        np.add.at(self.counts[:, col], rows, 1)

    def to_dict(self) -> dict:
        return {"x0": self.x0, "x1": self.x1, "y0": self.y0, "y1": self.y1, "wx": self.wx, "wy": self.wy,
                "counts": self.counts}
