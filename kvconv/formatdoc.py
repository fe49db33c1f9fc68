"""The generated docs (tests regenerate each and compare the committed file):

    python -m kvconv.formatdoc > docs/FORMAT.md              # schemas/layouts.json + the rules below
    python -m kvconv.formatdoc findings > docs/FINDINGS.md   # schemas/codes.json
    python -m kvconv.formatdoc outputs > docs/OUTPUTS.md     # the Arrow schemas + the trace tracks below
"""

from __future__ import annotations

from kvconv.format import layout

INTRO = """# kvconv dump format, version {major}.{minor}

Generated from `schemas/layouts.json` by `python -m kvconv.formatdoc`; do not edit by hand.

A dump file is a sequence of **record groups**. Each group is a 64-byte header followed by `record_count *
record_size` payload bytes, zero-padded to a multiple of {align} bytes; the next group's header follows. All integers
are little-endian. There is no file-level header: the first group's header starts at byte 0, and a file may hold
any number of groups of any kinds, for any number of CUDA contexts (`context_id`, `device_id`). Several files
(several processes or GPUs) are accepted together by every command.

Readers must:
- refuse a group whose `magic` is not `KVCDUMP\\0`, whose `major` is not one of {majors}, whose `header_size` is not
  64, or whose `header_crc32` (zlib CRC-32 of header bytes 0..59) does not match: the position of what follows is
  then unknown;
- never trust `record_count` beyond the file: `record_count * record_size` must fit in the bytes that remain; a
  file cut short is readable up to its last whole record only on request (`--salvage`), with the loss reported;
- check `record_size` against the kind's size, and `payload_crc32` (zlib CRC-32 of the unpadded payload);
- read a group with a newer `minor` or an unknown `record_kind` with a warning (unknown kinds are skipped);
- compare a finished dump with what its metadata says it holds (below) and refuse one that lacks a promised group
  or record (`cut-short`: a file cut at a group boundary reads as a shorter, well-formed dump, so only the promise
  shows the loss), or, on request (`--salvage`), read what is there with the loss counted and the verdict
  incomplete, never ok.

Producers write each file atomically (temporary name, then rename), record their buffer `capacity` and every
record they could not store in `drop_count`, and put run metadata (JSON, `schemas/metadata.schema.json`) in a
`metadata` group. Counters in metadata are integers: an empty string is an error, not a zero.

**A finished dump says what it holds.** Its first group is the `metadata` group, and its `holds` object counts
every group after it: `{{"groups": G, "kinds": {{"<kind>": {{"groups": g, "records": r}}, ...}}}}` (per record kind, its
groups and their `record_count`s: a few dozen bytes, whatever the number of contexts). The tracer's finished dump
and `kvconv.format.dump.new` write it. A finished dump is one with no `live` group and no `written_at: live`; a
live dump (its producer died) promises nothing and is judged unfinished instead. For a finished dump written before
`holds`, readers take the promise from what its metadata already said: a tracer dump's `contexts[]` (each context
holds its `strings`, `kernel`, `clock_sync`, `device_event`, `graph_node` and `eager_launch` groups, with the records
the entry counts) and `counters.target_launches` > 0 (a launch group and a `device_event` group). A finished dump
lacking a promised group or record, or ending inside its last group's padding, was cut short after it was written:
`cut-short`, an error naming the end of the file and the metadata field that promised more (exit 2); with
`--salvage`, a warning counting what was lost (verdict incomplete, exit 5), and a prefix that kept no launch,
device-event, canary, slot-write or value record is nothing checked (exit 4).

Device events: the tracer writes one `block_enter` event per CUDA block, from one elected thread as the block starts,
and, when recorded with `kvconv record --events enter,exit` (`KVCONV_EVENTS`), one `block_exit` event per block as
it ends, in the same buffer (both kinds take sequence numbers). `mem_write` is reserved: no producer writes it yet.
Reconciliation, the joins and the replay timing below use `block_enter` events only; a reader must skip the other
kinds there, not count them as blocks.

## Time

`device_event.globaltimer` is raw GPU `%globaltimer` ns; host records carry `CLOCK_MONOTONIC` ns. The two are
related only through `clock_sync` pairs (each a host bracket around one device read: `host_ns` is the bracket's
midpoint, `uncertainty_ns` its half-width), never by subtracting one from the other. The header's `clock_domain`
names the domain of a group's timestamps.

Mapping (what kvconv's outputs do, and what Perfetto's trace processor does with the clock snapshots it is given):
**piecewise constant, no interpolation**. Sort a context's pairs by `gpu_ns`; a device time `t` maps to
`host_ns[i] + (t - gpu_ns[i])` where pair `i` is the last one with `gpu_ns[i] <= t`, or the first pair for a time
before it. The reverse (host to device) is the same with the roles swapped (pairs sorted by `host_ns`). No drift is
corrected between pairs: the error bound kvconv reports is the largest `uncertainty_ns` plus the largest drift
between neighbouring pairs, `max |(host_ns[i+1] - host_ns[i]) - (gpu_ns[i+1] - gpu_ns[i])|`. A context without
pairs keeps raw `%globaltimer` times (and is reported as not aligned). Pairs must not go backwards in either clock.

## Joining host and device

Host records: both `eager_launch` and `graph_node` records of a context; `graph_node` records flagged
`graph_upload` are not launches and are ignored. Each launch is expected to produce `grid_x * grid_y * grid_z`
`block_enter` events.

A **duplicated host record** repeats an earlier one: a `graph_node` record with the same (`graph_exec`, `launch_id`,
`node`) as an earlier record, or an `eager_launch` record with the same nonzero `grid_id` (grid ids are unique per
eager launch). The earliest record (lowest record index) is the launch; each repeat is reported
(`duplicate-host-record`, an error), expects no blocks, matches no device event, and takes no part in either join.

**Exact join.** A device event with `flags.has_gridid` carries `%gridid`, equal to the host record's `grid_id` (a
graph node keeps its grid id in every replay); with `flags.has_tag` it carries the per-replay tag the host record
also holds (`launch_flags.has_tag`), so (gridid, tag) names (node, replay) without any assumption about order. An
event whose (gridid, tag) names no host record is unmatched (`unmatched-device-event`, `host-record-missing`,
`extra-replay`).

**Sequence-order join**, for events without `has_gridid` (one stream assumed):
- Events: the `block_enter` events in `sequence` order. An event's position is its `sequence` minus the number of
  events of other kinds with a lower `sequence`, so a sequence gap is a lost event at a known place; `T` = last
  position + 1.
- Launches: the host records (duplicates excluded) ordered by `host_ns`; records with equal `host_ns` keep the
  order eager_launch records first, then graph_node records, each by record index. Launch `k` owns the block slots
  `[C[k-1], C[k])` where `C` is the running sum of expected blocks; `E` = the total.
- Segmentation: the event at position `p` belongs to the launch owning slot `p + s`, for an offset `s`. Device
  drops `N` = the larger of the groups' `drop_count` and the metadata counter, plus records lost to truncation
  (`--salvage`). With `D = E - T` and `N = 0`, `s = D`: the missing blocks are the first `D` slots, so the first
  launches in host order get no events (the last of them possibly only its first blocks). Coverage starts late
  (kernels are patched at module load, so launches before it are not seen) and never stops early; these launches
  are reported as `coverage-late` (a warning; an error with `kvconv reconcile --strict-coverage`), any other deficit as
  `missing-blocks`. With `N > 0`, `s` can be anything in `[max(0, D - N), D]`: an event is assigned to a
  launch only when every such `s` gives the same launch; the others are reported as one ambiguous run of launches
  with its deficit (`ordered-ambiguous`). With more events than blocks (`D < 0`) and no drops, the surplus events
  are found as the first that do not fit the launch the forward placement gives them (another kernel slot, a
  blockIdx outside the grid, a blockIdx seen twice) and reported as `extra-blocks`.
- Neighbouring launches on different streams (or the nodes of one graph replay that spans streams) form a window:
  its events are attributed to the window (its replay, when all its launches share one) but to no launch or node.

## Replay timing

Per graph executable, from device `%globaltimer` of `block_enter` events only (block_exit events never enter it),
replays in `launch_id` order:
- a node's start in a replay is the earliest `block_enter` of its blocks in that replay;
- a replay's **span** is its last node start minus its first node start (first to last node's first block entry);
  when no event of the replay is attributed to a node, its last block entry minus its first;
- the **gap** after a replay is the next replay's first block entry minus this replay's last block entry (any block
  of any node).
Host times (`CLOCK_MONOTONIC`) are reported in their own domain and never subtracted from device times.
"""


