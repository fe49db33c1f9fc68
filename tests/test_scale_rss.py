"""Large dumps are checked in bounded memory: `kvconv validate`, `reconcile` and `info` of a generated dump larger than
the page-release threshold (256 MiB) keep a peak RSS well below the dump's size (issue 13; bench/bench_scale.py
measures 10 GiB). The peak counts the dump's mapped pages the command holds resident, so a pass that reads pages
after they were given back (or never gives them back) grows with the file and fails here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, load_script

gen = load_script(ROOT / "bench" / "gendump.py")

SIZE = 384 << 20


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scale")
    p = folder / "big.kvdump"
    gen.write(p, gen.GenOptions(size_bytes=SIZE, seed=3))
    yield p
    shutil.rmtree(folder, ignore_errors=True)  # 384 MiB: nothing left behind, even when a test failed


# A forked child starts with its parent's resident high-water mark (Linux keeps it across exec): the command is
# started from a small launcher process, not from this (large) test process, so that its peak is its own.
_LAUNCH = """import os, subprocess, sys
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
_, status, ru = os.wait4(p.pid, 0)
print(os.waitstatus_to_exitcode(status), ru.ru_maxrss * 1024)
"""


def _peak_rss(*args) -> tuple[int, int]:
    """(exit status, peak RSS in bytes) of ``python -m kvconv ARGS`` run as a user would."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", _LAUNCH, sys.executable, "-m", "kvconv", *map(str, args)], env=env,
                         cwd=str(ROOT), capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1])


@pytest.mark.slow
# info: its checksums read every page (this dump: 429 MiB peak before the pages summed were given back, 111 MiB after)
@pytest.mark.parametrize("command", [["validate"], ["reconcile"], ["reconcile", "--join", "exact"],
                                     ["reconcile", "--join", "ordered"], ["info"]])
def test_peak_rss_well_below_the_dump(big, command):
    rc, rss = _peak_rss(*command, big, "-q")
    size = big.stat().st_size
    assert rc == 0
    # interpreter and libraries (~70 MiB) + per-host-record state (~1/60 of this dump) + a few chunks in flight
    assert rss < size * 0.45, f"{' '.join(command)}: peak RSS {rss / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB dump"
