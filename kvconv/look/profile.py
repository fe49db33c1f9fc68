"""One read of a dump for ``kvconv report`` and ``kvconv diff``: reconcile's and canary's results, plus the few
aggregates a picture needs, each bounded by the host records or by a fixed number of bins, never by the events.

    >>> from kvconv.format import dump
    >>> from kvconv.look.profile import profile
    >>> with dump.open("fixtures/h200-single/single.kvdump") as d:
    ...     p = profile(d)
    >>> p.contexts[0].graphs[0].offsets.shape      # replays x node ordinals, start offsets in ns
    (7, 40)
    >>> int(p.contexts[0].sm_blocks.sum())          # block-enter events, counted per SM
    1760

What it holds (values, no objects with behaviour): ``reconcile`` (ReconcileResult.to_dict()), ``canary`` (the
summary, findings and a step x page count of flagged pages when the dump has canary records), and per context the
blocks per SM, the count of block-exit events, the per-launch expected and recorded blocks (host launch order), and
per graph exec the node x replay start offsets (and durations when kvconv.join.durations gives them).
The device events are read once: each chunk feeds reconcile's streaming pass and the per-SM count together.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

import numpy as np

from kvconv.format import layout

_EK = layout.ENUMS["event_kind"]
BLOCK_ENTER, BLOCK_EXIT = _EK["block_enter"], _EK["block_exit"]
SM_MAX = 1 << 16  # smid is u16: the count per SM is a fixed 512 KiB at most
# progress: the device-event pass is this share of a dump's work, the canary check the rest
PASS_SHARE = 0.9
SCALE = 1_000_000


@dataclass(frozen=True)
class GraphView:
    """One graph exec of a context: its replays, node ordinals, and per (replay, node) start offsets."""

    exec: str  # hex handle, as reconcile's report names it
    replays: np.ndarray  # u8, sorted
    offsets: np.ndarray  # f8 replays x nodes: first block entry minus the replay's first, ns (NaN: none recorded)
    expected: np.ndarray  # i8 per node ordinal: blocks its grid predicts (reference: the most common value)
    kernels: list  # per node ordinal: the kernel's short name
    durations: np.ndarray | None = None  # f8 replays x nodes, ns, when exit events give them (else None)
    per_replay: list = field(default_factory=list)  # reconcile's timing.per_replay


@dataclass(frozen=True)
class ContextView:
    context_id: int
    device_id: int
    sm_blocks: np.ndarray  # i8 block-enter events per smid (trailing zeros cut)
    exit_events: int
    kind: np.ndarray  # per host launch, in host order: host kind (reconcile.GRAPH_NODE / EAGER)
    expected: np.ndarray  # i8 blocks the grid predicts (0 for a duplicate record)
    recorded: np.ndarray  # i8 device events matched (-1: inside an ambiguous ordered run)
    graphs: list  # GraphView per graph exec, in reconcile's order


@dataclass(frozen=True)
class Profile:
    path: str
    size: int
    reconcile: dict
    ok: bool
    contexts: list
    canary: dict | None  # None: no canary record in the dump


def profile(d, *, join: str = "auto", progress=None) -> Profile:
    """Reconcile ``d`` (an opened dump) in one pass over its device events, count blocks per SM on the way, then
    check its canary records. ``progress(done, total)`` as :mod:`kvconv.progress` asks."""
    from kvconv.check import reconcile as rc

    r = rc.Reconciler(d, options=rc.ReconcileOptions(join=join), tables=False, launches=True)
    total = max(sum(r.n_events(ctx) for ctx in r.contexts), 1)
    done, sms = 0, {}
    for ctx in r.contexts:
        s = r.stream(ctx)
        sm, exits = np.zeros(SM_MAX, np.int64), 0
        for base, recs in rc.event_chunks(d, ctx):
            s.feed(base, recs)
            kind = recs["kind"]
            sm += np.bincount(recs["smid"][kind == BLOCK_ENTER], minlength=SM_MAX)
            exits += int(np.count_nonzero(kind == BLOCK_EXIT))
            done += len(recs)
            if progress is not None:
                progress(int(PASS_SHARE * SCALE * done / total), SCALE)
        r.close(ctx)
        sms[ctx] = (sm, exits)
    res = r.result()
    rep = res.to_dict()
    cviews = [_context_view(d, c, res.launches, *sms.get(c["context_id"], (np.zeros(0, np.int64), 0)))
              for c in rep["contexts"]]
    can = _canary(d, progress)
    if progress is not None:
        progress(SCALE, SCALE)
    return Profile(path=str(d.path), size=int(d.size), reconcile=rep, ok=res.ok, contexts=cviews, canary=can)


def _context_view(d, c: dict, launches: np.ndarray, sm: np.ndarray, exits: int) -> ContextView:
    ctx = int(c["context_id"])
    lt = launches[launches["context_id"] == ctx]
    nz = np.flatnonzero(sm)
    sm = sm[: int(nz[-1]) + 1] if len(nz) else sm[:0]
    names = d.kernel_names(context_id=ctx)
    graphs = [_graph_view(g, lt, names) for g in c["graph_execs"]]
    durs = _durations(d, ctx, lt, graphs) if exits else None
    if durs is not None:
        graphs = [GraphView(**{**g.__dict__, "durations": du}) for g, du in zip(graphs, durs)]
    expected = np.where(lt["duplicate"], 0, lt["expected_blocks"]).astype(np.int64)
    return ContextView(context_id=ctx, device_id=int(c["device_id"]), sm_blocks=sm.astype(np.int64),
                       exit_events=int(exits), kind=lt["host_kind"].copy(), expected=expected,
                       recorded=lt["recorded_blocks"].astype(np.int64), graphs=graphs)


def _graph_view(g: dict, lt: np.ndarray, names: dict) -> GraphView:
    """Replays x node ordinals of one graph exec, from the launch table's per-launch first entry."""
    from kvconv.join.launches import GRAPH_NODE, kernel_short

    ex = int(g["graph_exec"], 16)
    rows = lt[(lt["host_kind"] == GRAPH_NODE) & (lt["graph_exec"] == ex) & ~lt["duplicate"]]
    replays = np.array(sorted(set(g["replays"])), np.uint64)
    n = max(int(g["nodes"]), int(rows["node_ordinal"].max()) + 1 if len(rows) else 0)
    ri = np.searchsorted(replays, rows["replay"])
    ok = (ri < len(replays)) & (rows["node_ordinal"] >= 0) & (rows["first_ns"] > 0) & (rows["recorded_blocks"] > 0)
    first = np.full((len(replays), n), np.nan)
    first[ri[ok], rows["node_ordinal"][ok]] = rows["first_ns"][ok].astype(np.float64)
    with np.errstate(invalid="ignore"):
        base = np.nanmin(np.where(np.isnan(first), np.inf, first), axis=1, keepdims=True) if n else first
    offsets = first - base
    expected = np.zeros(n, np.int64)
    kernels = [""] * n
    for o in range(n):
        sel = rows["node_ordinal"] == o
        if sel.any():
            vals, cnt = np.unique(rows["expected_blocks"][sel], return_counts=True)
            expected[o] = int(vals[np.argmax(cnt)])
            kernels[o] = kernel_short(names, int(rows["kernel_slot"][sel][0]))
    per = (g.get("timing") or {}).get("per_replay") or []
    return GraphView(exec=g["graph_exec"], replays=replays, offsets=offsets, expected=expected, kernels=kernels,
                     per_replay=per)