def render() -> str:
    out = [INTRO.format(major=layout.MAJOR, minor=layout.MINOR, align=layout.ALIGN,
                        majors=", ".join(map(str, layout.SUPPORTED_MAJORS)))]
    out.append("## Versions\n")
    out.append("Each group header carries the lowest minor whose features the group uses; readers of an older minor "
               "read it with a warning.\n")
    out += [f"- {layout.MAJOR}.{m}: {what}" for m, what in layout._SPEC["minor_history"].items()] + [""]
    out.append("## Record kinds\n")
    out.append("| id | kind | record size | layout | what |")
    out.append("| --- | --- | --- | --- | --- |")
    for k in layout.KINDS.values():
        out.append(f"| {k.id} | `{k.name}` | {k.record_size} | {('`' + k.layout + '`') if k.layout else 'bytes'} "
                   f"| {k.doc} |")
    out.append("")
    out += _kind_facts()
    for lay in layout.LAYOUTS.values():
        out.append(f"## Layout `{lay.name}` ({lay.size} bytes)\n")
        if lay.doc:
            out.append(lay.doc[0].upper() + lay.doc[1:] + ".\n")
        out.append("| offset | size | field | type | meaning |")
        out.append("| --- | --- | --- | --- | --- |")
        for f in lay.fields:
            t = f"bytes[{f.count}]" if f.type == "bytes" else f.type
            extra = f" (enum `{f.enum}`)" if f.enum else (f" (bits `{f.bits}`)" if f.bits else "")
            out.append(f"| {f.offset} | {f.size} | `{f.name}` | {t} | {f.doc}{extra} |")
        out.append("")
    out.append("## Enums and flag bits\n")
    for name, values in layout.ENUMS.items():
        out.append(f"- `{name}`: " + ", ".join(f"`{k}` = {v}" for k, v in values.items()))
    out.append("")
    return "\n".join(out)


