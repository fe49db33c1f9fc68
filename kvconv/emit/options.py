"""The emitters' options and result: one frozen option set shared by every format, and what a write returns.

    >>> from kvconv.emit.options import EmitOptions, parse_range
    >>> EmitOptions(flows=4, replays=parse_range("1:3", what="--replays", cast=int)).replays
    (1, 3)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvconv.format.errors import UsageError


@dataclass(frozen=True)
class EmitOptions:
    """Options shared by the emitters (keyword-only, frozen).

    chunk: device events per streaming chunk (bounds memory).
    flows: flows drawn from each host launch to at most this many of its device blocks (0: no flows).
    window_ms: keep device events from START to END ms after each context's first device event (host records are
      kept when their launch's events are, or, unmatched, when the window mapped through the clock-sync pairs
      holds them).
    replays: keep only graph replays (launch ids) FIRST..LAST, their host records and matched device events.
    reconcile: "auto" (the vectorised exact (gridid, tag) join, which gives kvconv.check.reconcile's matches, when every
      device event carrying a gridid finds its host record; else kvconv.check.reconcile when the dump has at most
      reconcile_max_events device events; else the exact join alone), "always" (kvconv.check.reconcile), "never" (the
      exact join alone).
    ui_limit_bytes: warn when a Perfetto/Chrome trace is bigger than the Perfetto UI loads comfortably.
    progress: show a progress bar (None: only when stderr is a terminal).
    arrow_format: "arrow" (IPC files) or "parquet"; compression: None, "lz4" or "zstd".
    salvage: read dumps cut short up to their last whole record (the loss is reported as a warning).
    verdict: also check the dumps as kvconv validate does, in the same pass: ``EmitResult.verdicts``.
    """

    chunk: int = 1 << 18
    flows: int = 16
    window_ms: tuple[float, float] | None = None
    replays: tuple[int, int] | None = None
    reconcile: str = "auto"
    reconcile_max_events: int = 4_000_000
    ui_limit_bytes: int = 1 << 30
    progress: bool | None = None
    verify_checksums: bool = True
    arrow_format: str = "arrow"
    compression: str | None = None
    salvage: bool = False
    force: bool = False  # replace an existing output (kvconv.format.atomic.check_output says what is never replaced)
    # kvconv validate's report of each dump in EmitResult.verdicts, from the chunks the conversion reads (one pass;
    # kvconv.emit._checks); off for library callers, who did not ask for the checks' time
    verdict: bool = False

    def __post_init__(self) -> None:
        if self.chunk < 1:
            raise UsageError("chunk must be positive", code="bad-chunk")
        if self.flows < 0:
            raise UsageError("--flows must be 0 or more", code="bad-flows")
        if self.reconcile not in ("auto", "always", "never"):
            raise UsageError("reconcile must be auto, always or never", code="bad-reconcile")
        if self.window_ms is not None and not (self.window_ms[0] <= self.window_ms[1]):
            raise UsageError("--window START:END needs START <= END", code="bad-window")
        if self.replays is not None and not (self.replays[0] <= self.replays[1]):
            raise UsageError("--replays FIRST:LAST needs FIRST <= LAST", code="bad-replays")
        if self.arrow_format not in ("arrow", "parquet"):
            raise UsageError("--format must be arrow or parquet", code="bad-format")
        if self.compression not in (None, "lz4", "zstd"):
            raise UsageError("--compression must be none, lz4 or zstd", code="bad-compression")


@dataclass
class EmitResult:
    output: str
    contexts: int = 0
    device_events: int = 0
    host_records: int = 0
    written_events: int = 0
    bytes_written: int = 0
    flows: int = 0
    tables: int = 0  # arrow: the tables written (a folder each), instead of flows
    join: list[str] = field(default_factory=list)
    alignment: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    timings: dict = field(default_factory=dict)  # seconds per phase (arrow: join, record_tables, matches)
    # EmitOptions.verdict: per dump, in input order, kvconv validate's Report (kvconv.check.validate.Report)
    verdicts: list = field(default_factory=list)


def parse_range(text: str | None, *, what: str, cast=float):
    if text is None:
        return None
    try:
        a, b = text.split(":")
        return cast(a), cast(b)
    except ValueError:
        raise UsageError(f"{what} must look like START:END, not {text!r}", code="bad-range") from None
