"""What a finished dump should hold, against what the file holds: a file cut at a group boundary reads as a shorter,
well-formed dump, so only what the dump promised shows the loss.

The evidence, strongest first (:func:`promised`):

- ``holds`` in the metadata (every producer writes it into a finished dump: the tracer, ``dump.new``): every group
  after the metadata group that carries it, per record kind its groups and records. Exact.
- an older finished tracer dump's own metadata: each context of ``contexts[]`` holds its strings, kernel, clock_sync,
  device_event, graph_node and eager_launch groups (the tracer writes all six, empty ones too), with the records the
  entry counts.
- a tracer dump without ``contexts[]`` (one sealed from its live file): each context with any of its record tables
  holds all three, device_event, graph_node and eager_launch (the tracer reserves them together, empty ones too);
- a finished dump's counters: ``target_launches`` > 0 promises a launch group (graph_node or eager_launch) and a
  device_event group;
- groups written together: a canary group promises its canary_pages, a write_step group its slot_map, and in a
  tracer dump a cache group its slot_write group (each written right after the other).

A live dump (``written_at: live``, a live group) promises nothing: it is judged unfinished already.

    >>> from kvconv.format import dump, holds
    >>> with dump.open("fixtures/qwen3-14b/qwen3-14b.kvdump") as d:    # doctest: +SKIP
    ...     holds.lost(d)
    []

The reader (:func:`kvconv.format.reader.scan`) reports the loss as ``cut-short``: an error after which the dump cannot
be read as a whole, or with ``--salvage`` a warning (the verdict incomplete) counting what was lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvconv.format import layout
from kvconv.wording import counted

TRACER_KINDS = ("strings", "kernel", "clock_sync", "device_event", "graph_node", "eager_launch")
# contexts[] keys counting a tracer context's records, per kind
_CONTEXT_COUNTS = {"clock_sync": "clock_sync_pairs", "device_event": "device_events",
                   "graph_node": "graph_node_records", "eager_launch": "eager_launch_records"}
LAUNCH_KINDS = ("graph_node", "eager_launch")
KEPT_KINDS = ("device_event", "graph_node", "eager_launch", "canary", "slot_write", "value_digest")


@dataclass(frozen=True)
class Promise:
    """Groups of ``kinds`` (any of them: one promise) in context ``context_id`` (None: any context): at least
    ``groups`` of them, holding ``records`` (None: not counted) records. ``field``: the metadata field that says so."""

    kinds: tuple[str, ...]
    context_id: int | None
    groups: int
    records: int | None
    field: str
    exact: bool = False  # its records count too (holds); else only its groups (contexts[]: counted a moment apart)


@dataclass(frozen=True)
class Loss:
    """What a promise lacks in the file: ``groups`` whole groups and ``records`` records (None: not counted)."""

    promise: Promise
    groups: int
    records: int | None

    def text(self) -> str:
        kind = "/".join(self.promise.kinds)
        where = f" of context {self.promise.context_id}" if self.promise.context_id is not None else ""
        recs = f" ({counted(self.records, 'record')})" if self.records else ""
        if self.groups:
            return f"{counted(self.groups, kind + ' group')}{where}{recs}"
        return f"{counted(self.records or 0, kind + ' record')}{where}"


def metadata_of(d) -> dict:
    """The dump's metadata, {} when it has none or it is unreadable (validate reports that)."""
    try:
        meta = d.metadata()
    except Exception:  # noqa: BLE001 - unreadable metadata is the metadata check's finding
        return {}
    return meta if isinstance(meta, dict) else {}


def finished(d, meta: dict) -> bool:
    """Written whole by a producer that finished it: no live group and not ``written_at: live``."""
    return bool(d.groups_of("metadata")) and meta.get("written_at") != "live" and not any(g.live for g in d.groups)


def promised(d, meta: dict) -> list[Promise]:
    """What the dump promises to hold, from the strongest evidence its metadata gives (module docstring)."""
    if not finished(d, meta):
        return []
    holds = meta.get("holds")
    if isinstance(holds, dict) and isinstance(holds.get("kinds"), dict):
        return [Promise((k,), None, int(v.get("groups", 0)), _int(v.get("records")), "metadata.holds", True)
                for k, v in holds["kinds"].items() if isinstance(v, dict) and k in layout.KINDS]
    out: list[Promise] = []
    if meta.get("tool") == "kvconv-tracer" and isinstance(meta.get("contexts"), list):
        for c in meta["contexts"]:
            if isinstance(c, dict) and isinstance(c.get("context_id"), int):
                out += [Promise((k,), c["context_id"], 1, _int(c.get(_CONTEXT_COUNTS.get(k, ""))),
                                "metadata.contexts") for k in TRACER_KINDS]
    elif meta.get("tool") == "kvconv-tracer":  # no contexts[] (a dump sealed from the live file): each context seen
        # holds its three record tables, empty ones too (the tracer reserves them together, seal keeps them)
        seen = dict.fromkeys(g.context_id for k in RECORD_TABLES for g in d.groups_of(k))
        out += [Promise((k,), c, 1, None, "tool kvconv-tracer") for c in seen for k in RECORD_TABLES]
    counters = meta.get("counters") if isinstance(meta.get("counters"), dict) else {}
    if _int(counters.get("target_launches")) and not out:  # weaker than contexts[]: said only without them
        field = "metadata.counters.target_launches"
        out += [Promise(LAUNCH_KINDS, None, 1, None, field), Promise(("device_event",), None, 1, None, field)]
    return out + _pairs(d, meta.get("tool"))


