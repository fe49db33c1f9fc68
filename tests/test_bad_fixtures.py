"""Every malformed dump under fixtures/bad/ fails through the real CLI with its expected code, one line, no trace."""

import json

import pytest

from conftest import FIXTURES, run_cli

BAD = FIXTURES / "bad"
CASES = json.loads((BAD / "cases.json").read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_case(name, tmp_path):
    case = CASES[name]
    path = BAD / f"{name}.kvdump"
    before = path.read_bytes()
    r = run_cli("validate", "--json", path.name, cwd=BAD)
    assert r.returncode == case["exit"], r.stderr
    assert "Traceback" not in r.stderr
    out = json.loads(r.stdout)["dumps"][0]["result"]
    found = [f["code"] for f in out["findings"] if f["severity"] == "error"]
    if case["code"] is None:
        assert found == []
    else:
        assert case["code"] in found, found
    r = run_cli("validate", path.name, cwd=BAD)
    assert r.returncode == case["exit"]
    if case["exit"] == 2:
        # Unreadable: exactly one line on stderr naming file, byte offset and field.
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"Error: {name}.kvdump: byte ")
        assert "header" in r.stderr
    assert path.read_bytes() == before, "the input was changed"


def test_every_issue_case_is_present():
    wanted = {"truncated-header", "truncated-payload", "bad-magic", "future-major", "count-exceeds-file",
              "checksum-mismatch", "record-size-mismatch", "fatal-count-empty"}
    assert wanted <= set(CASES)


def test_fixtures_are_current(tmp_path):
    """The generator reproduces the committed bytes."""
    import shutil
    import subprocess
    import sys

    work = tmp_path / "bad"
    shutil.copytree(BAD, work)
    subprocess.run([sys.executable, str(work / "generate.py")], check=True, capture_output=True,
                   env={"PYTHONPATH": str(FIXTURES.parent), "PATH": "/usr/bin:/bin"})
    for f in BAD.glob("*.kvdump"):
        assert (work / f.name).read_bytes() == f.read_bytes(), f.name
