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
- one slot of one cache written by two blocks in one step: ``writes-slot-conflict``;
- slot writes of a context with no registered cache: not checked, ``writes-no-cache`` (a warning; nothing checked);
- from the probe's mapping alone (no slot_write record needed), a step mapping a slot that a request still running
  holds to another request: ``writes-live-overwrite`` (:mod:`kvconv.check.canary.ownership`).

    >>> from kvconv.check.canary import writes
    >>> from kvconv.format import dump                                       # doctest: +SKIP
    >>> with dump.open("fixtures/writes-stale-pad/writes-stale-pad.kvdump") as d:  # doctest: +SKIP
    ...     writes.check(d).verdict
    'failed'
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from kvconv.check.canary import ownership
from kvconv.check.canary import write_join as wj
from kvconv.check.canary.write_join import name as _name
from kvconv.check.canary.write_join import step_map as _step_map
from kvconv.format.findings import Finding
from kvconv.wording import counted

MAX_NAMED = 200  # findings named one by one per code; the rest are counted in one more finding


@dataclass
class WritesResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)

    @property
    def checked(self) -> bool:
        """Whether a write address was checked: slot_write records and a recorded step to judge them against."""
        return bool(self.summary.get("records") and self.summary.get("steps"))

    @property
    def verdict(self) -> str:
        """This check's part of the verdict (:func:`kvconv.check.verdict.part`; a live overwrite needs no slot_write
        record to fail)."""
        from kvconv.check.verdict import part

        return part(self.findings, checked=self.checked)

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

    def report(self, code: str, message: str, *, group=None, record=None, offset=None, fld=None, severity="error"):
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


def _outside_where(lo: int, hi: int, caches) -> str:
    if not len(caches):
        return "no cache is registered"
    base, end = caches["base"].astype(np.int64), (caches["base"] + caches["size"]).astype(np.int64)
    dist = np.where(hi <= base, base - hi, np.where(lo >= end, lo - end, 0))
    c = caches[int(np.argmin(dist))]
    if hi <= int(c["base"]):
        first = (lo - int(c["base"])) // int(c["slot_bytes"])
        return (f"{counted(int(c['base']) - lo, 'byte')} before cache {_name(c)!r} (id {int(c['cache_id'])}): "
                f"slot {first}, as a slot id of -1 gives")
    past = counted(lo - int(c["base"]) - int(c["size"]), "byte")
    return f"{past} after the end of cache {_name(c)!r} (id {int(c['cache_id'])})"


def check(d, *, path: str | None = None) -> WritesResult:
    """Check every context of dump ``d`` that holds slot_write records."""
    res = WritesResult(path=str(path or d.path))
    fs = _Findings(res.path)
    tot = defaultdict(int)
    for ctx, _dev in d.contexts():
        w = wj.join(d, ctx)
        if w is not None and not len(w.caches):
            _no_cache(d, ctx, w, fs)
        elif w is not None:
            _check_context(d, ctx, w, fs, tot, res)
    own = ownership.check(d, fs.report)
    res.findings = fs.all()
    if not tot["records"] or not tot["steps"]:
        what = ("no write address was verified (only the slot ownership of the probe's mapping)" if own.steps
                else "nothing was verified")
        res.findings.append(Finding("warning", "writes-nothing-checked", "no slot_write records, or no recorded step "
                                    f"(write_step) to check them against: {what}", path=res.path))
    n = fs.counts
    res.summary = {"records": tot["records"], "steps": tot["steps"], "caches": tot["caches"],
                   "writes_outside_steps": tot["writes_outside_steps"],
                   "unmapped_writes": n["writes-unmapped-slot"], "missing_slots": n["writes-missing-slot"],
                   "outside_writes": n["writes-outside-cache"], "slot_conflicts": n["writes-slot-conflict"],
                   **own.summary(),
                   "errors": sum(f.count for f in res.findings if f.severity == "error"),
                   "warnings": sum(f.count for f in res.findings if f.severity == "warning")}
    return res


def _no_cache(d, ctx, w: wj.WriteJoin, fs: _Findings) -> None:
    """A context whose slot writes have no registered cache to be judged against (issue 39: every store was
    'outside every registered cache'): its records are not checked, so they count for nothing, not for a fault. The
    probe's slot ownership (``writes-live-overwrite``) needs no cache and still runs."""
    fs.report("writes-no-cache", f"context {ctx}: {counted(len(w.records), 'slot-write record')} but no cache is "
              "registered: nothing to judge them against, not checked (register the caches: `kvconv record --writes "
              "--engine vllm` loads kvconv's vLLM plugin, or WriteProbe.register_cache; docs/CANARY.md)",
              group=d.groups.index(w.group), severity="warning")


def _check_context(d, ctx, w: wj.WriteJoin, fs: _Findings, tot, res) -> None:
    sw_group, sw, caches, steps, smap = w.group, w.records, w.caches, w.steps, w.smap
    names = d.kernel_names(context_id=ctx)
    cinfo = {int(c["cache_id"]): c for c in caches}
    tot["records"] += len(sw)
    tot["steps"] += len(steps)
    tot["caches"] += len(caches)
    if sw_group.drop_count:
        fs.report("writes-dropped", f"context {ctx}: {sw_group.drop_count} stores found no room in the device write "
               f"table: their slots may be missing here (record with a larger KVCONV_WRITE_CAPACITY)",
               group=d.groups.index(sw_group), fld="header.drop_count")
    step_idx = w.step_idx
    unattributed = int((step_idx < 0).sum())
    tot["writes_outside_steps"] += unattributed
    if unattributed:
        fs.report("writes-unattributed", f"context {ctx}: {unattributed} slot-write records belong to no recorded step "
               f"(no host launch record, or a launch outside every write_step window): not checked",
               group=d.groups.index(sw_group), severity="warning")
    gi = d.groups.index(sw_group)
    written = defaultdict(lambda: defaultdict(list))  # step -> (cache, slot) -> [record index]
    for i in range(len(sw)):
        _check_record(w, i, names, cinfo, fs, gi, written)
    for si in range(len(steps)):
        _check_step(steps, smap, si, written[si], cinfo, sw, fs, gi, ctx, res)