RECORD_TABLES = ("device_event", "graph_node", "eager_launch")  # a tracer context's record tables

# Groups their producers write together, the first before the second: a file holding the first and not the second
# was cut between them. (tool: the producer it holds for; None: every producer)
PAIRS = (("canary", "canary_pages", None), ("write_step", "slot_map", None), ("cache", "slot_write", "kvconv-tracer"))


def _pairs(d, tool) -> list[Promise]:
    out = []
    for first, second, by in PAIRS:
        if by is None or by == tool:
            ctxs = dict.fromkeys(g.context_id for g in d.groups_of(first))
            out += [Promise((second,), c, 1, None, f"{first} group") for c in ctxs]
    return out


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def lost(d, meta: dict | None = None) -> list[Loss]:
    """Each promise the file does not keep: the groups missing, and the records they held (with a salvaged group's
    records lost to the cut)."""
    meta = metadata_of(d) if meta is None else meta
    carrier = d.groups_of("metadata")[0].index if d.groups_of("metadata") else None
    out = []
    for p in promised(d, meta):
        gs = [g for g in d.groups if g.kind is not None and g.kind.name in p.kinds and g.index != carrier
              and (p.context_id is None or g.context_id == p.context_id)]
        missing = max(p.groups - len(gs), 0)
        cut = sum(g.lost_records for g in gs)
        have = sum(len(g.records) + g.lost_records for g in gs)
        records = max(p.records - have, 0) + cut if p.records is not None else (cut or None)
        if missing or (p.exact and records and p.records is not None and p.records > have):
            out.append(Loss(p, missing, records))
    return out


def padding_cut(d) -> int:
    """Bytes of the last group's zero padding that the file lacks (0 when it ends where its last group does)."""
    if not d.groups:
        return 0
    g = d.groups[-1]
    if g.live or g.lost_records:
        return 0
    end = g.payload_offset + layout.padded(len(g.records) * int(g.header["record_size"]))
    return max(end - d.size, 0)


def message(losses: list[Loss], pad: int) -> str:
    """The finding's text: what the file lacks, counted, and the metadata fields that promised it."""
    if not losses:
        return f"cut short: the file ends {pad} bytes into its last group's 8-byte padding"
    fields = sorted({x.promise.field for x in losses})
    parts = [x.text() for x in losses]
    what = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    return f"cut short: the file lacks {what} that {' and '.join(fields)} promise{'s' if len(fields) == 1 else ''}"


def kept_nothing(d) -> bool:
    """A salvaged prefix that kept no record to check: no launch, device-event, canary, slot-write or value record."""
    return not any(len(g.records) for k in KEPT_KINDS for g in d.groups_of(k))


def problem(d, *, salvage: bool):
    """The ``cut-short`` finding of a dump whose structure read cleanly so far (None when it holds what it promises):
    an error naming the end of the file and the metadata field that promised more, or with ``salvage`` a warning
    (the verdict incomplete) counting what was lost."""
    from kvconv.format.findings import Finding

    if any(p.severity == "error" for p in d.problems):
        return None  # unreadable already: the first problem says where
    meta = metadata_of(d)
    losses, pad = lost(d, meta), padding_cut(d)
    if not losses and not pad:
        return None
    fld = losses[0].promise.field if losses else "header.record_count"
    hint = ("its producer finished it: it was cut afterwards, by a partial copy or download or a full disk; "
            + ("results cover what is left" if salvage else "read what is left with --salvage"))
    return Finding("warning" if salvage else "error", "cut-short", f"{message(losses, pad)} ({hint})", path=d.path,
                   offset=d.size, field=fld)


def salvaged(d) -> bool:
    """Read with ``--salvage`` from a file cut short: some of what it held is lost."""
    return any(p.severity == "warning" and p.code in CUT_CODES for p in d.problems)


CUT_CODES = ("cut-short", "salvaged", "truncated-header")


def cut_launches(d, ctx: int) -> str | None:
    """What a salvaged cut took of context ``ctx``'s launches, said for the reconciler (None: nothing): host launch
    records (a launch group missing or cut short) or its whole device-event group. Its mismatches then follow from
    the cut, not from the GPU. A device-event group cut short is not here: its tail is placed (``lost-at-cut``)."""
    if not salvaged(d) or not d.groups:
        return None
    # a cut takes the end of the file: a loss counted for the whole dump (holds) is the last context's, since each
    # producer writes a context's groups together
    last = d.groups[-1].context_id
    mine = (ctx, None) if ctx == last else (ctx,)
    what = [x.text() for x in lost(d) if x.groups and set(x.promise.kinds) & {"device_event", *LAUNCH_KINDS}
            and x.promise.context_id in mine]
    what += [f"{counted(g.lost_records, g.kind_name + ' record')} of context {ctx}" for k in LAUNCH_KINDS
             for g in d.groups_of(k, context_id=ctx) if g.lost_records]
    return ", ".join(what) or None
