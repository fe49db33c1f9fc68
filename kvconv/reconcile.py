"""Reconcile host launch records, the executions their geometry predicts, and the device block events.

    >>> from kvconv import dump, reconcile
    >>> with dump.open("run.kvdump") as d:                                  # doctest: +SKIP
    ...     res = reconcile.reconcile(d)
    ...     print(res.agreement_line())
    280 graph-node records = 280 expected executions = 280 device events, 0 drops

What it computes, per context of the dump:

* every host launch (eager launches and graph kernel-node launches; graph uploads are ignored) with the number of
  blocks its grid predicts, the device block-enter events matched to it, and the difference;
* per graph executable: its target nodes, its replays (launch ids), records per (replay, node), nodes repeated in a
  replay, nodes missing from a replay, whether the node order is the same in every replay;
* the join of device events to host launches:

  - **exact** when device events carry ``%gridid`` (flag ``has_gridid``) and, for graph nodes, the per-replay tag
    (``has_tag``): gridid -> launch or graph node (the host's ``grid_id``), tag -> replay (the host's ``tag``).
    Independent of the order in which the device's atomics landed, so right for multi-stream graphs.
  - **ordered** when they do not: device events in sequence order are laid over host launches in host order
    (``host_ns``), each launch taking as many consecutive events as its grid has blocks. This assumes one stream.
    Positions come from the event ``sequence`` (a sequence gap is a lost event at a known place). A deficit with 0
    device drops can only be launches that ran before coverage began (patching happens at module load; coverage
    starts late and never stops early), so it is attributed to the earliest launches and the report says so. With
    drops, the deficit may lie anywhere: events whose launch is the same under every possible placement are matched,
    the rest are reported as one ambiguous run of launches with its deficit. Launches that ran on different streams
    next to each other (e.g. the nodes of a multi-stream graph replay) form a window whose events are attributed to
    the window (the replay) but not to a node, and the report says the ordered join cannot tell.

* timing per graph executable from device ``%globaltimer`` only (per replay span from the first to the last node's
  first block entry, gaps from the last entry of one replay to the first of the next, per node start offsets); host
  ``CLOCK_MONOTONIC`` times are reported in their own domain and never subtracted from device times;
* drops on both sides (group header ``drop_count`` and the metadata counters) and the agreement line.

Record indices (``host_index``, ``device_index``, Finding.record) are indices into ``d.records(kind, context_id=ctx)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import layout
from .errors import SchemaError, UsageError
from .findings import Finding
from .wording import counted

GRAPH_NODE = layout.KINDS["graph_node"].id  # 6
EAGER = layout.KINDS["eager_launch"].id  # 7
JOIN_NONE, JOIN_EXACT, JOIN_ORDERED = 0, 1, 2
JOIN_NAMES = {JOIN_NONE: "none", JOIN_EXACT: "exact", JOIN_ORDERED: "ordered"}
JOINS = ("auto", "exact", "ordered")

MATCH_DTYPE = np.dtype([
    ("context_id", "<u4"),
    ("device_index", "<i8"),
    ("host_kind", "<u2"),
    ("host_index", "<i8"),
    ("replay", "<u8"),
    ("node_ordinal", "<i4"),
    ("join", "u1"),
])

LAUNCH_DTYPE = np.dtype([
    ("context_id", "<u4"),
    ("host_kind", "<u2"),
    ("host_index", "<i8"),
    ("kernel_slot", "<u4"),
    ("graph_exec", "<u8"),
    ("replay", "<u8"),
    ("node", "<u8"),
    ("node_ordinal", "<i4"),
    ("grid_id", "<u8"),
    ("stream", "<u8"),
    ("host_ns", "<u8"),
    ("expected_blocks", "<i8"),
    ("recorded_blocks", "<i8"),  # device events matched to this launch (-1: inside an ambiguous ordered run)
    ("distinct_blocks", "<i8"),  # distinct in-grid blockIdx among them
    ("first_ns", "<u8"),  # earliest matched block entry, %globaltimer ns (0 if none)
    ("duplicate", "?"),  # a repeat of an earlier host record (same gridid / same graph exec, replay and node)
])

_EV_FLAGS = layout.ENUMS["event_flags"]
_LF = layout.ENUMS["launch_flags"]
_BLOCK_ENTER = layout.ENUMS["event_kind"]["block_enter"]


@dataclass(frozen=True)
class ReconcileOptions:
    """join: "auto" (exact when device events carry gridid, ordered otherwise), "exact" or "ordered".
    relaxed: report mismatches (missing / extra / duplicated / unmatched) as warnings instead of errors.
    strict_coverage: report blocks the ordered join attributes to launches that ran before coverage began (0 device
    drops, deficit at the start: code ``coverage-late``) as errors; by default they are warnings, since nothing the
    tracer saw was lost (the published Qwen3-14B run: its first launch ran before patching).
    max_listed: at most this many findings of one code name their launch individually; the rest are counted in one.
    """

    join: str = "auto"
    relaxed: bool = False
    strict_coverage: bool = False
    max_listed: int = 20

    def __post_init__(self) -> None:
        if self.join not in JOINS:
            raise UsageError(f"--join must be one of {', '.join(JOINS)}, not {self.join!r}", code="bad-join")


@dataclass
class ReconcileResult:
    path: str
    join_requested: str
    contexts: list[dict]
    findings: list[Finding]
    matches: np.ndarray  # MATCH_DTYPE, one row per device event of every context
    launches: np.ndarray  # LAUNCH_DTYPE, one row per host launch record of every context (graph uploads excluded)

    mismatches: int = 0  # findings that are errors unless --relaxed (each context's agreement.agree is false)

    @property
    def ok(self) -> bool:
        """The exit status: no error-level finding. Without --relaxed, the same as every context agreeing."""
        return not any(f.severity == "error" for f in self.findings)

    def status_line(self) -> str:
        return status_line([self])

    def agreement_line(self, context_id: int | None = None) -> str:
        """The agreement line of one context (the first when not given)."""
        for c in self.contexts:
            if context_id is None or c["context_id"] == context_id:
                return c["agreement"]["line"]
        return ""

    def to_dict(self) -> dict:
        """JSON-able report, schema ``schemas/reconcile.schema.json``."""
        counts = {s: sum(1 for f in self.findings if f.severity == s) for s in ("error", "warning", "info")}
        return {
            "path": self.path,
            "join_requested": self.join_requested,
            "ok": self.ok,
            "contexts": self.contexts,
            "findings": [f.to_dict() for f in self.findings],
            "summary": {**counts, "device_events": int(len(self.matches)),
                        "matched": int((self.matches["host_index"] >= 0).sum()),
                        "host_launches": int(len(self.launches))},
        }

    def columns(self, table: str = "matches") -> dict[str, np.ndarray]:
        """Arrow-ready columns (name -> contiguous 1-D numpy array) of ``matches`` or ``launches``:
        ``pyarrow.table(res.columns())`` builds the table without copying the numeric data again."""
        arr = {"matches": self.matches, "launches": self.launches}[table]
        out = {name: np.ascontiguousarray(arr[name]) for name in arr.dtype.names}
        if table == "matches":
            out["join_name"] = np.array(["none", "exact", "ordered"], dtype=object)[arr["join"]]
        return out

    def to_arrow(self, table: str = "matches"):
        """A ``pyarrow.Table`` of :meth:`columns` (imports pyarrow)."""
        import pyarrow as pa

        cols = self.columns(table)
        if "join_name" in cols:
            cols["join_name"] = pa.DictionaryArray.from_arrays(
                pa.array(self.matches["join"].astype(np.int8)), pa.array(["none", "exact", "ordered"]))
        return pa.table(cols)

    def lines(self) -> list[str]:
        """The text report ``kvconv reconcile`` prints (without the findings)."""
        out = []
        for c in self.contexts:
            out.extend(_context_lines(self.path, c))
        return out


# ---------------------------------------------------------------------------------------------------------------
# entry point


def reconcile(d, *, options: ReconcileOptions = ReconcileOptions()) -> ReconcileResult:
    """Reconcile every context of an opened dump (:func:`kvconv.dump.open`)."""
    findings: list[Finding] = []
    contexts: list[dict] = []
    matches: list[np.ndarray] = []
    launches: list[np.ndarray] = []
    mismatches = 0
    for ctx, dev in d.contexts():
        if not (d.groups_of("device_event", context_id=ctx) or d.groups_of("graph_node", context_id=ctx)
                or d.groups_of("eager_launch", context_id=ctx)):
            continue
        c = _Context(d, ctx, dev, options)
        c.run()
        contexts.append(c.report)
        findings.extend(c.findings)
        mismatches += sum(c.mismatches.values())
        matches.append(c.matches)
        launches.append(c.launch_table)
    m = np.concatenate(matches) if matches else np.zeros(0, MATCH_DTYPE)
    la = np.concatenate(launches) if launches else np.zeros(0, LAUNCH_DTYPE)
    return ReconcileResult(path=str(d.path), join_requested=options.join, contexts=contexts, findings=findings,
                           matches=m, launches=la, mismatches=mismatches)


# ---------------------------------------------------------------------------------------------------------------
# helpers


_SEQ_LIMIT = 1 << 48  # no device buffer has this many slots


def _hex(v) -> str:
    return f"{int(v):#x}"


_n = counted  # '1 device event' / '3 device events'


def _ms(ns) -> str:
    return f"{float(ns) / 1e6:.2f} ms"


def _stats(values) -> dict | None:
    v = np.asarray(values, dtype=np.int64)
    if not len(v):
        return None
    return {"min": int(v.min()), "max": int(v.max()), "median": float(np.median(v)), "count": int(len(v))}


def _ranges(ids) -> str:
    """'1..7' / '1..3, 5, 7..9' for a sorted int list."""
    ids = [int(x) for x in ids]
    if not ids:
        return "none"
    parts, start, prev = [], ids[0], ids[0]
    for x in ids[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        parts.append(f"{start}" if start == prev else f"{start}..{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(parts)


def _group_runs(sorted_keys: np.ndarray):
    """Start indices and lengths of runs of equal values in a sorted 1-D array."""
    n = len(sorted_keys)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    brk = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    starts = np.r_[0, brk]
    return starts, np.diff(np.r_[starts, n])


class _Context:
    """Reconciles one context. Host launches are held as plain arrays, one entry per host record."""

    def __init__(self, d, ctx: int, dev: int, options: ReconcileOptions) -> None:
        self.d, self.ctx, self.dev, self.o = d, ctx, dev, options
        self.path = str(d.path)
        self.findings: list[Finding] = []
        self._listed: dict[str, int] = {}
        self._unlisted: dict[str, list] = {}
        self.mismatches: dict[str, int] = {}  # code -> findings that are errors before --relaxed
        self.extra_replay_events = 0
        self.unattributed = 0

    # --- findings -------------------------------------------------------------------------------------------

    def _sev(self, severity: str) -> str:
        return "warning" if (self.o.relaxed and severity == "error") else severity

    def _where(self, kind: str | None, index: int | None) -> dict:
        if kind is None or index is None or index < 0:
            return {}
        off = 0
        for g in self.d.groups_of(kind, context_id=self.ctx):
            n = len(g.records)
            if index < off + n:
                return {"group": g.index, "record": int(index), "offset": g.record_offset(index - off), "field": kind}
            off += n
        return {"record": int(index), "field": kind}

    def add(self, severity: str, code: str, message: str, *, kind: str | None = None, index: int | None = None,
            count: int = 1, listed: bool = True) -> None:
        """Add a finding; after max_listed findings of one code, further ones are summed into one."""
        if severity == "error":
            self.mismatches[code] = self.mismatches.get(code, 0) + 1
        if listed:
            n = self._listed.get(code, 0)
            if n >= self.o.max_listed:
                u = self._unlisted.setdefault(code, [self._sev(severity), 0, 0])
                u[1] += 1
                u[2] += count
                return
            self._listed[code] = n + 1
        self.findings.append(Finding(self._sev(severity), code, f"context {self.ctx}: {message}", path=self.path,
                                     count=count, **self._where(kind, index)))

    def _flush_unlisted(self) -> None:
        for code, (sev, n, count) in self._unlisted.items():
            self.findings.append(Finding(sev, code, f"context {self.ctx}: {n:,} more {code} findings not listed "
                                         f"(see --json)", path=self.path, count=max(count, 1)))

    # --- the work ---------------------------------------------------------------------------------------------

    def run(self) -> None:
        self._load()
        self._host_graphs()
        self._dedup()
        self._join()
        self._count_blocks()
        self._check_ordered_against_gridid()
        self._graph_device()
        self._report()
        self._flush_unlisted()

    def _load(self) -> None:
        d, ctx = self.d, self.ctx
        ev = d.records("device_event", context_id=ctx)
        self.ev_all = ev
        kinds = ev["kind"]
        be = np.flatnonzero(kinds == _BLOCK_ENTER)
        self.other_events = int(len(ev) - len(be))
        seq = ev["sequence"][be]
        if len(seq) > 1 and np.any(seq[1:] < seq[:-1]):
            o = np.argsort(seq, kind="stable")
            be = be[o]
            seq = seq[o]
        self.ev_idx = be  # device indices of block-enter events, in sequence order
        self.seq = seq
        flags = ev["flags"][be]
        self.ev_gridid = ev["gridid"][be]
        self.ev_tag = ev["tag"][be]
        self.ev_has_gid = (flags & _EV_FLAGS["has_gridid"]) != 0
        self.ev_has_tag = (flags & _EV_FLAGS["has_tag"]) != 0
        self.ev_slot = ev["kernel_slot"][be]
        self.ev_x = ev["block_x"][be].astype(np.uint64)
        self.ev_y = ev["block_y"][be].astype(np.uint64)
        self.ev_z = ev["block_z"][be].astype(np.uint64)
        self.ev_t = ev["globaltimer"][be]
        # non-block-enter events consume sequence numbers too; positions count block-enter slots only
        if len(seq) and int(seq[-1]) >= _SEQ_LIMIT:
            # A slot sequence can never exceed the buffer it indexes: numbers this large are damage. Keep the
            # event order, give up the gap information (positions are ranks), and say so.
            self.add("error", "sequence-range", f"device event sequences reach {int(seq[-1]):,}, beyond any "
                     "buffer; the ordered join uses event order without gap positions", kind="device_event",
                     index=int(self.ev_idx[-1]), listed=False)
            self.pos = np.arange(len(seq), dtype=np.int64)
        elif self.other_events:
            oseq = np.sort(ev["sequence"][kinds != _BLOCK_ENTER])
            self.pos = seq.astype(np.int64) - np.searchsorted(oseq, seq).astype(np.int64)
        else:
            self.pos = seq.astype(np.int64)

        el = d.records("eager_launch", context_id=ctx)
        gn = d.records("graph_node", context_id=ctx)
        upload = (gn["flags"] & _LF["graph_upload"]) != 0
        self.uploads_ignored = int(upload.sum())
        gsel = np.flatnonzero(~upload)
        self.n_eager, self.n_graph_records = len(el), len(gsel)

        def cat(name):
            return np.concatenate([el[name], gn[name][gsel]])

        n = len(el) + len(gsel)
        self.h_kind = np.r_[np.full(len(el), EAGER, np.uint16), np.full(len(gsel), GRAPH_NODE, np.uint16)]
        self.h_index = np.r_[np.arange(len(el), dtype=np.int64), gsel.astype(np.int64)]
        self.h_gx, self.h_gy, self.h_gz = (cat(f).astype(np.uint64) for f in ("grid_x", "grid_y", "grid_z"))
        with np.errstate(over="ignore"):
            self.h_expected = (self.h_gx * self.h_gy * self.h_gz).astype(np.int64)
        self.h_slot = cat("kernel_slot")
        self.h_gid = cat("grid_id")
        hflags = cat("flags")
        self.h_has_tag = (hflags & _LF["has_tag"]) != 0
        self.h_tag = np.where(self.h_has_tag, cat("tag"), np.uint64(0))
        self.h_ns = cat("host_ns")
        self.h_stream = cat("stream")
        self.h_exec = cat("graph_exec")
        self.h_replay = np.where(self.h_kind == GRAPH_NODE, cat("launch_id"), np.uint64(0))
        self.h_node = cat("node")
        self.h_ordinal = np.full(n, -1, np.int32)
        self.h_dup = np.zeros(n, bool)
        self.n_host = n

        # drops: group headers and metadata counters
        try:
            meta = d.metadata(context_id=ctx) or d.metadata()
            counters = meta.get("counters") if isinstance(meta.get("counters"), dict) else {}
        except SchemaError:
            counters = {}
            self.add("warning", "reconcile-metadata", "metadata unreadable; drop counters taken from group headers "
                     "only", listed=False)

        def counter(name):
            v = counters.get(name)
            return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

        def lost(kind):
            return sum(g.lost_records for g in d.groups_of(kind, context_id=ctx))

        self.drops = {
            "device_event": {"header": d.drops("device_event", context_id=ctx),
                             "counter": counter("device_event_drops"), "lost_records": lost("device_event")},
            "graph_node": {"header": d.drops("graph_node", context_id=ctx),
                           "counter": counter("graph_node_table_drops"), "lost_records": lost("graph_node")},
            "eager_launch": {"header": d.drops("eager_launch", context_id=ctx),
                             "counter": counter("eager_table_drops"), "lost_records": lost("eager_launch")},
        }
        for kind, dd in self.drops.items():
            dd["effective"] = max(dd["header"], dd["counter"] or 0) + dd["lost_records"]
            if dd["counter"] is not None and dd["counter"] != dd["header"]:
                self.add("warning", "drop-counters-differ", f"{kind}: group header drop_count {dd['header']:,} "
                         f"but metadata counter says {dd['counter']:,}; using the larger", listed=False)
        # effective = dropped by the producer + lost to truncation (a salvaged file): both are records this dump
        # lacks, which is what the joins need; messages and the agreement name the two facts apart (_loss).
        self.device_drops = self.drops["device_event"]["effective"]
        self.host_drops = self.drops["graph_node"]["effective"] + self.drops["eager_launch"]["effective"]
        self.device_lost = self.drops["device_event"]["lost_records"]
        self.host_lost = self.drops["graph_node"]["lost_records"] + self.drops["eager_launch"]["lost_records"]
        if self.uploads_ignored:
            self.add("info", "graph-uploads-ignored", f"{self.uploads_ignored:,} graph-node records flagged "
                     "graph_upload ignored", listed=False)
        self.names = d.kernel_names(context_id=ctx)

    def _kname(self, slot) -> str:
        name = self.names.get(int(slot))
        if not name:
            return f"kernel slot {int(slot)}"
        short = name.split("(")[0].split("<")[0].replace("void ", "").strip()
        return short.rsplit("::", 1)[-1] or name

    def _launch_name(self, h: int) -> str:
        """Human name of host launch h: 'eager launch #12 (kernel, grid 4x1x1)' or 'graph exec 0x.. replay 3 node #5
        (0x..)'."""
        geo = f"grid {int(self.h_gx[h])}x{int(self.h_gy[h])}x{int(self.h_gz[h])}"
        if self.h_kind[h] == EAGER:
            return f"eager launch #{int(self.h_index[h])} ({self._kname(self.h_slot[h])}, {geo})"
        return (f"graph exec {_hex(self.h_exec[h])} replay {int(self.h_replay[h])} node #{int(self.h_ordinal[h])} "
                f"({_hex(self.h_node[h])}, {self._kname(self.h_slot[h])}, {geo})")

    def _kind_name(self, h: int) -> str:
        return "eager_launch" if self.h_kind[h] == EAGER else "graph_node"

    # --- host side: graph executables ---------------------------------------------------------------------------

    def _host_graphs(self) -> None:
        self.graphs: list[dict] = []
        g = np.flatnonzero(self.h_kind == GRAPH_NODE)
        if not len(g):
            return
        # records of each exec in (launch_id, table order)
        order = g[np.lexsort((self.h_index[g], self.h_replay[g], self.h_exec[g]))]
        ex_starts, ex_lens = _group_runs(self.h_exec[order])
        for s, ln in zip(ex_starts, ex_lens):
            idx = order[s : s + ln]
            self.graphs.append(self._one_graph(idx))

    def _one_graph(self, idx: np.ndarray) -> dict:
        exec_h = int(self.h_exec[idx[0]])
        nodes, nid = np.unique(self.h_node[idx], return_inverse=True)
        replays, rid = np.unique(self.h_replay[idx], return_inverse=True)
        N, R = len(nodes), len(replays)
        cnt = np.bincount(rid * N + nid, minlength=R * N).reshape(R, N)
        # canonical node order: the first replay holding the most distinct nodes, in its record order
        present = (cnt > 0).sum(axis=1)
        best = int(np.argmax(present))
        in_best = rid == best
        first_seen = {}
        for k in nid[in_best]:
            first_seen.setdefault(int(k), len(first_seen))
        for k in nid:
            first_seen.setdefault(int(k), len(first_seen))
        ordmap = np.empty(N, np.int32)
        for k, o in first_seen.items():
            ordmap[k] = o
        ords = ordmap[nid]
        self.h_ordinal[idx] = ords
        # stable order: within each replay, first occurrences of nodes have increasing ordinals
        key = rid.astype(np.int64) * N + nid
        _, first_pos = np.unique(key, return_index=True)
        first_pos = np.sort(first_pos)
        fr, fo = rid[first_pos], ords[first_pos]
        same = fr[1:] == fr[:-1]
        bad = same & (fo[1:] <= fo[:-1])
        unstable = sorted({int(replays[r]) for r in fr[1:][bad]})
        repeated = [{"replay": int(replays[r]), "node": _hex(nodes[k]), "node_ordinal": int(ordmap[k]),
                     "records": int(cnt[r, k])} for r, k in zip(*np.nonzero(cnt > 1))]
        missing = [{"replay": int(replays[r]), "node": _hex(nodes[k]), "node_ordinal": int(ordmap[k])}
                   for r, k in zip(*np.nonzero(cnt == 0))]
        streams = sorted({int(s) for s in np.unique(self.h_stream[idx])})
        gname = f"graph exec {_hex(exec_h)}"
        for m in sorted(missing, key=lambda m: (m["replay"], m["node_ordinal"])):
            self.add("error", "node-missing", f"{gname} replay {m['replay']} has no host record of node "
                     f"#{m['node_ordinal']} ({m['node']}), which other replays have")
        rep_ids = [int(r) for r in replays]
        if rep_ids and rep_ids != list(range(rep_ids[0], rep_ids[0] + len(rep_ids))):
            # Gaps as ranges, never as a set of ids: a damaged launch_id can be near 2^64.
            holes = [(a + 1, b - 1) for a, b in zip(rep_ids, rep_ids[1:]) if b - a > 1]
            text = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in holes[:20]) + (
                f" and {len(holes) - 20} more" if len(holes) > 20 else "")
            self.add("warning", "replay-ids-gap", f"{gname}: host records hold replays {_ranges(rep_ids)}; "
                     f"no record of replay(s) {text}", listed=False)
        if unstable:
            self.add("warning", "node-order-changed", f"{gname}: node order differs from the reference replay "
                     f"{int(replays[best])} in replay(s) {_ranges(unstable)}", listed=False)
        # host timing, CLOCK_MONOTONIC, its own domain
        hns = self.h_ns[idx].astype(np.int64)
        hmin = np.full(R, np.iinfo(np.int64).max)
        hmax = np.full(R, np.iinfo(np.int64).min)
        np.minimum.at(hmin, rid, hns)
        np.maximum.at(hmax, rid, hns)
        return {
            "graph_exec": _hex(exec_h),
            "_exec": exec_h,
            "_idx": idx,
            "_nodes": nodes,
            "_replays": replays,
            "_ordmap": ordmap,
            "_cnt": cnt,
            "nodes": N,
            "replays": rep_ids,
            "replay_count": R,
            "records": int(len(idx)),
            "records_per_replay": _stats(cnt.sum(axis=1)),
            "repeated_nodes": repeated,
            "missing_nodes": missing,
            "stable_order": not unstable,
            "unstable_replays": unstable,
            "reference_replay": int(replays[best]),
            "streams": [_hex(s) for s in streams],
            "kernels": sorted({self._kname(s) for s in np.unique(self.h_slot[idx])}),
            "host_timing": {
                "clock": "host_monotonic",
                "note": "graph-node launch callbacks (CLOCK_MONOTONIC ns); never subtracted from device times",
                "first_ns": int(hmin.min()),
                "last_ns": int(hmax.max()),
                "callback_span_ns": _stats(hmax - hmin),
                "replay_start_interval_ns": _stats(np.diff(hmin)) if R > 1 else None,
            },
        }

    def _dedup(self) -> None:
        """Mark repeats of an earlier host record: same (exec, replay, node) for graph nodes, same gridid for eager
        launches (gridids are unique per eager launch)."""
        dup = self.h_dup
        g = np.flatnonzero(self.h_kind == GRAPH_NODE)
        if len(g):
            o = g[np.lexsort((self.h_index[g], self.h_node[g], self.h_replay[g], self.h_exec[g]))]
            same = ((self.h_exec[o][1:] == self.h_exec[o][:-1]) & (self.h_replay[o][1:] == self.h_replay[o][:-1])
                    & (self.h_node[o][1:] == self.h_node[o][:-1]))
            dup[o[1:][same]] = True
        e = np.flatnonzero((self.h_kind == EAGER) & (self.h_gid != 0))
        if len(e):
            o = e[np.lexsort((self.h_index[e], self.h_gid[e]))]
            same = self.h_gid[o][1:] == self.h_gid[o][:-1]
            dup[o[1:][same]] = True
        for h in np.flatnonzero(dup):
            if self.h_kind[h] == GRAPH_NODE:
                first = np.flatnonzero((self.h_kind == GRAPH_NODE) & (self.h_exec == self.h_exec[h])
                                       & (self.h_replay == self.h_replay[h]) & (self.h_node == self.h_node[h]))[0]
            else:
                first = np.flatnonzero((self.h_kind == EAGER) & (self.h_gid == self.h_gid[h]))[0]
            self.add("error", "duplicate-host-record", f"{self._launch_name(h)} recorded again: "
                     f"{self._kind_name(h)} record {int(self.h_index[h])} repeats record {int(self.h_index[first])}; "
                     "counted once", kind=self._kind_name(h), index=int(self.h_index[h]))
        self.h_exp_eff = np.where(dup, 0, self.h_expected)

    # --- the join ----------------------------------------------------------------------------------------------

    def _join(self) -> None:
        n = len(self.ev_idx)
        self.m_host = np.full(n, -1, np.int64)  # host launch (index into the h_* arrays)
        self.m_kind = np.zeros(n, np.uint16)
        self.m_replay = np.zeros(n, np.uint64)
        self.m_join = np.zeros(n, np.uint8)
        self.m_window = np.full(n, -1, np.int64)  # ordered: multi-stream window attribution without a node
        self.m_exec = np.zeros(n, np.uint64)
        self.m_ordinal = np.full(n, -1, np.int32)
        self.ambiguous: list[dict] = []
        self.coverage_late = 0
        want = self.o.join
        all_gid = bool(n) and bool(self.ev_has_gid.all())
        any_gid = bool(self.ev_has_gid.any())
        if want == "auto":
            mode = "exact" if any_gid else "ordered"
        else:
            mode = want
        self.mode = mode if (n or self.n_host) else "none"
        if not n or not self.n_host:
            self.join_note = "nothing to join" if not (n or self.n_host) else (
                "no device events" if not n else "no host launch records")
            self.mode = "none" if not (n and self.n_host) else self.mode
            if n and not self.n_host:
                # An events-only dump (like the published event file) is not wrong, but nothing joins it.
                self.add("warning", "no-host-records", f"{n:,} device events and no host launch records: "
                         "nothing to reconcile them against", kind="device_event", index=int(self.ev_idx[0]),
                         count=n, listed=False)
            return
        if mode == "exact":
            if not any_gid:
                self.add("error", "join-impossible", "--join exact needs device events carrying %gridid "
                         "(flags.has_gridid); none do", listed=False)
                self.join_note = "exact join impossible: no device event carries gridid"
                return
            self._join_exact()
            self.join_note = ("exact: gridid -> launch/node, tag -> replay; independent of device event order"
                              + ("" if all_gid else f"; {int((~self.ev_has_gid).sum()):,} events lack gridid and "
                                 "stay unmatched"))
            if not all_gid:
                self.add("warning", "gridid-missing", f"{int((~self.ev_has_gid).sum()):,} device events carry no "
                         "gridid and cannot be joined exactly", listed=False)
        else:
            self._join_ordered()

    def _check_ordered_against_gridid(self) -> None:
        """An ordered join forced on events that carry %gridid is checked against the grid id each event names.

        Where they disagree, the device order is not the host order (a multi-stream graph, concurrent kernels):
        the ordered answer for those events is wrong, so it is reported and their launch/node attribution is
        withdrawn (they keep their replay; block counts were taken before, per replay they still agree)."""
        if self.mode != "ordered":
            return
        m = (self.m_host >= 0) & self.ev_has_gid
        bad = np.zeros(len(m), bool)
        bad[m] = self.h_gid[self.m_host[m]] != self.ev_gridid[m]
        n = int(bad.sum())
        if not n:
            return
        first = int(np.flatnonzero(bad)[0])
        self.add("warning", "ordered-ambiguous", f"ordered join contradicted by %gridid for {n:,} device events: "
                 "the device order is not the host order (a multi-stream graph or concurrent kernels), so these "
                 "events keep their replay but not a launch or node; use --join exact",
                 kind="device_event", index=int(self.ev_idx[first]), count=n)
        self.m_host[bad] = -1
        self.m_ordinal[bad] = -1
        self.ordered_contradicted = n

    def _join_exact(self) -> None:
        hv = np.flatnonzero(~self.h_dup)
        ev_ok = self.ev_has_gid
        # 1) tagged: (gridid, tag) on both sides
        ht = hv[self.h_has_tag[hv]]
        e1 = np.flatnonzero(ev_ok & self.ev_has_tag)
        if len(ht) and len(e1):
            self._match_pairs(ht, e1)
        # 2) gridid alone where it names exactly one host record and one side has no tag
        rest = np.flatnonzero(ev_ok & (self.m_host < 0))
        if len(rest):
            hg = self.h_gid[hv]
            o = np.argsort(hg, kind="stable")
            hs = hg[o]
            ug, starts, counts = np.unique(hs, return_index=True, return_counts=True)
            gi = np.searchsorted(ug, self.ev_gridid[rest])
            gi_c = np.minimum(gi, max(len(ug) - 1, 0))
            found = (gi < len(ug)) & (ug[gi_c] == self.ev_gridid[rest]) if len(ug) else np.zeros(len(rest), bool)
            host_first = hv[o[starts[gi_c]]] if len(ug) else np.zeros(len(rest), np.int64)
            single = found & (counts[gi_c] == 1) if len(ug) else found
            untagged = ~self.ev_has_tag[rest] | ~self.h_has_tag[host_first]
            take = single & untagged
            self.m_host[rest[take]] = host_first[take]
        self.m_join[self.m_host >= 0] = JOIN_EXACT
        self._fill_from_host()
        self._explain_exact_unmatched()

    def _match_pairs(self, hidx: np.ndarray, eidx: np.ndarray) -> None:
        """Match events eidx to host records hidx on (gridid, tag); the first host record wins on duplicates."""
        tags = np.unique(np.r_[self.h_tag[hidx], self.ev_tag[eidx]])
        gids = np.unique(np.r_[self.h_gid[hidx], self.ev_gridid[eidx]])
        nt = np.int64(len(tags))
        hk = np.searchsorted(gids, self.h_gid[hidx]).astype(np.int64) * nt + np.searchsorted(tags, self.h_tag[hidx])
        ek = np.searchsorted(gids, self.ev_gridid[eidx]).astype(np.int64) * nt + np.searchsorted(tags,
                                                                                                 self.ev_tag[eidx])
        o = np.argsort(hk, kind="stable")
        hks = hk[o]
        p = np.searchsorted(hks, ek)
        pc = np.minimum(p, len(hks) - 1)
        ok = (p < len(hks)) & (hks[pc] == ek)
        self.m_host[eidx[ok]] = hidx[o[pc[ok]]]

    def _fill_from_host(self) -> None:
        m = self.m_host >= 0
        h = self.m_host[m]
        self.m_kind[m] = self.h_kind[h]
        self.m_replay[m] = self.h_replay[h]
        self.m_exec[m] = self.h_exec[h]
        self.m_ordinal[m] = self.h_ordinal[h]

    def _explain_exact_unmatched(self) -> None:
        """Name every unmatched exact-mode event group precisely: host record missing for (replay, node), an extra
        replay the host never saw, or a gridid no host record has."""
        un = np.flatnonzero((self.m_host < 0) & self.ev_has_gid)
        if not len(un):
            return
        hv = np.flatnonzero(~self.h_dup)
        # gridid -> a host record with it (node identity); tag -> (exec, replay)
        hg_o = hv[np.argsort(self.h_gid[hv], kind="stable")]
        hg_s = self.h_gid[hg_o]
        tagged = hv[self.h_has_tag[hv] & (self.h_kind[hv] == GRAPH_NODE)]
        tg_o = tagged[np.argsort(self.h_tag[tagged], kind="stable")]
        tg_s = self.h_tag[tg_o]
        key = np.stack([self.ev_gridid[un], np.where(self.ev_has_tag[un], self.ev_tag[un], 0)], axis=1)
        uk, inv, cnt = np.unique(key, axis=0, return_inverse=True, return_counts=True)
        inv = inv.reshape(-1)
        extra_replays: dict[tuple, dict] = {}
        for k, ((gid, tag), c) in enumerate(zip(uk, cnt)):
            first_ev = un[np.flatnonzero(inv == k)[0]]
            dev_i = int(self.ev_idx[first_ev])
            p = np.searchsorted(hg_s, gid)
            if p >= len(hg_s) or hg_s[p] != gid:
                self.add("error", "unmatched-device-event", f"{int(c):,} device events with gridid {int(gid)} "
                         f"({self._kname(self.ev_slot[first_ev])}) match no host launch record",
                         kind="device_event", index=dev_i, count=int(c))
                continue
            h = hg_o[p]
            nsame = int(np.searchsorted(hg_s, gid, side="right") - p)
            if self.h_kind[h] == EAGER or not self.ev_has_tag[first_ev]:
                self.add("error", "unmatched-device-event", f"{int(c):,} device events with gridid {int(gid)} "
                         f"cannot be joined: {nsame} host records share that gridid and the events carry no tag to "
                         f"pick one ({self._launch_name(h)})", kind="device_event", index=dev_i, count=int(c))
                continue
            q = np.searchsorted(tg_s, tag)
            rec_h = None
            if q < len(tg_s) and tg_s[q] == tag:
                cand = tg_o[q : int(np.searchsorted(tg_s, tag, side="right"))]
                cand = cand[self.h_exec[cand] == self.h_exec[h]]
                rec_h = cand[0] if len(cand) else None
            node_desc = f"node #{int(self.h_ordinal[h])} ({_hex(self.h_node[h])})"
            if rec_h is not None:
                r = int(self.h_replay[rec_h])
                self.add("error", "host-record-missing", f"graph exec {_hex(self.h_exec[h])} replay {r} {node_desc}: "
                         f"{_n(c, 'device event')} (tag {_hex(tag)}) but no host graph-node record of this node in "
                         "this replay", kind="device_event", index=dev_i, count=int(c))
                # attribute to the replay, node known: keep it unmatched to a record but name it in the table
                sel = un[inv == k]
                self.m_kind[sel] = GRAPH_NODE
                self.m_replay[sel] = r
                self.m_join[sel] = JOIN_EXACT
                self.m_exec[sel] = self.h_exec[h]
                self.m_ordinal[sel] = self.h_ordinal[h]
            else:
                x = extra_replays.setdefault((int(self.h_exec[h]), int(tag)), {"events": 0, "nodes": set(),
                                                                               "first": dev_i})
                x["events"] += int(c)
                x["nodes"].add(int(self.h_ordinal[h]))
        for (ex, tag), x in sorted(extra_replays.items()):
            known = sorted({int(r) for r in self.h_replay[(self.h_kind == GRAPH_NODE) & (self.h_exec == ex)]})
            self.add("error", "extra-replay", f"graph exec {_hex(ex)}: {x['events']:,} device events of a replay "
                     f"the host never recorded (tag {_hex(tag)}; host replays {_ranges(known)}), nodes "
                     f"#{_ranges(sorted(x['nodes']))}", kind="device_event", index=x["first"], count=x["events"])
        self.extra_replay_events = sum(x["events"] for x in extra_replays.values())

    def _join_ordered(self) -> None:
        """Lay events (sequence order) over host launches (host order), each launch taking its grid's block count."""
        n_ev = len(self.ev_idx)
        live = np.flatnonzero(~self.h_dup)
        order = live[np.lexsort((np.arange(len(live)), self.h_ns[live]))]  # host order; stable within equal host_ns
        self.h_order = order
        nL = len(order)
        exp = self.h_expected[order]
        C = np.cumsum(exp)
        E = int(C[-1]) if nL else 0
        start = C - exp
        T = int(self.pos[-1]) + 1 if n_ev else 0  # block-enter slots reserved (gaps included)
        gaps = T - n_ev
        delta = E - T
        drops = self.device_drops
        p = self.pos
        surplus_found = np.zeros(n_ev, bool)
        if delta < 0 and drops == 0 and nL:
            # More events than blocks: find each surplus event as the first that does not fit the launch the
            # forward placement gives it (kernel slot, blockIdx outside the grid, blockIdx repeated); a few rounds.
            p, surplus_found, surplus_host = self._locate_surplus(order, C, -delta)
            if surplus_found.any():
                self.m_host[surplus_found] = surplus_host
                self.m_join[surplus_found] = JOIN_ORDERED
                keep = ~surplus_found
                T = int(p[keep][-1]) + 1 if keep.any() else 0
                delta = E - T
        # offsets s: event at position p sits at host block p + s
        if delta >= 0:
            s_lo, s_hi = (delta, delta) if drops == 0 else (max(0, delta - drops), delta)
        else:
            s_lo, s_hi = delta, 0
        self.ordered_info = {"expected_blocks": E, "sequence_slots": T, "sequence_gaps": gaps, "offset_lo": s_lo,
                             "offset_hi": s_hi, "device_drops": drops}

        # windows: neighbouring launches on different streams (not across replays of one graph exec)
        st = self.h_stream[order]
        link = st[1:] != st[:-1]
        kd = self.h_kind[order]
        both_g = (kd[1:] == GRAPH_NODE) & (kd[:-1] == GRAPH_NODE)
        other_replay = both_g & ((self.h_exec[order][1:] != self.h_exec[order][:-1])
                                 | (self.h_replay[order][1:] != self.h_replay[order][:-1]))
        # a graph replay spanning several streams forms one window with all its nodes
        rep_key_same = both_g & ~other_replay
        link = (link & ~other_replay) | (rep_key_same & self._replay_multistream(order))
        win = np.r_[0, np.cumsum(~link)] if nL else np.zeros(0, np.int64)
        wstart_of = np.searchsorted(win, win, side="left")
        wend_of = np.searchsorted(win, win, side="right") - 1

        a_raw = p + s_lo
        b_raw = p + s_hi
        in_a = (a_raw >= 0) & (a_raw < E)
        in_b = (b_raw >= 0) & (b_raw < E)
        la = np.searchsorted(C, np.clip(a_raw, 0, max(E - 1, 0)), side="right")
        lb = np.searchsorted(C, np.clip(b_raw, 0, max(E - 1, 0)), side="right")
        la = np.minimum(la, nL - 1)
        lb = np.minimum(lb, nL - 1)
        wa = wstart_of[la]
        wb = wend_of[lb]
        in_a &= ~surplus_found
        in_b &= ~surplus_found
        exact_node = in_a & in_b & (wa == wb)  # one launch, single-launch window
        win_only = in_a & in_b & ~exact_node & (win[la] == win[lb])
        amb = ~(exact_node | win_only | surplus_found)
        self.m_host[exact_node] = order[la[exact_node]]
        self.m_join[exact_node | win_only] = JOIN_ORDERED
        self._fill_from_host()
        # window attribution: kind and replay of the window when uniform
        if win_only.any():
            h0 = order[wa[win_only]]
            h1 = order[wb[win_only]]
            same_rep = (self.h_kind[h0] == self.h_kind[h1]) & (self.h_replay[h0] == self.h_replay[h1]) & (
                self.h_exec[h0] == self.h_exec[h1])
            sel = np.flatnonzero(win_only)
            self.m_kind[sel[same_rep]] = self.h_kind[h0[same_rep]]
            self.m_replay[sel[same_rep]] = self.h_replay[h0[same_rep]]
            self.m_exec[sel[same_rep]] = self.h_exec[h0[same_rep]]
            self.m_window[sel] = win[la[win_only]]
        # kernel slot must fit; misfits are unmatched and reported
        m = self.m_host >= 0
        mis = m & (self.ev_slot != self.h_slot[np.maximum(self.m_host, 0)])
        if mis.any():
            hs = self.m_host[mis]
            uh, first, cnt = np.unique(hs, return_index=True, return_counts=True)
            evs = np.flatnonzero(mis)
            for h, f, c in zip(uh, first, cnt):
                self.add("error", "ordered-misfit", f"ordered join: {int(c):,} device events laid on "
                         f"{self._launch_name(h)} carry {self._kname(self.ev_slot[evs[f]])}, not the launch's kernel; "
                         "the single-stream, same-order assumption does not hold here",
                         kind="device_event", index=int(self.ev_idx[evs[f]]), count=int(c))
            self.m_host[mis] = -1
            self.m_kind[mis] = 0
            self.m_replay[mis] = 0
            self.m_join[mis] = 0
            self.m_exec[mis] = 0
            self.m_ordinal[mis] = -1
        # windows (multi-stream) and ambiguous runs: [first launch, last launch] in host order
        lo = np.where(amb, np.where(in_a, wa, 0), wa)
        hi = np.where(amb, np.where(in_b, wb, nL - 1), wb)
        regions = []
        for sel, reason in ((amb, "deficit"), (win_only, "multi-stream")):
            ev_sel = np.flatnonzero(sel)
            if not len(ev_sel):
                continue
            rl, rh = lo[ev_sel], hi[ev_sel]
            # lo/hi are non-decreasing in position; a new region starts where lo passes the running hi
            run_hi = np.maximum.accumulate(rh)
            brk = np.r_[0, np.flatnonzero(rl[1:] > run_hi[:-1]) + 1]
            ends = np.r_[brk[1:], len(ev_sel)]
            for b0, b1 in zip(brk, ends):
                regions.append((int(rl[b0]), int(run_hi[b1 - 1]), reason, int(b1 - b0), int(ev_sel[b0])))
        self.regions = []
        self.h_in_region = np.zeros(self.n_host, bool)
        reg_by_lo = sorted(regions)
        for r_lo, r_hi, reason, nev, first_ev in reg_by_lo:
            hs = order[r_lo : r_hi + 1]
            self.h_in_region[hs] = True
            # every event whose position falls in the region's block span under either offset
            blo, bhi = int(start[r_lo]), int(C[r_hi])
            evin = int(((b_raw >= blo) & (a_raw < bhi)).sum())
            exp_r = int(exp[r_lo : r_hi + 1].sum())
            self.regions.append({"first_launch": int(r_lo), "last_launch": int(r_hi), "reason": reason,
                                 "expected_blocks": exp_r, "device_events": evin, "unattributed_events": nev,
                                 "hosts": hs, "first_event": first_ev})
        self.ordered_info["late_start_blocks"] = s_lo if (delta > 0 and drops == 0) else 0
        self.coverage_late = self.ordered_info["late_start_blocks"]
        self.ordered_order_pos = np.empty(self.n_host, np.int64)
        self.ordered_order_pos[:] = -1
        self.ordered_order_pos[order] = np.arange(nL)
        streams = np.unique(self.h_stream[order])
        note = ("ordered: device events in sequence order laid over host launches in host order; assumes a single "
                "stream")
        if len(streams) > 1:
            note += f" (host records name {len(streams)} streams: launches on different streams next to each other " \
                    "are attributed to their window, not to one launch)"
        if self.coverage_late:
            note += (f"; {self.coverage_late:,} blocks missing with 0 device drops are attributed to the earliest "
                     "launches (coverage starts late, it never stops early)")
        elif drops and delta > 0:
            note += f"; {self._loss()}: the deficit cannot be placed, ambiguous runs are reported"
        self.join_note = note

    def _locate_surplus(self, order, C, surplus: int, rounds: int = 64):
        """Forward placement with surplus events taken out one at a time: the first event that does not fit its
        launch (another kernel, blockIdx outside the grid, blockIdx seen before in that launch) is the surplus one.
        Returns adjusted positions, the mask of surplus events found (all or none) and their launches."""
        n = len(self.pos)
        E = int(C[-1])
        found = np.zeros(n, bool)
        self.surplus_alt = {}
        host_of = np.full(n, -1, np.int64)
        for _ in range(min(surplus, rounds)):
            p = self.pos - np.cumsum(found) + found  # an excluded event keeps the slot it was found at
            ok = ~found & (p < E)
            idx = np.flatnonzero(ok)
            la = np.minimum(np.searchsorted(C, p[idx], side="right"), len(order) - 1)
            h = order[la]
            mis = (self.ev_slot[idx] != self.h_slot[h]) | (self.ev_x[idx] >= self.h_gx[h]) | (
                self.ev_y[idx] >= self.h_gy[h]) | (self.ev_z[idx] >= self.h_gz[h])
            with np.errstate(over="ignore"):
                lin = self.ev_x[idx] + self.h_gx[h] * (self.ev_y[idx] + self.h_gy[h] * self.ev_z[idx])
            o = np.lexsort((np.arange(len(idx)), lin, la))
            rep = np.r_[False, (la[o][1:] == la[o][:-1]) & (lin[o][1:] == lin[o][:-1])]
            dup = np.zeros(len(idx), bool)
            dup[o] = rep
            bad = np.flatnonzero(mis | dup)
            if not len(bad):
                break
            j = idx[bad[0]]
            found[j] = True
            host_of[j] = h[bad[0]]
            lj = int(la[bad[0]])
            if lj > 0 and p[j] == C[lj - 1]:  # first block of its launch: might be the previous launch's surplus
                self.surplus_alt[int(h[bad[0]])] = int(order[lj - 1])
        if int(found.sum()) != surplus:
            self.surplus_alt = {}
            return self.pos, np.zeros(n, bool), host_of[:0]
        p = self.pos - np.cumsum(found) + found
        return p, found, host_of[found]

    def _replay_multistream(self, order: np.ndarray) -> np.ndarray:
        """For each neighbouring pair in host order that is inside one graph replay: does that replay use >1
        stream?"""
        g = self.h_kind[order] == GRAPH_NODE
        key = np.where(g, self.h_exec[order] * np.uint64(0x9E3779B97F4A7C15) + self.h_replay[order], 0)
        if not g.any():
            return np.zeros(max(len(order) - 1, 0), bool)
        ks, inv = np.unique(key, return_inverse=True)
        st = self.h_stream[order]
        # number of distinct streams per replay key
        pair = np.unique(np.stack([inv.astype(np.uint64), st], axis=1), axis=0)
        nstreams = np.bincount(pair[:, 0].astype(np.int64), minlength=len(ks))
        multi = (nstreams > 1) & (ks != 0)
        mm = multi[inv]
        return mm[1:] & mm[:-1]

    # --- counting ----------------------------------------------------------------------------------------------

    def _count_blocks(self) -> None:
        nH = self.n_host
        m = np.flatnonzero(self.m_host >= 0)
        h = self.m_host[m]
        self.h_recorded = np.bincount(h, minlength=nH).astype(np.int64)
        gx, gy, gz = self.h_gx[h], self.h_gy[h], self.h_gz[h]
        x, y, z = self.ev_x[m], self.ev_y[m], self.ev_z[m]
        inside = (x < gx) & (y < gy) & (z < gz)
        with np.errstate(over="ignore"):
            lin = x + gx * (y + gy * z)
        # duplicates: same launch, same blockIdx
        key_o = np.lexsort((np.arange(len(m)), lin, h))
        hs, ls = h[key_o], lin[key_o]
        dupe_sorted = np.r_[False, (hs[1:] == hs[:-1]) & (ls[1:] == ls[:-1])]
        dupe = np.zeros(len(m), bool)
        dupe[key_o] = dupe_sorted
        valid = inside & ~dupe
        self.h_distinct = np.bincount(h[valid], minlength=nH).astype(np.int64)
        self.h_outside = np.bincount(h[~inside], minlength=nH).astype(np.int64)
        self.h_dupblk = np.bincount(h[inside & dupe], minlength=nH).astype(np.int64)
        tmin = np.full(nH, np.iinfo(np.uint64).max, np.uint64)
        if len(m):  # earliest entry per launch: a reduceat over the (launch, blockIdx) order already sorted
            gs, _ = _group_runs(hs)
            tmin[hs[gs]] = np.minimum.reduceat(self.ev_t[m][key_o], gs)
        self.h_first_ns = np.where(self.h_recorded > 0, tmin, 0).astype(np.uint64)
        first_out = {}
        if (~inside).any():
            for i in np.flatnonzero(~inside):
                first_out.setdefault(int(h[i]), i)
        first_dup = {}
        if (inside & dupe).any():
            for i in np.flatnonzero(inside & dupe):
                first_dup.setdefault(int(h[i]), i)

        in_region = getattr(self, "h_in_region", np.zeros(nH, bool))
        exp = self.h_exp_eff
        missing = np.where(~in_region & ~self.h_dup, np.maximum(exp - self.h_distinct, 0), 0)
        self.h_missing = missing
        self.h_extra = self.h_outside + self.h_dupblk
        late = self.coverage_late
        late_until = -1
        if late:
            # launches whose blocks lie (in part) before the first covered block, in host order
            exp_o = self.h_expected[self.h_order]
            late_until = int(np.searchsorted(np.cumsum(exp_o), late, side="left"))  # last launch touched
        dev_note = ""
        if self.device_drops:
            dev_note = f" ({self._loss()})"
        for hh in np.flatnonzero(missing > 0):
            rec, ex = int(self.h_distinct[hh]), int(exp[hh])
            why, sev, code = dev_note, "error", "missing-blocks"
            if late and 0 <= self.ordered_order_pos[hh] <= late_until:
                why = (" - ran before coverage began: 0 device drops, so the deficit can only be launches that ran "
                       "before patching (coverage starts late, it never stops early)")
                sev, code = ("error" if self.o.strict_coverage else "warning"), "coverage-late"
            self.add(sev, code, f"{self._launch_name(hh)}: {rec:,} of {ex:,} blocks recorded, "
                     f"{ex - rec:,} missing{why}", kind=self._kind_name(hh), index=int(self.h_index[hh]))
        for hh in np.flatnonzero(self.h_outside > 0):
            i = first_out[int(hh)]
            blk = f"({int(x[i])},{int(y[i])},{int(z[i])})"
            alt = getattr(self, "surplus_alt", {}).get(int(hh))
            alt = (f"; ordered join: it came right after the last block of {self._launch_name(alt)} and may belong "
                   "to that launch instead") if alt is not None else ""
            self.add("error", "extra-blocks", f"{self._launch_name(hh)}: {int(self.h_recorded[hh]):,} device events "
                     f"for {int(exp[hh]):,} expected blocks; {int(self.h_outside[hh]):,} outside the grid, first "
                     f"block {blk}{alt}", kind="device_event", index=int(self.ev_idx[m[i]]),
                     count=int(self.h_outside[hh]))
        for hh in np.flatnonzero(self.h_dupblk > 0):
            i = first_dup[int(hh)]
            blk = f"({int(x[i])},{int(y[i])},{int(z[i])})"
            self.add("error", "duplicate-block", f"{self._launch_name(hh)}: {int(self.h_dupblk[hh]):,} blocks "
                     f"recorded more than once, first {blk}", kind="device_event", index=int(self.ev_idx[m[i]]),
                     count=int(self.h_dupblk[hh]))
        ms_groups: dict = {}
        for r in getattr(self, "regions", []):
            hs = r["hosts"]
            if (r["reason"] == "multi-stream" and r["expected_blocks"] == r["device_events"]
                    and (self.h_kind[hs] == GRAPH_NODE).all() and len(np.unique(self.h_exec[hs])) == 1):
                ms_groups.setdefault(int(self.h_exec[hs[0]]), []).append(r)
            else:
                self._region_finding(r)
        for ex, rs in ms_groups.items():
            reps = sorted({int(v) for r in rs for v in self.h_replay[r["hosts"]]})
            hs = np.concatenate([r["hosts"] for r in rs])
            nev = sum(r["unattributed_events"] for r in rs)
            self.add("warning", "ordered-ambiguous", f"ordered join: graph exec {_hex(ex)} replays {_ranges(reps)}: "
                     f"the nodes ran on {len(np.unique(self.h_stream[hs]))} streams and the device order between "
                     f"streams is unknown, so {nev:,} events are attributed to their replay only, not to a node "
                     "(counts per replay agree); use a dump with gridid+tag for the exact join",
                     kind="device_event", index=int(self.ev_idx[rs[0]["first_event"]]), count=nev)
        # ordered: events that fall outside every launch (surplus at the ends) and were not placed
        if self.mode == "ordered":
            un = (self.m_join == 0) & (self.m_host < 0)
            amb_ev = sum(r["unattributed_events"] for r in self.regions if r["reason"] == "deficit")
            self.ordered_unplaced = int(un.sum()) - amb_ev
        # events counted neither in a launch nor in an ambiguous run: blocks no host launch accounts for
        in_runs = sum(r["unattributed_events"] for r in getattr(self, "regions", []))
        self.unattributed = int((self.m_host < 0).sum()) - in_runs

    def _region_finding(self, r: dict) -> None:
        hs = r["hosts"]
        first, last = int(hs[0]), int(hs[-1])
        d_ = r["expected_blocks"] - r["device_events"]
        what = f"{len(hs):,} launches from {self._launch_name(first)} to {self._launch_name(last)}"
        if r["reason"] == "multi-stream":
            ex = sorted({_hex(v) for v in self.h_exec[hs] if v}) or ["-"]
            self.add("warning", "ordered-ambiguous", f"ordered join: {what} ran on "
                     f"{len(np.unique(self.h_stream[hs]))} streams; the device order between streams is unknown, so "
                     f"{r['unattributed_events']:,} events are attributed to their replay/window only, not to a "
                     f"node (graph exec {', '.join(ex)}); use a dump with gridid+tag for the exact join",
                     kind="device_event", index=int(self.ev_idx[r["first_event"]]), count=r["unattributed_events"])
            if d_:
                self.add("error", "missing-blocks" if d_ > 0 else "extra-blocks",
                         f"{what}: {r['expected_blocks']:,} expected blocks, {r['device_events']:,} device events "
                         f"({abs(d_):,} {'missing' if d_ > 0 else 'extra'}); which launch cannot be told",
                         kind=self._kind_name(first), index=int(self.h_index[first]))
            return
        sev = "error"
        self.add(sev, "missing-blocks" if d_ > 0 else ("extra-blocks" if d_ < 0 else "ordered-ambiguous"),
                 f"ordered join: {what}: {r['expected_blocks']:,} expected blocks, {r['device_events']:,} device "
                 f"events, {abs(d_):,} {'missing' if d_ >= 0 else 'extra'}; {self._loss()}, "
                 f"so the ordered join cannot tell which of these launches "
                 f"{'lost' if d_ >= 0 else 'gained'} them ({r['unattributed_events']:,} events unattributed)",
                 kind=self._kind_name(first), index=int(self.h_index[first]))

    # --- device side per graph exec: records per (replay, node), timing --------------------------------------

    def _loss(self) -> str:
        """Why device events may be missing anywhere: dropped by the device, lost when the file was cut short."""
        dropped, lost = self.device_drops - self.device_lost, self.device_lost
        parts = ([f"the device dropped {_n(dropped, 'event')}"] if dropped else []) + (
            [f"{_n(lost, 'device event')} lost to truncation"] if lost else [])
        return " and ".join(parts) or "0 device events dropped or lost"

    def _graph_device(self) -> None:
        self.ev_ordinal = self.m_ordinal
        self.ev_exec = self.m_exec
        for gr in self.graphs:
            self._graph_timing(gr)

    def _graph_timing(self, gr: dict) -> None:
        ex = gr["_exec"]
        idx = gr["_idx"]
        sel = np.flatnonzero((self.m_kind == GRAPH_NODE) & (self.ev_exec == ex))
        live = idx[~self.h_dup[idx]]
        gr["expected_executions"] = int(len(live))
        gr["expected_blocks"] = int(self.h_exp_eff[live].sum())
        gr["device_events"] = int(len(sel))
        gr["matched_events"] = int((self.m_host[sel] >= 0).sum())
        dev_replays = np.unique(self.m_replay[sel])
        gr["device_replays"] = [int(r) for r in dev_replays]
        gr["node_attribution"] = bool(len(sel) == 0 or (self.ev_ordinal[sel] >= 0).all())
        t = self.ev_t[sel].astype(np.int64)
        rep = self.m_replay[sel]
        ordn = self.ev_ordinal[sel]
        timing = {"clock": "gpu_globaltimer", "note": "device %globaltimer only; block entries, not kernel durations"}
        if len(sel):
            ur, rinv = np.unique(rep, return_inverse=True)
            R = len(ur)
            rfirst = np.full(R, np.iinfo(np.int64).max)
            rlast = np.full(R, np.iinfo(np.int64).min)
            np.minimum.at(rfirst, rinv, t)
            np.maximum.at(rlast, rinv, t)
            N = int(gr["nodes"])
            known = ordn >= 0
            spans = rlast - rfirst
            per_replay = []
            node_first = None
            if known.any():
                k = rinv[known].astype(np.int64) * N + ordn[known]
                nf = np.full(R * N, np.iinfo(np.int64).max)
                np.minimum.at(nf, k, t[known])
                node_first = nf.reshape(R, N)
                has = node_first != np.iinfo(np.int64).max
                nf_min = np.where(has, node_first, np.iinfo(np.int64).max).min(axis=1)
                nf_max = np.where(has, node_first, np.iinfo(np.int64).min).max(axis=1)
                rows_ok = has.any(axis=1)
                spans = np.where(rows_ok, nf_max - nf_min, spans)
            for j in range(R):
                per_replay.append({"replay": int(ur[j]), "first_ns": int(rfirst[j]), "last_ns": int(rlast[j]),
                                   "span_ns": int(spans[j]),
                                   "gap_to_next_ns": int(rfirst[j + 1] - rlast[j]) if j + 1 < R else None})
            timing["span_ns"] = _stats(spans)
            timing["gap_ns"] = _stats(rfirst[1:] - rlast[:-1]) if R > 1 else None
            timing["per_replay"] = per_replay
            if node_first is not None:
                offs = []
                has = node_first != np.iinfo(np.int64).max
                base = np.where(has, node_first, np.iinfo(np.int64).max).min(axis=1)
                for o in range(N):
                    col = has[:, o]
                    if not col.any():
                        continue
                    v = node_first[col, o] - base[col]
                    node_h = gr["_nodes"][np.flatnonzero(gr["_ordmap"] == o)[0]]
                    offs.append({"node_ordinal": o, "node": _hex(node_h), "replays": int(col.sum()),
                                 "min_ns": int(v.min()), "median_ns": float(np.median(v)), "max_ns": int(v.max())})
                timing["node_offsets"] = offs
        gr["timing"] = timing

    # --- the report --------------------------------------------------------------------------------------------

    def _report(self) -> None:
        nH = self.n_host
        graph = self.h_kind == GRAPH_NODE
        live = ~self.h_dup
        ev_graph = int((self.m_kind == GRAPH_NODE).sum()) + self.extra_replay_events
        ev_eager = int((self.m_kind == EAGER).sum())
        n_ev = len(self.ev_idx)
        records = int(graph.sum())
        exp_exec = int((graph & live).sum())  # distinct (graph exec, replay, node) launches
        exp_blocks = int(self.h_exp_eff[graph].sum())  # the blocks their grids predict
        drops = self.device_drops + self.host_drops - self.device_lost - self.host_lost
        counts = {"lost_records": self.device_lost + self.host_lost, "graph_node_records": records, "expected_executions": exp_exec, "expected_blocks": exp_blocks,
                  "device_events": ev_graph, "drops": drops,
                  "eager_expected_blocks": int(self.h_exp_eff[~graph].sum()), "eager_events": ev_eager,
                  "unattributed": int(self.unattributed - self.extra_replay_events),
                  "device_drops": self.device_drops - self.device_lost, "host_drops": self.host_drops - self.host_lost}
        if not _counts_agree(counts) and not self.mismatches:
            self.add("error", "counts-differ", f"the counts do not agree ({_agreement_line(counts, {})}) and no "
                     "launch explains it", listed=False)
        exp_total = int(self.h_exp_eff.sum())
        in_region = getattr(self, "h_in_region", np.zeros(nH, bool))
        missing_total = int(self.h_missing.sum()) + sum(
            max(r["expected_blocks"] - r["device_events"], 0) for r in getattr(self, "regions", []))
        extra_total = int(self.h_extra.sum()) + sum(
            max(r["device_events"] - r["expected_blocks"], 0) for r in getattr(self, "regions", []))
        first_missing = None
        for hh in np.flatnonzero(self.h_missing > 0)[:1]:
            first_missing = {"host_kind": "eager_launch" if self.h_kind[hh] == EAGER else "graph_node",
                             "host_index": int(self.h_index[hh]), "expected_blocks": int(self.h_exp_eff[hh]),
                             "recorded_blocks": int(self.h_distinct[hh]), "missing_blocks": int(self.h_missing[hh]),
                             "description": self._launch_name(hh)}
        problem_launches = []
        bad = np.flatnonzero((self.h_missing > 0) | (self.h_extra > 0) | self.h_dup)
        for hh in bad[:1000]:
            problem_launches.append({
                "host_kind": "eager_launch" if self.h_kind[hh] == EAGER else "graph_node",
                "host_index": int(self.h_index[hh]), "expected_blocks": int(self.h_expected[hh]),
                "recorded_blocks": int(self.h_recorded[hh]), "distinct_blocks": int(self.h_distinct[hh]),
                "missing_blocks": int(self.h_missing[hh]), "extra_blocks": int(self.h_extra[hh]),
                "duplicate_record": bool(self.h_dup[hh]), "replay": int(self.h_replay[hh]),
                "node_ordinal": int(self.h_ordinal[hh]), "description": self._launch_name(hh)})
        graphs = []
        for gr in self.graphs:
            graphs.append({k: v for k, v in gr.items() if not k.startswith("_")})
        regions = []
        for r in getattr(self, "regions", []):
            d_ = {k: v for k, v in r.items() if k not in ("hosts", "first_event")}
            for end, hh in (("first", int(r["hosts"][0])), ("last", int(r["hosts"][-1]))):
                d_[end] = {"host_kind": self._kind_name(hh), "host_index": int(self.h_index[hh]),
                           "description": self._launch_name(hh)}
            regions.append(d_)
        rep = {
            "context_id": int(self.ctx),
            "device_id": int(self.dev),
            "join": self.mode,
            "join_note": self.join_note,
            "agreement": _verdict(counts, self.mismatches),
            "device": {"events": int(len(self.ev_all)), "block_enter_events": n_ev,
                       "other_events": self.other_events, "matched": int((self.m_host >= 0).sum()),
                       "replay_only": int(((self.m_host < 0) & (self.m_join != 0)).sum()),
                       "unmatched": int(((self.m_host < 0) & (self.m_join == 0)).sum()), "graph_node_events": ev_graph, "eager_events": ev_eager,
                       "drops": self.drops["device_event"]},
            "host": {"eager_launches": self.n_eager, "graph_node_records": self.n_graph_records,
                     "graph_uploads_ignored": self.uploads_ignored, "duplicate_records": int(self.h_dup.sum()),
                     "drops": {"graph_node": self.drops["graph_node"], "eager_launch": self.drops["eager_launch"]}},
            "blocks": {"expected": exp_total, "recorded": int(n_ev),
                       "missing": missing_total, "extra": extra_total + self.unattributed,
                       "launches_with_missing": int((self.h_missing > 0).sum()),
                       "launches_with_extra": int((self.h_extra > 0).sum()),
                       "late_start_blocks": int(self.coverage_late), "first_missing": first_missing},
            "problem_launches": problem_launches,
            "ambiguous_runs": regions,
            "graph_execs": graphs,
        }
        if self.mode == "ordered" and hasattr(self, "ordered_info"):
            rep["ordered"] = dict(self.ordered_info)
        self.report = rep

        # tables
        n = len(self.ev_all)
        mt = np.zeros(n, MATCH_DTYPE)
        mt["context_id"] = self.ctx
        mt["device_index"] = np.arange(n)
        mt["host_index"] = -1
        mt["node_ordinal"] = -1
        b = self.ev_idx
        hi = self.m_host
        mt["host_kind"][b] = self.m_kind
        if len(self.h_index):  # a context may hold device events and no host record at all
            mt["host_index"][b] = np.where(hi >= 0, self.h_index[np.maximum(hi, 0)], -1)
        mt["replay"][b] = self.m_replay
        mt["node_ordinal"][b] = self.ev_ordinal
        mt["join"][b] = self.m_join
        self.matches = mt
        lt = np.zeros(nH, LAUNCH_DTYPE)
        lt["context_id"] = self.ctx
        lt["host_kind"] = self.h_kind
        lt["host_index"] = self.h_index
        lt["kernel_slot"] = self.h_slot
        lt["graph_exec"] = self.h_exec
        lt["replay"] = self.h_replay
        lt["node"] = self.h_node
        lt["node_ordinal"] = self.h_ordinal
        lt["grid_id"] = self.h_gid
        lt["stream"] = self.h_stream
        lt["host_ns"] = self.h_ns
        lt["expected_blocks"] = self.h_expected
        lt["recorded_blocks"] = np.where(in_region, -1, self.h_recorded)
        lt["distinct_blocks"] = np.where(in_region, -1, self.h_distinct)
        lt["first_ns"] = self.h_first_ns
        lt["duplicate"] = self.h_dup
        self.launch_table = lt


