"""The emitters' options and result: one frozen option set shared by every format, and what a write returns.

    >>> from kvconv.emit.options import EmitOptions, parse_range
    >>> EmitOptions(flows=4, replays=parse_range("1:3", what="--replays", cast=int)).replays
    (1, 3)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvconv.format.errors import UsageError
from kvconv.join import JOINS  # the one vocabulary of --join


@dataclass(frozen=True)
class EmitOptions:
    """Options shared by the emitters (keyword-only, frozen).

    chunk: device events per streaming chunk (bounds memory).
    flows: flows drawn from each host launch to at most this many of its device blocks (0: no flows).
    window_ms: keep device events from START to END ms after each context's first device event (host records are
      kept when their launch's events are, or, unmatched, when the window mapped through the clock-sync pairs
      holds them).
    replays: keep only graph replays (launch ids) FIRST..LAST, their host records and matched device events.
    join: device event -> host launch, in the words of ``kvconv reconcile --join`` (one vocabulary from the CLI to
      the code): "auto" (the vectorised exact (gridid, tag) join, which gives kvconv.check.reconcile's matches, when
      every device event carrying a gridid finds its host record; else kvconv.check.reconcile's auto join when the
      dump has at most reconcile_max_events device events; else the exact join alone), "exact" (the exact join
      alone), "ordered" (kvconv.check.reconcile's ordered join, by sequence order, whatever the size).
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
    join: str = "auto"
    reconcile_max_events: int = 4_000_000
    ui_limit_bytes: int = 1 << 30
    progress: bool | None = None
    verify_checksums: bool = True
    arrow_format: str = "arrow"
    compression: str | None = None
    salvage: bool = False
    force: bool = False  # replace an existing output (kvconv.format.atomic.check_output says what is never replaced)
    # kvconv validate's report of each dump in EmitResult.verdicts, from the chunks the conversion reads (one pass;
    # kvconv.check.validate.Validation, the one driver); off for library callers, who did not ask for the checks' time
    verdict: bool = False

    def __post_init__(self) -> None:
        if self.chunk < 1:
            raise UsageError("chunk must be positive", code="bad-chunk")
        if self.flows < 0:
            raise UsageError("--flows must be 0 or more", code="bad-flows")
        if self.join not in JOINS:
            raise UsageError(f"--join must be one of {', '.join(JOINS)}, not {self.join!r}", code="bad-join")
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
