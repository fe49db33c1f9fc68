"""--capture-range nvtx:NAME without a GPU: the tracer library as the process's NVTX injection opens the range when an
NVTX range named NAME begins and closes it when that range ends (push/pop, start/end, domain ranges, registered
strings), in a process that never touches CUDA (NVTX needs none). The `nvtx` package makes the NVTX calls."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

NATIVE = ROOT / "native"
pytest.importorskip("nvtx", reason="the nvtx package makes the NVTX calls (pip install nvtx)")

PROGRAM = r"""
import nvtx
nvtx.push_range("warmup"); nvtx.pop_range()                 # another name: nothing
with nvtx.annotate("steady", domain="engine"):              # a domain range with a registered string
    with nvtx.annotate("inner"):
        pass
nvtx.push_range("steady"); nvtx.pop_range()                 # core push/pop
r = nvtx.start_range("steady"); nvtx.end_range(r)           # start/end
"""


@pytest.fixture(scope="module")
def tracer(tmp_path_factory):
    if shutil.which("make") is None or shutil.which("g++") is None:
        pytest.skip("no make/g++")
    build = tmp_path_factory.mktemp("nvtx-build")
    p = subprocess.run(["make", "-C", str(NATIVE), f"BUILD={build}", str(build / "libkvconv_tracer.so")],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"the tracer does not build here: {(p.stdout + p.stderr).strip().splitlines()[-1:]}")
    lib = build / "libkvconv_tracer.so"
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    if "InitializeInjectionNvtx2" not in syms:
        pytest.skip("built without NVTX's headers (the toolkit's include/nvtx3)")
    return lib


def _run(lib, rng, end=None):
    env = dict(os.environ, NVTX_INJECTION64_PATH=str(lib), KVCONV_CAPTURE_RANGE=rng)
    env.pop("KVCONV_CAPTURE_RANGE_END", None)
    if end:
        env["KVCONV_CAPTURE_RANGE_END"] = end
    p = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    return [ln for ln in p.stderr.splitlines() if "capture range" in ln]


@pytest.mark.slow
def test_named_range_opens_and_closes_once(tracer):
    lines = _run(tracer, "nvtx:steady")
    assert lines == ["kvconv-tracer: capture range opened (NVTX range steady) after 0 target launches",
                     "kvconv-tracer: capture range closed (NVTX range steady)"]


@pytest.mark.slow
def test_repeat_opens_at_every_named_range(tracer):
    lines = _run(tracer, "nvtx:steady", "repeat")
    assert sum("opened" in ln for ln in lines) == 3 and sum("closed" in ln for ln in lines) == 3


@pytest.mark.slow
def test_other_names_and_ranges_open_nothing(tracer):
    assert _run(tracer, "nvtx:decode") == []
    assert _run(tracer, "profiler") == []  # not an NVTX range: the injection leaves NVTX alone