def _durations(d, ctx: int, lt: np.ndarray, graphs: list) -> list | None:
    """Per graph exec, replays x nodes durations from kvconv.join.durations when that module exists
    (block-exit events); None otherwise."""
    if importlib.util.find_spec("kvconv.join.durations") is None:
        return None
    from kvconv.look import _durations

    return _durations.matrices(d, ctx, graphs)


def _canary(d, progress) -> dict | None:
    """Canary summary, findings and the flagged pages binned by step x page (two passes over the flagged steps:
    the ranges, then the counts), or None when the dump holds no canary record."""
    from kvconv.check import canary
    from kvconv.look.bins import Grid2D

    if not any(d.groups_of("canary", context_id=ctx) for ctx, _ in d.contexts()):
        return None

    def step(done, total):
        if progress is not None:
            progress(int(SCALE * (PASS_SHARE + (1 - PASS_SHARE) * done / max(total, 1))), SCALE)

    res = canary.check(d, progress=step)
    grids = {}
    for what in ("unexpected", "missing"):
        lo = hi = None  # (step, page) corners of the flagged pages
        for s in res.steps.flagged():
            if s[what]:
                st, p0, p1 = int(s["step"]), int(min(s[what])), int(max(s[what]))
                lo = (st, p0) if lo is None else (min(lo[0], st), min(lo[1], p0))
                hi = (st, p1) if hi is None else (max(hi[0], st), max(hi[1], p1))
        if lo is None:
            continue
        g = Grid2D.spanning(lo[0], hi[0], lo[1], hi[1])
        for s in res.steps.flagged():
            if s[what]:
                g.add(int(s["step"]), np.asarray(s[what], np.int64))
        grids[what] = g.to_dict()
    return {"summary": res.summary(), "verdict": res.verdict, "findings": [f.to_dict() for f in res.findings],
            "grids": grids}