def _kind_facts() -> list[str]:
    """The facts of every record kind (schemas/layouts.json ``record_kind_facts``): how it is written, validated,
    drawn and exported."""
    facts = layout._SPEC["record_kind_facts"]
    out = ["### What each kind is to kvconv\n", "Every record kind states these facts in `schemas/layouts.json`; "
           "kvconv derives from them (docs/DEVELOPING.md, \"Adding a record kind\"):\n"]
    out += [f"- `{name}`: {what}" for name, what in facts.items()] + [""]
    out.append("| kind | clock | per context | validated by | Arrow table |")
    out.append("| --- | --- | --- | --- | --- |")
    for k in layout.KINDS.values():
        out.append(f"| `{k.name}` | {k.clock} | {'yes' if k.per_context else 'no'} | "
                   f"{('`' + k.validate + '`') if k.validate else 'structure only'} | "
                   f"{_cell(k.arrow) if k.arrow else 'not exported'} |")
    out.append("")
    return out


FINDINGS_INTRO = """# kvconv finding and error codes

Generated from `schemas/codes.json` by `python -m kvconv.formatdoc findings`; do not edit by hand.

Every problem kvconv reports carries a stable code. Findings (from `validate`, `reconcile`, `canary`, `info`,
`record`) print as one line, `SEVERITY CODE FILE: byte N: group G record R: FIELD: message`, and appear in `--json`
output as `{"severity", "code", "message", "path", "group", "record", "offset", "field", "count"}`. Errors that stop
a command print as one line on stderr, `Error: FILE: byte N: FIELD: message (what to do)`, and carry the same kind
of code in `--json` error output.

- **error**: the dump (or the run) is wrong where named; `kvconv validate` exits 1.
- **unreadable**: an error after which the file cannot be read as a whole (where the next group starts is unknown);
  `kvconv validate` exits 2. `--salvage` reads a dump cut short up to its last whole record.
- **warning**: worth knowing, not wrong; exit 0. **info**: for the record.

Severity lists the levels a code can have, the usual one first. `--relaxed` (validate, reconcile) reports every
reconciliation error as a warning.
"""


