"""The launch table: every host launch record of one context as one set of columns, shared by reconcile and the
emitters (one table, one dedup, one node order, one exact join over it: :mod:`kvconv.join.exact`).

    >>> t = LaunchTable.load(d, ctx)                      # doctest: +SKIP
    >>> t.kind[t.in_order(~t.upload)][:3], t.dup.sum()   # eager launches first when reported

Rows: the context's graph-node records (graph uploads included, flagged: they are not launches), then its eager
launches, each in record order. Reconcile reports rows in report order (eager launches, then graph nodes:
``in_order``); ``rank`` is a row's place in it (ties in host time are broken by it, and the first of duplicated
records wins by it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

from kvconv.format import layout

GRAPH_NODE = layout.KINDS["graph_node"].id  # 6
EAGER = layout.KINDS["eager_launch"].id  # 7
_LF = layout.ENUMS["launch_flags"]


@dataclass(frozen=True)
class LaunchTable:
    n_gn: int  # graph-node rows come first
    kind: np.ndarray  # u1: GRAPH_NODE or EAGER
    index: np.ndarray  # i4 (i8 beyond 2^31 rows): index into d.records(kind, context_id=ctx)
    host_ns: np.ndarray | None  # (the LATE columns: None in a lean table until complete)
    graph_exec: np.ndarray
    launch_id: np.ndarray
    node: np.ndarray
    grid_id: np.ndarray
    stream: np.ndarray
    kernel_slot: np.ndarray
    flags: np.ndarray  # u1: the launch_flags bits (all of them lie in the low byte)
    tag: np.ndarray
    gx: np.ndarray  # u4 grid dimensions, as recorded (cast to u8 before multiplying them)
    gy: np.ndarray
    gz: np.ndarray
    grid: np.ndarray  # i8: blocks the grid predicts
    upload: np.ndarray  # bool: a graph upload (not a launch; never joined or counted)
    dup: np.ndarray  # bool: repeats an earlier record (same graph exec, replay and node / same eager gridid)
    node_ordinal: np.ndarray  # i4: node's place in its graph exec's canonical order; -1 for eager and uploads

    @property
    def n(self) -> int:
        return len(self.kind)

    @property
    def shown(self) -> np.ndarray:
        """Records drawn on host tracks (graph uploads are not launches)."""
        return ~self.upload

    @property
    def has_tag(self) -> np.ndarray:
        return (self.flags & _LF["has_tag"]) != 0

    @property
    def replay(self) -> np.ndarray:
        """Graph launch id (the replay) of graph-node rows, 0 for eager launches."""
        return np.where(self.kind == GRAPH_NODE, self.launch_id, np.uint64(0))

    def replay_at(self, rows) -> np.ndarray:
        """:attr:`replay` of ``rows`` only (a chunk's or a report's rows: not a column of the whole table each time)."""
        return np.where(self.kind[rows] == GRAPH_NODE, self.launch_id[rows], np.uint64(0))

    def rank_at(self, rows) -> np.ndarray:
        """Place of ``rows`` in report order (eager launches, then graph nodes)."""
        i = self.index[rows].astype(np.int64)
        return np.where(self.kind[rows] == EAGER, i, (self.n - self.n_gn) + i)

    def in_order(self, mask: np.ndarray) -> np.ndarray:
        """Rows where ``mask`` holds, in report order."""
        # eager rows, then graph-node rows, each in row order: no permutation of all rows is built
        return np.r_[np.flatnonzero(mask[self.n_gn:]) + self.n_gn, np.flatnonzero(mask[: self.n_gn])].astype(np.int64)

    @classmethod
    def load(cls, d, ctx: int, *, lean: bool = False) -> LaunchTable:
        """The table of a context's host records. ``lean``: without the columns (``LATE``: 40 bytes a row) that
        only the report needs, not the pass over the device events (the exact join, the tally, validate's grids):
        :meth:`complete` reads them once the pass is over, when its own state is gone (the state held during the
        pass is what grows with the dump)."""
        c, n_gn, n_el = _columns(d, ctx, tuple(f for f in _FIELDS if f not in _UNUSED_LEAN) if lean else _FIELDS)
        # narrow columns: the host state is the one that grows with the dump (docs/BENCH.md: the 10 GiB budget)
        kind = np.empty(n_gn + n_el, np.uint8)
        kind[:n_gn], kind[n_gn:] = GRAPH_NODE, EAGER
        index = np.empty(n_gn + n_el, np.int32 if n_gn + n_el < (1 << 31) else np.int64)
        index[:n_gn], index[n_gn:] = np.arange(n_gn), np.arange(n_el)
        gx, gy, gz = (c.pop(f) for f in ("grid_x", "grid_y", "grid_z"))
        grid = gx.astype(np.uint64)
        with np.errstate(over="ignore"):
            grid *= gy
            grid *= gz
        grid = grid.view(np.int64)  # a product beyond 2^63 (damage) reads negative: no blocks expected
        upload = (kind == GRAPH_NODE) & ((c["flags"] & _LF["graph_upload"]) != 0)
        ordn = np.full(n_gn + n_el, -1, np.int32)
        ordn[:n_gn] = node_ordinals({f: c[f][:n_gn] for f in ("flags", "graph_exec", "launch_id", "node")})
        dup = _duplicates(kind, index, upload, c, ordn)
        if lean:  # (graph_exec, launch_id and node gave the node ordinals and the duplicates; host_ns and stream
            c.update(dict.fromkeys(LATE))  # were not read)
        return cls(n_gn=n_gn, kind=kind, index=index, gx=gx, gy=gy, gz=gz, grid=grid, upload=upload, dup=dup,
                   node_ordinal=ordn, **c)

    def complete(self, d, ctx: int) -> LaunchTable:
        """The table with every ``LATE`` column (a table loaded ``lean``, or let go of some, reads them now)."""
        missing = tuple(f for f in LATE if getattr(self, f) is None)
        return replace(self, **_columns(d, ctx, missing)[0]) if missing else self


_FIELDS = ("host_ns", "graph_exec", "launch_id", "node", "grid_id", "stream", "kernel_slot", "flags", "tag",
           "grid_x", "grid_y", "grid_z")
LATE = ("host_ns", "graph_exec", "launch_id", "node", "stream")  # the columns a lean table reads after the pass
_UNUSED_LEAN = ("host_ns", "stream")  # not even needed to build a lean table
_HOST_DTYPE = layout.DTYPES["host_launch"]
_CHUNK = 1 << 16  # records copied into the columns at a time
_NARROW = {"flags": np.uint8}  # every launch_flags bit lies in the low byte (validate reports any other bit)
assert max(layout.ENUMS["launch_flags"].values()) < 256


def _columns(d, ctx: int, fields: tuple = _FIELDS) -> tuple[dict, int, int]:
    """The host records' ``fields`` as compact columns (graph nodes, then eager launches, each in record order),
    read from the mapped records a chunk at a time: no copy of whole records is made (a record is 96 bytes, the
    table's columns 76 of them) and, on large dumps, each chunk's pages are given back once copied."""
    from kvconv.format.dump import release_pages
    from kvconv.join.events import RELEASE_BYTES

    gn = d.groups_of("graph_node", context_id=ctx)
    el = d.groups_of("eager_launch", context_id=ctx)
    n_gn, n_el = sum(len(g.records) for g in gn), sum(len(g.records) for g in el)
    cols = {f: np.empty(n_gn + n_el, _NARROW.get(f, _HOST_DTYPE[f])) for f in fields}
    release = d.size > RELEASE_BYTES
    at = 0
    for g in list(gn) + list(el):
        r, rs = g.records, int(g.header["record_size"])
        for s in range(0, len(r), _CHUNK):
            v = r[s : s + _CHUNK]
            for f in fields:
                cols[f][at + s : at + s + len(v)] = v[f]
            if release:
                release_pages(d._mm, g.payload_offset + s * rs, len(v) * rs)
        at += len(r)
    return cols, n_gn, n_el


def host_columns(d, ctx: int, fields: tuple) -> dict:
    """Some fields of a context's host records (graph nodes, then eager launches) as columns, read a chunk at a
    time with each chunk's pages given back on large dumps (kvconv.check.validate's grid tables)."""
    return _columns(d, ctx, fields)[0]


def _duplicates(kind, index, upload, recs, ordn) -> np.ndarray:
    """Repeats of an earlier record: same (graph exec, replay, node) for graph nodes, same gridid for eager launches
    (gridids are unique per eager launch); the first record in record order is the one counted. ``ordn``: the node
    ordinals (a node's own within its graph exec)."""
    dup = np.zeros(len(kind), bool)
    for o, first in _repeat_groups(kind, index, upload, recs, ordn):
        dup[o] = o != first
    return dup


def first_records(t: LaunchTable, rows: np.ndarray) -> np.ndarray:
    """For duplicated ``rows`` (``t.dup``), the row of the record each repeats (the one counted)."""
    first = np.full(t.n, -1, np.int64)
    cols = {f: getattr(t, f) for f in ("graph_exec", "launch_id", "node", "grid_id")}
    for o, f in _repeat_groups(t.kind, t.index, t.upload, cols, t.node_ordinal):
        first[o] = f
    return first[rows]


def _repeat_groups(kind, index, upload, recs, ordn):
    """Rows that may repeat one another, sorted by key then record order (``o``), each with the first row of its key:
    graph nodes by (graph exec, replay, node), eager launches by gridid. One sort each, only where a repeat is
    possible (:func:`_may_repeat`; increasing gridids)."""
    g = np.flatnonzero((kind == GRAPH_NODE) & ~upload)
    if len(g) and _may_repeat(recs["graph_exec"][g], recs["launch_id"][g], ordn[g]):
        ex, rp, nd = recs["graph_exec"], recs["launch_id"], recs["node"]
        o = g[np.lexsort((index[g], nd[g], rp[g], ex[g]))]
        new = np.r_[True, (ex[o][1:] != ex[o][:-1]) | (rp[o][1:] != rp[o][:-1]) | (nd[o][1:] != nd[o][:-1])]
        yield o, _group_first(o, new)
    gid = recs["grid_id"]
    e = np.flatnonzero((kind == EAGER) & (gid != 0))
    if len(e) > 1 and not bool(np.all(gid[e][1:] > gid[e][:-1])):  # increasing gridids repeat none
        o = e[np.lexsort((index[e], gid[e]))]
        yield o, _group_first(o, np.r_[True, gid[o][1:] != gid[o][:-1]])


def _group_first(o: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Per element of ``o``, the first element of its group (groups start where ``new``)."""
    return o[np.flatnonzero(new)[np.cumsum(new) - 1]]


def _may_repeat(ex: np.ndarray, rp: np.ndarray, ordn: np.ndarray) -> bool:
    """Whether graph-node records (record order) may repeat a (graph exec, replay, node): False when they come in
    (graph exec, replay) order, as a tracer writes them, and no (replay, node ordinal) cell is counted twice (a
    count per cell instead of a sort of every record)."""
    if len(ex) < 2:
        return False
    new = (ex[1:] != ex[:-1]) | (rp[1:] != rp[:-1])
    if not bool(np.all((ex[1:] > ex[:-1]) | ((ex[1:] == ex[:-1]) & (rp[1:] >= rp[:-1])))):
        return True
    n_ord = int(ordn.max()) + 1
    groups = int(np.count_nonzero(new)) + 1
    if int(ordn.min()) < 0 or groups * n_ord > 4 * len(ex) + (1 << 16):
        return True
    cell = np.zeros(len(ex), np.int64)
    np.cumsum(new, out=cell[1:])
    cell *= n_ord
    cell += ordn
    return bool(np.bincount(cell, minlength=groups * n_ord).max() > 1)


def node_ordinals(g) -> np.ndarray:
    """Node ordinal of each graph-node record (graph uploads: -1): per graph exec, the nodes of the first replay
    holding the most distinct nodes in their record order, then the other nodes in order of first sight (replay,
    then record order). ``g``: records, or columns by field name."""
    out = np.full(len(g["flags"]), -1, np.int32)
    live = np.flatnonzero((g["flags"] & _LF["graph_upload"]) == 0)
    if not len(live):
        return out
    ex, rep = g["graph_exec"][live], g["launch_id"][live]
    if len(live) > 1 and bool(np.all((ex[1:] > ex[:-1]) | ((ex[1:] == ex[:-1]) & (rep[1:] >= rep[:-1])))):
        order = live  # already in (graph exec, replay, record) order
    else:
        order = live[np.lexsort((live, rep, ex))]
    exs = g["graph_exec"][order]
    brk = np.flatnonzero(exs[1:] != exs[:-1]) + 1
    for idx in np.split(order, brk):
        nodes, nid = _node_ids(g["node"][idx])
        out[idx] = _exec_ordinals(nid, g["launch_id"][idx], len(nodes))
    return out


def _node_ids(handles: np.ndarray, head: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(handles, return_inverse=True)`` of one graph exec's records without a sort of all of them: its
    nodes are few and its first replays name them all, so the distinct handles of the first ``head`` records are
    the candidates; when every record's handle is among them (one search each), they are the answer, else the sort."""
    cand = np.unique(handles[:head])
    if len(cand):
        pos = np.searchsorted(cand, handles)
        np.minimum(pos, len(cand) - 1, out=pos)
        if bool(np.all(cand[pos] == handles)):
            return cand, pos
    nodes, nid = np.unique(handles, return_inverse=True)
    return nodes, nid.reshape(-1)


def _exec_ordinals(nid: np.ndarray, r: np.ndarray, N: int) -> np.ndarray:
    """Ordinals of one graph exec's records (node ids ``nid``, replays ``r`` in increasing order)."""
    BIG = np.iinfo(np.int64).max
    rid = np.concatenate([[0], np.cumsum(r[1:] != r[:-1])])
    R, m = int(rid[-1]) + 1, len(nid)
    if R * N <= (1 << 22):
        present = (np.bincount(rid * N + nid, minlength=R * N).reshape(R, N) > 0).sum(axis=1)
    else:
        present = np.bincount(np.unique(rid * N + nid) // N, minlength=R)
    best = int(np.argmax(present))
    lo, hi = np.searchsorted(rid, [best, best + 1])
    key = np.full(N, BIG, np.int64)
    np.minimum.at(key, nid[lo:hi], np.arange(lo, hi))  # first sight in the reference replay
    fa = np.full(N, BIG, np.int64)
    np.minimum.at(fa, nid, np.arange(m))
    rest = key == BIG
    key[rest] = m + fa[rest]  # then first sight anywhere
    rank = np.empty(N, np.int32)
    rank[np.argsort(key, kind="stable")] = np.arange(N, dtype=np.int32)
    return rank[nid]


def kernel_short(names: dict, slot) -> str:
    name = names.get(int(slot))
    if not name:
        return f"kernel slot {int(slot)}"
    return short_name(name)


@functools.lru_cache(maxsize=4096)  # a character loop over names of hundreds of characters: asked for each chunk
def short_name(name: str) -> str:
    """A kernel's readable name (the one shortener of reconcile and the emitters): the function without its
    return type, scopes, template arguments and parameters.

    >>> short_name("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(int*)")
    'reshape_and_cache_flash_kernel'
    >>> short_name("void at::native::(anonymous namespace)::Outer<int>::inner<2>(float*)")
    'inner'
    """
    s = name.replace("(anonymous namespace)", "anonymous_namespace")
    depth, out = 0, []
    for ch in s:  # template arguments may hold parentheses: drop them before looking for the parameter list
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    s = "".join(out)
    p = s.find("(")
    if p > 0:
        s = s[:p]
    s = s.strip()
    if s.startswith("void "):
        s = s[5:]
    return s.split("::")[-1].strip() or name


def kind_name(t: LaunchTable, h: int) -> str:
    return "eager_launch" if t.kind[h] == EAGER else "graph_node"


def launch_name(t: LaunchTable, names: dict, h: int) -> str:
    """'eager launch #12 (kernel, grid 4x1x1)' or 'graph exec 0x.. replay 3 node #5 (0x.., kernel, grid ..)'."""
    geo = f"grid {int(t.gx[h])}x{int(t.gy[h])}x{int(t.gz[h])}"
    k = kernel_short(names, t.kernel_slot[h])
    if t.kind[h] == EAGER:
        return f"eager launch #{int(t.index[h])} ({k}, {geo})"
    return (f"graph exec {int(t.graph_exec[h]):#x} replay {int(t.launch_id[h])} node #{int(t.node_ordinal[h])} "
            f"({int(t.node[h]):#x}, {k}, {geo})")


class Dropped:
    """Stands for a launch-table column let go (:func:`kvconv.join.exact.load_joined`'s ``drop``, the emitters'
    ``Ctx.held``): any use of it is a bug, said so."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attr):
        raise RuntimeError(f"launch table column {self.name!r} was let go (Ctx.held drop=...) but is used")

    __getitem__ = __array__ = __len__ = __iter__ = __and__ = __eq__ = lambda self, *a: self.__getattr__("")


def release_groups(d, kinds, ctx: int) -> None:
    """Give the pages of a context's groups of ``kinds`` back (read again from the page cache if asked for)."""
    from kvconv.format.dump import release_pages

    for kind in kinds:
        for g in d.groups_of(kind, context_id=ctx):
            rs = int(g.header["record_size"])
            release_pages(getattr(d, "_mm", None), g.payload_offset, len(g.records) * rs)
