"""Time `reconcile` of 1,048,576 device events against 65,536 host records, exact and ordered join.

    .venv/bin/python bench/bench_reconcile.py [--events-per-launch 16]

Synthetic run (fixtures/synthetic-reconcile/generate.py): 16,384 eager launches and one graph executable of 64 nodes
replayed 768 times (49,152 graph-node records), 16 blocks per launch = 1,048,576 block events. Prints wall times and
the ratio against a baseline measured in the same process: np.argsort of the events' sequence column plus a copy of
the event array (the least any reconciler has to touch). Each join is timed as the library runs it by default
(with the per-event matches table) and as ``kvconv reconcile`` runs it (report only, ``tables=False``).
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _timing import best, quietness  # noqa: E402

from kvconv.check import reconcile  # noqa: E402
from kvconv.format import dump  # noqa: E402


def _synth():
    spec = importlib.util.spec_from_file_location("synth", ROOT / "fixtures" / "synthetic-reconcile" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    synth = _synth()
    print(quietness("start"))
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for exact in (True, False):
            parts = synth.build(eager=16_384, eager_blocks=16, nodes=64, replays=768, node_blocks=16, exact=exact)
            n_ev, n_host = len(parts["events"]), len(parts["eager"]) + len(parts["graph"])
            p = Path(tmp) / f"bench-{'exact' if exact else 'ordered'}.kvdump"
            synth.write(p, parts)
            paths["exact" if exact else "ordered"] = p
        print(f"{n_ev:,} device events, {n_host:,} host records")
        with dump.open(paths["exact"]) as d:
            ev = d.records("device_event")
            base = best(3, lambda: (np.argsort(ev["sequence"], kind="stable"), ev.copy()))[0]
        print(f"baseline (argsort sequence + copy events): {base * 1e3:8.1f} ms")
        for join, p in paths.items():
            with dump.open(p) as d:
                _time_join(d, join, base)
    print(quietness("end"))


def _time_join(d, join: str, base: float) -> None:
    """One join timed as the library runs it (with the matches table) and as the CLI does (report only)."""
    opts = reconcile.ReconcileOptions(join=join)
    t, _, res = best(3, reconcile.reconcile, d, options=opts)
    matched = int((res.matches["host_index"] >= 0).sum())
    print(f"reconcile --join {join:<7}: {t * 1e3:8.1f} ms  = {t / base:5.1f} x baseline  "
          f"({matched:,} matched, ok={res.ok}; {res.agreement_line()})")
    t = best(3, reconcile.reconcile, d, options=opts, tables=False)[0]
    print(f"  report only (the CLI: tables=False): {t * 1e3:8.1f} ms  = {t / base:5.1f} x baseline")


if __name__ == "__main__":
    main()
