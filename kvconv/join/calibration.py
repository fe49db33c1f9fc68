"""The tracer's start-up calibration of its own bias on durations (native/src/calibrate.cpp): a
duration from block events spans the first block-enter event to the last block-exit event, and the patch calls
around the kernel's body lie inside it; the tracer measures how much that adds on a kernel of its own at start-up
and records it in the metadata (``contexts[].calibration``). Durations are then given raw and corrected (raw minus
the bias, never below 0).

    >>> cal = Calibration(bias_ns=1540, traced_span_ns=2850, reference_ns=1310, launches=200,
    ...                   kernel="kvconv_calib_append")
    >>> cal.corrected(np.array([3840, 1000])).tolist()
    [2300, 0]
    >>> of_metadata({"contexts": [{"context_id": 0, "calibration": {"done": False, "why": "KVCONV_CALIBRATE=0"}}]}, 0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Calibration:
    bias_ns: int  # added to a launch's span by the instrumentation (traced span - untraced reference)
    traced_span_ns: int  # the calibration kernel's span as kvconv measures it, patched (median)
    reference_ns: int  # CUPTI's duration of the same kernel untraced (median; a program run without the tracer)
    launches: int
    kernel: str

    def corrected(self, ns: np.ndarray) -> np.ndarray:
        """Durations (ns) less the bias, never below 0."""
        return np.maximum(np.asarray(ns, np.int64) - self.bias_ns, 0)

    def as_dict(self) -> dict:
        return {"bias_ns": self.bias_ns, "traced_span_ns": self.traced_span_ns, "reference_ns": self.reference_ns,
                "launches": self.launches, "kernel": self.kernel}


def of_metadata(meta: dict, ctx: int) -> Calibration | None:
    """Context ``ctx``'s calibration in a dump's metadata, or None (none recorded, not done, or malformed)."""
    for c in meta.get("contexts") or []:
        if not isinstance(c, dict) or c.get("context_id") != ctx:
            continue
        cal = c.get("calibration")
        if not isinstance(cal, dict) or cal.get("done") is not True:
            return None
        try:
            return Calibration(bias_ns=int(cal["bias_ns"]), traced_span_ns=int(cal["traced_span_ns"]),
                               reference_ns=int(cal["cupti_unpatched_ns"]), launches=int(cal["launches"]),
                               kernel=str(cal.get("kernel", "?")))
        except (KeyError, TypeError, ValueError):
            return None
    return None


def of_dump(d, ctx: int) -> Calibration | None:
    """Context ``ctx``'s calibration in an open dump's metadata (None when unreadable: validate says why)."""
    from kvconv.format.errors import SchemaError

    try:
        meta = d.metadata()
    except SchemaError:  # a bad metadata group is validate's finding, not a reason to fail a duration
        return None
    return of_metadata(meta if isinstance(meta, dict) else {}, ctx)
