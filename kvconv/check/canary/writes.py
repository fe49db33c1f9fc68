"""The write-address canary: which KV slots each block of a target kernel wrote, against the slots each step's
tokens map to (``kvconv canary --writes``; docs/CANARY.md).

The tracer (``kvconv record --writes``) writes ``slot_write`` records (one per launch, replay, block and slot of a
registered cache, or per 4 KiB granule outside every cache) and, from the probe in the traced process
(kvconv.capture.probe.writes), the ``cache``, ``write_step`` and ``slot_map`` groups. A write is joined to its launch
through ``(gridid, tag)`` = the host record's ``(grid_id, tag)`` (graph nodes; eager launches by ``grid_id``), and to
its step through the host record's ``host_ns`` inside the step's ``[begin_ns, end_ns]``. Per step:

- a write to a slot no token of the step maps to (padding rows' slots >= 0 are sentinels where writes are allowed):
  ``writes-unmapped-slot``, naming the request that owns the slot (the last earlier token mapped there) and the batch
  row the block wrote for when the kernel runs one block per row;
- a token's slot not written in some registered cache: ``writes-missing-slot``;
- a write outside every registered cache (PADDING_SLOT_ID = -1 written through lands just before a cache):
  ``writes-outside-cache``, with the address range and where it lies relative to the nearest cache;
- one slot of one cache written by two blocks in one step: ``writes-slot-conflict``.

    >>> from kvconv.check.canary import writes
    >>> writes.EXIT_CODES["nothing-checked"]
    4
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from kvconv.format import layout
from kvconv.format.findings import Finding

EXIT_CODES = {"ok": 0, "failed": 1, "nothing-checked": 4}
MAX_NAMED = 200  # findings named one by one per code; the rest are counted in one more finding
_SW = layout.ENUMS["slot_write_flags"]
_PAD = layout.ENUMS["slot_map_flags"]["pad"]
_LF = layout.ENUMS["launch_flags"]


@dataclass
class WritesResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if not self.summary.get("records") or not self.summary.get("steps"):
            return "nothing-checked"
        return "failed" if any(f.severity == "error" for f in self.findings) else "ok"

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def to_dict(self) -> dict:
        return {"path": self.path, "ok": self.ok, "verdict": self.verdict, "summary": self.summary,
                "steps": self.steps, "findings": [f.to_dict() for f in self.findings]}


class _Findings:
    """Findings per code, the first MAX_NAMED named, the rest counted."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.named: list[Finding] = []
        self.more: dict[str, tuple[int, str]] = {}
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, code: str, message: str, *, group=None, record=None, offset=None, fld=None, severity="error"):
        self.counts[code] += 1
        if self.counts[code] <= MAX_NAMED:
            self.named.append(Finding(severity, code, message, path=self.path, group=group, record=record,
                                      offset=offset, field=fld))
        else:
            n, _ = self.more.get(code, (0, severity))
            self.more[code] = (n + 1, severity)

    def all(self) -> list[Finding]:
        out = list(self.named)
        for code, (n, sev) in self.more.items():
            out.append(Finding(sev, code, f"{n} more like the above, not listed", path=self.path, count=n))
        return out


def _ctx_groups(d, ctx: int):
    def one(kind):
        gs = d.groups_of(kind, context_id=ctx)
        return (gs[0] if gs else None), d.records(kind, context_id=ctx)
    return {k: one(k) for k in ("cache", "slot_write", "write_step", "slot_map", "graph_node", "eager_launch")}


def _launches(g: dict):
    """(keys sorted, host_ns, launch_id, node, index) of host records: key (grid_id << 20 | tag) for graph nodes,
    grid_id << 20 for eager launches (tag 0)."""
    gn, ea = g["graph_node"][1], g["eager_launch"][1]
    keys = np.concatenate([(gn["grid_id"] << np.uint64(20)) | (gn["tag"] & np.uint64(0xFFFFF)),
                           ea["grid_id"] << np.uint64(20)]).astype(np.uint64)
    host = np.concatenate([gn["host_ns"], ea["host_ns"]]).astype(np.uint64)
    lid = np.concatenate([gn["launch_id"], np.zeros(len(ea), np.uint64)]).astype(np.uint64)
    node = np.concatenate([gn["node"], np.zeros(len(ea), np.uint64)]).astype(np.uint64)
    order = np.argsort(keys, kind="stable")
    return keys[order], host[order], lid[order], node[order]


def _join(sw, g):
    """Per slot_write: index of its step (-1: none) and its launch's replay id and node (0 for eager)."""
    keys, host, lid, node = _launches(g)
    k = (sw["gridid"].astype(np.uint64) << np.uint64(20)) | (sw["tag"].astype(np.uint64) & np.uint64(0xFFFFF))
    i = np.searchsorted(keys, k)
    hit = i < len(keys)
    hit[hit] &= keys[i[hit]] == k[hit]
    j = np.where(hit, i, 0)
    hns = np.where(hit, host[j] if len(host) else 0, 0)
    steps = g["write_step"][1]
    order = np.argsort(steps["begin_ns"], kind="stable")
    b, e = steps["begin_ns"][order], steps["end_ns"][order]
    s = np.searchsorted(b, hns, side="right") - 1
    ok = hit & (s >= 0)
    ok[ok] &= hns[ok] <= e[s[ok]]
    step_idx = np.where(ok, order[np.clip(s, 0, max(len(order) - 1, 0))] if len(order) else -1, -1)
    return step_idx, np.where(hit, lid[j] if len(lid) else 0, 0), np.where(hit, node[j] if len(node) else 0, 0)


