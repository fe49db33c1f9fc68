"""What a dump holds, as one JSON-able dict: its groups, totals per kind, contexts, metadata, and the verdict of every
payload checksum (what ``kvconv info`` prints; docs/FORMAT.md: readers verify the checksums).

    >>> from kvconv.format import dump, info
    >>> with dump.open("fixtures/qwen3-14b/qwen3-14b.kvdump", options=dump.ReadOptions(verify_checksums=False)) as d:
    ...     summary = info.describe(d)
    >>> summary["totals"]["graph_node"]["records"]
    280
"""

from __future__ import annotations

from kvconv.format.errors import KvconvError, SchemaError
from kvconv.format.findings import Finding


def _groups(d) -> tuple[list[dict], dict[str, dict]]:
    """Each group's header facts, and the records, drops and losses per kind."""
    groups, totals = [], {}
    for g in d.groups:
        groups.append({
            "index": g.index, "offset": g.offset, "kind": g.kind_name, "major": g.major, "minor": g.minor,
            "record_size": g.record_size,
            "record_count": len(g.records) if g.kind and g.kind.layout else g.record_count,
            "capacity": g.capacity, "drop_count": g.drop_count, "lost_records": g.lost_records,
            "context_id": g.context_id, "device_id": g.device_id, "clock_domain": g.clock_domain_name,
            "payload_bytes": g.record_count * g.record_size,
        })
        t = totals.setdefault(g.kind_name, {"records": 0, "drops": 0, "lost_records": 0, "groups": 0})
        t["records"] += groups[-1]["record_count"]
        t["drops"] += g.drop_count
        t["lost_records"] += g.lost_records
        t["groups"] += 1
    return groups, totals


def describe(d, *, progress=None, mismatched: set[int] | None = None) -> dict:
    """What ``kvconv info`` reports of an open dump ``d``, payload checksums included (docs/FORMAT.md: readers verify
    them); a group a salvaged file cut short, and a live group of an unfinished dump (its producer died before it
    summed the payload), have no checksum to compare (``payload_crc: "not-checked"``, and
    ``payload_crc_not_checked``: ``"cut-short"`` or ``"unfinished"``): only the groups summed are claimed.
    ``progress(done, total)``: bytes summed (kvconv.progress's contract), called from the checksum thread.
    ``mismatched``: the groups whose checksum does not match, as checks that summed every one found them (kvconv
    info's verdict: the file read once); None: summed here."""
    from kvconv._workers import worker
    from kvconv.format.reader import release_pages

    # only a group with a checksum is summed: a live group's producer never wrote one (it died before finishing the
    # dump; payload_crc32 is 0), a cut-short group lacks the bytes it covered. Neither is claimed as verified.
    checked = [g for g in d.groups if g.checksummed]
    total, done = sum(g.record_count * g.record_size for g in checked), [0]

    def summed(offset: int, nbytes: int) -> None:
        # the pages summed go back: a 10 GiB dump stayed resident (10.0 GiB peak RSS); the bytes are the progress
        release_pages(getattr(d, "_mm", None), offset, nbytes)
        done[0] += nbytes
        if progress is not None:
            progress(done[0], total)

    # The checksums run in the CRC worker (zlib releases the GIL) while this thread gathers the rest.
    crc_jobs = {g.index: worker("crc").submit(g.crc_ok, release=summed) for g in checked} if mismatched is None \
        else {g.index: _Known(g.index not in mismatched) for g in checked}
    groups, totals = _groups(d)
    findings = []
    for g, row in zip(d.groups, groups):
        job = crc_jobs.get(g.index)
        row["payload_crc"] = "not-checked" if job is None else ("ok" if job.result() else "mismatch")
        if job is None:  # why it has no checksum to compare: a live group of an unfinished dump, or cut short
            row["payload_crc_not_checked"] = "unfinished" if g.live else "cut-short"
        if row["payload_crc"] == "mismatch":
            findings.append(Finding("error", "payload-checksum", "payload checksum does not match "
                                    "header.payload_crc32 (the records are damaged)", path=d.path, group=g.index,
                                    offset=g.payload_offset, field="header.payload_crc32"))
    try:
        meta = d.metadata()
        meta_error = None
    except SchemaError as e:
        meta, meta_error = None, str(e)
    out = {
        "size": d.size,
        "groups": groups,
        "totals": totals,
        "contexts": [{"context_id": c, "device_id": v} for c, v in d.contexts()],
        "metadata": meta,
        "findings": [f.to_dict() for f in findings],
    }
    if meta_error:
        out["metadata_error"] = meta_error
    return out



