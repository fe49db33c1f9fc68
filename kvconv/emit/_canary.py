"""The canary's checked (step, buffer) records of each context, as the traces show them.

    >>> steps = canary_steps(d).get(ctx)                  # doctest: +SKIP
    >>> for step, buffer, host_ns, (expected, changed, unexpected, missing) in steps.rows(): ...
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CanarySteps:
    """The checked (step, buffer) records of one context, as the traces show them: step, buffer name, host time and
    the page counts of :attr:`LISTS` (a few numbers per record, not the page lists :func:`kvconv.check.canary.check`'s
    step dicts carry)."""

    LISTS = ("expected", "changed", "unexpected", "missing")
    step: np.ndarray
    buffer: np.ndarray  # index into names
    names: list
    host_ns: np.ndarray
    counts: np.ndarray  # (records, 4)

    def __len__(self) -> int:
        return len(self.step)

    def rows(self):
        """``(step, buffer name, host ns, (expected, changed, unexpected, missing))`` per record, as Python ints."""
        for st, b, hn, n in zip(self.step.tolist(), self.buffer.tolist(), self.host_ns.tolist(), self.counts.tolist()):
            yield st, self.names[b], hn, n


def canary_steps(d) -> dict:
    """context id -> :class:`CanarySteps` of the dump ``d`` (one check of the dump for all its contexts; the step
    dicts are read a batch at a time and only their counts kept)."""
    if not d.groups_of("canary"):
        return {}
    from kvconv.check import canary

    cols: dict = {}
    names: dict = {}
    for s in canary.check(d).steps:
        ctx = s["context_id"]
        c = cols.setdefault(ctx, ([], [], [], []))
        buf = s.get("buffer", s.get("buffer_id"))
        c[0].append(s["step"])
        c[1].append(names.setdefault(buf, len(names)))
        c[2].append(s["host_ns"])
        c[3].append([len(s.get(k, ())) for k in CanarySteps.LISTS])
    nl = list(names)
    return {ctx: CanarySteps(step=np.array(a, np.uint64), buffer=np.array(b, np.int64), names=nl,
                             host_ns=np.array(h, np.uint64), counts=np.array(n, np.int64).reshape(-1, 4))
            for ctx, (a, b, h, n) in cols.items() if a}


def canaries(ctxs) -> list:
    """Each context's :class:`CanarySteps` (empty: none), each dump checked once."""
    by_dump: dict = {}
    for c in ctxs:
        if id(c.dump) not in by_dump:
            by_dump[id(c.dump)] = canary_steps(c.dump)
    return [by_dump[id(c.dump)].get(c.context_id, ()) for c in ctxs]
