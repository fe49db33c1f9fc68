"""One join vocabulary from the CLI to the code (issue 51): ``--join auto|exact|ordered`` on every command that joins
(reconcile, report, diff, perfetto, chrome, arrow), the same words in ``ReconcileOptions``, ``EmitOptions`` and
``RunOptions`` (kvconv.join.JOINS); the converters' former words, which docs/CLI.md promises, still work unlisted."""

from __future__ import annotations

import json
import re

import pytest

from conftest import FIXTURES, ROOT, run_cli
from kvconv.check.reconcile import ReconcileOptions
from kvconv.emit import EmitOptions
from kvconv.format.errors import UsageError
from kvconv.join import JOINS
from kvconv.run import RunOptions

QWEN = FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump"


@pytest.mark.parametrize("cmd", ["reconcile", "report", "diff", "perfetto", "chrome", "arrow"])
def test_every_join_option_says_the_one_vocabulary(cmd):
    r = run_cli(cmd, "--help")
    assert r.returncode == 0
    assert re.search(r"--join\s+auto\|exact\|ordered", r.stdout), r.stdout


@pytest.mark.parametrize("make", [lambda j: ReconcileOptions(join=j), lambda j: EmitOptions(join=j),
                                  lambda j: RunOptions(join=j)], ids=["reconcile", "emit", "run"])
def test_the_options_take_the_same_words_and_refuse_others(make):
    assert JOINS == ("auto", "exact", "ordered")
    for word in JOINS:
        assert make(word).join == word
    with pytest.raises(UsageError, match="auto, exact, ordered"):
        make("always")


def test_no_other_vocabulary_is_left_in_the_code_or_the_docs():
    olds = re.compile(r"auto\|exact\|reconcile|auto\|never\|always|auto\\\|exact\\\|reconcile")
    found = [p.relative_to(ROOT).as_posix() for p in [*(ROOT / "kvconv").rglob("*.py"), *(ROOT / "docs").glob("*.md")]
             if olds.search(p.read_text(encoding="utf-8"))]
    assert not found, found


def test_the_converters_join_as_reconcile_does_and_keep_the_former_words(tmp_path):
    joins = {}
    for word in ("auto", "exact", "ordered"):
        r = run_cli("perfetto", QWEN, "-o", tmp_path / f"{word}.pftrace", "--join", word, "--json")
        assert r.returncode == 0, r.stderr
        joins[word] = json.loads(r.stdout)["output"]
    # the Qwen3-14B dump's events carry no gridid: exact joins none, auto joins as reconcile's auto (ordered) does
    assert joins["exact"]["flows"] == 0 and joins["auto"]["flows"] == joins["ordered"]["flows"] > 0
    for former, same in ((("--join", "reconcile"), "auto"), (("--reconcile", "always"), "auto"),
                         (("--reconcile", "never"), "exact")):
        out = tmp_path / f"{former[1]}.pftrace"
        r = run_cli("perfetto", QWEN, "-o", out, *former, "-q")
        assert r.returncode == 0, r.stderr
        assert out.read_bytes() == (tmp_path / f"{same}.pftrace").read_bytes(), former