# ---------------------------------------------------------------------------------------------------------------
# the verdict: computed once per context; the agreement line, the JSON and the exit status all come from it


def _counts_agree(c: dict) -> bool:
    return (c["graph_node_records"] == c["expected_executions"] and c["expected_blocks"] == c["device_events"]
            and c["drops"] == 0 and c["lost_records"] == 0)


def _dropped(dd: dict) -> str:
    """'12' (dropped by the producer), or '0, 69,243 lost to truncation' for a salvaged, cut-short file."""
    n = dd["effective"] - dd["lost_records"]
    return f"{n:,}" + (f", {dd['lost_records']:,} lost to truncation" if dd["lost_records"] else "")


def _agreement_line(c: dict, mismatches: dict) -> str:
    """'280 graph-node records = 280 expected executions = 280 device events, 0 drops'; when those agree but the
    context does not, what else differs (eager launches, events no launch accounts for) and the finding codes."""
    def eq(a, b):
        return "=" if a == b else "!="

    records, exp_exec, exp_blocks, ev = (c["graph_node_records"], c["expected_executions"], c["expected_blocks"],
                                         c["device_events"])
    drops = c["drops"]
    dn = f"{drops:,} drop" + ("" if drops == 1 else "s")
    if drops:
        dn += f" (device {c['device_drops']:,}, host {c['host_drops']:,})"
    if c["lost_records"]:
        dn += f", {_n(c['lost_records'], 'record')} lost to truncation"
    blocks = "" if exp_blocks == exp_exec else f" ({exp_blocks:,} blocks)"
    line = (f"{records:,} graph-node records {eq(records, exp_exec)} {exp_exec:,} expected executions{blocks} "
            f"{eq(exp_blocks, ev)} {ev:,} device events, {dn}")
    if not mismatches or not _counts_agree(c):  # a "!=" or a drop already says it
        return line
    if c["eager_expected_blocks"] != c["eager_events"]:
        line += (f"; eager launches: {c['eager_expected_blocks']:,} expected blocks != {c['eager_events']:,} "
                 "device events")
    if c["unattributed"] > 0:
        line += f"; {_n(c['unattributed'], 'device event')} no host launch accounts for"
    return line + f"; does not agree: {', '.join(sorted(mismatches))}"


