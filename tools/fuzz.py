#!/usr/bin/env python3
"""Fuzz every kvconv command with damaged and hostile dumps, through the real entry point (``kvconv.cli.main``).

    .venv/bin/python tools/fuzz.py run --cases 100000 --jobs 2 --seed 1     # the long run (issue 7)
    .venv/bin/python tools/fuzz.py replay 1:4711 -o /tmp/case.kvdump       # rebuild one case, print its commands
    .venv/bin/python tools/fuzz.py run --cases 2000 --jobs 1               # a quick look

A *case* is one command run on one mutated dump. Every mutated dump is run through every command that takes a dump
(discovered from the typer app: info, validate, reconcile, canary, perfetto, chrome, arrow, whichever exist), with
random ``--json`` / ``--salvage`` flags and, for the emitters, ``-o`` into an empty folder. A case passes when:

- the exit code is one of the verdict table's (0, 1, 2, 4, 5; 3 is kvconv's "internal error": a bug), and no
  traceback is printed;
- a failing run (exit 2, or exit 1 with nothing on stdout) says why in an ``Error: ...`` line on stderr, and every
  stderr line is one ``Error: ...`` / ``Warning: ...`` line;
- a failing run leaves the output folder empty (no output, no temporary names); a successful one leaves exactly its
  output; a command whose output renders the verdict (``report``) leaves exactly its output for every verdict
  (exit 0, 1, 4, 5) and nothing when it fails with an ``Error:`` line (2, or 1); the input file is never modified;
- memory stays bounded by the file's size (python + numpy allocations traced with tracemalloc, and the worker's
  peak RSS), and the run ends within the time limit.

Mutations (:func:`mutate`): bit flips in headers (with and without re-fixing header_crc32, so the deeper code is
reached) and payloads (with and without re-fixing payload_crc32), truncation at every group boundary and inside
records, hostile header counts, capacities, record sizes, kinds, versions and contexts, swapped, duplicated and
dropped groups, garbage metadata JSON, hostile record fields (grid dims 0 / 2^32-1, huge sequences, page lists and
string offsets out of range), appended garbage and concatenated dumps.

The long run forks worker subprocesses that run many cases in-process; a worker that dies (segfault, killed for
memory, hang in C) is recorded as a crash of the case it was running and restarted. Each case is rebuilt from
``SEED:INDEX`` alone (``replay``). tests/test_fuzz.py drives the same mutators from hypothesis.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import random
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


from kvconv.format import dump, layout  # noqa: E402

HS = layout.HEADER_SIZE
HDR = layout.LAYOUTS["header"]
MAGIC = layout.MAGIC
MiB = 1 << 20

# Memory allowed per case: a constant (the command's own working set on a tiny dump) plus a multiple of the file
# size. Dumps here are a few KiB, so in practice the bound says "hostile counts never turn into big allocations".
MEM_BASE = 48 * MiB
MEM_PER_BYTE = 64
CASE_TIMEOUT_S = 30.0


# ---------------------------------------------------------------------------------------------------------------
# randomness: random.Random for the long run, hypothesis data in tests/test_fuzz.py


class Rand:
    """What the mutators draw from. Subclasses only need :meth:`int` (inclusive bounds)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, seq):
        seq = list(seq)
        return seq[self.int(0, len(seq) - 1)]

    def chance(self, percent: int) -> bool:
        return self.int(0, 99) < percent

    def bytes(self, n: int) -> bytes:
        return bytes(self.int(0, 255) for _ in range(n))


# ---------------------------------------------------------------------------------------------------------------
# the group structure of a (possibly damaged) dump


@dataclass
class G:
    off: int
    kind: int
    rsize: int
    count: int
    nbytes: int
    end: int  # header + padded payload, clipped to the file
    whole: bool  # the payload is entirely inside the file

    @property
    def payload(self) -> int:
        return self.off + HS

    @property
    def layout(self):
        k = layout.KINDS_BY_ID.get(self.kind)
        return layout.LAYOUTS[k.layout] if k is not None and k.layout else None


def walk(raw) -> list[G]:
    """The groups of ``raw`` as far as their headers can be followed (magic present, payload inside the file)."""
    out, pos, n = [], 0, len(raw)
    while pos + HS <= n and bytes(raw[pos : pos + 8]) == MAGIC:
        kind, = struct.unpack_from("<H", raw, pos + 12)
        rsize, = struct.unpack_from("<I", raw, pos + 16)
        count, = struct.unpack_from("<Q", raw, pos + 24)
        nbytes = count * rsize
        end = pos + HS + layout.padded(nbytes)
        out.append(G(pos, kind, rsize, count, nbytes, min(end, n), pos + HS + nbytes <= n))
        if end > n:
            break
        pos = end
    return out


def fix_header(raw: bytearray, off: int) -> None:
    struct.pack_into("<I", raw, off + 60, zlib.crc32(bytes(raw[off : off + 60])))


def fix_crcs(raw: bytearray) -> None:
    """Re-fix every followable group's payload and header checksums, so the damage reaches the record checks."""
    for g in walk(raw):
        if g.whole:
            struct.pack_into("<I", raw, g.off + 56, zlib.crc32(bytes(raw[g.payload : g.payload + g.nbytes])))
        fix_header(raw, g.off)


def set_header_field(raw: bytearray, off: int, name: str, value: int, *, fix: bool = True) -> None:
    f = HDR.field(name)
    fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[f.size]
    struct.pack_into(fmt, raw, off + f.offset, value & ((1 << (8 * f.size)) - 1))
    if fix:
        fix_header(raw, off)


