"""The schema as the registry of record kinds: every kind in schemas/layouts.json states its facts
(``record_kind_facts``: clock, per_context, validate, arrow), and what kvconv does with a kind follows from them:
the writer's default clock, the check validate runs on it, the Arrow tables ``kvconv arrow`` writes."""

import json
import sys

import numpy as np
import pyarrow.dataset as ds
import pytest

import synth
from conftest import run_cli
from kvconv import formatdoc
from kvconv.format import dump, layout

SPEC = json.loads((layout.schema_dir() / "layouts.json").read_text())


@pytest.mark.parametrize("kind", sorted(SPEC["record_kinds"]))
def test_every_kind_states_every_fact(kind):
    entry = SPEC["record_kinds"][kind]
    missing = [f for f in SPEC["record_kind_facts"] if f not in entry]
    assert not missing, f"schemas/layouts.json record_kinds.{kind} lacks {missing} (docs/DEVELOPING.md)"
    assert entry["clock"] in layout.ENUMS["clock_domain"]
    assert isinstance(entry["per_context"], bool)
    assert entry["validate"] is None or callable(layout.resolve_hook(entry["validate"]))
    assert entry["arrow"] is None or (isinstance(entry["arrow"], str) and entry["arrow"])


def write_every_kind(path) -> dict[str, int]:
    """A small valid dump (tests/synth.py) plus one group of every other kind: the records written per kind."""
    parts = synth.small_parts()
    counts = {"metadata": 1, "strings": 1}
    with dump.new(path) as w:
        w.write_metadata(parts["meta"])
        w.write_strings(parts["strings"])
        for kind in ("kernel", "clock_sync", "eager_launch", "graph_node", "device_event"):
            w.write_records(kind, parts[kind], capacity=64)
            counts[kind] = len(parts[kind])
        for kind in layout.KINDS.values():
            if kind.name not in counts and kind.layout:
                w.write_records(kind.name, np.zeros(1, dtype=layout.DTYPES[kind.layout]))
                counts[kind.name] = 1
    assert set(counts) == set(layout.KINDS)  # a blob kind other than metadata and strings needs a line above
    return counts


def test_writer_default_clock_is_the_kinds(tmp_path):
    p = tmp_path / "every.kvdump"
    write_every_kind(p)
    with dump.open(p) as d:
        got = {g.kind_name: g.clock_domain_name for g in d.groups}
    assert got == {k.name: k.clock for k in layout.KINDS.values()}


def test_validate_reaches_every_kinds_hook(tmp_path):
    from kvconv.check.validate import validate

    p = tmp_path / "every.kvdump"
    write_every_kind(p)
    called = set()

    def profile(frame, event, arg):
        if event == "call":
            called.add(frame.f_code)

    sys.setprofile(profile)
    try:
        validate(p)
    finally:
        sys.setprofile(None)
    for kind in layout.KINDS.values():
        if kind.validate:
            hook = layout.resolve_hook(kind.validate)
            assert hook.__code__ in called, f"kvconv validate never ran {kind.validate}, {kind.name}'s check"


def test_arrow_writes_a_table_for_exactly_the_exported_kinds(tmp_path):
    p = tmp_path / "every.kvdump"
    counts = write_every_kind(p)
    r = run_cli("arrow", p, "-o", tmp_path / "tables")
    assert r.returncode == 0, r.stderr
    tables = {t.name for t in (tmp_path / "tables").iterdir() if t.is_dir()}
    derived = set(formatdoc.TABLES) - set(layout.KINDS)  # tables made from several kinds: matches, launch
    assert derived and tables - derived == layout.ARROW_KINDS
    for kind in layout.ARROW_KINDS:
        if layout.KINDS[kind].layout and kind != "canary_pages":  # canary_pages: one row per page
            rows = ds.dataset(tmp_path / "tables" / kind, format="ipc", partitioning="hive").count_rows()
            assert rows == counts[kind], kind


def test_every_fixtures_groups_carry_their_kinds_clock():
    """What the tracer (fixtures/h200-*, recorded on the H200) and kvconv's own writers put in each group header's
    clock_domain is the kind's "clock": the schema, not each writer, says it."""
    import warnings

    from conftest import FIXTURES

    checked, tracer = 0, 0
    for p in sorted(FIXTURES.rglob("*.kvdump")):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                d = dump.open(p, options=dump.ReadOptions(verify_checksums=False, salvage=True))
        except Exception:  # noqa: BLE001 - the damaged fixtures of fixtures/bad are about other things
            continue
        with d:
            for g in d.groups:
                if g.kind is not None:
                    assert g.clock_domain_name == g.kind.clock, (p, g.index, g.kind_name)
                    checked += 1
                    tracer += p.parent.name.startswith("h200-")
    assert checked > 100 and tracer > 50, (checked, tracer)