def _verdict(c: dict, mismatches: dict) -> dict:
    """The context's verdict. ``agree``: every count equal, 0 drops and no mismatch finding (one that is an error
    unless --relaxed: when the counts differ, a finding says why, so agree is false exactly when the exit status is
    1, --relaxed aside). ``ReconcileResult.ok`` (the exit status) and the status line follow from the same
    findings."""
    return {"graph_node_records": c["graph_node_records"], "expected_executions": c["expected_executions"],
            "expected_blocks": c["expected_blocks"], "device_events": c["device_events"], "drops": c["drops"],
            "lost_records": c["lost_records"], "agree": not mismatches, "line": _agreement_line(c, mismatches)}


def status_line(results) -> str:
    """The last line of ``kvconv reconcile``: ok / ok (--relaxed: ...) / FAILED (...), from the contexts' verdicts."""
    errors = sum(1 for r in results for f in r.findings if f.severity == "error")
    if errors or not all(r.ok for r in results):
        return f"FAILED ({_n(errors, 'error finding')})"
    relaxed = sum(r.mismatches for r in results)
    if relaxed:
        return f"ok (--relaxed: {_n(relaxed, 'mismatch')} reported as warnings; the counts do not agree)"
    return "ok"


# ---------------------------------------------------------------------------------------------------------------
# text