def render_findings() -> str:
    """docs/FINDINGS.md: every code of schemas/codes.json, by area: what it means, what to do."""
    from kvconv.format import codes

    out = [FINDINGS_INTRO]
    for area, title in codes.AREAS.items():
        rows = [c for c in codes.CODES.values() if c.area == area]
        if not rows:
            continue
        out.append(f"## {title}\n")
        out.append("| code | severity | what it means | what to do |")
        out.append("| --- | --- | --- | --- |")
        for c in sorted(rows, key=lambda c: c.code):
            sev = ", ".join(c.severity) + (" (unreadable, exit 2)" if c.unreadable else "")
            out.append(f"| `{c.code}` | {sev} | {_cell(c.means)} | {_cell(c.do)} |")
        out.append("")
    return "\n".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


OUTPUTS_INTRO = """# kvconv outputs: trace tracks and tables

Generated by `python -m kvconv.formatdoc outputs` (the tables from the Arrow schemas of a real conversion of
fixtures/h200-enter-exit and fixtures/canary-clean); do not edit by hand.

## Perfetto (`kvconv perfetto`) and Chrome JSON (`kvconv chrome`) tracks

One track group (Perfetto) or process (Chrome `pid`) per context of every dump, named
`GPU <device> · ctx <context> · <file>` (Perfetto adds the clock alignment's error bound). Inside it:

| Perfetto track | Chrome thread (`tid`) | clock | events |
| --- | --- | --- | --- |
| `graph exec 0x…` › `replays` | `graph exec 0x… · replays` | device | one slice per replay, first to last block entry (`args.replay`); extra lanes `replays (2)`... only where replays overlap |
| `graph exec 0x…` › `nodes` | `graph exec 0x… · nodes` | device | one slice per node execution in a replay, first to last block entry (`args.replay`, `args.blocks`); extra lanes `nodes (2)`... only where executions overlap |
| `graph exec 0x…` › `host node launches` | `graph exec 0x… · host node launches` | host | one zero-length slice per graph_node record (replay, node, grid_id, blocks_predicted, blocks_recorded) |
| `eager launches · stream 0x…` | `eager launches · stream 0x…` | host | one zero-length slice per eager_launch record (grid_id, blocks_predicted, blocks_recorded) |
| `device blocks` › `SM <n>` | `SM <n>` | device | per block event an instant (Chrome: `dur` 0, `cat` block), named after its kernel (Chrome: `args.block`, `args.seq`); where the dump records block exits (`--events enter,exit`) a block is one slice from its entry to its exit (Chrome: `X` with its `dur`), on extra lanes `SM <n> (<n>)` where blocks overlap on the SM; an exit with no entry stays an instant; with write recording (`kvconv record --writes`) the events of a block that wrote carry debug annotations (Chrome: args) `cache`, `page`, `offset`, `slot`, `request`, `slot_owner`, `write`, `step`, `writes` (the `slot_write` table's join, its lowest slot), and a block that wrote outside every cache or to an unmapped slot is named `<kernel> · write outside every cache` / `· write to an unmapped slot` |
| `graph exec 0x…` › `kernels`, `kernels · stream 0x…` (lanes `kernels (2)`...) | `graph exec 0x… · kernels`, lanes `graph exec 0x… · kernels (<n>)`, `kernels · stream 0x…`: Chrome `cat` kernel events | device | per launch or node execution its kernel, first block entry to last block exit (as Nsight Systems' CUDA HW row; Perfetto: only where exits are recorded). Chrome writes them as torch.profiler (Kineto) does (`args.device`, `stream`, `correlation` = grid id, `grid`, `block`; `args.span` "entries" where no exits bound them) and the trace header carries `distributedInfo.rank` (the dump's `metadata.rank`, else its GPU), so Holistic Trace Analysis reads a folder of traces, one per rank (run it with `HTA_DISABLE_NS_ROUNDING=1`: kvconv times are ns, which HTA otherwise rounds to whole us per event) |
| `block events per ms` | counter `block events per ms` | device | block events in each millisecond |
| `dropped device events` | counter `dropped device events` | device | the device drop count (0 at the start, the total at the end) |
| `dropped host records` | - | host | the host drop count (Perfetto only) |
| `canary` | `canary` | host | one slice per canary step and buffer: ok, or the unexpected / missing pages |
| - | thread 0 | host | `clock sync` instants, one per clock-sync pair (`args.gpu_ns`, `args.uncertainty_ns`) |

Flows (`launch`): from each host launch record to up to `--flows` of its device blocks (Chrome: `s` / `f` events,
`cat` flow). Device times: Perfetto keeps them in their own clock (a custom clock per context) and gives the
clock-sync pairs as ClockSnapshots; Chrome has one time base, so device times are mapped onto the host
`CLOCK_MONOTONIC` timeline by the piecewise-constant rule in docs/FORMAT.md. `ts` in Chrome is in microseconds.
The Perfetto trace's first packet makes `CLOCK_MONOTONIC` the trace time and relates `CLOCK_BOOTTIME` (the clock
trace_processor assigns to every proto trace file) to it at offset 0: without it trace_processor logs
`clock_sync_unrelatable_clock_domains`. Dumps hold no BOOTTIME reading; the offset is exact on a host not suspended
since boot, and only matters when the trace is merged with one recorded in BOOTTIME.

### Inside a torch.profiler trace (`kvconv chrome DUMP --merge TORCH_TRACE.json -o merged.json`)

The merged file is the torch.profiler trace (its events unchanged) with kvconv's Chrome events appended, their pids
moved to 2^30 + pid. Clocks: torch.profiler writes CPU events at `(CLOCK_REALTIME ns - baseTimeNanoseconds) / 1000`
µs; kvconv's host records are `CLOCK_MONOTONIC`. Neither file states REALTIME - MONOTONIC, so the profiled program
calls `kvconv.emit.torchmerge.clock_anchor()` at the start and end of the profiled run: two `record_function` ranges
named after `CLOCK_MONOTONIC` read just before each. The offset lies between the first range's end minus the second
reading and the first range's start minus the first reading; the merge takes the middle, and its stated error is
the half width plus the anchors' disagreement (`kvconv_merge.error_ns`; the device tracks add kvconv's clock-sync
bound, `otherData.alignment`). On the H200 fixture (fixtures/h200-torch-merge) the error is ±10.25 µs, and the
offset is 0.01-0.74 µs from REALTIME - MONOTONIC read back to back in the profiled process. The profiler's own GPU
rows are absent when kvconv records: Kineto's CUPTI cannot subscribe while the tracer holds the callbacks
(`CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED`), so the kernels on the timeline are kvconv's.

## Arrow / Parquet tables (`kvconv arrow`)

A Hive-partitioned dataset: `OUT/<table>/run=<dump file stem>/device=<device id>/part-ctx<context>.arrow` (or
`.parquet` with `--format parquet`), so `pyarrow.dataset(OUT/<table>, partitioning="hive")`, polars and DuckDB read
every dump as one table; `run` and `device` come from the path. Every file's schema metadata holds the dump format
version, the table name, the run metadata and the clock alignment of its context. Record columns have the meaning
of the same field in docs/FORMAT.md.
"""

