"""One exception family at the API boundary (issue 51): what kvconv.open, Run and DumpRun refuse is a
:class:`kvconv.format.errors.KvconvError` with a code of schemas/codes.json (a one-line error naming what to do),
never a bare ValueError or KeyError; a dump that cannot be read is the verdict's to say (unreadable), and its reader
raises the error that names file, byte and field."""

from __future__ import annotations

import pytest

import kvconv
from conftest import FIXTURES
from kvconv.format import codes
from kvconv.format.errors import FormatError, KvconvError, UsageError
from kvconv.run import RunOptions

QWEN = FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump"
RANK0 = FIXTURES / "synthetic-multi" / "rank0.kvdump"


@pytest.mark.parametrize("misuse", [
    lambda: kvconv.open([]),
    lambda: RunOptions(join="sideways"),
    lambda: kvconv.open(QWEN).table("nope"),
    lambda: kvconv.open(QWEN).write("csv", "x.csv"),
    lambda: kvconv.open([QWEN, RANK0]).reconciliation,
    lambda: kvconv.open([QWEN, RANK0]).reader,
], ids=["no-path", "bad-join", "no-table", "no-format", "several-dumps-reconciliation", "several-dumps-reader"])
def test_misuse_is_a_usage_error_with_a_registered_code(misuse):
    with pytest.raises(UsageError) as e:
        misuse()
    assert e.value.code in codes.CODES and not isinstance(e.value, (ValueError, KeyError))


def test_an_unreadable_dump_is_a_verdict_and_its_reader_a_format_error(tmp_path):
    with kvconv.open(tmp_path / "missing.kvdump") as run:
        assert run.verdict == "unreadable" and run.exit_code == 2
        with pytest.raises(FormatError, match="no such file"):
            run.reader  # noqa: B018 - the property raises
    bad = FIXTURES / "bad" / "bad-magic.kvdump"
    with kvconv.open(bad) as run:
        assert run.verdict == "unreadable"
        with pytest.raises(KvconvError) as e:
            run.to_perfetto(tmp_path / "t.pftrace")
        assert e.value.code == "bad-magic" and e.value.offset == 0
    assert not (tmp_path / "t.pftrace").exists()