class _Known:
    """A checksum's verdict known already (the checks summed it), answered as a job of the CRC worker is."""

    def __init__(self, ok: bool) -> None:
        self.ok = ok

    def result(self) -> bool:
        return self.ok


def run_lines(meta: dict) -> list[str]:
    """The traced process and the capture range of a tracer dump's metadata, as ``kvconv info`` prints them (an
    engine's run is several processes: each dump names its own; the range says what was left out on purpose, which
    the checks count neither as missing nor as dropped).

    >>> run_lines({"pid": 7, "ppid": 1, "command": ["python3", "serve.py"],
    ...            "capture": {"range": "graph", "ranges": [{"start": "first graph replay",
    ...                        "target_launches_before": 2400}], "out_of_range": {"eager_launches": 2400,
    ...                        "graph_node_launches": 0, "graph_replays": 0, "blocks": 1228800}}})[1][:88]
    'capture range: graph (first graph replay after 2,400 target launches, open at the end); '
    """
    lines = []
    if meta.get("pid") is not None:
        cmd = " ".join(str(a) for a in meta.get("command") or [])
        parent = f", parent {meta['ppid']}" if meta.get("ppid") is not None else ""
        lines.append(f"process: pid {meta['pid']}{parent}" + (f": {cmd}" if cmd else ""))
    cap = meta.get("capture")
    if isinstance(cap, dict) and cap.get("range", "none") != "none":
        spans = []
        for r in cap.get("ranges") or []:
            end = f" to {r['stop']}" if r.get("stop") else ", open at the end"
            before = int(r.get("target_launches_before", 0))
            spans.append(f"{r.get('start', '?')} after {before:,} target launches{end}")
        out = cap.get("out_of_range")
        if out is None:  # a live dump's metadata, written at start: the process did not finish its dump
            lines.append(f"capture range: {cap['range']} (its ranges are written when the dump is finished; this "
                         "process did not finish it)")
            return lines
        lines.append(f"capture range: {cap['range']} (" + ("; ".join(spans) or "never opened") + "); out of range: "
                     f"{int(out.get('eager_launches', 0)):,} eager launches, "
                     f"{int(out.get('graph_node_launches', 0)):,} graph-node launches "
                     f"({int(out.get('graph_replays', 0)):,} replays), {int(out.get('blocks', 0)):,} blocks")
    return lines


def process_of(dump) -> dict:
    """The traced process a dump came from, from its metadata: pid, ppid, command (a list), written_at ("live" while
    the process runs or after it was killed), hostname, output_owner_pid. Empty when the metadata cannot be read.
    ``dump``: an open dump (read as it is), or a path (opened for its metadata)."""
    from kvconv.format import dump as dumpmod

    try:
        if isinstance(dump, dumpmod.Dump):
            meta = dump.metadata() or {}
        else:
            with dumpmod.open(dump) as d:
                meta = d.metadata() or {}
    except (KvconvError, OSError, ValueError):
        return {}
    return process_in(meta)


def process_in(meta: dict) -> dict:
    """:func:`process_of` of a dump's metadata already read."""
    if not isinstance(meta, dict):
        return {}
    run = meta.get("run", meta)
    keys = ("pid", "ppid", "command", "written_at", "hostname", "output_owner_pid")
    return {k: run.get(k, meta.get(k)) for k in keys}