TABLES = {  # what each table is: a record kind's is its "arrow" in schemas/layouts.json; render_outputs fails on
    # a table described nowhere
    **{k.name: k.arrow for k in layout.KINDS.values() if k.arrow},
    "matches": "one row per device event: the host record it joins (kvconv reconcile's matches)",
    "launch": "one row per launch or graph-node execution (graph uploads left out): its device start and end, "
              "blocks predicted and recorded",
}
COLUMNS = {  # columns that are not a layout field
    "context_id": "CUDA context (index within the process) of the record",
    "run": "partition: the dump file's name without its suffix",
    "device": "partition: CUDA device ordinal",
    "name": "function name (from the strings group)",
    "module": "module name (from the strings group)",
    "buffer": "buffer name (from the strings group)",
    "json": "the metadata group's JSON text",
    "blob": "the strings group's bytes",
    "device_index": "row of the device event in device_event (same run, device, context_id)",
    "host_kind": "record kind of the host record: 6 graph_node, 7 eager_launch, 0 none",
    "host_index": "row of the host record in graph_node or eager_launch (-1 if unmatched)",
    "replay": "graph replay (launch_id; 0 for eager)",
    "node_ordinal": "node's position in its replay (-1 eager or unknown)",
    "join": "how it was joined: 1 exact, 2 ordered, 0 none",
    "join_name": "the same as text: exact, ordered, none",
    "kind": "graph_node or eager_launch",
    "graph_exec": "the graph exec (0 for eager launches), as in the host record",
    "stream": "the launch's stream, as in the host record",
    "grid_id": "the launch's grid id, as in the host record",
    "kernel": "the launched kernel's name",
    "blocks_predicted": "blocks the grid predicts (grid_x * grid_y * grid_z)",
    "blocks_recorded": "block entries joined to the launch",
    "start_ns": "device ns of its first block entry (null: none recorded)",
    "last_entry_ns": "device ns of its last block entry (null: none recorded)",
    "end_ns": "device ns of its last block exit (null: the dump records no exits)",
    "duration_ns": "end_ns - start_ns: the kernel's device duration (null without exits)",
    "blocks_paired": "blocks whose entry and exit were both recorded",
    "duration_corrected_ns": "duration_ns less the tracer's own cost per launch, as it measured it at start-up "
                             "(metadata contexts[].calibration.bias_ns), at least 0 (null without exits or without a "
                             "calibration)",
    "record": "row of the slot_write record among the context's slot_write records",
    "cache": "the registered cache's name (null: outside every cache)",
    "kv_slot": "page * page_size + offset in that cache (null: outside every cache)",
    "outside_cache": "the stores lie outside every registered cache (flags.outside)",
    "node_id": "the graph node of the launch (0 for eager launches)",
    "write_step": "the probe's step the launch belongs to (null: none)",
    "request": "the request of the step's token mapped to kv_slot (null: no token of the step maps it)",
    "slot_owner": "the request of the last token mapped to kv_slot at that step or before (a stale write: whose KV "
                  "it overwrote)",
    "slot_owner_step": "that token's step",
    "status": "what kvconv canary --writes makes of the write: mapped, pad, unmapped, outside, unknown-cache, no-step",
}
_FIXTURES = ("h200-enter-exit/enter-exit.kvdump", "canary-clean/canary-clean.kvdump",
             "writes-stale-pad/writes-stale-pad.kvdump")


