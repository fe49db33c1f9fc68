"""The report's pictures: matplotlib figures written as SVG text to embed in the page (no file, no network).

    >>> import numpy as np
    >>> from kvconv.look import plots
    >>> svg = plots.sm_blocks(np.array([3, 0, 5]), title="blocks per SM")
    >>> svg.startswith("<svg")
    True

Every function takes values already reduced to a bounded number of bins (:mod:`kvconv.look.bins`), so a picture's
size does not grow with the dump. Rasters (heatmaps) are embedded inside the SVG as PNG by matplotlib itself.
Output is deterministic: fixed hash salt, no date.
"""

from __future__ import annotations

import io
import logging

import numpy as np

from kvconv.look import bins

# matplotlib warns on stderr, in several lines, when $HOME/.config is not writable (then it uses a temporary cache):
# nothing the user of a report can act on, and it broke the one-line stderr rule. Its errors still show.
logging.getLogger("matplotlib").setLevel(logging.ERROR)

_RC = {"svg.hashsalt": "kvconv", "svg.fonttype": "none", "font.size": 9, "axes.titlesize": 10,
       "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": 100}
WIDE = (9.0, 3.0)


def _figure(size=WIDE, ncols: int = 1):
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure  # no pyplot: no global figure registry

    fig = Figure(figsize=size)  # fixed margins: a layout engine costs seconds per figure on a busy machine
    fig.subplots_adjust(left=0.08, right=0.97 if ncols == 1 else 0.98, bottom=0.17, top=0.86, wspace=0.32)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, axes


def _svg(fig) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _with_rc(fn):
    """Build the figure under the report's rc settings (fonts, spines), never touching the global ones."""
    import functools

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        import matplotlib

        with matplotlib.rc_context(_RC):
            return fn(*a, **kw)

    return wrapper


def _whole(*axes) -> None:
    """Axes that count things (replays, nodes, pages, steps, SMs, launches): ticks at whole numbers only."""
    from matplotlib.ticker import MaxNLocator

    for axis in axes:
        axis.set_major_locator(MaxNLocator(integer=True))


def _band(ax, x, b: dict, *, label: str, color: str) -> None:
    """A binned series: the median as a line, min..max as a band when bins hold several items."""
    if b["per_bin"] > 1:
        ax.fill_between(x, b["min"], b["max"], color=color, alpha=0.25, linewidth=0)
    ax.plot(x, b["median"], color=color, label=label, marker="o" if len(x) <= 40 else None, markersize=3)


@_with_rc
def replay_timing(spans_ns: np.ndarray, gaps_ns: np.ndarray, *, title: str) -> str:
    """Per replay (in order): first-to-last node entry span and the gap to the next replay, ms."""
    fig, (a1, a2) = _figure(ncols=2)
    for ax, v, label, color in ((a1, spans_ns, "span", "tab:blue"), (a2, gaps_ns, "gap to next", "tab:orange")):
        b = bins.series(np.asarray(v, np.float64) / 1e6)
        _band(ax, b["x"] + 1, b, label=label, color=color)
        ax.set_xlabel("replay (position)" + (f", {b['per_bin']} per bin: median, min..max" if b["per_bin"] > 1
                                              else ""))
        ax.set_ylabel(f"{label} (ms)")
        _whole(ax.xaxis)
        ax.set_title(f"{title}: {label} per replay")
        ax.grid(alpha=0.3)
    return _svg(fig)


@_with_rc
def heatmap(m: np.ndarray, first_rows: np.ndarray, *, title: str, label: str, unit: float = 1e3) -> str:
    """Replays (binned, x) x node ordinals (y) matrix, in ``label`` units of ``unit`` ns, beside the same minus
    each node's median over the replays (what changes from replay to replay); NaN cells left blank."""
    fig, axes = _figure((9.0, 3.8), ncols=2)
    v = np.asarray(m, np.float64).T / unit
    with np.errstate(all="ignore"):
        med = np.nanmedian(np.where(np.isnan(v).all(axis=1, keepdims=True), 0, v), axis=1, keepdims=True)
    dev = v - med
    lim = float(np.nanmax(np.abs(dev))) if np.isfinite(dev).any() else 1.0
    step = int(first_rows[1] - first_rows[0]) if len(first_rows) > 1 else 1
    extent = (0.5, v.shape[1] + 0.5, -0.5, v.shape[0] - 0.5)
    for ax, data, cmap, kw, what in ((axes[0], v, "viridis", {}, label),
                                     (axes[1], dev, "RdBu_r", {"vmin": -lim or -1, "vmax": lim or 1},
                                      f"minus node median ({label.split('(')[-1].rstrip(')')})")):
        im = ax.imshow(np.ma.masked_invalid(data), aspect="auto", interpolation="nearest", cmap=_cmap(cmap),
                       origin="lower", extent=extent, **kw)
        fig.colorbar(im, ax=ax, label=what)
        ax.set_ylabel("node ordinal")
        ax.set_xlabel("replay (position)" + (f", {step} per column: median" if step > 1 else ""))
        _whole(ax.xaxis, ax.yaxis)
    fig.suptitle(title, fontsize=10)
    axes[0].set_title("as recorded")
    axes[1].set_title("change from replay to replay")
    return _svg(fig)


