"""The write-address canary's findings by cause (its part of :func:`kvconv.check.verdict.incidents`).

The same block of a step writing the same wrong slot in every cache (a padding row's stale slot, a stale page-table
entry) is one ``writes-unmapped-slot`` incident "in 80 of 80 caches", the token it should have written (missing in
those caches) folded into it; a token not written in several caches is one ``writes-missing-slot``; the stores of one
block outside every cache one ``writes-outside-cache``.

    >>> from kvconv.format import dump                                             # doctest: +SKIP
    >>> with dump.open("fixtures/writes-stale-pad/writes-stale-pad.kvdump") as d:  # doctest: +SKIP
    ...     [i["message"] for i in incidents(d)][:1]
    ['context 0 step 3, replay 3: batch row 3 (a padding row) wrote slot 60, ...']
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from kvconv.check.canary import write_join as wj

CODES = ("writes-unmapped-slot", "writes-missing-slot", "writes-outside-cache")


def incidents(d) -> list[dict] | None:
    """Every context's write incidents; None when the dump holds no slot_write record (nothing to group)."""
    if not d.groups_of("slot_write"):
        return None
    out = []
    for ctx, _dev in dict.fromkeys(d.contexts()):
        w = wj.join(d, ctx)
        if w is None or not len(w.steps):
            continue
        c = _Context(d, ctx, w)
        absorbed = set()  # (step idx, slot) of tokens whose missing writes an unmapped incident explains
        out += c.unmapped(absorbed)
        out += c.missing(absorbed)
        out += c.outside()
    return out


class _Context:
    """One context's joined writes, with its steps' maps made once each."""

    def __init__(self, d, ctx: int, w) -> None:
        self.ctx, self.w = ctx, w
        self.names = d.kernel_names(context_id=ctx)
        self.ncache = len(w.caches)
        self.maps: dict[int, dict] = {}

    def step_map(self, si: int) -> dict:
        if si not in self.maps:
            self.maps[si] = wj.step_map(self.w.steps, self.w.smap, si)
        return self.maps[si]

    def row(self, si: int, r):
        """The batch row block x wrote for (one block per row), or None."""
        rows = self.step_map(si)["rows"]
        x = int(r["block_x"])
        if int(r["block_y"]) or int(r["block_z"]) or x >= len(rows):
            return None
        return rows[x]

    def kernel(self, r) -> str:
        return repr(self.names.get(int(r["kernel_slot"]), "?"))

    def unmapped(self, absorbed: set) -> list[dict]:
        """Writes to an unmapped slot, by (step, replay, block, slot): the caches it happened in."""
        from kvconv.check.verdict import incident

        w, groups = self.w, defaultdict(list)
        for i in np.flatnonzero(w.status == wj.UNMAPPED).tolist():
            r = w.records[i]
            groups[(int(w.step_idx[i]), int(w.replay[i]), int(r["block_x"]), int(r["block_y"]), int(r["block_z"]),
                    int(w.slot[i]))].append(i)
        out = []
        for (si, replay, bx, by, bz, slot), recs in groups.items():
            r, i0 = w.records[recs[0]], recs[0]
            caches = {int(w.records[i]["cache_id"]) for i in recs}
            t = self.row(si, r)
            pad = t is not None and bool(int(t["flags"]) & wj.PAD_FLAG)
            who, tail = f"block ({bx},{by},{bz})", ""
            if t is not None:
                who = f"batch row {bx} (" + ("a padding row" if pad else f"request {int(t['request_id'])}") + ")"
                tail = f", instead of {int(t['slot'])}"
                if not pad:
                    absorbed.add((si, int(t["slot"])))
            owner = (f", a slot of request {int(w.owner[i0])} since step {int(w.owner_step[i0])}" if w.has_owner[i0]
                     else ", a slot no request had mapped")
            step = int(w.steps[si]["step"])
            msg = (f"context {self.ctx} step {step}, replay {replay}: {who} wrote slot {slot}{owner}{tail}, in "
                   f"{len(caches)} of {self.ncache} caches (kernel {self.kernel(r)})")
            out.append(incident("error", "writes-unmapped-slot", msg, len(recs), context=self.ctx, step=step,
                                replay=replay, slot=slot, caches=len(caches),
                                request=int(t["request_id"]) if t is not None and not pad else None))
        return out

    def missing(self, absorbed: set) -> list[dict]:
        """Tokens not written, by (step, slot): the caches that miss them (those an unmapped write explains
        folded into it)."""
        from kvconv.check.verdict import incident

        w, written = self.w, defaultdict(set)  # (step idx, slot) -> caches written (any status but outside/unknown)
        for i in np.flatnonzero(w.slot >= 0).tolist():
            if w.step_idx[i] >= 0:
                written[(int(w.step_idx[i]), int(w.slot[i]))].add(int(w.records[i]["cache_id"]))
        out = []
        for si in range(len(w.steps)):
            step = int(w.steps[si]["step"])
            for slot, req in sorted(self.step_map(si)["live"].items()):
                miss = self.ncache - len(written.get((si, slot), ()))
                if miss <= 0 or (si, slot) in absorbed:
                    continue
                msg = (f"context {self.ctx} step {step}: request {req}'s token at slot {slot} was not written in "
                       f"{miss} of {self.ncache} caches")
                out.append(incident("error", "writes-missing-slot", msg, miss, context=self.ctx, step=step, slot=slot,
                                    request=req, caches=miss))
        return out

    def outside(self) -> list[dict]:
        """Stores outside every cache, by (step, replay, block)."""
        from kvconv.check.verdict import incident

        w, groups = self.w, defaultdict(list)
        for i in np.flatnonzero(w.status == wj.OUTSIDE).tolist():
            r = w.records[i]
            groups[(int(w.step_idx[i]), int(w.replay[i]), int(r["block_x"]), int(r["block_y"]),
                    int(r["block_z"]))].append(i)
        out = []
        for (si, replay, bx, by, bz), recs in groups.items():
            r = w.records[recs[0]]
            t = self.row(si, r) if si >= 0 else None
            who = (f"batch row {bx} (" + ("a padding row" if int(t["flags"]) & wj.PAD_FLAG
                                          else f"request {int(t['request_id'])}") + f", slot {int(t['slot'])})"
                   if t is not None else f"block ({bx},{by},{bz})")
            before = sum(1 for i in recs if self._just_before(w.records[i]))
            where = (f"step {int(w.steps[si]['step'])}, " if si >= 0 else "no step, ") + f"replay {replay}"
            msg = (f"context {self.ctx} {where}: {who} stored outside every registered cache, {len(recs)} store "
                   f"ranges" + (f" ({before} just before a cache: slot -1)" if before else "")
                   + f" (kernel {self.kernel(r)})")
            out.append(incident("error", "writes-outside-cache", msg, len(recs), context=self.ctx,
                                step=int(w.steps[si]["step"]) if si >= 0 else None, replay=replay))
        return out

    def _just_before(self, rec) -> bool:
        """A store range ending within one slot before a cache's base (what a slot id of -1 writes)."""
        hi = int(rec["addr_hi"])
        return any(hi <= int(c["base"]) and int(c["base"]) - hi < int(c["slot_bytes"]) for c in self.w.caches)
