"""docs/OUTPUTS.md: generated (tables from the Arrow schemas of a real conversion) and true of the traces."""

from __future__ import annotations

import json
import re

from conftest import FIXTURES, ROOT, run_cli


def test_outputs_page_is_current():
    from kvconv import formatdoc

    assert (ROOT / "docs/OUTPUTS.md").read_text() == formatdoc.render_outputs(), (
        "docs/OUTPUTS.md is stale: run python -m kvconv.formatdoc outputs > docs/OUTPUTS.md")


def _pattern(name: str) -> str:
    name = re.sub(r"0x[0-9a-f]+", "0x…", name)
    return re.sub(r"(?<![0-9a-zA-Z])\d+(?![0-9a-zA-Z])", "<n>", name)


def test_every_chrome_track_and_counter_is_documented(tmp_path):
    page = (ROOT / "docs/OUTPUTS.md").read_text()
    seen = set()
    for dump in ("h200-enter-exit/enter-exit.kvdump", "canary-clean/canary-clean.kvdump",
                 "h200-twostream/twostream.kvdump"):
        out = tmp_path / (dump.split("/")[0] + ".json")
        r = run_cli("chrome", FIXTURES / dump, "-o", out)
        assert r.returncode == 0, r.stderr
        doc = json.loads(out.read_text())
        for e in doc["traceEvents"] if isinstance(doc, dict) else doc:
            if e.get("ph") == "M" and e["name"] == "thread_name":
                seen.add(_pattern(e["args"]["name"]))
            elif e.get("ph") == "C" or (e.get("ph") == "i" and e.get("tid") == 0):
                seen.add(e["name"])
    assert seen, "no tracks"
    missing = sorted(n for n in seen if f"`{n}`" not in page and f"counter `{n}`" not in page
                     and f"`{n}` instants" not in page)
    assert not missing, f"docs/OUTPUTS.md does not describe these Chrome tracks: {missing}"