def _name(c) -> str:
    return bytes(c["name"]).rstrip(b"\0").decode("utf-8", "replace")


def _outside_where(lo: int, hi: int, caches) -> str:
    if not len(caches):
        return "no cache is registered"
    base, end = caches["base"].astype(np.int64), (caches["base"] + caches["size"]).astype(np.int64)
    dist = np.where(hi <= base, base - hi, np.where(lo >= end, lo - end, 0))
    c = caches[int(np.argmin(dist))]
    if hi <= int(c["base"]):
        first = (lo - int(c["base"])) // int(c["slot_bytes"])
        return (f"{int(c['base']) - lo} bytes before cache {_name(c)!r} (id {int(c['cache_id'])}): slot {first}, "
                f"as a slot id of -1 gives")
    return f"{lo - int(c['base']) - int(c['size'])} bytes after the end of cache {_name(c)!r} (id {int(c['cache_id'])})"


def check(d, *, path: str | None = None) -> WritesResult:
    """Check every context of dump ``d`` that holds slot_write records."""
    res = WritesResult(path=str(path or d.path))
    fs = _Findings(res.path)
    tot = defaultdict(int)
    for ctx, _dev in d.contexts():
        g = _ctx_groups(d, ctx)
        if g["slot_write"][0] is None:
            continue
        _check_context(d, ctx, g, fs, tot, res)
    res.findings = fs.all()
    if not tot["records"] or not tot["steps"]:
        res.findings.append(Finding("warning", "writes-nothing-checked", "no slot_write records, or no recorded step "
                                    "(write_step) to check them against: nothing was verified", path=res.path))
    n = fs.counts
    res.summary = {"records": tot["records"], "steps": tot["steps"], "caches": tot["caches"],
                   "writes_outside_steps": tot["writes_outside_steps"],
                   "unmapped_writes": n["writes-unmapped-slot"], "missing_slots": n["writes-missing-slot"],
                   "outside_writes": n["writes-outside-cache"], "slot_conflicts": n["writes-slot-conflict"],
                   "errors": sum(f.count for f in res.findings if f.severity == "error"),
                   "warnings": sum(f.count for f in res.findings if f.severity == "warning")}
    return res


def _check_context(d, ctx, g, fs: _Findings, tot, res) -> None:
    sw_group, sw = g["slot_write"]
    caches = g["cache"][1]
    steps, smap = g["write_step"][1], g["slot_map"][1]
    names = d.kernel_names(context_id=ctx)
    cinfo = {int(c["cache_id"]): c for c in caches}
    tot["records"] += len(sw)
    tot["steps"] += len(steps)
    tot["caches"] += len(caches)
    if sw_group.drop_count:
        fs.add("writes-dropped", f"context {ctx}: {sw_group.drop_count} stores found no room in the device write "
               f"table: their slots may be missing here (record with a larger KVCONV_WRITE_CAPACITY)",
               group=d.groups.index(sw_group), fld="header.drop_count")
    step_idx, replay, node = _join(sw, g)
    unattributed = int((step_idx < 0).sum())
    tot["writes_outside_steps"] += unattributed
    if unattributed:
        fs.add("writes-unattributed", f"context {ctx}: {unattributed} slot-write records belong to no recorded step "
               f"(no host launch record, or a launch outside every write_step window): not checked",
               group=d.groups.index(sw_group), severity="warning")
    gi = d.groups.index(sw_group)
    history = _slot_history(steps, smap)
    written = defaultdict(lambda: defaultdict(list))  # step -> (cache, slot) -> [record index]
    for i in range(len(sw)):
        r, si = sw[i], int(step_idx[i])
        where = (f"step {int(steps[si]['step'])} " if si >= 0 else "no step ") + \
                (f"replay {int(replay[i])} node {int(node[i]):#x} " if replay[i] else "eager launch ") + \
                f"kernel {names.get(int(r['kernel_slot']), '?')!r} gridid {int(r['gridid'])} " \
                f"block ({int(r['block_x'])},{int(r['block_y'])},{int(r['block_z'])})"
        off = sw_group.record_offset(i)
        if int(r["flags"]) & _SW["outside"]:
            lo, hi = int(r["addr_lo"]), int(r["addr_hi"])
            fs.add("writes-outside-cache", f"{where}: {int(r['stores'])} stores to [{lo:#x}, {hi:#x}) outside every "
                   f"registered cache: {_outside_where(lo, hi, caches)}{_row(steps, smap, si, r)}",
                   group=gi, record=i, offset=off, fld="slot_write.addr_lo")
            continue
        c = cinfo.get(int(r["cache_id"]))
        if c is None:
            fs.add("writes-cache-id", f"{where}: cache id {int(r['cache_id'])} is not registered", group=gi, record=i,
                   offset=off + 40, fld="slot_write.cache_id")
            continue
        if si < 0:
            continue
        slot = int(r["page"]) * int(c["page_size"]) + int(r["offset"])
        written[si][(int(r["cache_id"]), slot)].append(i)
        m = _step_map(steps, smap, si)
        if slot in m["live"] or slot in m["pad"]:
            continue
        owner = history.get(slot)
        own = ", no request mapped it before" if owner is None or owner[0] > int(steps[si]["step"]) else \
            f", a slot of request {owner[1]} (mapped at step {owner[0]})"
        fs.add("writes-unmapped-slot", f"{where}: cache {_name(c)!r} slot {slot} (page {int(r['page'])} offset "
               f"{int(r['offset'])}) is mapped by no token of the step{own}{_row(steps, smap, si, r)}",
               group=gi, record=i, offset=off + 32, fld="slot_write.page")
    for si in range(len(steps)):
        _check_step(steps, smap, si, written[si], cinfo, sw, fs, gi, ctx, res)