def _arrow_schemas() -> dict:
    """The schema of every table of a real conversion (read back as a hive dataset)."""
    import tempfile
    from pathlib import Path

    import pyarrow.dataset as ds

    from kvconv.emit import write_arrow

    root = Path(__file__).resolve().parent.parent / "fixtures"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tables"
        write_arrow([str(root / f) for f in _FIXTURES], str(out), warn=lambda *a, **k: None)
        return {t.name: ds.dataset(t, format="ipc", partitioning="hive").schema
                for t in sorted(out.iterdir()) if t.is_dir()}


def render_outputs() -> str:
    out = [OUTPUTS_INTRO]
    for table, schema in _arrow_schemas().items():
        if table not in TABLES:
            raise AssertionError(f"describe the Arrow table {table!r} in kvconv/formatdoc.py TABLES")
        kind = layout.KINDS.get(table)
        lay = layout.LAYOUTS[kind.layout] if kind and kind.layout else None
        names = {x.name for x in lay.fields} if lay else set()
        out.append(f"### `{table}`: {TABLES[table]}\n")
        out.append("| column | type | meaning |")
        out.append("| --- | --- | --- |")
        for f in schema:
            if f.name in COLUMNS:
                doc = COLUMNS[f.name]
            elif f.name in names:
                fl = lay.field(f.name)
                doc = fl.doc + (f" (enum `{fl.enum}`)" if fl.enum else (f" (bits `{fl.bits}`)" if fl.bits else ""))
            else:
                raise AssertionError(f"describe the Arrow column {table}.{f.name} in kvconv/formatdoc.py COLUMNS")
            out.append(f"| `{f.name}` | {_cell(str(f.type))} | {_cell(doc.strip())} |")
        out.append("")
    return "\n".join(out)


