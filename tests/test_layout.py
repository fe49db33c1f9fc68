"""The layouts are defined once (schemas/layouts.json); dtypes and the C header derive from it."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from kvconv.format import layout


def test_generated_header_is_current():
    current = (ROOT / "native/include/kvconv_records.h").read_text()
    assert current == layout.c_header(), (
        "native/include/kvconv_records.h is stale: "
        "run python -m kvconv.format.layout > native/include/kvconv_records.h")


def test_cli_regenerates_the_same_header():
    out = subprocess.run([sys.executable, "-m", "kvconv.format.layout"], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    assert out == (ROOT / "native/include/kvconv_records.h").read_text()


def test_dtypes_match_schema_offsets_and_sizes():
    spec = json.loads((ROOT / "schemas/layouts.json").read_text())
    for name, lay in spec["layouts"].items():
        dt = layout.DTYPES[name]
        assert dt.itemsize == lay["size"]
        for f in lay["fields"]:
            assert dt.fields[f["name"]][1] == f["offset"], (name, f["name"])
    assert layout.DTYPES["device_event"].itemsize == 64
    assert layout.DTYPES["host_launch"].itemsize == 96
    assert layout.HEADER_DTYPE.itemsize == 64


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_header_static_asserts_compile(tmp_path):
    src = tmp_path / "t.cpp"
    src.write_text('#include "kvconv_records.h"\nint main() { return sizeof(kvconv_device_event_t) == 64 ? 0 : 1; }\n')
    subprocess.run(["g++", "-std=c++17", "-I", str(ROOT / "native/include"), str(src), "-o", str(tmp_path / "t")],
                   check=True)
    assert subprocess.run([str(tmp_path / "t")]).returncode == 0


def test_a_broken_offset_fails_the_static_assert(tmp_path):
    if shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    hdr = layout.c_header().replace("offsetof(kvconv_device_event_t, pc) == 8",
                                    "offsetof(kvconv_device_event_t, pc) == 9")
    (tmp_path / "h.h").write_text(hdr)
    src = tmp_path / "t.cpp"
    src.write_text('#include "h.h"\nint main() { return 0; }\n')
    p = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-I", str(tmp_path), str(src)], capture_output=True,
                       text=True)
    assert p.returncode != 0 and "pc offset" in p.stderr


def test_kind_ids_unique_and_dtypes_for_blob_kinds():
    ids = [k.id for k in layout.KINDS.values()]
    assert len(ids) == len(set(ids))
    assert layout.kind_dtype(layout.KINDS["metadata"]) == np.dtype("u1")


def test_format_doc_is_current():
    from kvconv import formatdoc

    assert (ROOT / "docs/FORMAT.md").read_text() == formatdoc.render(), (
        "docs/FORMAT.md is stale: run python -m kvconv.formatdoc > docs/FORMAT.md")


def test_format_doc_specifies_what_a_decoder_needs():
    """Read alone, docs/FORMAT.md settles the join, the kinds, the clock mapping, timing and duplicates."""
    doc = (ROOT / "docs/FORMAT.md").read_text()
    row = doc.split("## Record kinds")[1].split("| 5 |")[1].split("\n")[0]  # device_event
    assert "block exit" not in row.replace("(block_exit) when recorded", "") and "(block_exit) when recorded" in row
    for phrase in ("`block_exit` event per block", "`mem_write` is reserved",
                   "**piecewise constant, no interpolation**", "the last one with `gpu_ns[i] <= t`, or the first pair",
                   "**Sequence-order join**",
                   "the first launches in host order get no events", "`coverage-late`", "[max(0, D - N), D]",
                   "**duplicated host record**", "takes no part in either join", "a replay's **span**",
                   "the **gap** after a replay", "`block_enter` events only"):
        assert phrase in " ".join(doc.split()), phrase


def test_clock_mapping_is_the_documented_piecewise_constant_one(tmp_path):
    """Two clock-sync pairs whose offsets differ by 50 us: an event between them maps through the earlier pair
    (no interpolation), one after the last through the last, as docs/FORMAT.md says (Chrome JSON, a reader we do
    not control, shows the times)."""
    import json

    import synth
    from conftest import run_cli

    parts = synth.small_parts()
    cs = parts["clock_sync"]
    cs["gpu_ns"][1] += 50_000
    dump = tmp_path / "two-offsets.kvdump"
    synth.write_parts(dump, parts)
    r = run_cli("chrome", dump, "-o", tmp_path / "t.json")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "t.json").read_text())
    blocks = {e["args"]["seq"]: e["ts"] for e in (doc["traceEvents"] if isinstance(doc, dict) else doc)
              if e.get("cat") == "block"}
    ev = parts["device_event"]
    h0, g0, h1, g1 = (int(cs["host_ns"][0]), int(cs["gpu_ns"][0]), int(cs["host_ns"][1]), int(cs["gpu_ns"][1]))
    for i in range(len(ev)):
        t = int(ev["globaltimer"][i])
        host = (h0 + t - g0) if t < g1 else (h1 + t - g1)
        assert blocks[int(ev["sequence"][i])] == pytest.approx(host / 1e3, abs=1e-3), i
    assert g0 < int(ev["globaltimer"][7]) < g1  # one event between the pairs, mapped with the first pair's offset