def _context_lines(path: str, c: dict) -> list[str]:
    out = []
    ag = c["agreement"]
    out.append(f"{path}: context {c['context_id']} (device {c['device_id']}): {c['join']} join")
    out.append(f"  join: {c['join_note']}")
    h, dv, b = c["host"], c["device"], c["blocks"]
    hd = h["drops"]
    out.append(f"  host: {h['eager_launches']:,} eager launches + {h['graph_node_records']:,} graph-node records"
               + (f" ({h['graph_uploads_ignored']:,} graph uploads ignored)" if h["graph_uploads_ignored"] else "")
               + f"; drops: graph_node {_dropped(hd['graph_node'])}, eager_launch {_dropped(hd['eager_launch'])}")
    ro = f"{dv['replay_only']:,} to a replay or window only, " if dv["replay_only"] else ""
    out.append(f"  device: {dv['block_enter_events']:,} block events ({dv['matched']:,} matched to a launch, {ro}"
               f"{dv['unmatched']:,} unmatched); drops {_dropped(dv['drops'])}")
    out.append(f"  blocks: {b['expected']:,} expected from launch geometry, {b['recorded']:,} recorded, "
               f"{b['missing']:,} missing, {b['extra']:,} extra")
    fm = b.get("first_missing")
    if fm:
        more = b["launches_with_missing"] - 1
        out.append(f"  missing: {fm['description']}: {fm['recorded_blocks']:,} of {fm['expected_blocks']:,} blocks "
                   f"recorded" + (f" (+{more:,} more launches)" if more > 0 else "")
                   + (" - ran before coverage began" if b["late_start_blocks"] else ""))
    amb = c["ambiguous_runs"]
    if len(amb) > 5:
        out.append(f"  ambiguous runs: {len(amb):,} (first 5 listed; all in --json)")
    for r in amb[:5]:
        out.append(f"  ambiguous ({r['reason']}): launches {r['first_launch']:,}..{r['last_launch']:,} in host order: "
                   f"{r['expected_blocks']:,} expected blocks, {r['device_events']:,} device events, "
                   f"{r['unattributed_events']:,} events not attributed to one launch")
    for g in c["graph_execs"]:
        rp = g["records_per_replay"] or {}
        out.append(f"  graph exec {g['graph_exec']}: {g['nodes']} nodes, replays {_ranges(g['replays'])}, "
                   f"{g['records']:,} records ({rp.get('min', 0)}..{rp.get('max', 0)} per replay), "
                   f"{'no repeated nodes' if not g['repeated_nodes'] else str(len(g['repeated_nodes'])) + ' repeated'}"
                   f", {'no missing nodes' if not g['missing_nodes'] else str(len(g['missing_nodes'])) + ' missing'}"
                   f", {'stable node order' if g['stable_order'] else 'node order changes'}, "
                   f"{len(g['streams'])} stream{'s' if len(g['streams']) != 1 else ''}")
        t = g["timing"]
        if t.get("span_ns"):
            s = t["span_ns"]
            line = (f"    device timing (gpu_globaltimer): first-to-last node entry per replay {_ms(s['min'])} .. "
                    f"{_ms(s['max'])} (median {_ms(s['median'])})")
            if t.get("gap_ns"):
                gp = t["gap_ns"]
                line += f"; inter-replay gap {_ms(gp['min'])} .. {_ms(gp['max'])} (median {_ms(gp['median'])})"
            if not g.get("node_attribution", True):
                line += " [nodes not attributed: spans from replay first/last events]"
            out.append(line)
        ht = g["host_timing"]
        if ht.get("callback_span_ns"):
            cs = ht["callback_span_ns"]
            line = (f"    host timing (host_monotonic, own domain): node callbacks per replay span "
                    f"{_ms(cs['min'])} .. {_ms(cs['max'])}")
            if ht.get("replay_start_interval_ns"):
                ri = ht["replay_start_interval_ns"]
                line += f"; replay start to next {_ms(ri['min'])} .. {_ms(ri['max'])}"
            out.append(line)
    out.append(f"  {ag['line']}")
    return out
