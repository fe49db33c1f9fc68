"""Slot ownership across steps (issue 29): a slot the engine mapped to a request stays that request's until the
engine releases it or the request finishes; a later step mapping it to another request while the first is still
running is ``writes-live-overwrite`` (a live slot handed out twice: a double free, an eviction of a page in use).

It reads the probe's mapping alone (``write_step`` and ``slot_map``, kvconv.capture.probe.writes), no tracer write
record: the bug is visible in the mapping, and the kernel then writes exactly the slot it was given, which the write
and location canaries accept. The rule, per context:

- a token (not a padding row, slot >= 0, request id > 0) of request B mapped to slot s takes s; if s held a token of
  another request A and A is still running (A maps a token in this step or a later one), the finding names both;
- a release (``WriteProbe.release(request_ids)``: every slot those requests hold; ``WriteProbe.free(slots)``: those
  slots) gives the slots back, from the host time it was recorded;
- without any release in the dump, the check assumes a request owns its slots until its last step (its last token in
  the dump), and says so in the finding and in ``summary()['note']``.

Order: by host time (``write_step.begin_ns``; a release's time is when it was recorded), not by step number alone:
under async scheduling the engine dispatches step N+1 before it processes step N's output and frees the finished
requests' blocks, so a release belongs after step N+1's mapping although its step number says N (vLLM #45357,
#47728). Device times of the writes are not used: on one stream they follow the launch order. Where a step carries
no host time (begin_ns 0, a producer other than the probe), steps are ordered by step number and a release follows
the step whose number it carries.

    >>> from kvconv.check.canary import ownership
    >>> ownership.CODE
    'writes-live-overwrite'
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from kvconv.check.canary.write_join import PAD_FLAG, releases

CODE = "writes-live-overwrite"
NO_RELEASE = "no release recorded: a request owns its slots until its last step"
BY_TIME = "steps and releases ordered by host time (write_step.begin_ns)"
BY_STEP = "steps ordered by step number (the steps carry no host time)"


class Ownership:
    """What :func:`check` found: findings reported through ``report(code, message, ...)`` (the write canary's
    findings list), and the counts of its summary."""

    def __init__(self) -> None:
        self.steps = 0
        self.releases = 0
        self.overwrites = 0
        self.notes: list[str] = []

    def summary(self) -> dict:
        return {"ownership_steps": self.steps, "releases": self.releases, "live_overwrites": self.overwrites,
                "ownership_note": "; ".join(dict.fromkeys(self.notes))}


def check(d, report, own: Ownership | None = None) -> Ownership:
    """Check slot ownership in every context of dump ``d`` holding write_step records; each overwrite goes to
    ``report(code, message, group=, record=, offset=, fld=)`` (kvconv.check.canary.writes._Findings.report)."""
    own = own or Ownership()
    for ctx in dict.fromkeys(c for c, _dev in d.contexts()):
        steps = d.records("write_step", context_id=ctx)
        if len(steps):
            _context(d, ctx, steps, d.records("slot_map", context_id=ctx), report, own)
    return own


def _order(steps, rel: np.ndarray) -> tuple[np.ndarray, bool]:
    """Indices of the step records in the order the check walks them, and whether that is host time."""
    idx = np.arange(len(steps))
    timed = bool(len(steps)) and bool((steps["begin_ns"] > 0).all())
    if timed:  # at equal times a step's mapping comes before a release
        return np.lexsort((idx, rel, steps["begin_ns"])), True
    return np.lexsort((idx, rel, steps["step"])), False


def _context(d, ctx, steps, smap, report, own: Ownership) -> None:
    rel = releases(steps, smap)
    order, timed = _order(steps, rel)
    n_rel = int(rel.sum())
    own.steps += int((~rel).sum())
    own.releases += n_rel
    own.notes.append(BY_TIME if timed else BY_STEP)
    if not n_rel:
        own.notes.append(NO_RELEASE)
    tail = "" if n_rel else f"; {NO_RELEASE}"
    prefix = f"context {ctx} " if len({c for c, _ in d.contexts()}) > 1 else ""
    groups = d.groups_of("slot_map", context_id=ctx)
    g0 = groups[0] if groups else None

    def rows(si):
        first, count = int(steps[si]["map_first"]), int(steps[si]["map_count"])
        return first, smap[first:first + count]

    # each request's last step (its rank in the walk): it is running until then
    last: dict[int, int] = {}
    for k, si in enumerate(order.tolist()):
        if rel[si]:
            continue
        _, r = rows(si)
        live = r[((r["flags"] & PAD_FLAG) == 0) & (r["slot"] >= 0) & (r["request_id"] > 0)]
        for req in np.unique(live["request_id"]).tolist():
            last[req] = k
    owner: dict[int, tuple[int, int]] = {}  # slot -> (request, step number of its token)
    held: dict[int, set] = defaultdict(set)  # request -> slots it holds
    for k, si in enumerate(order.tolist()):
        first, r = rows(si)
        if rel[si]:
            for req in np.unique(r["request_id"][r["request_id"] > 0]).tolist():
                for s in held.pop(req, ()):
                    if owner.get(s, (None,))[0] == req:
                        del owner[s]
            for s in r["slot"][(r["request_id"] == 0) & (r["slot"] >= 0)].tolist():
                o = owner.pop(s, None)
                if o is not None:
                    held[o[0]].discard(s)
            continue
        st = int(steps[si]["step"])
        keep = np.flatnonzero(((r["flags"] & PAD_FLAG) == 0) & (r["slot"] >= 0) & (r["request_id"] > 0))
        for j, s, req in zip(keep.tolist(), r["slot"][keep].tolist(), r["request_id"][keep].tolist()):
            o = owner.get(s)
            if o is not None and o[0] != req and last.get(o[0], -1) >= k:
                own.overwrites += 1
                i = first + j
                inside = g0 is not None and i < len(g0.records)
                until = int(steps[order[last[o[0]]]]["step"])
                report(code="writes-live-overwrite",
                       message=f"{prefix}step {st}: request {req}'s token mapped to slot {s}, which holds request "
                       f"{o[0]}'s token from step {o[1]}; request {o[0]} is still running (it maps tokens until "
                       f"step {until}){tail}",
                       group=d.groups.index(g0) if inside else None, record=i if inside else None,
                       offset=g0.record_offset(i) if inside else None, fld="slot_map.slot")
            if o is not None:
                held[o[0]].discard(s)
            owner[s] = (req, st)
            held[req].add(s)
