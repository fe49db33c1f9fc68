"""`kvconv reconcile` through the real CLI: exit codes, text and JSON output."""

from __future__ import annotations

import json

import jsonschema

from conftest import run_cli
from kvconv import layout
from test_reconcile import QWEN, synth


def _dump(tmp_path, name):
    p = tmp_path / f"{name}.kvdump"
    synth.write(p, synth.make(name))
    return p


def test_clean_exits_0(tmp_path):
    r = run_cli("reconcile", _dump(tmp_path, "clean-exact"))
    assert r.returncode == 0, r.stderr
    assert "15 graph-node records = 15 expected executions = 15 device events, 0 drops" in r.stdout
    assert r.stdout.rstrip().endswith("ok")


def test_fault_exits_1_and_names_it(tmp_path):
    r = run_cli("reconcile", _dump(tmp_path, "fault-dropped-event"))
    assert r.returncode == 1
    assert "error missing-blocks" in r.stdout and "replay 2 node #3" in r.stdout


def test_relaxed_exits_0(tmp_path):
    r = run_cli("reconcile", "--relaxed", _dump(tmp_path, "fault-dropped-event"))
    assert r.returncode == 0 and "warning missing-blocks" in r.stdout


def test_unreadable_exits_2(tmp_path):
    bad = tmp_path / "bad.kvdump"
    bad.write_bytes(b"not a dump at all, really not" * 4)
    r = run_cli("reconcile", bad)
    assert r.returncode == 2 and r.stderr.startswith("Error: ") and "Traceback" not in r.stderr
    assert run_cli("reconcile", tmp_path / "absent.kvdump").returncode == 2


def test_bad_join_exits_2(tmp_path):
    r = run_cli("reconcile", "--join", "sideways", _dump(tmp_path, "clean-exact"))
    assert r.returncode == 2 and "--join" in r.stderr


def test_json_follows_schema(tmp_path):
    v = jsonschema.Draft202012Validator(layout.load_json_schema("reconcile.schema.json"))
    r = run_cli("reconcile", "--json", "--join", "ordered", _dump(tmp_path, "multistream"))
    assert r.returncode == 0
    obj = json.loads(r.stdout)
    v.validate(obj)
    assert obj["contexts"][0]["join"] == "ordered"
    assert [f["code"] for f in obj["findings"]] == ["ordered-ambiguous"]
    r2 = run_cli("reconcile", "--json", _dump(tmp_path, "clean-exact"), _dump(tmp_path, "fault-extra-replay"))
    assert r2.returncode == 1
    obj2 = json.loads(r2.stdout)
    v.validate(obj2)
    assert obj2["ok"] is False and [d["ok"] for d in obj2["dumps"]] == [True, False]


def test_qwen_text():
    r = run_cli("reconcile", QWEN)
    assert r.returncode == 0  # the 1,768 missing blocks ran before coverage began: a warning
    assert "warning coverage-late" in r.stdout
    out = r.stdout
    assert "280 graph-node records = 280 expected executions = 280 device events, 0 drops" in out
    assert "eager launch #0" in out and "0 of 1,768 blocks recorded" in out
    assert "graph exec 0x55813d402e10: 40 nodes, replays 1..7, 280 records" in out
    assert "106.85 ms .. 108.58 ms" in out and "11.38 ms .. 11.42 ms" in out
    assert run_cli("reconcile", "--strict-coverage", QWEN).returncode == 1


def test_help_is_light():
    r = run_cli("reconcile", "--help")
    assert r.returncode == 0 and "--join" in r.stdout
