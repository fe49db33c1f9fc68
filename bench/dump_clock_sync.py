"""Clock-sync pairs and calibration of tracer dumps: the pairs and each context's calibration, per dump.

    PYTHONPATH=. python3 bench/dump_clock_sync.py run.kvdump ...
"""

import json
import sys

from kvconv.format import dump

for p in sys.argv[1:]:
    with dump.open(p) as d:
        cs = d.records("clock_sync")
        ctxs = d.metadata().get("contexts", [])
        print(p, "pairs", len(cs), "flags", cs["flags"].tolist(), "uncertainty_ns", cs["uncertainty_ns"].tolist())
        for c in ctxs:
            print("  calibration", json.dumps(c.get("calibration")))