def _cmap(name: str):
    import matplotlib

    return matplotlib.colormaps[name].with_extremes(bad="#ffffff")  # set_bad is deprecated (matplotlib 3.10)


@_with_rc
def sm_blocks(counts: np.ndarray, *, title: str) -> str:
    """Block-enter events per SM id (SM ids grouped when there are more than a picture holds)."""
    fig, (ax,) = _figure()
    s, first = bins.sums(np.asarray(counts, np.int64))
    width = (int(first[1] - first[0]) if len(first) > 1 else 1)
    ax.bar(first, s, width=width * 0.9, align="edge", color="tab:green")
    ax.set_xlabel("SM id" + (f" ({width} per bar)" if width > 1 else ""))
    ax.set_ylabel("blocks")
    _whole(ax.xaxis, ax.yaxis)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return _svg(fig)


@_with_rc
def launch_blocks(expected: np.ndarray, recorded: np.ndarray, *, title: str) -> str:
    """Blocks predicted by each launch's grid and recorded on the device, in host launch order (runs of launches
    summed when there are many); runs with missing blocks marked in red with their count of such launches."""
    fig, (ax,) = _figure()
    rec = np.where(recorded < 0, 0, recorded)
    missing = (expected > rec) & (recorded >= 0)
    e, first = bins.sums(expected)
    r, _ = bins.sums(rec)
    nm, _ = bins.sums(missing.astype(np.int64))
    width = int(first[1] - first[0]) if len(first) > 1 else 1
    ax.step(first, e, where="post", color="0.45", label="predicted (grid)", linewidth=1.5)
    ax.step(first, r, where="post", color="tab:blue", label="recorded", linewidth=1, linestyle="--")
    hit = np.flatnonzero(nm > 0)
    if len(hit):
        ax.scatter(first[hit], e[hit], marker="v", color="tab:red", zorder=3,
                   label=f"missing blocks ({int(missing.sum()):,} launches)")
        for i in hit[:10]:
            ax.annotate(f"{int(e[i] - r[i]):,} missing", (first[i], e[i]), textcoords="offset points",
                        xytext=(4, 4), color="tab:red", fontsize=8)
    ax.set_xlabel("launch (host order)" + (f", {width} per step: sums" if width > 1 else ""))
    ax.set_ylabel("blocks")
    _whole(ax.xaxis)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    return _svg(fig)


@_with_rc
def canary_grid(g: dict, *, title: str) -> str:
    """Flagged canary pages counted per (step bin, page bin)."""
    fig, (ax,) = _figure((9.0, 3.5))
    c = np.asarray(g["counts"], np.float64)
    extent = (g["x0"] - 0.5, g["x0"] + c.shape[1] * g["wx"] - 0.5, g["y0"] - 0.5, g["y0"] + c.shape[0] * g["wy"] - 0.5)
    im = ax.imshow(np.ma.masked_equal(c, 0), aspect="auto", interpolation="nearest", cmap=_cmap("Reds"),
                   origin="lower", extent=extent, vmin=0)
    _whole(fig.colorbar(im, ax=ax, label="pages (buffers summed)").ax.yaxis)
    ax.set_xlabel("step" + (f" ({g['wx']} per column)" if g["wx"] > 1 else ""))
    ax.set_ylabel("page" + (f" ({g['wy']} per row)" if g["wy"] > 1 else ""))
    _whole(ax.xaxis, ax.yaxis)
    ax.set_title(title)
    return _svg(fig)


@_with_rc
def skew(per_member: list[tuple[str, np.ndarray]], bound_ns: list, *, title: str) -> str:
    """Cross-dump start skew per replay position, µs, one line per dump against the first; the alignment bound as
    a band."""
    fig, (ax,) = _figure()
    for i, ((name, v), b) in enumerate(zip(per_member, bound_ns)):
        bb = bins.series(np.asarray(v, np.float64) / 1e3)
        _band(ax, bb["x"] + 1, bb, label=name, color=f"C{i}")
        if b:
            ax.axhspan(-b / 1e3, b / 1e3, color="0.85", zorder=0)
    ax.axhline(0, color="0.4", linewidth=0.8)
    ax.set_xlabel("replay (position)")
    ax.set_ylabel("start skew vs first dump (µs)")
    _whole(ax.xaxis)
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    return _svg(fig)