def _check_record(w: wj.WriteJoin, i: int, names, cinfo, fs: _Findings, gi: int, written) -> None:
    r, si, st = w.records[i], int(w.step_idx[i]), int(w.status[i])
    steps, smap = w.steps, w.smap
    if st in (wj.MAPPED, wj.PAD):  # allowed: only counted for the step's missing slots and conflicts
        written[si][(int(r["cache_id"]), int(w.slot[i]))].append(i)
        return
    if st == wj.NO_STEP:
        return
    where = (f"step {int(steps[si]['step'])} " if si >= 0 else "no step ") + \
            (f"replay {int(w.replay[i])} node {int(w.node[i]):#x} " if w.replay[i] else "eager launch ") + \
            f"kernel {names.get(int(r['kernel_slot']), '?')!r} gridid {int(r['gridid'])} " \
            f"block ({int(r['block_x'])},{int(r['block_y'])},{int(r['block_z'])})"
    off = w.group.record_offset(i)
    if st == wj.OUTSIDE:
        lo, hi = int(r["addr_lo"]), int(r["addr_hi"])
        fs.report("writes-outside-cache", f"{where}: {int(r['stores'])} stores to [{lo:#x}, {hi:#x}) outside every "
               f"registered cache: {_outside_where(lo, hi, w.caches)}{_row(steps, smap, si, r)}",
               group=gi, record=i, offset=off, fld="slot_write.addr_lo")
        return
    if st == wj.UNKNOWN_CACHE:
        fs.report("writes-cache-id", f"{where}: cache id {int(r['cache_id'])} is not registered", group=gi, record=i,
               offset=off + 40, fld="slot_write.cache_id")
        return
    slot, c = int(w.slot[i]), cinfo[int(r["cache_id"])]
    written[si][(int(r["cache_id"]), slot)].append(i)
    own = f", a slot of request {int(w.owner[i])} (mapped at step {int(w.owner_step[i])})" if w.has_owner[i] \
        else ", no request mapped it before"
    fs.report("writes-unmapped-slot", f"{where}: cache {_name(c)!r} slot {slot} (page {int(r['page'])} offset "
           f"{int(r['offset'])}) is mapped by no token of the step{own}{_row(steps, smap, si, r)}",
           group=gi, record=i, offset=off + 32, fld="slot_write.page")


def _check_step(steps, smap, si, written, cinfo, sw, fs, gi, ctx, res) -> None:
    st = int(steps[si]["step"])
    m = _step_map(steps, smap, si)
    missing = 0
    for cid, c in cinfo.items():
        for slot, req in sorted(m["live"].items()):
            if (cid, slot) not in written:
                missing += 1
                fs.report("writes-missing-slot", f"context {ctx} step {st}: request {req}'s token at slot {slot} (page "
                       f"{slot // int(c['page_size'])} offset {slot % int(c['page_size'])}) was not written in cache "
                       f"{_name(c)!r} (id {cid})")
    conflicts = 0
    for (cid, slot), recs in written.items():
        blocks = {(int(sw[i]["gridid"]), int(sw[i]["tag"]), int(sw[i]["block_x"]), int(sw[i]["block_y"]),
                   int(sw[i]["block_z"])) for i in recs}
        if len(blocks) > 1:
            conflicts += 1
            desc = ", ".join(f"gridid {b[0]} block ({b[2]},{b[3]},{b[4]})" for b in sorted(blocks))
            fs.report("writes-slot-conflict", f"context {ctx} step {st}: cache {_name(cinfo[cid])!r} slot {slot} "
                      f"written by {len(blocks)} blocks: {desc}", group=gi, record=recs[0])
    res.steps.append({"context_id": ctx, "step": st, "tokens": int(steps[si]["map_count"]),
                      "slot_records": len(written), "missing_slots": missing, "conflicts": conflicts})


def _row(steps, smap, si, r) -> str:
    """The batch row a block wrote for, when the launch has one block per token of the step (block x = row)."""
    if si < 0:
        return ""
    rows = _step_map(steps, smap, si)["rows"]
    x = int(r["block_x"])
    if int(r["block_y"]) or int(r["block_z"]) or x >= len(rows):
        return ""
    t = rows[x]
    who = "a padding row" if int(t["flags"]) & wj.PAD_FLAG else f"request {int(t['request_id'])}"
    return f"; block x {x} is batch row {x} of the step: {who}, mapped to slot {int(t['slot'])}"


def summary_line(res: WritesResult) -> str:
    """The first line of ``kvconv canary --writes``: what was checked and what was found, counted."""
    s = res.summary
    return (f"{res.path}: {s.get('records', 0)} slot-write records, {s.get('steps', 0)} steps, "
            f"{s.get('caches', 0)} caches: {s['unmapped_writes']} writes to unmapped slots, "
            f"{s['missing_slots']} mapped slots never written, {s['outside_writes']} "
            f"writes outside every cache, {s['slot_conflicts']} slots written by two blocks"
            + (f"; slot ownership: {counted(s['ownership_steps'], 'step')}, {counted(s['releases'], 'release')}, "
               f"{counted(s['live_overwrites'], 'live slot')} handed out again ({s['ownership_note']})"
               if s.get("ownership_steps") else ""))