def interesting(R: Rand, size: int, current: int | None = None) -> int:
    """A value for an integer field of ``size`` bytes that code tends to get wrong."""
    mx = (1 << (8 * size)) - 1
    cands = [0, 1, 2, 3, 7, 8, 31, 32, 63, 64, 255, 256, 1023, 1024, 1025, 4095, 4096, 65535, 65536, 1 << 20,
             (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 40, 1 << 53, (1 << 63) - 1, 1 << 63, mx, mx - 1]
    cands = [c for c in cands if c <= mx]
    if current is not None:
        cands += [(current + d) & mx for d in (1, -1, 2, -2)] + [(current * 2) & mx, (current << 16) & mx]
    if R.chance(15):
        return R.int(0, mx)
    return R.choice(cands)


# ---------------------------------------------------------------------------------------------------------------
# mutators: each takes (raw, R, bases) and returns (new raw, description)

HEADER_FIELDS = ("record_count", "capacity", "record_size", "drop_count", "context_id", "device_id", "clock_domain",
                 "record_kind", "minor", "major", "header_size", "flags", "payload_crc32")
# Record fields most likely to reach allocation-sized arithmetic or indexing.
HOT_FIELDS = {
    "host_launch": ("grid_x", "grid_y", "grid_z", "block_dim_x", "launch_id", "node", "grid_id", "kernel_slot",
                    "flags", "host_ns", "graph_exec", "stream"),
    "device_event": ("sequence", "globaltimer", "block_x", "block_y", "block_z", "gridid", "kernel_slot", "flags",
                     "kind", "smid", "tag"),
    "kernel": ("slot", "name_off", "name_len", "module_off", "module_len"),
    "clock_sync": ("host_ns", "gpu_ns", "uncertainty_ns", "sequence"),
    "canary": ("step", "buffer_id", "name_off", "name_len", "num_pages", "page_size", "expected_first",
               "expected_count", "changed_first", "changed_count", "excluded_first", "excluded_count", "host_ns"),
    "canary_page": ("page",),
}


def _pick_group(R: Rand, raw, pred=lambda g: True) -> G | None:
    gs = [g for g in walk(raw) if pred(g)]
    return R.choice(gs) if gs else None


def m_flip_header(raw, R, bases):
    g = _pick_group(R, raw)
    if g is None:
        return m_flip_any(raw, R, bases)
    raw = bytearray(raw)
    b = R.int(0, HS - 1)
    bit = R.int(0, 7)
    raw[g.off + b] ^= 1 << bit
    fix = b < 60 and R.chance(75)
    if fix:
        fix_header(raw, g.off)
    return raw, f"flip header bit: group@{g.off} byte {b} bit {bit}{' +header_crc' if fix else ''}"


def m_flip_payload(raw, R, bases):
    g = _pick_group(R, raw, lambda g: g.whole and g.nbytes > 0)
    if g is None:
        return m_flip_any(raw, R, bases)
    raw = bytearray(raw)
    nflips = R.choice([1, 1, 1, 2, 8])
    where = []
    for _ in range(nflips):
        b = R.int(0, g.nbytes - 1)
        raw[g.payload + b] ^= 1 << R.int(0, 7)
        where.append(b)
    fix = R.chance(75)
    if fix:
        fix_crcs(raw)
    return raw, f"flip payload bits: group@{g.off} kind {g.kind} bytes {where}{' +crcs' if fix else ''}"


def m_flip_any(raw, R, bases):
    raw = bytearray(raw)
    if not raw:
        return raw, "flip nothing (empty)"
    n = R.int(1, 8)
    for _ in range(n):
        raw[R.int(0, len(raw) - 1)] ^= 1 << R.int(0, 7)
    return raw, f"flip {n} random bits"


def m_truncate_boundary(raw, R, bases):
    gs = walk(raw)
    if not gs:
        return raw[: R.int(0, len(raw))], "truncate anywhere"
    g = R.choice(gs)
    cuts = {"group start": g.off, "inside header": g.off + R.int(1, HS - 1), "after header": g.payload,
            "payload end": g.payload + g.nbytes, "padded end": g.end}
    if g.rsize and g.count:
        k = R.int(0, max(0, g.count - 1))
        cuts["record boundary"] = g.payload + k * g.rsize
        cuts["inside record"] = g.payload + k * g.rsize + R.int(1, max(1, g.rsize - 1))
    what = R.choice(sorted(cuts))
    at = min(cuts[what], len(raw))
    return raw[:at], f"truncate at {what} of group@{g.off} (byte {at})"


def m_truncate_any(raw, R, bases):
    at = R.int(0, len(raw))
    return raw[:at], f"truncate at byte {at}"


def m_header_field(raw, R, bases):
    g = _pick_group(R, raw)
    if g is None:
        return m_flip_any(raw, R, bases)
    raw = bytearray(raw)
    name = R.choice(HEADER_FIELDS)
    f = HDR.field(name)
    cur = int.from_bytes(raw[g.off + f.offset : g.off + f.offset + f.size], "little")
    if name == "record_kind" and R.chance(60):
        v = R.choice(sorted(layout.KINDS_BY_ID) + [0, 10, 0xFFFF])
    elif name == "clock_domain" and R.chance(50):
        v = R.choice([0, 1, 2, 3, 0xFFFF])
    else:
        v = interesting(R, f.size, cur)
    fix = R.chance(90)
    set_header_field(raw, g.off, name, v, fix=fix)
    return raw, f"header field: group@{g.off} {name} {cur} -> {v}{' +header_crc' if fix else ''}"


def _split(raw) -> tuple[list[bytes], bytes]:
    gs = walk(raw)
    parts = [bytes(raw[g.off : g.end]) for g in gs]
    tail = bytes(raw[gs[-1].end :]) if gs else bytes(raw)
    return parts, tail


def m_swap_groups(raw, R, bases):
    parts, tail = _split(raw)
    if len(parts) < 2:
        return m_duplicate_group(raw, R, bases)
    i, j = R.int(0, len(parts) - 1), R.int(0, len(parts) - 1)
    parts[i], parts[j] = parts[j], parts[i]
    return bytearray(b"".join(parts) + tail), f"swap groups {i} and {j}"


def m_duplicate_group(raw, R, bases):
    parts, tail = _split(raw)
    if not parts:
        return m_flip_any(raw, R, bases)
    i = R.int(0, len(parts) - 1)
    j = R.int(0, len(parts))
    parts.insert(j, parts[i])
    return bytearray(b"".join(parts) + tail), f"duplicate group {i} at {j}"


def m_drop_group(raw, R, bases):
    parts, tail = _split(raw)
    if not parts:
        return m_flip_any(raw, R, bases)
    i = R.int(0, len(parts) - 1)
    del parts[i]
    return bytearray(b"".join(parts) + tail), f"drop group {i}"


def m_context(raw, R, bases):
    g = _pick_group(R, raw)
    if g is None:
        return m_flip_any(raw, R, bases)
    raw = bytearray(raw)
    name = R.choice(["context_id", "context_id", "device_id"])
    v = R.choice([0, 1, 2, 7, 0xFFFF, 0xFFFFFFFF])
    set_header_field(raw, g.off, name, v)
    return raw, f"group@{g.off} {name} -> {v}"


def garbage_json(R: Rand) -> bytes:
    """Metadata payloads: not JSON, not UTF-8, the wrong JSON type, hostile values for known keys, deep nesting."""
    k = R.int(0, 15)
    if k == 0:
        return R.bytes(R.int(0, 64))
    if k == 1:
        return b"\xff\xfe{\"tool\": \"x\"}"
    if k == 2:
        return R.choice([b"[]", b"null", b"0", b"\"tool\"", b"true", b"[{\"tool\": 1}]", b""])
    if k == 3:
        return b"[" * R.choice([100, 1000, 5000, 100000]) + b"]" * R.choice([0, 1])
    if k == 4:
        return b"{\"tool\": \"x\", \"counters\": {\"fatal_count\": " + b"9" * R.choice([20, 400, 5000]) + b"}}"
    if k == 5:
        return b"{\"tool\": NaN, \"tool_version\": Infinity, \"counters\": -Infinity}"
    if k == 6:
        return b"{\"tool\": \"x\", \"tool\": 1, \"counters\": {\"a\": 1e999}}"
    if k == 7:
        return b"{\"tool\": \"x\", \"tool_version\": \"1\", \"counters\": \"many\"}"
    if k == 8:
        return b"{\"tool\": \"x\\ud800\", \"gpu\": \"\\u0000\"}"
    if k == 9:
        return b"{\"tool\": \"" + b"A" * R.choice([1000, 100000]) + b"\"}"
    if k == 10:
        return b"{\"tool\": \"x\", \"counters\": {\"fatal_count\": [], \"device_event_drops\": {\"x\": 1}}}"
    if k == 11:
        return b"{\"a\": " * 200 + b"1" + b"}" * 200
    if k == 12:
        return b"{\"tool\": \"x\"" + b" " * R.int(0, 8)  # cut short
    if k == 13:
        return json.dumps({"tool": 1, "tool_version": None, "gpu": ["a"], "driver": {}, "model": 3.5,
                           "counters": {"fatal_count": -1, "device_event_drops": 2 ** 70}}).encode()
    if k == 14:
        return b"{\"tool\": \"x\"}\x00\x00\x00"
    return (b"{\"counters\": {\"" + R.bytes(4).hex().encode() + b"\": 1}, \"tool\": \""
            + R.bytes(3).hex().encode() + b"\"}")


def m_metadata(raw, R, bases):
    parts, tail = _split(raw)
    gs = walk(raw)
    meta_kind = layout.KINDS["metadata"]
    idx = [i for i, g in enumerate(gs) if g.kind == meta_kind.id]
    payload = garbage_json(R)
    ctx = 0
    if idx and R.chance(80):
        i = R.choice(idx)
        ctx, = struct.unpack_from("<I", raw, gs[i].off + 48)
    else:
        i = None
    hdr = dump.make_header(meta_kind, record_count=len(payload), payload_crc32=zlib.crc32(payload), context_id=ctx)
    new = hdr + payload + b"\0" * (layout.padded(len(payload)) - len(payload))
    if i is None:
        j = R.int(0, len(parts))
        parts.insert(j, new)
        where = f"new metadata group at {j}"
    else:
        parts[i] = new
        where = f"metadata group {i} replaced"
    return bytearray(b"".join(parts) + tail), f"{where}: {payload[:48]!r}{'...' if len(payload) > 48 else ''}"


def m_record_field(raw, R, bases):
    g = _pick_group(R, raw, lambda g: g.whole and g.count > 0 and g.layout is not None
                    and g.rsize == g.layout.size)
    if g is None:
        return m_header_field(raw, R, bases)
    lay = g.layout
    if R.chance(60):
        name = R.choice(HOT_FIELDS.get(lay.name, [f.name for f in lay.fields]))
    else:
        name = R.choice([f.name for f in lay.fields])
    f = lay.field(name)
    if f.type == "bytes":
        return m_flip_payload(raw, R, bases)
    size = f.size
    mode = R.choice(["one", "one", "all", "last"])
    recs = list(range(g.count)) if mode == "all" else [g.count - 1 if mode == "last" else R.int(0, g.count - 1)]
    raw = bytearray(raw)
    cur = int.from_bytes(raw[g.payload + recs[0] * g.rsize + f.offset :][:size], "little")
    v = interesting(R, size, cur)
    signed = f.type.startswith("i")
    for r in recs:
        at = g.payload + r * g.rsize + f.offset
        raw[at : at + size] = v.to_bytes(size, "little", signed=False) if not signed else \
            (v if v < (1 << (8 * size - 1)) else v - (1 << (8 * size))).to_bytes(size, "little", signed=True)
    fix = R.chance(90)
    if fix:
        fix_crcs(raw)
    which = "all records" if mode == "all" else f"record {recs[0]}"
    return raw, f"{lay.name}.{name} of {which} in group@{g.off}: {cur} -> {v}{' +crcs' if fix else ''}"


def m_append(raw, R, bases):
    raw = bytearray(raw)
    k = R.int(0, 3)
    if k == 0:
        extra = R.bytes(R.int(1, 100))
        what = f"{len(extra)} random bytes"
    elif k == 1:
        extra = MAGIC + R.bytes(R.int(0, 56))
        what = "a partial header"
    elif k == 2:
        extra = b"\0" * R.choice([8, 64, 4096])
        what = "zeros"
    else:
        name, other = R.choice(bases)
        extra = bytes(other)
        what = f"all of {name}"
    return raw + extra, f"append {what}"


def m_concat_context(raw, R, bases):
    """Append another dump whose groups claim context 1 (a second context / device), maybe the same as ours."""
    name, other = R.choice(bases)
    other = bytearray(other)
    ctx = R.choice([0, 1, 2])
    for g in walk(other):
        set_header_field(other, g.off, "context_id", ctx)
        set_header_field(other, g.off, "device_id", ctx)
    return bytearray(raw) + other, f"append {name} as context {ctx}"


def m_zero_tail(raw, R, bases):
    """A crashed writer: the file has its full size but its end was never written (zeros)."""
    raw = bytearray(raw)
    if not raw:
        return raw, "zero nothing"
    at = R.int(0, len(raw) - 1)
    raw[at:] = b"\0" * (len(raw) - at)
    return raw, f"zero from byte {at} to the end"


MUTATORS = {
    "flip_header": (m_flip_header, 10),
    "flip_payload": (m_flip_payload, 8),
    "flip_any": (m_flip_any, 3),
    "truncate_boundary": (m_truncate_boundary, 10),
    "truncate_any": (m_truncate_any, 4),
    "header_field": (m_header_field, 14),
    "swap_groups": (m_swap_groups, 5),
    "duplicate_group": (m_duplicate_group, 5),
    "drop_group": (m_drop_group, 4),
    "context": (m_context, 4),
    "metadata": (m_metadata, 8),
    "record_field": (m_record_field, 20),
    "append": (m_append, 3),
    "concat_context": (m_concat_context, 3),
    "zero_tail": (m_zero_tail, 2),
}
_MUT_TABLE = [name for name, (_, w) in MUTATORS.items() for _ in range(w)]


def mutate(R: Rand, bases: list[tuple[str, bytes]]) -> tuple[str, bytes, list[str]]:
    """One damaged dump: a base, 1-3 mutations, then maybe every checksum re-fixed. Returns (base, bytes, log)."""
    name, raw = R.choice(bases)
    raw = bytearray(raw)
    log = []
    for _ in range(R.choice([1, 1, 1, 2, 2, 3])):
        op = R.choice(_MUT_TABLE)
        raw, what = MUTATORS[op][0](raw, R, bases)
        log.append(f"{op}: {what}")
    if R.chance(30):
        raw = bytearray(raw)
        fix_crcs(raw)
        log.append("fix all checksums")
    return name, bytes(raw), log


# ---------------------------------------------------------------------------------------------------------------
# the valid dumps to start from


def _load_synth():
    import importlib.util

    spec = importlib.util.spec_from_file_location("kvconv_bad_fixtures", ROOT / "fixtures" / "bad" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def base_dumps(max_size: int = 64 << 10) -> list[tuple[str, bytes]]:
    """Small valid dumps: the synthetic small dump and every committed fixture under ``max_size`` that validates
    structurally (fixtures/bad/* other than valid-small are damaged on purpose and left out)."""
    out = []
    mod = _load_synth()
    with tempfile.TemporaryDirectory() as t:
        p = Path(t) / "small.kvdump"
        mod.small_valid(p)
        out.append(("synth-small", p.read_bytes()))
    for p in sorted((ROOT / "fixtures").glob("*/*.kvdump")):
        if p.parent.name == "bad" or p.stat().st_size > max_size:
            continue
        d = dump.scan(p)
        ok = not any(f.severity == "error" for f in d.problems)
        d.close()
        if ok:
            out.append((f"{p.parent.name}/{p.name}", p.read_bytes()))
    return out


# ---------------------------------------------------------------------------------------------------------------
# the commands, discovered from the typer app


@dataclass(frozen=True)
class Command:
    name: str
    json: bool = False
    salvage: bool = False
    out_opt: str | None = None  # "-o" when the command writes a file or folder
    out_dir: bool = False  # the output is a folder (arrow)
    multi: bool = False  # takes several dumps
    extra: tuple[str, ...] = ()
    renders_verdict: bool = False  # its output is the verdict itself (report): written for every verdict but unreadable

    def argv(self, inputs: list[str], outdir: str, *, json_: bool = False, salvage: bool = False) -> list[str]:
        a = [self.name, *inputs]
        if json_ and self.json:
            a.append("--json")
        if salvage and self.salvage:
            a.append("--salvage")
        if self.out_opt:
            a += [self.out_opt, self.out_path(outdir)]
        return a + list(self.extra)

    def out_path(self, outdir: str) -> str:
        ext = {"perfetto": ".pftrace", "chrome": ".json"}.get(self.name, "" if self.out_dir else ".out")
        return os.path.join(outdir, f"{self.name}-out{ext}")


SKIP_COMMANDS = {"demo", "record"}
# Commands whose output renders the verdict (an HTML report of a FAILED run is the point of the report): they write it
# for every verdict (exit 0, 1, 4, 5) and write nothing when the dump is unreadable (2). The others write only on 0.
VERDICT_RENDERERS = {"report"}


def commands() -> list[Command]:
    import typer.main  # typer >= 0.20 carries its own click (typer._click): tell parameters apart by their type name

    from kvconv import cli

    grp = typer.main.get_command(cli.app)
    out = []
    for name, cmd in sorted(grp.commands.items()):
        if name in SKIP_COMMANDS:
            continue
        args = [p for p in cmd.params if p.param_type_name == "argument"]
        if not args:
            continue
        a0 = args[0]
        if "dump" not in (a0.name or "").lower() and "DUMP" not in (a0.metavar or ""):
            continue
        opts = {o: p for p in cmd.params if p.param_type_name == "option" for o in p.opts + p.secondary_opts}
        out_opt = "-o" if "-o" in opts else ("--out" if "--out" in opts else ("--output" if "--output" in opts
                                                                            else None))
        out_dir = False
        if out_opt:
            h = (opts[out_opt].help or "").lower()
            out_dir = name == "arrow" or "folder" in h or "directory" in h
        out.append(Command(name, json="--json" in opts, salvage="--salvage" in opts, out_opt=out_opt,
                           out_dir=out_dir, multi=bool(a0.nargs == -1),
                           renders_verdict=name in VERDICT_RENDERERS))
    return out


# ---------------------------------------------------------------------------------------------------------------
# running one case in-process, and judging it


AS_HEADROOM = 1 << 30  # address space a case may add to the process (a soft RLIMIT_AS, restored after the case)


def _vm_size() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for ln in f:
                if ln.startswith("VmSize:"):
                    return int(ln.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@contextlib.contextmanager
def memory_cap(extra: int):
    """Cap this process's address space at its current size + ``extra`` while a case runs, so a hostile count
    that turns into a huge allocation fails fast (MemoryError: judged as a memory problem) instead of eating the
    machine. Only the soft limit is lowered, and it is restored afterwards."""
    vm = _vm_size() if extra > 0 else None
    if vm is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = vm + extra
    for lim in (soft, hard):
        if lim != resource.RLIM_INFINITY:
            cap = min(cap, lim)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


class CaseTimeout(BaseException):
    """Raised by the alarm; a BaseException so kvconv's last-resort handler does not swallow it."""


def _alarm(signum, frame):
    raise CaseTimeout()


@dataclass
class Outcome:
    argv: list[str]
    rc: object  # int, or "timeout" / "escaped: ..."
    stdout: str
    stderr: str
    seconds: float
    peak_bytes: int  # tracemalloc peak during the run (0 when not traced)
    leftovers: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _listing(d: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            out.append(os.path.relpath(os.path.join(root, n), d))
    return sorted(out)


def run_case(cmd: Command, inputs: list[str], outdir: str, *, json_: bool = False, salvage: bool = False,
             timeout: float = CASE_TIMEOUT_S, trace_memory: bool = True, cap: int = AS_HEADROOM) -> Outcome:
    """Run one command in-process through ``kvconv.cli.main`` and judge the outcome (``Outcome.problems``)."""
    from kvconv import cli

    argv = cmd.argv(inputs, outdir, json_=json_, salvage=salvage)
    before = [_digest(p) for p in inputs]
    ob, eb = io.BytesIO(), io.BytesIO()
    # stdout strict like a real pipe (a lone surrogate from a hostile string must not crash the print);
    # stderr backslashreplace, as Python sets it up.
    out = io.TextIOWrapper(ob, encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(eb, encoding="utf-8", errors="backslashreplace", write_through=True)
    old = sys.stdout, sys.stderr
    old_handler = signal.signal(signal.SIGALRM, _alarm) if timeout else None
    if trace_memory:
        tracemalloc.reset_peak()
        base_mem = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    sys.stdout, sys.stderr = out, err
    try:
        with warnings.catch_warnings(), memory_cap(cap):
            warnings.simplefilter("always")
            if timeout:
                signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                rc = cli.main(argv)
            finally:
                if timeout:
                    signal.setitimer(signal.ITIMER_REAL, 0)
    except CaseTimeout:
        rc = "timeout"
    except BaseException as e:  # noqa: BLE001 - anything escaping main is a finding
        rc = f"escaped {type(e).__name__}: {e}"
    finally:
        sys.stdout, sys.stderr = old
        if old_handler is not None:
            signal.signal(signal.SIGALRM, old_handler)
    secs = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] - base_mem if trace_memory else 0
    o = Outcome(argv, rc, ob.getvalue().decode("utf-8", "backslashreplace"),
                eb.getvalue().decode("utf-8", "backslashreplace"), secs, max(0, peak))
    o.leftovers = _listing(outdir)
    size = sum(os.path.getsize(p) for p in inputs if os.path.isfile(p))
    o.problems = judge(cmd, o, size, inputs_changed=[p for p, h in zip(inputs, before) if _digest(p) != h])
    return o


def _digest(p: str) -> str | None:
    try:
        with open(p, "rb") as f:
            return hashlib.blake2b(f.read(), digest_size=16).hexdigest()
    except OSError:
        return None


def _verdict_exits() -> frozenset:
    from kvconv.check.verdict import EXIT_CODES  # schemas/codes.json "verdicts": one table for every command

    return frozenset(EXIT_CODES.values())


_VERDICT_EXITS = _verdict_exits()
CRASH_KINDS = ("internal-error", "bad-exit", "traceback", "timeout", "escaped", "worker-died")


def judge(cmd: Command, o: Outcome, size: int, *, inputs_changed=()) -> list[str]:
    """Problems with an outcome, each ``kind: detail``; kinds in CRASH_KINDS count as crashes."""
    p = []
    rc = o.rc
    if rc == "timeout":
        p.append(f"timeout: no exit after {CASE_TIMEOUT_S:.0f} s")
    elif isinstance(rc, str):
        p.append(f"escaped: {rc}")
    elif rc == 3:
        p.append("internal-error: exit 3: " + o.stderr.strip()[:400])
    elif rc not in _VERDICT_EXITS:  # the verdict table's: 0 ok, 1 failed, 2 unreadable, 4 nothing-checked, 5 incomplete
        p.append(f"bad-exit: exit {rc}: " + o.stderr.strip()[:200])
    if "Traceback (most recent call last)" in o.stderr or "Traceback (most recent call last)" in o.stdout:
        p.append("traceback: " + o.stderr.strip().splitlines()[-1][:200] if o.stderr.strip() else "traceback")
    lines = [ln for ln in o.stderr.splitlines() if ln.strip()]
    # Informational lines are fine; Python internals leaking out (warnings with their source line, frames) are not.
    stray = [ln for ln in lines if _PY_LEAK.search(ln) or ln[:1] in (" ", "\t")]
    if stray:
        p.append(f"stray-stderr: {stray[0][:200]!r} ({len(stray)} lines of Python internals on stderr)")
    has_error_line = any(ln.startswith("Error: ") for ln in lines)
    as_json = "--json" in o.argv
    if rc == 2 and not has_error_line and not (as_json and o.stdout.strip()):
        p.append("silent-failure: exit 2 without an 'Error: ' line")
    if rc == 1 and not has_error_line and not o.stdout.strip():
        p.append("silent-failure: exit 1 with no output and no 'Error: ' line")
    if as_json and isinstance(rc, int) and rc in (0, 1, 2, 4) and o.stdout.strip():
        try:
            json.loads(o.stdout, parse_constant=_no_constant)
        except (ValueError, RecursionError) as e:
            p.append(f"bad-json-output: --json printed something that is not strict JSON ({e})"[:300])
    if rc == 0 and has_error_line:
        p.append("error-on-success: exit 0 with an 'Error: ' line")
    if any("out of memory" in ln for ln in lines):
        p.append("memory: the command ran out of memory")
    if cmd.out_opt:
        target = os.path.basename(cmd.out_path("."))
        # a verdict renderer's exit 1 is a FAILED verdict (output written) unless an Error line says it could not
        # render one (e.g. metadata that is not JSON: an error, nothing written)
        wrote = ({0, 4, 5} | (set() if has_error_line else {1})) if cmd.renders_verdict else {0}
        if rc not in wrote and o.leftovers:
            p.append(f"leftover-output: exit {rc} left {o.leftovers[:5]}")
        if rc in wrote:
            if target not in o.leftovers:
                p.append(f"missing-output: exit {rc} but no output")
            others = [x for x in o.leftovers if x != target and not x.startswith(target + os.sep)]
            if others:
                p.append(f"leftover-output: temporaries beside the output: {others[:5]}")
    elif o.leftovers:
        p.append(f"leftover-output: {o.leftovers[:5]}")
    if inputs_changed:
        p.append(f"input-modified: {inputs_changed}")
    limit = MEM_BASE + MEM_PER_BYTE * size
    if o.peak_bytes > limit:
        p.append(f"memory: traced peak {o.peak_bytes / MiB:.1f} MiB > {limit / MiB:.1f} MiB for a {size}-byte file")
    return p


_PY_LEAK = __import__("re").compile(r'\.py:\d+: |File ".*", line \d+|^Traceback ')


def _no_constant(name):
    raise ValueError(f"{name} in JSON output")


def is_crash(problem: str) -> bool:
    return problem.split(":", 1)[0] in CRASH_KINDS


def fast_typer():
    """Build the click group of ``kvconv.cli.app`` once instead of on every ``main()`` call (typer rebuilds it from
    the function signatures each time: ~20 ms, 90 % of a small case). ``main()`` itself runs unchanged.
    Returns a function that undoes the patch."""
    import typer.main

    if getattr(typer.main.get_command, "_kvconv_cached", False):
        return lambda: None
    orig = typer.main.get_command
    cache = {}

    def get_command(typer_instance):
        k = id(typer_instance)
        if k not in cache:
            cache[k] = (typer_instance, orig(typer_instance))
        return cache[k][1]

    get_command._kvconv_cached = True
    typer.main.get_command = get_command

    def restore() -> None:
        typer.main.get_command = orig

    return restore


def warm_up(cmds: list[Command], bases, tmp: str) -> None:
    """Run every command once on a valid dump so lazy imports are not counted as a case's memory."""
    p = os.path.join(tmp, "warm.kvdump")
    Path(p).write_bytes(bases[0][1])
    for c in cmds:
        for js in (False, True):
            od = tempfile.mkdtemp(dir=tmp)
            run_case(c, [p], od, json_=js, trace_memory=False, timeout=0)
            shutil.rmtree(od, ignore_errors=True)
    os.unlink(p)


# ---------------------------------------------------------------------------------------------------------------
# one mutated dump through every command


def case_rand(seed: int, index: int) -> Rand:
    return Rand(random.Random(f"kvconv-fuzz:{seed}:{index}"))


def case_plan(R: Rand, cmds: list[Command], bases):
    """The mutated dump and, per command, its flags and whether a second, valid dump goes with it."""
    base, data, log = mutate(R, bases)
    plan = []
    for c in cmds:
        plan.append((c, R.chance(40), R.chance(50), c.multi and R.chance(10)))
    return base, data, log, plan


def run_file(data: bytes, plan, tmp: str, *, second: bytes, trace_memory=True, on_start=None):
    """Write ``data`` and run each planned command on it; yields (Command, Outcome)."""
    inp = os.path.join(tmp, "case.kvdump")
    with open(inp, "wb") as f:
        f.write(data)
    other = os.path.join(tmp, "other.kvdump")
    for j, (c, js, salv, two) in enumerate(plan):
        if two:
            with open(other, "wb") as f:
                f.write(second)
        od = os.path.join(tmp, "out")
        shutil.rmtree(od, ignore_errors=True)
        os.mkdir(od)
        if on_start:
            on_start(j)
        o = run_case(c, [inp, other] if two else [inp], od, json_=js, salvage=salv, trace_memory=trace_memory)
        yield c, o
    for p in (inp, other):
        with contextlib.suppress(OSError):
            os.unlink(p)


# ---------------------------------------------------------------------------------------------------------------
# the long run: a parent process, worker subprocesses


def worker(args) -> None:
    """Run files [first, last) of ``seed``; one line per event on stdout (the parent parses them)."""
    limit = int(args.rlimit_gib * (1 << 30))
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    bases = base_dumps()
    cmds = commands()
    tmp = tempfile.mkdtemp(prefix="kvconv-fuzz-", dir=args.tmp)
    proto = sys.__stdout__
    fast_typer()
    try:
        warm_up(cmds, bases, tmp)
        prev_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for i in range(args.first, args.last):
            R = case_rand(args.seed, i)
            base, data, log, plan = case_plan(R, cmds, bases)
            # tracemalloc slows a case 3-6x: trace every Nth dump; the worker's RSS is watched on every case.
            trace = args.trace_every > 0 and i % args.trace_every == 0
            if trace:
                tracemalloc.start()

            def started(j, i=i):
                proto.write(f"B {i} {j}\n")
                proto.flush()

            for c, o in run_file(data, plan, tmp, second=bases[0][1], trace_memory=trace, on_start=started):
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                rc = o.rc if isinstance(o.rc, int) else -1
                rec = {"i": i, "c": c.name, "rc": rc, "s": round(o.seconds, 4), "m": o.peak_bytes, "n": len(data)}
                if rss > prev_rss:
                    rec["rss"] = rss
                    if rss - prev_rss > (MEM_BASE + MEM_PER_BYTE * len(data)) // 1024:
                        o.problems.append(f"memory: the worker's peak RSS grew by {(rss - prev_rss) / 1024:.0f} MiB "
                                          f"in this case ({len(data)}-byte dump)")
                    prev_rss = rss
                if o.problems:
                    rec["p"] = o.problems
                    rec["argv"] = o.argv
                    rec["log"] = log
                    rec["base"] = base
                proto.write("R " + json.dumps(rec) + "\n")
            if trace:
                tracemalloc.stop()
            proto.flush()
        proto.write("DONE\n")
        proto.flush()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class Stats:
    cases: int = 0
    files: int = 0
    exits: dict = field(default_factory=dict)  # command -> {rc: n}
    problems: list = field(default_factory=list)
    crashes: int = 0
    slowest: dict | None = None
    peak_traced: dict | None = None
    peak_rss_kib: int = 0
    peak_rss_case: dict | None = None
    worker_restarts: int = 0

    def add(self, rec: dict) -> None:
        self.cases += 1
        e = self.exits.setdefault(rec["c"], {})
        e[str(rec["rc"])] = e.get(str(rec["rc"]), 0) + 1
        if self.slowest is None or rec["s"] > self.slowest["s"]:
            self.slowest = rec
        if self.peak_traced is None or rec["m"] > self.peak_traced["m"]:
            self.peak_traced = rec
        if rec.get("rss", 0) > self.peak_rss_kib:
            self.peak_rss_kib = rec["rss"]
            self.peak_rss_case = rec
        if rec.get("p"):
            self.problems.append(rec)
            if any(is_crash(x) for x in rec["p"]):
                self.crashes += 1


def _spawn(args, first: int, last: int) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "_worker", "--seed", str(args.seed), "--first", str(first),
           "--last", str(last), "--rlimit-gib", str(args.rlimit_gib)]
    if args.tmp:
        cmd += ["--tmp", args.tmp]
    cmd += ["--trace-every", str(args.trace_every)]
    env = dict(os.environ)
    env.pop("KVCONV_DEBUG", None)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, bufsize=1)


def run(args) -> int:
    cmds = commands()
    per_file = max(1, len(cmds))
    files = -(-args.cases // per_file)
    st = Stats()
    t0 = time.time()
    jobs = max(1, args.jobs)
    # Split the file range into one slice per job; each slice is run by a chain of workers (restarted on death).
    bounds = [(files * k // jobs, files * (k + 1) // jobs) for k in range(jobs)]
    todo = {k: b for k, b in enumerate(bounds) if b[0] < b[1]}
    procs: dict[int, tuple[subprocess.Popen, list]] = {}
    last_print = time.time()

    def start(k):
        a, b = todo[k]
        p = _spawn(args, a, b)
        procs[k] = (p, [None, None, time.time()])  # current (file, cmd), last activity

    for k in list(todo):
        start(k)
    print(f"kvconv fuzz: seed {args.seed}, {files:,} files x {per_file} commands "
          f"({', '.join(c.name for c in cmds)}), {jobs} worker(s)", flush=True)
    while procs:
        fds = {p.stdout.fileno(): k for k, (p, _) in procs.items()}
        ready, _, _ = select.select(list(fds), [], [], 5.0)
        now = time.time()
        for fd in ready:
            k = fds[fd]
            p, cur = procs[k]
            line = p.stdout.readline()
            cur[2] = now
            if line.startswith("B "):
                _, i, j = line.split()
                cur[0], cur[1] = int(i), int(j)
            elif line.startswith("R "):
                rec = json.loads(line[2:])
                st.add(rec)
                if rec.get("p"):
                    print(f"PROBLEM {args.seed}:{rec['i']} {' '.join(rec['argv'][:1])}: {rec['p']}", flush=True)
                a, b = todo[k]
                if rec["i"] >= a:
                    todo[k] = (rec["i"], b)
            elif line.startswith("DONE"):
                p.wait()
                st.files += todo[k][1] - bounds[k][0]
                del procs[k]
            elif line == "":  # EOF without DONE: the worker died
                rc = p.wait()
                err = p.stderr.read()[-2000:]
                i, j = cur[0], cur[1]
                if i is None:
                    print(f"worker failed to start (exit {rc}): {err}", file=sys.stderr)
                    return 3
                c = cmds[j]
                rec = {"i": i, "c": c.name, "rc": f"died {rc}", "s": 0, "m": 0,
                       "p": [f"worker-died: exit {rc}: {err.strip()[-300:]}"], "argv": [c.name]}
                st.add(rec)
                st.worker_restarts += 1
                print(f"PROBLEM {args.seed}:{i} {c.name}: worker died (exit {rc})", flush=True)
                a, b = todo[k]
                todo[k] = (i + 1, b)
                if i + 1 < b:
                    start(k)
                else:
                    del procs[k]
        for _k, (p, cur) in list(procs.items()):
            if now - cur[2] > args.hang_s:  # stuck in C code, where the alarm cannot reach
                p.kill()
                cur[2] = now
        if now - last_print > 30:
            last_print = now
            print(f"  {st.cases:,} cases, {len(st.problems)} problems, {st.crashes} crashes, "
                  f"{now - t0:.0f} s", flush=True)
    wall = time.time() - t0
    summary = summarize(st, args, wall, cmds)
    print(summary["text"], flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return 1 if st.crashes or st.problems else 0


def summarize(st: Stats, args, wall: float, cmds) -> dict:
    peak_rss = max(st.peak_rss_kib, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    exits_total: dict[str, int] = {}
    for e in st.exits.values():
        for rc, n in e.items():
            exits_total[rc] = exits_total.get(rc, 0) + n
    lines = [f"cases: {st.cases:,} ({st.files:,} mutated dumps x {len(cmds)} commands), seed {args.seed}, "
             f"wall {wall:,.0f} s, {args.jobs} worker(s)",
             "exits: " + ", ".join(f"{rc}: {n:,}" for rc, n in sorted(exits_total.items()))]
    for c, e in sorted(st.exits.items()):
        lines.append(f"  {c:<10} " + ", ".join(f"{rc}: {n:,}" for rc, n in sorted(e.items())))
    lines.append(f"crashes: {st.crashes} (exit 3, other exits, tracebacks, timeouts, worker deaths)")
    lines.append(f"other problems: {len(st.problems) - st.crashes}")
    by_kind: dict[str, int] = {}
    for r in st.problems:
        for x in r["p"]:
            by_kind[x.split(":", 1)[0]] = by_kind.get(x.split(":", 1)[0], 0) + 1
    if by_kind:
        lines.append("  by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items())))
    if st.slowest:
        s = st.slowest
        lines.append(f"slowest case: {args.seed}:{s['i']} {s['c']} {s['s']:.3f} s ({s['n']:,}-byte dump)")
    if st.peak_traced:
        s = st.peak_traced
        lines.append(f"peak traced allocation: {s['m'] / MiB:.1f} MiB in {args.seed}:{s['i']} {s['c']} "
                     f"({s['n']:,}-byte dump)")
    lines.append(f"peak RSS of a worker: {peak_rss / 1024:.0f} MiB (worker restarts: {st.worker_restarts})")
    return {"text": "\n".join(lines), "cases": st.cases, "files": st.files, "exits": st.exits,
            "exits_total": exits_total, "crashes": st.crashes, "problems": st.problems[:200],
            "problem_kinds": by_kind, "slowest": st.slowest, "peak_traced": st.peak_traced,
            "peak_rss_kib": peak_rss, "wall_s": wall, "seed": args.seed}


def replay(args) -> int:
    seed, index = (int(x) for x in args.case.split(":"))
    bases = base_dumps()
    cmds = commands()
    R = case_rand(seed, index)
    base, data, log, plan = case_plan(R, cmds, bases)
    print(f"case {seed}:{index}: base {base}, {len(data)} bytes")
    for x in log:
        print(f"  {x}")
    if args.out:
        Path(args.out).write_bytes(data)
        print(f"wrote {args.out}")
    fast_typer()
    tracemalloc.start()
    with tempfile.TemporaryDirectory() as tmp:
        warm_up(cmds, bases, tmp)
        for _c, o in run_file(data, plan, tmp, second=bases[0][1]):
            print(f"$ kvconv {' '.join(o.argv)}  -> exit {o.rc} in {o.seconds:.3f} s, "
                  f"traced peak {o.peak_bytes / MiB:.1f} MiB")
            for ln in o.stderr.splitlines()[:5]:
                print(f"    stderr: {ln[:300]}")
            for x in o.problems:
                print(f"    PROBLEM {x}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="the long run")
    r.add_argument("--cases", type=int, default=100_000, help="command runs in all (default 100,000)")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--jobs", type=int, default=1, help="worker processes")
    r.add_argument("--tmp", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                   help="where the cases are written")
    r.add_argument("--json-out", help="write the summary (and up to 200 problem cases) here")
    r.add_argument("--rlimit-gib", type=float, default=2.5,
                   help="address-space limit of a worker (its baseline is ~1.4 GiB)")
    r.add_argument("--hang-s", type=float, default=120.0, help="kill a worker silent for this long")
    r.add_argument("--trace-every", type=int, default=10,
                   help="trace python/numpy allocations (tracemalloc) on every Nth dump (0: never)")
    w = sub.add_parser("_worker")
    w.add_argument("--seed", type=int, required=True)
    w.add_argument("--first", type=int, required=True)
    w.add_argument("--last", type=int, required=True)
    w.add_argument("--tmp")
    w.add_argument("--rlimit-gib", type=float, default=2.5)
    w.add_argument("--trace-every", type=int, default=10)
    p = sub.add_parser("replay", help="rebuild case SEED:INDEX and run its commands")
    p.add_argument("case")
    p.add_argument("-o", "--out", help="also write the damaged dump here")
    args = ap.parse_args(argv)
    if args.what == "run":
        return run(args)
    if args.what == "_worker":
        worker(args)
        return 0
    return replay(args)


if __name__ == "__main__":
    sys.exit(main())
