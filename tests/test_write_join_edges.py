"""The write canary's join on mappings with nothing live (found by the fuzzer, issue 27): every command still gives
a verdict, never an internal error."""

from __future__ import annotations

import numpy as np

from conftest import FIXTURES, ROOT, load_script, run_cli

fuzz = load_script(ROOT / "tools" / "fuzz.py")


def test_a_mapping_without_a_live_token_is_judged_not_crashed(tmp_path):
    # Before: IndexError in write_join._requests (exit 3, "internal error") when no mapped token was live.
    from kvconv.format import layout

    raw = bytearray((FIXTURES / "writes-clean" / "writes-clean.kvdump").read_bytes())
    kind = layout.KINDS["slot_map"].id
    groups = [g for g in fuzz.walk(raw) if g.kind == kind]
    assert groups
    for g in groups:
        recs = np.frombuffer(raw, layout.DTYPES["slot_map"], g.count, g.payload).copy()
        recs["slot"] = -1  # every token of every step unmapped
        raw[g.payload : g.payload + g.nbytes] = recs.tobytes()
    fuzz.fix_crcs(raw)
    dump = tmp_path / "no-live.kvdump"
    dump.write_bytes(bytes(raw))
    for argv in (["validate", dump], ["canary", dump, "--writes"], ["report", dump, "-o", tmp_path / "r.html"]):
        r = run_cli(*argv)
        assert r.returncode in (0, 1, 4, 5), (argv, r.returncode, r.stderr[-500:])
        assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
