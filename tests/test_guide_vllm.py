"""docs/guides/vllm.md: its shell blocks that run without a GPU are run here (a block whose previous line is
``<!-- gpu -->`` needs vLLM on a GPU and is only checked to name kvconv's real options), and every finding code it
explains is one the registry (schemas/codes.json) defines."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guides" / "vllm.md"
BLOCK = re.compile(r"(?:^(<!-- gpu -->)\n)?^```sh\n(.*?)^```", re.S | re.M)


def _blocks() -> list[tuple[bool, str]]:
    return [(bool(m.group(1)), m.group(2)) for m in BLOCK.finditer(GUIDE.read_text())]


def test_the_guide_has_cpu_and_gpu_blocks():
    kinds = [gpu for gpu, _ in _blocks()]
    assert True in kinds and False in kinds


@pytest.mark.parametrize("i", [i for i, (gpu, _) in enumerate(_blocks()) if not gpu])
def test_cpu_blocks_run(i):
    code = _blocks()[i][1]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    p = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    if "vllm.general_plugins" in code:
        assert p.stdout.strip() == "['kvconv.capture.engines.vllm:register']"
    if "plant-slot-off-by-one" in code:  # what the text under the block says the finding names
        said = ("validate exit 1", "step 10, replay 9: batch row 0 (request 5) wrote slot 856", "instead of 855")
        assert all(w in p.stdout for w in said), p.stdout


def test_gpu_blocks_use_real_record_options():
    from conftest import run_cli

    help_text = run_cli("record", "--help").stdout
    seen = set()
    for _gpu, code in _blocks():
        for cmd in re.findall(r"kvconv record.*?(?= -- )", code.replace("\\\n", " "), re.S):
            seen |= set(re.findall(r"\s(--[a-z][a-z-]+)", cmd))
    assert {"--writes", "--engine", "--capture-range"} <= seen
    assert not [f for f in seen if f not in help_text], seen


def test_every_finding_the_guide_explains_is_registered():
    codes = json.loads((ROOT / "schemas" / "codes.json").read_text())["codes"]
    explained = re.findall(r"^\| `([a-z]+(?:-[a-z]+)+)` \|", GUIDE.read_text(), re.M)
    assert len(explained) >= 7 and not [c for c in explained if c not in codes]
