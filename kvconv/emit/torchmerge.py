"""kvconv's Chrome tracks inside a torch.profiler trace of the same run (``kvconv chrome DUMP --merge TORCH.json``).

    >>> from kvconv.emit import torchmerge
    >>> with torch.profiler.profile() as prof:            # doctest: +SKIP
    ...     torchmerge.clock_anchor()                      # at the start of the profiled run (and at its end)
    ...     run_model()
    ...     torchmerge.clock_anchor()
    >>> prof.export_chrome_trace("torch.json")            # doctest: +SKIP
    $ kvconv chrome run.kvdump --merge torch.json -o merged.json

How the clocks relate. torch.profiler (Kineto) writes CPU events at ``ts = (CLOCK_REALTIME ns -
baseTimeNanoseconds) / 1000`` (µs; ``baseTimeNanoseconds`` is in the trace). kvconv's Chrome output is on the host's
CLOCK_MONOTONIC (its device events placed there through the dump's clock-sync pairs). REALTIME - MONOTONIC is one
constant per boot, moved only by clock adjustments (NTP), and nothing in either file states it: the profiled program
states it with :func:`clock_anchor`, two ``record_function`` ranges whose names carry CLOCK_MONOTONIC read just
before each. A range starts after its reading and the second reading comes after the first range ends, so
REALTIME - MONOTONIC lies in ``[end_1 - mono_2, start_1 - mono_1]``: the offset is that window's middle and the
alignment error its half width (a few µs), plus, with several anchors, their disagreement (clock drift). The
device tracks add kvconv's own clock-sync bound (``otherData.alignment``). The Kineto GPU rows cannot be there:
Kineto's CUPTI cannot subscribe while the tracer's Compute Sanitizer holds the callbacks
(``CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED``), so the kernels come from kvconv alone.

The merged file is the torch trace with kvconv's events appended, their ``ts`` shifted onto its clock and their
pids moved to ``PID_BASE + pid`` (clear of real pids and Kineto's GPU pids), and ``kvconv_merge`` added at the top
level (offset, error, anchors).
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kvconv.format.errors import UsageError

ANCHOR = "kvconv-clock-anchor"
_ANCHOR_RE = re.compile(re.escape(ANCHOR) + r" monotonic_ns=(\d+)$")
PID_BASE = 1 << 30


def clock_anchor() -> None:
    """Two empty ``record_function`` ranges naming CLOCK_MONOTONIC read just before each: call it inside a
    torch.profiler run, once at its start and once at its end."""
    import torch

    for _ in range(2):
        m = time.monotonic_ns()
        with torch.profiler.record_function(f"{ANCHOR} monotonic_ns={m}"):
            pass


@dataclass(frozen=True)
class Alignment:
    offset_ns: int  # CLOCK_REALTIME - CLOCK_MONOTONIC of the profiled run
    error_ns: int  # half width of the window the anchors leave, plus their disagreement
    anchors: int  # anchor pairs used
    spread_ns: int  # largest difference between the pairs' estimates (clock drift over the run)

    def to_dict(self) -> dict:
        return {"offset_ns": self.offset_ns, "error_ns": self.error_ns, "anchors": self.anchors,
                "spread_ns": self.spread_ns}


def _bad(path, msg: str) -> UsageError:
    return UsageError(f"{path}: {msg}", code="bad-torch-trace")


def load(path: str | Path) -> dict:
    """A torch.profiler Chrome trace (``export_chrome_trace``): JSON with ``traceEvents`` and
    ``baseTimeNanoseconds``."""
    try:
        with open(path, encoding="utf-8") as f:
            tr = json.load(f)
    except OSError as e:
        raise _bad(path, f"cannot read ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, f"not JSON ({e})") from None
    if not isinstance(tr, dict) or not isinstance(tr.get("traceEvents"), list):
        raise _bad(path, "not a torch.profiler trace: no traceEvents list")
    if not isinstance(tr.get("baseTimeNanoseconds"), int):
        raise _bad(path, "no baseTimeNanoseconds: not written by torch.profiler >= 2.0 (export_chrome_trace)")
    return tr


def alignment(tr: dict, *, path: str = "TORCH_TRACE") -> Alignment:
    """REALTIME - MONOTONIC from the trace's :func:`clock_anchor` ranges."""
    base = tr["baseTimeNanoseconds"]
    marks = []  # (monotonic read, start ns, end ns) in CLOCK_REALTIME
    for e in tr["traceEvents"]:
        m = _ANCHOR_RE.match(str(e.get("name", ""))) if e.get("ph") == "X" else None
        if m:
            start = base + round(float(e["ts"]) * 1000)
            marks.append((int(m.group(1)), start, start + round(float(e.get("dur", 0)) * 1000)))
    marks.sort()
    windows = []
    for (m1, s1, e1), (m2, s2, _) in zip(marks, marks[1:]):
        lo, hi = e1 - m2, min(s1 - m1, s2 - m2)
        if m2 - m1 < 1_000_000_000 and lo <= hi:  # the two ranges of one call
            windows.append((lo, hi))
    if not windows:
        raise _bad(path, f"no clock anchor: call kvconv.emit.torchmerge.clock_anchor() inside the profiled run "
                   f"(two '{ANCHOR} monotonic_ns=...' ranges) so the profiler's CLOCK_REALTIME can be related to "
                   "the dump's CLOCK_MONOTONIC")
    mids = [(lo + hi) // 2 for lo, hi in windows]
    off = round(sum(mids) / len(mids))
    err = max((hi - lo + 1) // 2 + abs(mid - off) for (lo, hi), mid in zip(windows, mids))
    return Alignment(offset_ns=off, error_ns=err, anchors=len(windows), spread_ns=max(mids) - min(mids))


def merge(kv: dict, tr: dict, al: Alignment) -> dict:
    """The torch trace ``tr`` with kvconv's Chrome events ``kv`` moved onto its clock (a new dict; inputs kept)."""
    shift_us = (al.offset_ns - tr["baseTimeNanoseconds"]) / 1000
    events = list(tr["traceEvents"])
    for e in kv["traceEvents"]:
        e = dict(e)
        if "ts" in e:
            e["ts"] = round(e["ts"] + shift_us, 3)
        if "pid" in e:
            e["pid"] = PID_BASE + int(e["pid"])
        events.append(e)
    out = {k: v for k, v in tr.items() if k != "traceEvents"}
    out["traceEvents"] = events
    out["kvconv_merge"] = {**al.to_dict(), "clock": "kvconv CLOCK_MONOTONIC + offset_ns = torch CLOCK_REALTIME",
                           "pid_base": PID_BASE, "kvconv": kv.get("otherData", {})}
    return out


def _span_us(events) -> tuple[float, float] | None:
    """The [first start, last end] of the timed events (µs), None when there are none."""
    lo = hi = None
    for e in events:
        ts = e.get("ts")
        if not isinstance(ts, (int, float)) or isinstance(ts, bool):
            continue
        end = ts + (e["dur"] if isinstance(e.get("dur"), (int, float)) and e.get("ph") == "X" else 0)
        lo = ts if lo is None or ts < lo else lo
        hi = end if hi is None or end > hi else hi
    return None if lo is None else (lo, hi)


def check_overlap(merged: dict, n_torch: int, al: Alignment, *, path) -> None:
    """Refuse a merge whose two timelines do not overlap within the alignment error: the torch trace is of another
    run (a silent merge put kvconv's events minutes away from the profiler's)."""
    torch_span, kv_span = _span_us(merged["traceEvents"][:n_torch]), _span_us(merged["traceEvents"][n_torch:])
    if torch_span is None or kv_span is None:
        return
    slack = al.error_ns / 1000
    gap = max(kv_span[0] - torch_span[1], torch_span[0] - kv_span[1])
    if gap > slack:
        where = "after" if kv_span[0] > torch_span[1] else "before"
        raise _bad(path, f"does not overlap the dump: kvconv's events lie {gap / 1e6:,.3f} s {where} the profiler's "
                   f"(alignment error ±{slack:.2f} µs); merge the torch trace of the same run")


def write_merged(write, dumps, out: str, torch_trace: str | Path, *, options):
    """``kvconv chrome DUMP... --merge TORCH -o OUT``: kvconv's Chrome trace (``write``: the chrome format's
    writer) into a temporary file beside OUT, merged with the torch trace, written to OUT atomically."""
    import dataclasses
    import tempfile

    from kvconv.format.atomic import atomic_output

    tr = load(torch_trace)
    al = alignment(tr, path=str(torch_trace))
    if out == "-":
        raise UsageError("--merge writes a file: give -o PATH", code="bad-output")
    with tempfile.TemporaryDirectory(dir=Path(out).resolve().parent, prefix=".kvconv-merge-") as tmp:
        part = Path(tmp) / "kvconv.json"
        res = write(dumps, str(part), options=dataclasses.replace(options, force=True))
        with open(part, encoding="utf-8") as f:
            kv = json.load(f)
        merged = merge(kv, tr, al)
        check_overlap(merged, len(tr["traceEvents"]), al, path=torch_trace)
        with atomic_output(out, inputs=[*dumps, torch_trace], force=options.force) as dst:
            with open(dst, "w", encoding="utf-8") as f:
                json.dump(merged, f, separators=(",", ":"))
    return dataclasses.replace(res, output=out, bytes_written=Path(out).stat().st_size), al


def report_merge(al: Alignment, torch_trace, *, quiet: bool) -> None:
    """The merge's line on stderr: the clock offset and its error."""
    if not quiet:
        sys.stderr.write(f"merged into {torch_trace}: CLOCK_REALTIME - CLOCK_MONOTONIC {al.offset_ns:,} ns from "
                         f"{al.anchors} clock anchors, alignment error ±{al.error_ns / 1000:.2f} µs (anchors disagree "
                         f"by {al.spread_ns / 1000:.2f} µs); device tracks add kvconv's clock-sync bound\n")
        sys.stderr.flush()