def render_cli() -> str:
    """docs/CLI.md with its exit-status table generated from schemas/codes.json ``verdicts`` (between the markers)."""
    from pathlib import Path

    from kvconv.check.verdict import exit_table

    page = (Path(__file__).resolve().parent.parent / "docs" / "CLI.md").read_text()
    head, rest = page.split(_CLI_BEGIN, 1)
    return head + _CLI_BEGIN + "\n" + exit_table() + rest[rest.index(_CLI_END):]


def render_verdict_guide() -> str:
    """docs/guides/verdict.md with its verdict table and the codes a traced run can meet generated from
    schemas/codes.json (between the markers); options and outputs are docs/FINDINGS.md's."""
    from pathlib import Path

    from kvconv.format import codes
    from kvconv.format.layout import load_json_schema

    page = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "verdict.md").read_text()
    head, rest = page.split(_VERDICT_BEGIN, 1)
    verdicts = {k: v for k, v in load_json_schema("codes.json")["verdicts"].items() if not k.startswith("$")}
    out = ["", "## The verdicts", "", "| verdict | exit | validate says | means |", "| --- | --- | --- | --- |"]
    out += [f"| `{k}` | {v['exit']} | {v['label']} | {_cell(v['means'])} |" for k, v in verdicts.items()]
    for area in ("structure", "validate", "reconcile", "canary", "record", "input"):
        rows = sorted((c for c in codes.CODES.values() if c.area == area), key=lambda c: c.code)
        out += ["", f"## {codes.AREAS[area]}", "", "| code | severity | what it means | what to do |",
                "| --- | --- | --- | --- |"]
        out += [f"| `{c.code}` | {', '.join(c.severity)} | {_cell(c.means)} | {_cell(c.do)} |" for c in rows]
    out += ["", "The codes of options and outputs (usage errors, refused outputs) are in docs/FINDINGS.md.", ""]
    return head + _VERDICT_BEGIN + "\n".join(out) + "\n" + rest[rest.index(_VERDICT_END):]


_VERDICT_BEGIN = "<!-- generated from schemas/codes.json by python -m kvconv.formatdoc verdict -->"
_VERDICT_END = "<!-- end of the generated codes -->"
_CLI_BEGIN = "<!-- exit statuses: generated from schemas/codes.json by python -m kvconv.formatdoc cli -->"
_CLI_END = "<!-- end of the generated exit statuses -->"
_DOCS = {"format": lambda: render(), "findings": lambda: render_findings(), "outputs": lambda: render_outputs(),
         "cli": lambda: render_cli(), "verdict": lambda: render_verdict_guide()}


if __name__ == "__main__":  # pragma: no cover
    import sys

    which = sys.argv[1] if len(sys.argv) > 1 else "format"
    if which not in _DOCS:
        sys.exit(f"usage: python -m kvconv.formatdoc [{'|'.join(_DOCS)}]")
    sys.stdout.write(_DOCS[which]())
