"""The generated docs (tests regenerate each and compare the committed file):

    python -m kvconv.formatdoc > docs/FORMAT.md              # schemas/layouts.json + the rules below
    python -m kvconv.formatdoc findings > docs/FINDINGS.md   # schemas/codes.json
    python -m kvconv.formatdoc outputs > docs/OUTPUTS.md     # the Arrow schemas + the trace tracks below
"""

from __future__ import annotations

from . import layout

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
- read a group with a newer `minor` or an unknown `record_kind` with a warning (unknown kinds are skipped).

Producers write each file atomically (temporary name, then rename), record their buffer `capacity` and every
record they could not store in `drop_count`, and put run metadata (JSON, `schemas/metadata.schema.json`) in a
`metadata` group. Counters in metadata are integers: an empty string is an error, not a zero.

Time: `device_event.globaltimer` is raw GPU `%globaltimer` ns; host records carry `CLOCK_MONOTONIC` ns. The two
are related only through `clock_sync` pairs (each a host bracket around one device read, with its half-width as
`uncertainty_ns`), never by subtracting one from the other. The header's `clock_domain` names the domain of a
group's timestamps.

Joining host and device: a device event with `flags.has_gridid` carries `%gridid`, equal to the host record's
`grid_id` (a graph node keeps its grid id in every replay); with `flags.has_tag` it carries the per-replay tag
the host record also holds, so (gridid, tag) names (node, replay) without any assumption about order. Events
without them can only be joined in sequence order (single stream).
"""


def render() -> str:
    out = [INTRO.format(major=layout.MAJOR, minor=layout.MINOR, align=layout.ALIGN,
                        majors=", ".join(map(str, layout.SUPPORTED_MAJORS)))]
    out.append("## Record kinds\n")
    out.append("| id | kind | record size | layout | what |")
    out.append("| --- | --- | --- | --- | --- |")
    for k in layout.KINDS.values():
        out.append(f"| {k.id} | `{k.name}` | {k.record_size} | {('`' + k.layout + '`') if k.layout else 'bytes'} "
                   f"| {k.doc} |")
    out.append("")
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

Severity lists the levels a code can have, the usual one first. `--relaxed-reconcile` reports every reconciliation
error as a warning.
"""


def render_findings() -> str:
    """docs/FINDINGS.md: every code of schemas/codes.json, by area: what it means, what to do."""
    from . import codes

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


_DOCS = {"format": lambda: render(), "findings": lambda: render_findings()}


if __name__ == "__main__":  # pragma: no cover
    import sys

    which = sys.argv[1] if len(sys.argv) > 1 else "format"
    if which not in _DOCS:
        sys.exit(f"usage: python -m kvconv.formatdoc [{'|'.join(_DOCS)}]")
    sys.stdout.write(_DOCS[which]())