def _check_step(steps, smap, si, written, cinfo, sw, fs, gi, ctx, res) -> None:
    st = int(steps[si]["step"])
    m = _step_map(steps, smap, si)
    missing = 0
    for cid, c in cinfo.items():
        for slot, req in sorted(m["live"].items()):
            if (cid, slot) not in written:
                missing += 1
                fs.add("writes-missing-slot", f"context {ctx} step {st}: request {req}'s token at slot {slot} (page "
                       f"{slot // int(c['page_size'])} offset {slot % int(c['page_size'])}) was not written in cache "
                       f"{_name(c)!r} (id {cid})")
    conflicts = 0
    for (cid, slot), recs in written.items():
        blocks = {(int(sw[i]["gridid"]), int(sw[i]["tag"]), int(sw[i]["block_x"]), int(sw[i]["block_y"]),
                   int(sw[i]["block_z"])) for i in recs}
        if len(blocks) > 1:
            conflicts += 1
            desc = ", ".join(f"gridid {b[0]} block ({b[2]},{b[3]},{b[4]})" for b in sorted(blocks))
            fs.add("writes-slot-conflict", f"context {ctx} step {st}: cache {_name(cinfo[cid])!r} slot {slot} written "
                   f"by {len(blocks)} blocks: {desc}", group=gi, record=recs[0])
    res.steps.append({"context_id": ctx, "step": st, "tokens": int(steps[si]["map_count"]),
                      "slot_records": len(written), "missing_slots": missing, "conflicts": conflicts})


def _step_map(steps, smap, si) -> dict:
    s = steps[si]
    rows = smap[int(s["map_first"]):int(s["map_first"]) + int(s["map_count"])]
    live = {int(r["slot"]): int(r["request_id"]) for r in rows if not int(r["flags"]) & _PAD and int(r["slot"]) >= 0}
    pad = {int(r["slot"]) for r in rows if int(r["flags"]) & _PAD and int(r["slot"]) >= 0}
    return {"live": live, "pad": pad, "rows": rows}


def _slot_history(steps, smap) -> dict[int, tuple[int, int]]:
    """slot -> (step, request) of the last non-padding token mapped to it (steps in step order)."""
    out: dict[int, tuple[int, int]] = {}
    for si in np.argsort(steps["step"], kind="stable"):
        for slot, req in _step_map(steps, smap, int(si))["live"].items():
            out[slot] = (int(steps[si]["step"]), req)
    return out


def _row(steps, smap, si, r) -> str:
    """The batch row a block wrote for, when the launch has one block per token of the step (block x = row)."""
    if si < 0:
        return ""
    rows = _step_map(steps, smap, si)["rows"]
    x = int(r["block_x"])
    if int(r["block_y"]) or int(r["block_z"]) or x >= len(rows):
        return ""
    t = rows[x]
    who = "a padding row" if int(t["flags"]) & _PAD else f"request {int(t['request_id'])}"
    return f"; block x {x} is batch row {x} of the step: {who}, mapped to slot {int(t['slot'])}"


def report_text(res: WritesResult) -> str:
    s = res.summary
    lines = [f"{res.path}: {s.get('records', 0)} slot-write records, {s.get('steps', 0)} steps, "
             f"{s.get('caches', 0)} caches: {s['unmapped_writes']} writes to unmapped slots, "
             f"{s['missing_slots']} mapped slots never written, {s['outside_writes']} "
             f"writes outside every cache, {s['slot_conflicts']} slots written by two blocks"]
    lines += [f.line() for f in res.findings]
    lines.append({"ok": "ok", "failed": "FAILED",
                  "nothing-checked": "NOTHING CHECKED (no slot_write records or steps; see docs/CANARY.md)"}[res.verdict])
    return "\n".join(lines)
